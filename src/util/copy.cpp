#include "util/copy.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cairn::util {
namespace {

constexpr size_t kStreamFrom = 1u << 20;

#if defined(__x86_64__)
// Both copy [0, n & ~(step - 1)) with an aligned destination; the caller
// copies the head (to reach the alignment) and the tail.
__attribute__((target("avx2"))) void stream_avx2(std::byte* d, const std::byte* s, size_t n) {
  for (size_t i = 0; i + 128 <= n; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  _mm256_zeroupper();  // SSE code follows (see util/hash.cpp)
}

void stream_sse2(std::byte* d, const std::byte* s, size_t n) {
  for (size_t i = 0; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
}
#endif

}  // namespace

void stream_copy(void* dst, const void* src, size_t len) {
  if (len >= kStreamFrom) stream_copy_piece(dst, src, len);
  else std::memcpy(dst, src, len);
}

void stream_copy_piece(void* dst, const void* src, size_t len) {
#if defined(__x86_64__)
  if (len >= 256) {
    auto* d = static_cast<std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    static const bool avx2 = __builtin_cpu_supports("avx2");
    const size_t step = avx2 ? 128 : 64;
    // Head: up to the destination's 64-byte line.
    const size_t head = (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    len -= head;
    const size_t body = len / step * step;
    if (avx2) stream_avx2(d, s, body);
    else stream_sse2(d, s, body);
    _mm_sfence();  // the streamed stores are ordered before whatever follows
    std::memcpy(d + body, s + body, len - body);
    return;
  }
#endif
  std::memcpy(dst, src, len);
}

}  // namespace cairn::util
