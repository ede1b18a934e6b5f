#include "util/hex.hpp"

#include <utility>

namespace cairn::util {

std::string hex_encode(std::string_view bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

bool hex_decode(std::string_view hex, size_t bytes, std::string* out) {
  if (hex.size() != bytes * 2) return false;
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string r(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) {
    int hi = val(hex[2 * i]), lo = val(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    r[i] = static_cast<char>(hi * 16 + lo);
  }
  *out = std::move(r);
  return true;
}

}  // namespace cairn::util
