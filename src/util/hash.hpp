// xxh3 checksums (the checksum of every on-disk object; see docs/format/).
#ifndef CAIRN_UTIL_HASH_HPP
#define CAIRN_UTIL_HASH_HPP

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace cairn::util {

uint64_t xxh3(const void* data, size_t len);
inline uint64_t xxh3(std::span<const std::byte> s) { return xxh3(s.data(), s.size()); }

// Incremental xxh3-64 (same value as xxh3() over the concatenation).
class xxh3_stream {
 public:
  xxh3_stream();
  ~xxh3_stream();
  xxh3_stream(const xxh3_stream&) = delete;
  xxh3_stream& operator=(const xxh3_stream&) = delete;
  void update(const void* data, size_t len);
  uint64_t digest() const;
  void reset();  // back to the empty input (no allocation)

 private:
  void* state_;
};

std::string hex64(uint64_t v);  // 16 lower-case hex digits
bool parse_hex64(const std::string& s, uint64_t* out);

}  // namespace cairn::util

#endif
