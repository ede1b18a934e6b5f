// Shard file: one rank's part of one checkpoint version.
// The byte layout is specified in docs/format/shard.md; keep the two in step.
#ifndef CAIRN_FORMAT_SHARD_HPP
#define CAIRN_FORMAT_SHARD_HPP

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "storage/storage_env.hpp"

namespace cairn::format {

inline constexpr char kShardMagic[8] = {'C', 'A', 'I', 'R', 'N', 'S', 'H', 'D'};
inline constexpr uint32_t kShardFormatVersion = 2;  // writes 2; reads 1 and 2
inline constexpr uint64_t kAlign = 4096;  // data offsets and file size are multiples
inline constexpr size_t kFixedHeaderBytes = 64;
inline constexpr int kMaxDims = 8;
inline constexpr size_t kMaxNameBytes = 255;

enum region_flags : uint8_t { kColumnMajor = 1, kHasLayout = 2 };

// Element size of a cairn_type value; 0 for an unknown type.
size_t type_size(uint8_t type);
const char* type_name(uint8_t type);
bool type_is_float(uint8_t type);

struct region_desc {
  std::string name;
  uint8_t type = 0;
  uint8_t flags = 0;
  uint8_t compression = 0;  // 0 = none (the only value format 1 writes)
  std::vector<uint64_t> dims;  // empty = one-dimensional of `count`
  // Global layout (flag kHasLayout, format 2): this block is dims elements at
  // `start` of a global array of shape `global`; both have dims.size() entries.
  std::vector<uint64_t> global;
  std::vector<uint64_t> start;
  uint64_t count = 0;          // elements
  uint64_t offset = 0;         // byte offset of the data in the file
  uint64_t length = 0;         // bytes of data (count * type_size)
  uint64_t checksum = 0;       // xxh3 of the data
};

struct shard_header {
  std::string run;
  std::string name;
  int64_t version = 0;
  uint32_t rank = 0;
  uint32_t nranks = 1;
  uint32_t flags = 0;
  // Which execution of the job wrote the shard (random, the same on every
  // rank of one execution; 0 in files of earlier cairn versions). A version
  // is assembled only from shards of one attempt: after a restart, shards the
  // failed execution left behind under the same version number never mix in.
  uint32_t attempt = 0;
  uint64_t data_offset = 0;
  uint64_t file_size = 0;
  uint64_t header_checksum = 0;  // filled by encode, checked by decode
  std::vector<region_desc> regions;
};

inline uint64_t align_up(uint64_t v, uint64_t a = kAlign) { return (v + a - 1) / a * a; }

// Assigns data_offset, every region's offset and length, and file_size.
// Fails on an unknown type, a name too long, or duplicate region names.
status plan_layout(shard_header& h);

// Writes the header and region table into out[0, h.data_offset) (zero padded)
// and sets h.header_checksum. out must hold at least h.data_offset bytes.
void encode_header(shard_header& h, std::span<std::byte> out);

// Parses and validates a header (magic, format version, header checksum, that
// every region lies inside the file). `where` names the file in messages.
// `buf` must hold at least the header bytes; returns how many it needs in
// *need if it is too short (errc::again).
result<shard_header> decode_header(std::span<const std::byte> buf, const std::string& where, size_t* need = nullptr);

// Reads and validates the header of a shard file.
result<shard_header> read_header(storage::storage_env* env, const std::string& path);

// Checks every region checksum of a complete shard image.
status verify_image(const shard_header& h, std::span<const std::byte> image, const std::string& where);

}  // namespace cairn::format

#endif
