// cairn: error values used throughout the C++ API and core.
//
// A status is ok or a code with a message that says what failed, where, and what
// to do. result<T> is a status or a value. Neither throws.
#ifndef CAIRN_STATUS_HPP
#define CAIRN_STATUS_HPP

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace cairn {
#if defined(__GNUC__)   // exported from libcairn, which hides everything else
#pragma GCC visibility push(default)
#endif

// Values equal the C API's CAIRN_E* codes.
enum class errc : int {
  ok = 0,
  invalid_argument = -1,
  not_found = -2,
  corruption = -3,
  io_error = -4,
  no_space = -5,
  again = -6,
  cancelled = -7,
  not_supported = -8,
  internal = -9,
  diverged = -10,
  // Checkpoints exist but this job cannot restore them (another rank count,
  // damaged copies, agents that do not answer).
  unusable = -11,
  // The version is already committed in this run (by an earlier execution).
  exists = -12,
  // The call did its own work (cairn_checkpoint took its version), but an
  // earlier version failed in the background: the message says which and why.
  earlier_failed = -13,
  // Another execution holds the run (its lease: docs/design/run-identity.md).
  busy = -14,
};

std::string_view errc_name(errc code);

class [[nodiscard]] status {
 public:
  status() = default;
  status(errc code, std::string message) : code_(code), message_(std::move(message)) {}

  static status ok() { return {}; }
  // An I/O failure: picks no_space for ENOSPC/EDQUOT, io_error otherwise, and
  // appends strerror(err) to the message.
  static status from_errno(int err, std::string_view what);

  bool is_ok() const { return code_ == errc::ok; }
  explicit operator bool() const { return is_ok(); }
  errc code() const { return code_; }
  const std::string& message() const { return message_; }
  // "io_error: <message>"
  std::string to_string() const;
  // Returns a copy whose message is prefixed with context ("while X: ...").
  status with_context(std::string_view context) const;

 private:
  errc code_ = errc::ok;
  std::string message_;
};

template <typename T>
class [[nodiscard]] result {
 public:
  result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  result(status st) : status_(std::move(st)) { assert(!status_.is_ok()); }  // NOLINT

  bool is_ok() const { return value_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const status& error() const { return status_; }
  status take_status() { return std::move(status_); }
  T& value() & { assert(value_); return *value_; }
  const T& value() const& { assert(value_); return *value_; }
  T&& value() && { assert(value_); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  std::optional<T> value_;
  status status_;
};

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
}  // namespace cairn

// Propagates a non-ok status from an expression returning status.
#define CAIRN_RETURN_IF_ERROR(expr)        \
  do {                                     \
    ::cairn::status cairn_st_ = (expr);    \
    if (!cairn_st_.is_ok()) return cairn_st_; \
  } while (0)

#define CAIRN_CONCAT_INNER_(a, b) a##b
#define CAIRN_CONCAT_(a, b) CAIRN_CONCAT_INNER_(a, b)
// Declares `lhs` from a result<T> expression or returns its status.
#define CAIRN_ASSIGN_OR_RETURN(lhs, expr)                                  \
  auto CAIRN_CONCAT_(cairn_res_, __LINE__) = (expr);                       \
  if (!CAIRN_CONCAT_(cairn_res_, __LINE__).is_ok())                        \
    return CAIRN_CONCAT_(cairn_res_, __LINE__).take_status();              \
  lhs = std::move(CAIRN_CONCAT_(cairn_res_, __LINE__)).value()

#endif  // CAIRN_STATUS_HPP
