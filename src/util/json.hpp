// Strict JSON reading for every message and record cairn decodes (daemon
// frames, agents control messages, journal records): a depth check before
// the parser sees the text, and typed field getters that never throw.
// Thread-safety: free functions are safe; a fields object is one thread's.
#ifndef CAIRN_UTIL_JSON_HPP
#define CAIRN_UTIL_JSON_HPP

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/status.hpp"

namespace cairn::util {

// Parses a message or record: a JSON object of valid UTF-8 nested at most kMaxJsonDepth
// deep (checked before parsing). invalid_argument otherwise. Never throws.
inline constexpr int kMaxJsonDepth = 16;
// `what` names the text in messages ("payload", "the hello frame's meta").
result<nlohmann::json> parse_json_object(std::string_view text, const std::string& what = "payload");
std::string dump_json(const nlohmann::json& j);  // compact; invalid UTF-8 replaced

// Reads typed fields of a JSON object without throwing: every getter records
// the first problem (missing required field, wrong type, out of range) and
// returns false; error() says which field of which message.
class fields {
 public:
  fields(const nlohmann::json& j, std::string where);
  bool str(const char* key, std::string* out, bool required = true, size_t max_len = 256);
  bool u64(const char* key, uint64_t* out, bool required = true, uint64_t max = UINT64_MAX);
  bool u32(const char* key, uint32_t* out, bool required = true, uint32_t max = UINT32_MAX);
  bool i64(const char* key, int64_t* out, bool required = true, int64_t min = INT64_MIN, int64_t max = INT64_MAX);
  // Arrays of at most max_items strings (each at most max_len bytes) or of
  // integers at most max.
  bool strings(const char* key, std::vector<std::string>* out, bool required = true, size_t max_items = 100000,
               size_t max_len = 256);
  bool u32s(const char* key, std::vector<uint32_t>* out, bool required = true, size_t max_items = 100000,
            uint32_t max = UINT32_MAX);
  bool num(const char* key, double* out, bool required = true, double min = 0, double max = 1e300);
  bool boolean(const char* key, bool* out, bool required = true);
  // An object or array member (borrowed from j); null when absent and optional.
  const nlohmann::json* object(const char* key, bool required = true);
  const nlohmann::json* array(const char* key, bool required = true, size_t max_items = 100000);
  bool ok() const { return error_.empty(); }
  status error() const;

 private:
  const nlohmann::json* find(const char* key, bool required);
  void fail(const std::string& why);
  const nlohmann::json& j_;
  std::string where_;
  std::string error_;
};

// For the store's decoders, written as one try block over nlohmann::json
// (format/, redundancy/): the integer v, in T's range, or a json::exception
// naming `what`. nlohmann's own conversion casts a float or a wider integer
// to T, which is undefined behaviour for a float out of T's range and a silent
// truncation for a wide integer.
namespace detail {
[[noreturn]] void bad_json_integer(const nlohmann::json& v, const char* what, int64_t min, uint64_t max);
}
template <class T>
T int_of(const nlohmann::json& v, const char* what) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  constexpr uint64_t max = static_cast<uint64_t>(std::numeric_limits<T>::max());
  constexpr int64_t min = static_cast<int64_t>(std::numeric_limits<T>::min());
  if (v.is_number_unsigned()) {
    if (const uint64_t x = v.get<uint64_t>(); x <= max) return static_cast<T>(x);
  } else if (v.is_number_integer()) {
    if (const int64_t x = v.get<int64_t>(); x >= 0 ? static_cast<uint64_t>(x) <= max : x >= min)
      return static_cast<T>(x);
  }
  detail::bad_json_integer(v, what, min, max);
}
// obj[key], which must be present.
template <class T>
T int_at(const nlohmann::json& obj, const char* key) {
  return int_of<T>(obj.at(key), key);
}
// obj[key], or dflt when obj has no such member.
template <class T>
T int_or(const nlohmann::json& obj, const char* key, T dflt) {
  auto it = obj.find(key);
  return it == obj.end() ? dflt : int_of<T>(*it, key);
}
// An array of such integers.
template <class T>
std::vector<T> ints_of(const nlohmann::json& v, const char* what) {
  if (!v.is_array())
    throw nlohmann::json::type_error::create(302, std::string(what) + " must be an array of integers", nullptr);
  std::vector<T> out;
  out.reserve(v.size());
  for (const auto& e : v) out.push_back(int_of<T>(e, what));
  return out;
}

}  // namespace cairn::util

#endif
