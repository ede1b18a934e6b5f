// Reading and writing shard files whatever their format: the uncompressed
// image (formats 1 and 2) and the zstd-compressed file (format 3) that agents
// write to the persistent level. Every reader of shard data goes through
// read_shard_image (whole shards: restart, agents) or shard_reader (parts of
// regions: verify, comparisons). The byte layout is docs/format/shard.md.
#ifndef CAIRN_FORMAT_SHARD_IO_HPP
#define CAIRN_FORMAT_SHARD_IO_HPP

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "format/shard.hpp"
#include "storage/storage_env.hpp"
#include "util/aligned_buffer.hpp"

namespace cairn::format {

// zstd level 1: on checkpoint data it keeps most of level 3's ratio at about
// twice the speed (docs/benchmarks.md, "Agents: compression").
inline constexpr int kDefaultCompressLevel = 1;

struct compress_options {
  int level = kDefaultCompressLevel;  // zstd level: 1 to 22, or negative (faster, less compression)
  int threads = 0;                    // zstd worker threads per region; 0: the calling thread only
};

// invalid_argument, saying why, unless o is usable (level 0 is not: it means
// "write uncompressed" to the callers that offer it).
status check_compress_options(const compress_options& o);

// A compressed shard file in memory.
struct compressed_shard {
  shard_header header;         // format 3
  util::aligned_buffer bytes;  // the first header.stored_size bytes are the file
  std::span<const std::byte> file() const { return {bytes.data(), header.stored_size}; }
};

// Encodes the uncompressed shard image `image` (h.file_size bytes laid out by
// plan_layout, header written by encode_header; `h` its header) as a
// compressed shard file (format 3): each region a zstd frame at a 4 KiB
// aligned offset. A region that zstd does not shrink by at least one 4 KiB
// page is stored as is (compression 0). Thread-safe.
// Errors: invalid_argument for level 0 or out of range, an image shorter than
// h.file_size, or a header that encode_header would not write as is (a format
// 1 image, an already compressed header): such images are written
// uncompressed. no_space when memory cannot be mapped; internal on a zstd
// failure.
result<compressed_shard> compress_shard(const shard_header& h, std::span<const std::byte> image,
                                        const compress_options& o = {});

// A whole shard, uncompressed and verified.
struct shard_image {
  // The image's header: as decoded from an uncompressed file; for a
  // compressed one, the header of the rebuilt image (format 2, compression 0,
  // the same header checksum). Use read_header for the file's own.
  shard_header header;
  util::aligned_buffer image;  // header.file_size bytes: the uncompressed image, unless mapped
  // Set by map_shard_image when the image was verified where it lies: the
  // file, whose read-only mapping `mapped_bytes` is the image (`image` is
  // then empty). The mapping lives as long as `mapped`.
  std::unique_ptr<storage::readable_file> mapped;
  std::span<const std::byte> mapped_bytes;

  // The image's header.file_size bytes, wherever they lie.
  std::span<const std::byte> bytes() const {
    return mapped ? mapped_bytes.first(header.file_size) : std::span<const std::byte>(image.span().first(header.file_size));
  }
};

// Checks a decoded header before any data are read (restart: the right rank,
// name, version, and the MANIFEST's entry). A failure is returned as is.
using header_check = std::function<status(const shard_header&)>;

// The restart's check of a shard read as rank `rank` of `name` version
// `version` by a job of `nranks` ranks: the header names exactly that shard
// (a node-local file recycled, or overwritten in place, may hold an older
// image whose checksums are intact: corruption), the job's rank count
// (invalid_argument), and the MANIFEST's entry when `expect` is not null (a
// shard replaced after the commit: corruption). `where` names the file.
struct shard_entry;
header_check shard_identity_check(std::string where, uint32_t rank, uint32_t nranks, std::string name,
                                  int64_t version, const shard_entry* expect);

// The reader of whole shards. Reads the shard file at `path`, whatever its
// format: validates the header and the file size, runs `check` (if given),
// reads the image into page-aligned memory, decompressing compressed regions
// and rebuilding the image's header (format 2), and verifies every region's
// checksum and, for a compressed file, that the rebuilt header is the one its
// checksum names. The image is then bit for bit the one that was compressed
// (padding is zero).
// Errors: not_found, io_error, not_supported (a newer format), corruption
// (truncated file, stored bytes past the end of the file, a damaged frame, a
// decompressed size that is not the region's length, a checksum mismatch),
// no_space (memory), or check's.
result<shard_image> read_shard_image(storage::storage_env* env, const std::string& path,
                                     const header_check& check = {});
// The same for a shard opened by open_persistent_image (container.hpp) or
// any other readable file; `where` names it in errors.
result<shard_image> read_shard_image(std::unique_ptr<storage::readable_file> file, const std::string& where,
                                     const header_check& check = {});
// The same, but an uncompressed file that can be mapped
// (readable_file::map: a node-local file, whose pages are in memory on
// tmpfs) is verified where it lies, without allocating or copying: the
// result's `mapped` holds it. Other files are read as above.
result<shard_image> map_shard_image(std::unique_ptr<storage::readable_file> file, const std::string& where,
                                    const header_check& check = {});
// The same for the bytes of a shard file held in memory; `where` names it.
result<shard_image> decode_shard_image(std::span<const std::byte> file, const std::string& where,
                                       const header_check& check = {});

// Reads parts of one shard file's regions, compressed or not, by their
// offsets in the uncompressed image. A compressed region is decompressed as a
// stream: reads moving forward through it cost what they read (and what they
// skip), a read before the previous one restarts the region's frame. Memory:
// about 2 MiB per reader reading a compressed region, nothing more otherwise.
// Not thread-safe: one reader per thread.
class shard_reader {
 public:
  // Opens `path` and reads and validates its header (read_header's checks).
  static result<std::unique_ptr<shard_reader>> open(storage::storage_env* env, const std::string& path);
  // A reader of an open file (open_persistent_image: a shard file or a rank's
  // image in an aggregated version); `where` names it in errors.
  static result<std::unique_ptr<shard_reader>> open(std::unique_ptr<storage::readable_file> file,
                                                    const std::string& where);
  // A reader of a shard file's bytes in memory (not copied: `file` must
  // outlive the reader).
  static result<std::unique_ptr<shard_reader>> open(std::span<const std::byte> file, const std::string& where);
  ~shard_reader();
  shard_reader(const shard_reader&) = delete;
  shard_reader& operator=(const shard_reader&) = delete;

  const shard_header& header() const;
  const std::string& path() const;

  // Reads len bytes at image offset `offset` into buf. The range must lie in
  // one region's data (invalid_argument otherwise), except in an uncompressed
  // file, where any range of the file may be read. Checksums are not
  // verified (read_region does). Errors: io_error; corruption for a damaged
  // frame or one whose size is not the region's length.
  status read(uint64_t offset, void* buf, size_t len);
  // Reads region `index` whole into out (its length) and verifies its checksum.
  status read_region(size_t index, std::span<std::byte> out);
  // Bytes read from the file so far, header included (stored bytes: a
  // compressed region counts its frame, not its length).
  uint64_t bytes_read() const;

 private:
  struct state;
  explicit shard_reader(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

}  // namespace cairn::format

#endif
