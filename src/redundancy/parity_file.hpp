// The parity file of the redundancy level: `redundancy.<rank:06>` beside
// the rank's node-local shard, holding the parity (or, with partner, the
// copy) blocks this rank keeps for its set. Format: docs/format/redundancy.md.
#ifndef CAIRN_REDUNDANCY_PARITY_FILE_HPP
#define CAIRN_REDUNDANCY_PARITY_FILE_HPP

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "redundancy/sets.hpp"
#include "storage/storage_env.hpp"
#include "util/aligned_buffer.hpp"

namespace cairn::redundancy {

inline constexpr char kParityMagic[8] = {'C', 'A', 'I', 'R', 'N', 'L', '2', '\n'};
inline constexpr uint32_t kParityFormat = 1;
inline constexpr uint64_t kParityPrefix = 24;  // magic, format, json length, json checksum

struct member {
  uint32_t rank = 0;
  std::string node;
  uint64_t size = 0;             // its shard image (file_size)
  uint64_t header_checksum = 0;  // its shard's header checksum: which image the parity covers
};

struct block {
  uint32_t stripe = 0;
  uint32_t row = 0;  // parity row of the stripe
  uint64_t offset = 0;  // in the file
  uint64_t length = 0;
  uint64_t checksum = 0;  // xxh3 of the block
};

struct parity_header {
  std::string run, name;
  int64_t version = 0;
  uint32_t nranks = 0;
  geometry geo;
  uint32_t position = 0;      // of this file's rank in the set
  std::vector<member> set;    // set order
  std::vector<block> blocks;  // offsets filled by encode_parity_header
  double written_at = 0;
};

std::string parity_file_name(uint32_t rank);

// The header block (prefix + JSON, zero padded to 4 KiB); fills the blocks'
// offsets, laid out after it in order, 4 KiB aligned.
std::string encode_parity_header(parity_header* h);
// Decodes and checks a header from a file's first bytes (at least the
// prefix and JSON). corruption on a bad magic, checksum or JSON.
result<parity_header> decode_parity_header(std::span<const std::byte> bytes, const std::string& where);
// Reads and decodes the header of a parity file.
result<parity_header> read_parity_header(storage::readable_file& f, const std::string& where);
// Writes `rank`'s parity file in the version directory `dir` (made if
// missing): h's header, then data[i] as h->blocks[i] (offsets filled here);
// written beside it and renamed into place, so a reader sees all or nothing.
status write_parity_file(storage::storage_env* env, const std::string& dir, uint32_t rank, parity_header* h,
                         const std::vector<util::aligned_buffer>& data);

}  // namespace cairn::redundancy

#endif
