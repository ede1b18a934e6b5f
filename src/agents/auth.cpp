#include "agents/auth.hpp"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "storage/storage_env.hpp"
#include "util/hex.hpp"

namespace cairn::agents {

status crypto_init() {
  static const int rc = sodium_init();  // thread-safe once; < 0 only without entropy
  if (rc < 0) return {errc::internal, "libsodium could not be initialised (no entropy source?)"};
  return {};
}

result<std::string> load_secret(const std::string& path, std::string* warning) {
  if (path.empty()) return status(errc::invalid_argument, "no secret file given");
  auto data = storage::storage_env::posix()->read_all(path);
  if (!data) {
    return status(errc::invalid_argument,
                  "cannot read the agents secret file " + path + ": " + data.error().message() +
                      " (create it with e.g. `openssl rand -hex 32 > " + path + "; chmod 600 " + path + "`)");
  }
  std::string s = std::move(*data);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  if (s.size() < kMinSecretSize) {
    return status(errc::invalid_argument, "agents secret file " + path + " holds " + std::to_string(s.size()) +
                                              " bytes; at least " + std::to_string(kMinSecretSize) +
                                              " are needed (e.g. `openssl rand -hex 32 > " + path + "`)");
  }
  if (s.size() > kMaxSecretSize) {
    return status(errc::invalid_argument, "agents secret file " + path + " is larger than " +
                                              std::to_string(kMaxSecretSize) + " bytes: is it the right file?");
  }
  struct stat st {};
  if (warning != nullptr && ::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    *warning = "agents secret file " + path + " is accessible by group or others (chmod 600 it)";
  }
  return s;
}

result<std::string> secret_file_from(const std::string& option) {
  if (!option.empty()) return option;
  const char* env = std::getenv("CAIRN_AGENTS_SECRET_FILE");
  if (env != nullptr && *env != '\0') return std::string(env);
  return status(errc::invalid_argument,
                "no deployment secret: give --secret-file FILE or set CAIRN_AGENTS_SECRET_FILE "
                "(every controller, manager and client of a deployment must use the same secret)");
}

result<std::string> load_deployment_secret(const std::string& option, std::string* warning, std::string* path) {
  CAIRN_ASSIGN_OR_RETURN(std::string file, secret_file_from(option));
  if (path) *path = file;
  return load_secret(file, warning);
}

result<std::string> load_service_secret(const std::string& option, std::string* warning) {
  std::string file = option;
  if (file.empty()) {
    const char* env = std::getenv("CAIRN_AGENTS_SERVICE_SECRET_FILE");
    if (env != nullptr) file = env;
  }
  if (file.empty()) return std::string();
  return load_secret(file, warning);
}

std::string hmac(std::string_view key, std::string_view data) {
  crypto_auth_hmacsha512256_state st;
  crypto_auth_hmacsha512256_init(&st, reinterpret_cast<const unsigned char*>(key.data()), key.size());
  crypto_auth_hmacsha512256_update(&st, reinterpret_cast<const unsigned char*>(data.data()), data.size());
  std::string out(crypto_auth_hmacsha512256_BYTES, '\0');
  crypto_auth_hmacsha512256_final(&st, reinterpret_cast<unsigned char*>(out.data()));
  sodium_memzero(&st, sizeof st);
  return out;
}

bool tag_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string random_nonce() {
  std::string n(kNonceSize, '\0');
  randombytes_buf(n.data(), n.size());
  return n;
}

session_keys derive_session_keys(std::string_view secret, std::string_view client_nonce,
                                 std::string_view server_nonce) {
  std::string nonces = std::string(client_nonce) + std::string(server_nonce);
  return {hmac(secret, "cairn-agents c2s v1" + nonces), hmac(secret, "cairn-agents s2c v1" + nonces)};
}

namespace {

result<session_keys> cipher_keys(bool client, const box_keypair& mine, std::string_view peer) {
  if (peer.size() != crypto_kx_PUBLICKEYBYTES || mine.public_key.size() != crypto_kx_PUBLICKEYBYTES ||
      mine.secret_key.size() != crypto_kx_SECRETKEYBYTES)
    return status(errc::invalid_argument, "a key exchange key of " + std::to_string(peer.size()) +
                                              " bytes (expected " + std::to_string(crypto_kx_PUBLICKEYBYTES) + ")");
  std::string rx(crypto_kx_SESSIONKEYBYTES, '\0'), tx(crypto_kx_SESSIONKEYBYTES, '\0');
  auto u = [](std::string& s) { return reinterpret_cast<unsigned char*>(s.data()); };
  auto c = [](std::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); };
  int rc = client ? crypto_kx_client_session_keys(u(rx), u(tx), c(mine.public_key), c(mine.secret_key), c(peer))
                  : crypto_kx_server_session_keys(u(rx), u(tx), c(mine.public_key), c(mine.secret_key), c(peer));
  if (rc != 0) return status(errc::invalid_argument, "a key exchange key that yields no shared key");
  // The client sends with tx, the server with its tx: c2s is the client's tx.
  return client ? session_keys{std::move(tx), std::move(rx)} : session_keys{std::move(rx), std::move(tx)};
}

}  // namespace

result<session_keys> client_cipher_keys(const box_keypair& mine, std::string_view server_public) {
  return cipher_keys(true, mine, server_public);
}

result<session_keys> server_cipher_keys(const box_keypair& mine, std::string_view client_public) {
  return cipher_keys(false, mine, client_public);
}

std::string cipher_xor(std::string_view key, uint64_t seq, std::string_view payload) {
  if (key.size() != crypto_stream_chacha20_ietf_KEYBYTES) return {};  // a session made without keys: sends nothing readable
  unsigned char nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {};
  for (int i = 0; i < 8; ++i) nonce[i] = static_cast<unsigned char>(seq >> (8 * i));
  std::string out(payload.size(), '\0');
  crypto_stream_chacha20_ietf_xor(reinterpret_cast<unsigned char*>(out.data()),
                                  reinterpret_cast<const unsigned char*>(payload.data()), payload.size(), nonce,
                                  reinterpret_cast<const unsigned char*>(key.data()));
  return out;
}

std::string new_app_key() {
  (void)crypto_init();
  std::string k(kAppKeySize, '\0');
  randombytes_buf(k.data(), k.size());
  return k;
}

box_keypair new_box_keypair() {
  (void)crypto_init();
  box_keypair kp{std::string(crypto_box_PUBLICKEYBYTES, '\0'), std::string(crypto_box_SECRETKEYBYTES, '\0')};
  crypto_box_keypair(reinterpret_cast<unsigned char*>(kp.public_key.data()),
                     reinterpret_cast<unsigned char*>(kp.secret_key.data()));
  return kp;
}

result<std::string> seal_to(std::string_view public_key, std::string_view message) {
  if (public_key.size() != crypto_box_PUBLICKEYBYTES)
    return status(errc::invalid_argument, "a public key of " + std::to_string(public_key.size()) + " bytes (expected " +
                                              std::to_string(crypto_box_PUBLICKEYBYTES) + ")");
  std::string box(message.size() + crypto_box_SEALBYTES, '\0');
  crypto_box_seal(reinterpret_cast<unsigned char*>(box.data()), reinterpret_cast<const unsigned char*>(message.data()),
                  message.size(), reinterpret_cast<const unsigned char*>(public_key.data()));
  return box;
}

result<std::string> open_sealed(const box_keypair& kp, std::string_view box) {
  if (box.size() < crypto_box_SEALBYTES || kp.public_key.size() != crypto_box_PUBLICKEYBYTES ||
      kp.secret_key.size() != crypto_box_SECRETKEYBYTES)
    return status(errc::invalid_argument, "not a sealed box of this key pair");
  std::string out(box.size() - crypto_box_SEALBYTES, '\0');
  if (crypto_box_seal_open(reinterpret_cast<unsigned char*>(out.data()),
                           reinterpret_cast<const unsigned char*>(box.data()), box.size(),
                           reinterpret_cast<const unsigned char*>(kp.public_key.data()),
                           reinterpret_cast<const unsigned char*>(kp.secret_key.data())) != 0)
    return status(errc::invalid_argument, "a sealed box that does not open with this key pair");
  return out;
}

namespace {

// Keyed BLAKE2b-256 under `key` over a label and parts, each part preceded
// by its length (u32), so that no two lists of parts hash alike.
std::string keyed_proof(std::string_view key, std::string_view label, std::initializer_list<std::string_view> parts) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, reinterpret_cast<const unsigned char*>(key.data()), key.size(), 32);
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(label.data()), label.size());
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>("\0"), 1);
  for (std::string_view p : parts) {
    const uint32_t n = static_cast<uint32_t>(p.size());
    crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(&n), sizeof n);
    crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(p.data()), p.size());
  }
  std::string out(32, '\0');
  crypto_generichash_final(&st, reinterpret_cast<unsigned char*>(out.data()), out.size());
  return out;
}

}  // namespace

std::string app_key_proof(std::string_view app_key, std::string_view name, std::string_view public_key) {
  return keyed_proof(app_key, "cairn-agents app key proof v1", {name, public_key});
}

std::string app_request_proof(std::string_view app_key, uint64_t app, std::string_view binding,
                              std::string_view request) {
  const std::string id = std::to_string(app);
  return keyed_proof(app_key, "cairn-agents app request v2", {id, binding, request});
}

std::string app_key_file(const std::string& store, const std::string& run) {
  return store + "/runs/" + run + "/agents.key";
}

std::string load_app_key(const std::string& path) {
  auto text = storage::storage_env::posix()->read_all(path);
  std::string key;
  if (!text) return key;
  std::string_view hex = *text;
  while (!hex.empty() && std::isspace(static_cast<unsigned char>(hex.back()))) hex.remove_suffix(1);
  if (!util::hex_decode(hex, kAppKeySize, &key)) key.clear();
  return key;
}

status save_app_key(const std::string& path, std::string_view key) {
  storage::storage_env* env = storage::storage_env::posix();
  const std::string dir = storage::dirname_of(path), tmp = path + ".tmp";
  CAIRN_RETURN_IF_ERROR(env->make_dirs(dir));
  const std::string text = util::hex_encode(key) + "\n";
  auto fail = [&](const char* what) {
    status st(errc::io_error, std::string(what) + " " + tmp + ": " + std::strerror(errno));
    (void)::unlink(tmp.c_str());
    return st;
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return fail("cannot create");
  const bool ok = ::fchmod(fd, 0600) == 0 &&
                  ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) return fail("cannot write");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("cannot rename");
  return env->sync_dir(dir);
}

}  // namespace cairn::agents
