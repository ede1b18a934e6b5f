// Erasure coding of one stripe with ISA-L (libisal): d data blocks, m parity
// blocks. rs: a Cauchy matrix (gf_gen_cauchy1_matrix), any d of the d+m
// blocks give the others back; xor and partner: one all-ones parity row
// (xor_gen; partner has d = 1, a copy). Blocks of one call have equal length.
// Thread-safety: a codec is immutable after make(); calls may run at once.
#ifndef CAIRN_REDUNDANCY_CODEC_HPP
#define CAIRN_REDUNDANCY_CODEC_HPP

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cairn/status.hpp"
#include "redundancy/sets.hpp"

namespace cairn::redundancy {

class codec {
 public:
  explicit codec(const geometry& g);
  uint32_t d() const { return d_; }
  uint32_t m() const { return m_; }

  // out = parity row `row` (0..m-1) of the d blocks `data`, `len` bytes each.
  void encode(uint32_t row, const unsigned char* const* data, unsigned char* out, size_t len) const;

  // The expansion tables that give data block `lost` (0..d-1) from the
  // blocks `rows` (d distinct indices: t < d is data block t, d + r is parity
  // row r). corruption when those blocks do not determine it.
  result<std::vector<unsigned char>> decoder(const std::vector<uint32_t>& rows, uint32_t lost) const;
  // out = the block `tables` decodes from `blocks` (in the order of `rows`).
  void decode(const std::vector<unsigned char>& tables, const unsigned char* const* blocks, unsigned char* out,
              size_t len) const;

 private:
  scheme kind_;
  uint32_t d_, m_;
  std::vector<unsigned char> matrix_;               // (d+m) x d, identity on top
  std::vector<std::vector<unsigned char>> tables_;  // per parity row, ec_init_tables
};

}  // namespace cairn::redundancy

#endif
