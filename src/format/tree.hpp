// Hash-tree file (tree.<rank>): per region, hashes of fixed-size chunks of the
// data (exact, and for floating-point regions tolerant = of values quantized to
// a quantum), and their Merkle roots. Layout in docs/format/tree.md.
#ifndef CAIRN_FORMAT_TREE_HPP
#define CAIRN_FORMAT_TREE_HPP

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "format/shard.hpp"
#include "storage/storage_env.hpp"

namespace cairn::format {

inline constexpr char kTreeMagic[8] = {'C', 'A', 'I', 'R', 'N', 'T', 'R', 'E'};
inline constexpr uint32_t kTreeFormatVersion = 1;
inline constexpr uint32_t kTreeFanout = 16;

struct region_tree {
  std::string name;
  uint8_t type = 0;
  bool has_tolerant = false;
  uint64_t count = 0;              // elements of the region
  uint64_t exact_root = 0;
  uint64_t tolerant_root = 0;      // 0 when !has_tolerant
  std::vector<uint64_t> exact;     // one per chunk
  std::vector<uint64_t> tolerant;  // one per chunk, or empty
};

struct tree_file {
  uint64_t chunk_bytes = 0;        // chunk size; the last chunk of a region may be shorter
  double quantum = 0;              // tolerant leaves: floor(v / quantum); 0 = none
  uint64_t shard_header_checksum = 0;  // binds the tree to its shard
  std::vector<region_tree> regions;    // in the shard's region order

  const region_tree* find(const std::string& region) const;
};

// Elements per chunk for a region of `type` (chunk_bytes rounded down to whole elements, at least 1).
uint64_t elements_per_chunk(uint64_t chunk_bytes, uint8_t type);

// Leaf hashes of one chunk. `data` holds `n` elements of `type`.
uint64_t exact_leaf(const std::byte* data, uint64_t n, uint8_t type);
uint64_t tolerant_leaf(const std::byte* data, uint64_t n, uint8_t type, double quantum);
// The quantum index of one value (equal indices imply |a - b| < quantum); NaN,
// infinities and values too large for an int64 index map to reserved tokens.
int64_t quantize(double v, double quantum);

// Root of a Merkle tree with fanout kTreeFanout over `leaves`.
uint64_t merkle_root(std::span<const uint64_t> leaves);

// Builds the tree of a complete shard image (header already encoded).
tree_file build_tree(const shard_header& h, std::span<const std::byte> image, uint64_t chunk_bytes, double quantum);
// The same from each region's bytes wherever they are (regions[i] holds
// h.regions[i].length bytes), e.g. regions lent by the application.
tree_file build_tree(const shard_header& h, std::span<const std::byte* const> regions, uint64_t chunk_bytes,
                     double quantum);

// The engine's one pass over a version's data (issue 11, item 3): per region,
// h->regions[i].checksum (xxh3 of its h->regions[i].length bytes at
// regions[i], what the shard header stores) and, when `tree` is not null, the
// region's tree as build_tree makes it. Each region is read once, chunk by
// chunk (the tree's chunks; blocks of kFusedBlock bytes without a tree or for
// larger chunks), and the chunk is hashed for the checksum and its leaves
// while it is in cache. Bit-identical to the separate functions.
// tree->shard_header_checksum is left to the caller: it is known only once
// the header with these checksums is encoded. Optional: *leaves_s gets the
// seconds spent on the leaves beyond the checksum's read (the trees' cost).
// Optional `ready(i, end)`: called before bytes [0, end) of region i are
// read, in order (the engine's pass behind the application's copy waits
// there); false stops the pass, which then returns false and leaves the
// checksums unset.
inline constexpr uint64_t kFusedBlock = 64 * 1024;
using ready_fn = std::function<bool(size_t region, uint64_t end)>;
bool checksum_and_tree(shard_header* h, std::span<const std::byte* const> regions, uint64_t chunk_bytes,
                       double quantum, tree_file* tree, double* leaves_s = nullptr, const ready_fn& ready = {});

std::string encode_tree(const tree_file& t);
result<tree_file> decode_tree(std::span<const std::byte> bytes, const std::string& where);
result<tree_file> read_tree(storage::storage_env* env, const std::string& path);

std::string tree_file_name(uint32_t rank);  // tree.<rank:06>

}  // namespace cairn::format

#endif
