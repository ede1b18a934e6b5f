// Names and texts from users or from disk that become paths, file names or
// JSON (run, checkpoint and region names, node ids, tags, code versions):
// validated at the edge, so that nothing deeper can fail on them (a JSON
// encoder throws on invalid UTF-8; a '/' would leave the store).
#ifndef CAIRN_UTIL_NAMES_HPP
#define CAIRN_UTIL_NAMES_HPP

#include <string>
#include <string_view>

#include "cairn/status.hpp"

namespace cairn::util {

inline constexpr size_t kMaxNameBytes = 255;
inline constexpr size_t kMaxTextBytes = 4096;

// Well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool valid_utf8(std::string_view s);

// A name that becomes one path component: 1..255 bytes of UTF-8, no control
// characters, no '/', not "." or "..". invalid_argument names `what` and the
// rule broken (the name itself escaped, so the message is printable).
status check_name(std::string_view what, std::string_view name);

// A free text (a code version, a tag value): UTF-8 without control
// characters other than tab, at most kMaxTextBytes.
status check_text(std::string_view what, std::string_view text);

// `s` with bytes that are not printable ASCII written as \xHH.
std::string escaped(std::string_view s);

}  // namespace cairn::util

#endif
