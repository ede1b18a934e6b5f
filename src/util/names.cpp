#include "util/names.hpp"

#include <cstdio>

namespace cairn::util {

bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const unsigned c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    size_t n;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) n = 1, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) n = 2, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) n = 3, cp = c & 0x07;
    else return false;
    if (static_cast<size_t>(end - p) <= n) return false;
    for (size_t i = 1; i <= n; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    p += n + 1;
  }
  return true;
}

std::string escaped(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    }
  }
  return out;
}

namespace {

bool has_control(std::string_view s, bool allow_tab) {
  for (unsigned char c : s)
    if ((c < 0x20 && !(allow_tab && c == '\t')) || c == 0x7F) return true;
  return false;
}

status bad(std::string_view what, std::string_view name, const std::string& rule) {
  return {errc::invalid_argument, std::string(what) + " '" + escaped(name) + "' " + rule};
}

}  // namespace

status check_name(std::string_view what, std::string_view name) {
  if (name.empty()) return {errc::invalid_argument, std::string(what) + " name is empty: give 1 to 255 bytes"};
  if (name.size() > kMaxNameBytes)
    return bad(what, name.substr(0, 32), "is " + std::to_string(name.size()) + " bytes long: at most 255 are allowed");
  if (!valid_utf8(name)) return bad(what, name, "is not valid UTF-8: names must be UTF-8 text");
  if (has_control(name, false)) return bad(what, name, "contains a control character: names must be printable");
  if (name.find('/') != std::string_view::npos) return bad(what, name, "contains '/': a name is one path component");
  if (name == "." || name == "..") return bad(what, name, "is not a usable name: '.' and '..' are directories");
  return {};
}

status check_text(std::string_view what, std::string_view text) {
  if (text.size() > kMaxTextBytes)
    return bad(what, text.substr(0, 32), "is " + std::to_string(text.size()) + " bytes long: at most " +
                                             std::to_string(kMaxTextBytes) + " are allowed");
  if (!valid_utf8(text)) return bad(what, text, "is not valid UTF-8");
  if (has_control(text, true)) return bad(what, text, "contains a control character");
  return {};
}

}  // namespace cairn::util
