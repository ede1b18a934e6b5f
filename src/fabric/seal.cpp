#include "fabric/seal.hpp"

#include <sodium.h>

#include <cstring>

namespace cairn::fabric {

namespace {

std::string tag(std::string_view key, uint32_t context, std::string_view message) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, reinterpret_cast<const unsigned char*>(key.data()), key.size(), kPlaneTagBytes);
  unsigned char c[4];
  std::memcpy(c, &context, 4);  // little-endian hosts only, as the message
  crypto_generichash_update(&st, c, sizeof c);
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(message.data()), message.size());
  std::string out(kPlaneTagBytes, '\0');
  crypto_generichash_final(&st, reinterpret_cast<unsigned char*>(out.data()), out.size());
  return out;
}

}  // namespace

result<std::string> new_plane_key() {
  if (sodium_init() < 0) return status(errc::internal, "libsodium could not be initialised (no entropy source?)");
  std::string k(kPlaneKeyBytes, '\0');
  randombytes_buf(k.data(), k.size());
  return k;
}

std::string seal(std::string_view key, uint32_t context, std::string message) {
  message += tag(key, context, message);
  return message;
}

std::optional<std::string_view> unseal(std::string_view key, uint32_t context, std::string_view sealed) {
  if (key.size() != kPlaneKeyBytes || sealed.size() < kPlaneTagBytes) return std::nullopt;
  const std::string_view message = sealed.substr(0, sealed.size() - kPlaneTagBytes);
  if (sodium_memcmp(tag(key, context, message).data(), sealed.data() + message.size(), kPlaneTagBytes) != 0)
    return std::nullopt;
  return message;
}

}  // namespace cairn::fabric
