#include "cairn/status.hpp"

#include <cerrno>
#include <cstring>

namespace cairn {

std::string_view errc_name(errc code) {
  switch (code) {
    case errc::ok: return "ok";
    case errc::invalid_argument: return "invalid_argument";
    case errc::not_found: return "not_found";
    case errc::corruption: return "corruption";
    case errc::io_error: return "io_error";
    case errc::no_space: return "no_space";
    case errc::again: return "again";
    case errc::cancelled: return "cancelled";
    case errc::not_supported: return "not_supported";
    case errc::internal: return "internal";
    case errc::diverged: return "diverged";
    case errc::unusable: return "unusable";
    case errc::exists: return "exists";
    case errc::earlier_failed: return "earlier_failed";
    case errc::busy: return "busy";
  }
  return "unknown";
}

status status::from_errno(int err, std::string_view what) {
  errc code = (err == ENOSPC || err == EDQUOT) ? errc::no_space : errc::io_error;
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  if (code == errc::no_space) msg += " (free space on that level or lower keep_* retention)";
  return {code, std::move(msg)};
}

std::string status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(errc_name(code_)) + ": " + message_;
}

status status::with_context(std::string_view context) const {
  if (is_ok()) return *this;
  return {code_, std::string(context) + ": " + message_};
}

}  // namespace cairn
