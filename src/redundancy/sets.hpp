// Node-loss redundancy (docs/design/redundancy.md): the schemes, how ranks
// form sets across nodes, and the rotated stripes a set is coded in. Pure
// functions: the same inputs give the same sets on every rank.
#ifndef CAIRN_REDUNDANCY_SETS_HPP
#define CAIRN_REDUNDANCY_SETS_HPP

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/status.hpp"

namespace cairn::redundancy {

enum class scheme { none, partner, xor_parity, rs };

// "none", "partner", "xor", "rs" (config values); invalid_argument otherwise.
result<scheme> parse_scheme(const std::string& s);
const char* scheme_name(scheme s);

// The coding of one set of k members (positions 0..k-1).
struct geometry {
  scheme kind = scheme::none;
  uint32_t k = 0;  // members
  uint32_t m = 0;  // parity blocks per stripe (partner, xor: 1)
  // Data blocks per stripe: partner 1, otherwise k - m.
  uint32_t d() const { return kind == scheme::partner ? 1 : k - m; }
  // Lost members the set always survives: m (partner: 1).
  uint32_t tolerance() const { return m; }
  // Stripe s (0..k-1): the positions holding parity (row r = index) and the
  // positions contributing a data block (index t = the block's row).
  std::vector<uint32_t> holders(uint32_t s) const;
  std::vector<uint32_t> contributors(uint32_t s) const;
  // Which of its d chunks position p gives to stripe s, or -1.
  int chunk_of(uint32_t p, uint32_t s) const;
  // The stripes position p holds parity for, in row order of its file.
  std::vector<uint32_t> held_stripes(uint32_t p) const;
  // Bytes of each of position p's chunks for an image of `size` bytes
  // (4 KiB aligned; partner: the whole image rounded up).
  uint64_t chunk_bytes(uint64_t size) const;
  std::string describe() const;  // e.g. "rs(k=4, m=2)"
};

// This rank's set, as formed at init.
struct set_info {
  geometry geo;
  std::vector<uint32_t> members;  // ranks, set order
  std::vector<std::string> nodes;  // per member
  uint32_t position = 0;           // this rank's
};

// Sets of ranks (each in set order) from every rank's node name. Ranks are
// taken round-robin over nodes and cut into ceil(N / set_size) balanced sets,
// set_size clamped to the number of nodes. invalid_argument, naming the
// ranks, node and what to change, when a set would hold two ranks of one node
// or fewer members than the scheme needs (partner/xor 2, rs m+1).
result<std::vector<std::vector<uint32_t>>> form_sets(const std::vector<std::string>& nodes, scheme kind,
                                                     int set_size, int rs_parity);

}  // namespace cairn::redundancy

#endif
