// The plan of an aggregated flush (paper 004, section 3; docs/design/aggregation.md):
// which ranks are the M leaders, which stripe-aligned extents of the output
// files each leader owns, and which leader writes which byte range of every
// rank's image. A pure function of what every rank learns from one collective
// (image sizes, nodes, loads): every rank computes the same plan on its own,
// with no further agreement.
//
// No I/O, no MPI, no threads: callable from anywhere, including simulations of
// far more ranks than exist.
#ifndef CAIRN_AGGREGATE_PLAN_HPP
#define CAIRN_AGGREGATE_PLAN_HPP

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cairn/status.hpp"

namespace cairn::aggregate {

// What one rank contributes (the record piggybacked on the collective).
struct rank_input {
  uint64_t bytes = 0;  // its image
  uint32_t node = 0;   // failure domain / host index (emulated nodes included)
  double load = 0;     // lower is better: a node's CPU, memory and network pressure
};

// How the output is laid out.
enum class layout {
  // M files, file k written only by leader k (CephFS: one writing client per
  // file keeps its write-back cache; also ext4/xfs).
  file_per_leader,
  // One file striped over M stripes; leader k owns stripes k, k+M, k+2M, ...
  // (Lustre: one writer per stripe, one leader per OST).
  shared_striped,
};

struct plan_options {
  uint32_t leaders = 1;         // M, 1 .. number of ranks
  uint64_t stripe = 1 << 20;    // stripe size in bytes, a multiple of 4096
  layout kind = layout::file_per_leader;
  // Baseline for comparisons: leaders are ranks 0..M-1 and ranks fill the
  // leaders' capacity in rank order (a prefix sum), ignoring nodes.
  bool naive = false;
};

// Bytes [src, src+length) of `rank`'s image go to leader `leader` (an index
// into plan::leaders) at `stream` in the leader's byte stream; locate() says
// where that is in the output files.
struct piece {
  uint32_t rank = 0;
  uint64_t src = 0;
  uint64_t length = 0;
  uint32_t leader = 0;
  uint64_t stream = 0;
};

// The extents of the output a leader owns, stripe-aligned: `count` extents of
// `length` bytes in `file`, the first at `offset`, each `stride` bytes after
// the previous one (count 1: one extent). The leader's byte stream fills them
// in order.
struct owned_extents {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t count = 1;
  uint64_t stride = 0;
};

struct plan {
  layout kind = layout::file_per_leader;
  uint64_t stripe = 0;
  std::vector<uint32_t> leaders;        // ranks, in leader order
  std::vector<owned_extents> owned;     // per leader
  std::vector<uint64_t> capacity;       // per leader: bytes of its stream (= what it owns)
  std::vector<uint64_t> used;           // per leader: bytes it writes
  std::vector<piece> pieces;            // by rank, then src
  std::vector<uint64_t> file_bytes;     // per output file: its size
  uint64_t bytes_between_nodes = 0;     // moved from a rank to a leader on another node
  uint64_t bytes_within_nodes = 0;      // moved to a leader on the same node (not itself)
  uint64_t padding = 0;                 // bytes between extents, written by nobody (self plans)
  std::vector<uint32_t> nodes;          // per rank: its node (rank_input::node)
};

// Where a piece's bytes go: (file, offset, length) runs, split at the ends of
// the leader's extents.
struct file_run {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};
std::vector<file_run> locate(const plan& p, const piece& x);

// The pieces of `rank`'s image (plan::pieces is sorted by rank), in src order.
std::span<const piece> pieces_of(const plan& p, uint32_t rank);

// Computes the plan. invalid_argument when the options cannot work (no rank,
// M outside 1..ranks, a stripe that is not a positive multiple of 4096).
result<plan> make_plan(std::span<const rank_input> ranks, const plan_options& options);

// The baselines of paper 004, section 2.1: every rank writes its own image
// (every rank is a "leader" of itself: plan::leaders is 0..N-1), ranks in
// order split into `files` groups of nearly equal count, each group one file
// laid out by a prefix sum of its images. `align` > 0 pads every extent to a
// multiple of it (the `aligned` strategy: no two ranks share a stripe); 0
// packs them (`posix_shared`: neighbours share stripes). invalid_argument for
// no rank, files outside 1..ranks, or an align that is not a multiple of 4096.
result<plan> make_self_plan(std::span<const rank_input> ranks, uint32_t files, uint64_t align);

// Checks every invariant of a plan against its input: every byte of every
// image assigned exactly once, every piece inside its leader's extents, no
// two leaders owning the same bytes of a file (every stripe one writer),
// extents aligned to the stripe, no leader above its capacity. Returns what is
// wrong (internal), for tests and simulations.
status check_plan(std::span<const rank_input> ranks, const plan_options& options, const plan& p);

}  // namespace cairn::aggregate

#endif
