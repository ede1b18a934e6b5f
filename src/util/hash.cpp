#include "util/hash.hpp"

#include <xxhash.h>
#if defined(CAIRN_XXH3_DISPATCH) && (defined(__x86_64__) || defined(__i386__))
// The library's x86 dispatch: the same xxh3 values, computed with the widest
// vector unit the CPU has (AVX-512, AVX2) instead of the SSE2 baseline this
// code is compiled for. Every checksum pass is bound by this hashing, not by
// memory bandwidth (bench/fused_pass_bench, docs/benchmarks.md).
#include <xxh_x86dispatch.h>
#define CAIRN_XXH3_VECTOR 1
#endif

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <new>

namespace cairn::util {
namespace {

// The dispatched code returns with the upper halves of the vector registers
// in use, and the SSE code that follows (this library is compiled for the
// SSE2 baseline) then runs about 3x slower: the quantization of tolerant
// tree leaves went from 0.28 to 0.84 s per 512 MiB. vzeroupper clears them.
inline void leave_vector_code() {
#ifdef CAIRN_XXH3_VECTOR
  static const bool avx = __builtin_cpu_supports("avx");
  if (avx) asm volatile("vzeroupper" ::: "memory");
#endif
}

}  // namespace

uint64_t xxh3(const void* data, size_t len) {
  const uint64_t h = XXH3_64bits(data, len);
  leave_vector_code();
  return h;
}

xxh3_stream::xxh3_stream() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
xxh3_stream::~xxh3_stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void xxh3_stream::update(const void* data, size_t len) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, len);
  leave_vector_code();
}
void xxh3_stream::reset() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }
uint64_t xxh3_stream::digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

bool parse_hex64(const std::string& s, uint64_t* out) {
  if (s.size() != 16) return false;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 16);
  if (end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

}  // namespace cairn::util
