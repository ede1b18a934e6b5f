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
// Uncompressed shards (every level's image, written as is) are format 2;
// compressed ones (compress_shard, shard_io.hpp) are format 3, which only
// adds a stored table. Readers take 1 to 3.
inline constexpr uint32_t kShardFormatVersion = 2;
inline constexpr uint32_t kCompressedShardFormatVersion = 3;
inline constexpr uint32_t kNewestShardFormatVersion = 3;
inline constexpr uint64_t kAlign = 4096;  // data offsets and file size are multiples
inline constexpr size_t kFixedHeaderBytes = 64;
inline constexpr int kMaxDims = 8;
inline constexpr size_t kMaxNameBytes = 255;

enum region_flags : uint8_t { kColumnMajor = 1, kHasLayout = 2 };
// How a region's bytes are stored in the file (region_desc::compression).
enum region_compression : uint8_t { kCompressNone = 0, kCompressZstd = 1 };

// Element size of a cairn_type value; 0 for an unknown type.
size_t type_size(uint8_t type);
const char* type_name(uint8_t type);
bool type_is_float(uint8_t type);

struct region_desc {
  std::string name;
  uint8_t type = 0;
  uint8_t flags = 0;
  uint8_t compression = 0;  // kCompressNone or (format 3) kCompressZstd
  std::vector<uint64_t> dims;  // empty = one-dimensional of `count`
  // Global layout (flag kHasLayout, format 2): this block is dims elements at
  // `start` of a global array of shape `global`; both have dims.size() entries.
  std::vector<uint64_t> global;
  std::vector<uint64_t> start;
  uint64_t count = 0;          // elements
  uint64_t offset = 0;         // byte offset of the data in the file
  uint64_t length = 0;         // bytes of data (count * type_size)
  uint64_t checksum = 0;       // xxh3 of the data
  // Where the region's bytes are in the file: equal to offset and length
  // unless the shard is compressed (format 3), where stored_length is the
  // size of the zstd frame (compression kCompressZstd) or equals length.
  uint64_t stored_offset = 0;
  uint64_t stored_length = 0;
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
  // The header, offsets, sizes and checksums always describe the
  // uncompressed image (what staging holds and restart rebuilds): data_offset,
  // file_size (the image's size) and header_checksum (the image's header
  // checksum, which MANIFESTs and tree files record) are the same whether the
  // file is compressed or not.
  uint64_t data_offset = 0;
  uint64_t file_size = 0;
  uint64_t header_checksum = 0;  // filled by encode, checked by decode
  std::vector<region_desc> regions;
  // The file as stored: its format version, its size and its own header
  // checksum. For formats 1 and 2 stored_size == file_size and
  // stored_checksum == header_checksum.
  uint32_t format_version = kShardFormatVersion;
  uint64_t stored_size = 0;
  uint64_t stored_checksum = 0;

  bool compressed() const { return format_version >= kCompressedShardFormatVersion; }
};

inline uint64_t align_up(uint64_t v, uint64_t a = kAlign) { return (v + a - 1) / a * a; }

// The image's header is header_base_bytes(run, checkpoint name) plus
// region_header_bytes of each region, rounded up to kAlign: what a caller
// that adds regions one at a time needs to size the image without planning
// every region again (the client's staging made ahead).
size_t header_base_bytes(const std::string& run, const std::string& name);
size_t region_header_bytes(const region_desc& r);

// Assigns data_offset, every region's offset and length (and the equal stored
// ones), and file_size. Fails on an unknown type, a name too long, or
// duplicate region names.
status plan_layout(shard_header& h);

// Writes the header and region table of the uncompressed image (format 2,
// every region's compression 0) into out[0, h.data_offset) (zero padded) and
// sets h.header_checksum (and the equal stored fields). out must hold at least
// h.data_offset bytes.
void encode_header(shard_header& h, std::span<std::byte> out);

// Format 3: bytes of the header of the compressed file h describes (the
// format 2 header plus the stored table).
size_t compressed_header_bytes(const shard_header& h);
// Format 3: writes the header of a compressed file into out[0,
// compressed_header_bytes(h)) (out must hold that many bytes). h describes the
// image (h.header_checksum is the image's, from encode_header) and the file:
// every region's compression, stored_offset and stored_length, and
// h.stored_size. Sets h.format_version and h.stored_checksum.
void encode_compressed_header(shard_header& h, std::span<std::byte> out);

// Parses and validates a header of any format 1 to 3 (magic, format version,
// header checksum, that every region lies inside the image and, compressed,
// that its stored bytes lie inside the file). `where` names the file in
// messages.
// `buf` must hold at least the header bytes; returns how many it needs in
// *need if it is too short (errc::again).
result<shard_header> decode_header(std::span<const std::byte> buf, const std::string& where, size_t* need = nullptr);

// Reads and validates the header of a shard file, and that the file has the
// size the header says (stored_size). Reads no region data: to read the data,
// compressed or not, use shard_io.hpp.
result<shard_header> read_header(storage::storage_env* env, const std::string& path);
// The same on an open file; *bytes_read (if given) adds the bytes it read.
result<shard_header> read_header(const storage::readable_file& f, const std::string& path,
                                 uint64_t* bytes_read = nullptr);

// Checks every region checksum of a complete (uncompressed) shard image.
status verify_image(const shard_header& h, std::span<const std::byte> image, const std::string& where);

}  // namespace cairn::format

#endif
