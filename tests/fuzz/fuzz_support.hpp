// Shared by the libFuzzer targets (tests/fuzz): an attacker who can write to
// a store can also recompute xxh3, so each target re-seals the checksums of
// the bytes it is given before decoding them, and the decoders' checks behind
// the checksum are what gets fuzzed (docs/design/security.md).
#ifndef CAIRN_TESTS_FUZZ_SUPPORT_HPP
#define CAIRN_TESTS_FUZZ_SUPPORT_HPP

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "util/hash.hpp"

namespace cairn::fuzz {

inline std::span<const std::byte> bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

inline void put_u64(std::string* s, size_t off, uint64_t v) {
  if (off + 8 <= s->size()) std::memcpy(s->data() + off, &v, 8);
}

inline uint32_t get_u32(const std::string& s, size_t off) {
  uint32_t v = 0;
  if (off + 4 <= s.size()) std::memcpy(&v, s.data() + off, 4);
  return v;
}

// A shard file's header checksum (either format): it covers the header's
// first hb bytes (hb at offset 16) with its own field (offset 56) zeroed.
inline void reseal_shard_header(std::string* buf) {
  const uint32_t hb = get_u32(*buf, 16);
  if (buf->size() >= 64 && hb >= 64 && hb <= buf->size()) {
    put_u64(buf, 56, 0);
    put_u64(buf, 56, util::xxh3(buf->data(), hb));
  }
}

}  // namespace cairn::fuzz

#endif
