#include "redundancy/codec.hpp"

#include <isa-l/erasure_code.h>
#include <isa-l/raid.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

namespace cairn::redundancy {

namespace {
// ISA-L takes int lengths: longer blocks go in pieces.
constexpr size_t kMaxCall = size_t{1} << 30;
}  // namespace

codec::codec(const geometry& g) : kind_(g.kind), d_(g.d()), m_(g.m) {
  const uint32_t n = d_ + m_;
  matrix_.assign(static_cast<size_t>(n) * d_, 0);
  if (kind_ == scheme::rs) {
    gf_gen_cauchy1_matrix(matrix_.data(), static_cast<int>(n), static_cast<int>(d_));
  } else {
    for (uint32_t t = 0; t < d_; ++t) matrix_[t * d_ + t] = 1;
    for (uint32_t r = d_; r < n; ++r)
      for (uint32_t t = 0; t < d_; ++t) matrix_[r * d_ + t] = 1;
  }
  for (uint32_t r = 0; r < m_; ++r) {
    std::vector<unsigned char> t(32u * d_);
    ec_init_tables(static_cast<int>(d_), 1, matrix_.data() + (d_ + r) * d_, t.data());
    tables_.push_back(std::move(t));
  }
}

void codec::encode(uint32_t row, const unsigned char* const* data, unsigned char* out, size_t len) const {
  for (size_t at = 0; at < len; at += kMaxCall) {
    const size_t n = std::min(kMaxCall, len - at);
    if (kind_ != scheme::rs && d_ == 1) {
      std::memcpy(out + at, data[0] + at, n);
      continue;
    }
    // xor_gen's vector code needs 32-byte aligned vectors (the stage's
    // buffers are page aligned); anything else takes the GF(2^8) path, whose
    // all-ones row is the same XOR.
    bool aligned = n % 32 == 0 && reinterpret_cast<uintptr_t>(out + at) % 32 == 0;
    for (uint32_t t = 0; t < d_; ++t) aligned &= reinterpret_cast<uintptr_t>(data[t] + at) % 32 == 0;
    if (kind_ != scheme::rs && aligned) {
      // xor_gen: the last vector is the destination.
      std::vector<void*> v(d_ + 1);
      for (uint32_t t = 0; t < d_; ++t) v[t] = const_cast<unsigned char*>(data[t]) + at;
      v[d_] = out + at;
      xor_gen(static_cast<int>(d_ + 1), static_cast<int>(n), v.data());
      continue;
    }
    std::vector<unsigned char*> src(d_);
    for (uint32_t t = 0; t < d_; ++t) src[t] = const_cast<unsigned char*>(data[t]) + at;
    unsigned char* dst = out + at;
    ec_encode_data(static_cast<int>(n), static_cast<int>(d_), 1, const_cast<unsigned char*>(tables_[row].data()),
                   src.data(), &dst);
  }
}

result<std::vector<unsigned char>> codec::decoder(const std::vector<uint32_t>& rows, uint32_t lost) const {
  if (rows.size() != d_ || lost >= d_) return status(errc::internal, "redundancy decoder: wrong block count");
  std::vector<unsigned char> b(static_cast<size_t>(d_) * d_), inv(b.size());
  for (uint32_t i = 0; i < d_; ++i) std::memcpy(&b[i * d_], &matrix_[rows[i] * d_], d_);
  if (gf_invert_matrix(b.data(), inv.data(), static_cast<int>(d_)) != 0)
    return status(errc::corruption, "redundancy: the surviving blocks do not determine the lost one");
  std::vector<unsigned char> t(32u * d_);
  ec_init_tables(static_cast<int>(d_), 1, &inv[lost * d_], t.data());
  return t;
}

void codec::decode(const std::vector<unsigned char>& tables, const unsigned char* const* blocks, unsigned char* out,
                   size_t len) const {
  for (size_t at = 0; at < len; at += kMaxCall) {
    const size_t n = std::min(kMaxCall, len - at);
    std::vector<unsigned char*> src(d_);
    for (uint32_t t = 0; t < d_; ++t) src[t] = const_cast<unsigned char*>(blocks[t]) + at;
    unsigned char* dst = out + at;
    ec_encode_data(static_cast<int>(n), static_cast<int>(d_), 1, const_cast<unsigned char*>(tables.data()), src.data(),
                   &dst);
  }
}

}  // namespace cairn::redundancy
