#include "util/json.hpp"

#include <cmath>

namespace cairn::util {

void detail::bad_json_integer(const nlohmann::json& v, const char* what, int64_t min, uint64_t max) {
  throw nlohmann::json::out_of_range::create(
      406,
      std::string(what) + " must be an integer from " + std::to_string(min) + " to " + std::to_string(max) +
          ", not " + v.dump().substr(0, 40),
      nullptr);
}

result<nlohmann::json> parse_json_object(std::string_view payload, const std::string& what) {
  // Depth first: a deeply nested document must not reach the parser.
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : payload) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) {
        return status(errc::invalid_argument, what + " nested deeper than " + std::to_string(kMaxJsonDepth));
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  nlohmann::json j = nlohmann::json::parse(payload.begin(), payload.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return status(errc::invalid_argument, what + " is not valid JSON (or not UTF-8)");
  if (!j.is_object()) return status(errc::invalid_argument, what + " is not a JSON object");
  return j;
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

fields::fields(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {
  if (!j_.is_object()) fail("not a JSON object");
}

void fields::fail(const std::string& why) {
  if (error_.empty()) error_ = why;
}

status fields::error() const {
  if (error_.empty()) return {};
  return {errc::invalid_argument, where_ + ": " + error_};
}

const nlohmann::json* fields::find(const char* key, bool required) {
  if (!j_.is_object()) return nullptr;
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) {
    if (required) fail(std::string("missing field '") + key + "'");
    return nullptr;
  }
  return &*it;
}

bool fields::str(const char* key, std::string* out, bool required, size_t max_len) {
  const nlohmann::json* v = find(key, required);
  if (v == nullptr) return !required;
  if (!v->is_string()) return fail(std::string("field '") + key + "' must be a string"), false;
  const auto& s = v->get_ref<const std::string&>();
  if (s.size() > max_len) {
    fail(std::string("field '") + key + "' is longer than " + std::to_string(max_len) + " bytes");
    return false;
  }
  *out = s;
  return true;
}

bool fields::u64(const char* key, uint64_t* out, bool required, uint64_t max) {
  const nlohmann::json* v = find(key, required);
  if (v == nullptr) return !required;
  // Non-negative integers parse as unsigned; built in code they may be signed.
  if (!v->is_number_integer() || (!v->is_number_unsigned() && v->get<int64_t>() < 0)) {
    fail(std::string("field '") + key + "' must be a non-negative integer");
    return false;
  }
  uint64_t x = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  if (x > max) {
    fail(std::string("field '") + key + "' is above " + std::to_string(max));
    return false;
  }
  *out = x;
  return true;
}

bool fields::u32(const char* key, uint32_t* out, bool required, uint32_t max) {
  uint64_t x = *out;
  if (!u64(key, &x, required, max)) return false;
  *out = static_cast<uint32_t>(x);
  return true;
}

bool fields::i64(const char* key, int64_t* out, bool required, int64_t min, int64_t max) {
  const nlohmann::json* v = find(key, required);
  if (v == nullptr) return !required;
  if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))) {
    fail(std::string("field '") + key + "' must be an integer");
    return false;
  }
  const int64_t x = v->get<int64_t>();
  if (x < min || x > max) {
    fail(std::string("field '") + key + "' is out of range");
    return false;
  }
  *out = x;
  return true;
}

bool fields::strings(const char* key, std::vector<std::string>* out, bool required, size_t max_items,
                     size_t max_len) {
  const nlohmann::json* v = array(key, required, max_items);
  if (v == nullptr) return !required && ok();
  std::vector<std::string> got;
  for (const auto& e : *v) {
    if (!e.is_string() || e.get_ref<const std::string&>().size() > max_len) {
      fail(std::string("field '") + key + "' must hold strings of at most " + std::to_string(max_len) + " bytes");
      return false;
    }
    got.push_back(e.get<std::string>());
  }
  *out = std::move(got);
  return true;
}

bool fields::u32s(const char* key, std::vector<uint32_t>* out, bool required, size_t max_items, uint32_t max) {
  const nlohmann::json* v = array(key, required, max_items);
  if (v == nullptr) return !required && ok();
  std::vector<uint32_t> got;
  for (const auto& e : *v) {
    if (!e.is_number_unsigned() || e.get<uint64_t>() > max) {
      fail(std::string("field '") + key + "' must hold integers from 0 to " + std::to_string(max));
      return false;
    }
    got.push_back(static_cast<uint32_t>(e.get<uint64_t>()));
  }
  *out = std::move(got);
  return true;
}

bool fields::num(const char* key, double* out, bool required, double min, double max) {
  const nlohmann::json* v = find(key, required);
  if (v == nullptr) return !required;
  if (!v->is_number()) return fail(std::string("field '") + key + "' must be a number"), false;
  double x = v->get<double>();
  if (!std::isfinite(x) || x < min || x > max) {
    fail(std::string("field '") + key + "' is out of range");
    return false;
  }
  *out = x;
  return true;
}

bool fields::boolean(const char* key, bool* out, bool required) {
  const nlohmann::json* v = find(key, required);
  if (v == nullptr) return !required;
  if (!v->is_boolean()) return fail(std::string("field '") + key + "' must be true or false"), false;
  *out = v->get<bool>();
  return true;
}

const nlohmann::json* fields::object(const char* key, bool required) {
  const nlohmann::json* v = find(key, required);
  if (v == nullptr) return nullptr;
  if (!v->is_object()) return fail(std::string("field '") + key + "' must be an object"), nullptr;
  return v;
}

const nlohmann::json* fields::array(const char* key, bool required, size_t max_items) {
  const nlohmann::json* v = find(key, required);
  if (v == nullptr) return nullptr;
  if (!v->is_array()) return fail(std::string("field '") + key + "' must be an array"), nullptr;
  if (v->size() > max_items) return fail(std::string("field '") + key + "' has too many items"), nullptr;
  return v;
}

}  // namespace cairn::util
