#include "format/shard_io.hpp"

#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "format/manifest.hpp"
#include "util/aligned_buffer.hpp"
#include "util/copy.hpp"
#include "util/hash.hpp"
#include "util/process.hpp"
#include "util/progress.hpp"

namespace cairn::format {
namespace {

// Compressed bytes are read from a file in pieces of this size.
constexpr size_t kInputChunk = size_t{1} << 20;
// Decompressed bytes skipped over (a read that starts past the stream's
// position) go through a buffer of this size.
constexpr size_t kSkipChunk = size_t{256} << 10;

status corrupt(const std::string& where, const std::string& what) {
  return {errc::corruption, where + ": " + what + " (the shard is damaged; restart uses another level or an older version)"};
}

struct cctx_deleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct dctx_deleter {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

// A readable_file over bytes in memory.
class span_file final : public storage::readable_file {
 public:
  span_file(std::span<const std::byte> b, std::string where) : b_(b), where_(std::move(where)) {}
  status read_at(uint64_t offset, void* data, size_t len) const override {
    if (offset > b_.size() || len > b_.size() - offset)
      return {errc::corruption, where_ + ": read past the end (" + std::to_string(b_.size()) + " bytes)"};
    if (len > 0) std::memcpy(data, b_.data() + offset, len);  // an empty file's span and buffer may both be null
    return {};
  }
  uint64_t size() const override { return b_.size(); }
  std::span<const std::byte> bytes() const { return b_; }

 private:
  std::span<const std::byte> b_;
  std::string where_;
};

}  // namespace

// ---- compression ---------------------------------------------------------------

status check_compress_options(const compress_options& o) {
  if (o.level == 0 || o.level < ZSTD_minCLevel() || o.level > ZSTD_maxCLevel())
    return {errc::invalid_argument, "zstd level " + std::to_string(o.level) + " is out of range (1 to " +
                                        std::to_string(ZSTD_maxCLevel()) + ", or negative down to " +
                                        std::to_string(ZSTD_minCLevel()) + " for faster levels)"};
  if (o.threads < 0 || o.threads > 256)
    return {errc::invalid_argument, "zstd threads " + std::to_string(o.threads) + " must be 0 to 256"};
  return {};
}

result<compressed_shard> compress_shard(const shard_header& h, std::span<const std::byte> image,
                                        const compress_options& o) {
  CAIRN_RETURN_IF_ERROR(check_compress_options(o));
  if (image.size() < h.file_size)
    return status(errc::invalid_argument, "image of " + std::to_string(image.size()) + " bytes, header says " +
                                              std::to_string(h.file_size));
  // The reader rebuilds the image's header with encode_header: only an image
  // whose header that function writes as is can be compressed.
  shard_header plain = h;
  bool laid_out = h.data_offset <= h.file_size;
  for (const auto& r : h.regions)
    laid_out = laid_out && r.offset >= h.data_offset && r.offset <= h.file_size && r.length <= h.file_size - r.offset;
  if (h.compressed() || !laid_out) {
    return status(errc::invalid_argument, "shard " + h.run + "/" + h.name + " v" + std::to_string(h.version) +
                                              " is already compressed or has no valid layout");
  }
  // Room for the header even when data_offset is too small for it (then the
  // checksums below differ and the image is refused).
  std::vector<std::byte> head(std::max<uint64_t>(h.data_offset, compressed_header_bytes(h)));
  encode_header(plain, head);
  if (plain.header_checksum != h.header_checksum ||
      std::memcmp(head.data(), image.data(), std::min<size_t>(head.size(), kFixedHeaderBytes)) != 0) {
    return status(errc::invalid_argument, "shard " + h.run + "/" + h.name + " v" + std::to_string(h.version) +
                                              " has a header this cairn does not write (format " +
                                              std::to_string(h.format_version) + "): it is kept uncompressed");
  }

  compressed_shard out;
  out.header = plain;
  const uint64_t data_start = align_up(compressed_header_bytes(out.header));
  uint64_t worst = data_start;
  for (const auto& r : h.regions) worst += align_up(r.length);
  // Not touched in advance: only the pages the frames fill use memory.
  CAIRN_ASSIGN_OR_RETURN(out.bytes, util::aligned_buffer::allocate(worst, /*touch=*/false));

  std::unique_ptr<ZSTD_CCtx, cctx_deleter> cctx(ZSTD_createCCtx());
  if (!cctx) return status(errc::no_space, "cannot create a zstd compression context");
  auto check = [](size_t rc, const char* what) -> status {
    if (ZSTD_isError(rc)) return {errc::internal, std::string("zstd: ") + what + ": " + ZSTD_getErrorName(rc)};
    return {};
  };
  CAIRN_RETURN_IF_ERROR(check(ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, o.level), "level"));
  CAIRN_RETURN_IF_ERROR(check(ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_contentSizeFlag, 1), "content size"));
  // A libzstd built without threads refuses workers: compress in this thread.
  if (o.threads > 0) (void)ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_nbWorkers, o.threads);

  std::byte* dst = out.bytes.data();
  uint64_t pos = data_start;
  for (auto& r : out.header.regions) {
    r.stored_offset = pos;
    r.compression = kCompressNone;
    r.stored_length = r.length;
    const std::byte* src = image.data() + r.offset;
    // Worth a frame only when it saves at least one page of the file.
    if (r.length > kAlign) {
      const size_t cap = align_up(r.length) - kAlign;
      const size_t n = ZSTD_compress2(cctx.get(), dst + pos, cap, src, r.length);
      if (!ZSTD_isError(n)) {
        r.compression = kCompressZstd;
        r.stored_length = n;
        std::memset(dst + pos + n, 0, align_up(n) - n);  // padding is zero
      } else if (ZSTD_getErrorCode(n) != ZSTD_error_dstSize_tooSmall) {
        return status(errc::internal, "zstd cannot compress region '" + r.name + "': " + ZSTD_getErrorName(n));
      }
    }
    if (r.compression == kCompressNone) {
      std::memcpy(dst + pos, src, r.length);
      std::memset(dst + pos + r.length, 0, align_up(r.length) - r.length);
    }
    pos = align_up(pos + r.stored_length);
  }
  out.header.stored_size = pos;
  encode_compressed_header(out.header, out.bytes.span());
  return out;
}

// ---- reading -------------------------------------------------------------------

struct shard_reader::state {
  std::string path;
  std::unique_ptr<storage::readable_file> file;
  const span_file* memory = nullptr;  // = file.get() when reading from memory
  shard_header header;
  uint64_t bytes_read = 0;
  util::aligned_buffer bounce;  // read_region's pieces of a large region read from a file

  // The decompression stream of one compressed region.
  std::unique_ptr<ZSTD_DCtx, dctx_deleter> dctx;
  size_t region = SIZE_MAX;  // index of the region being decompressed
  uint64_t produced = 0;     // its uncompressed bytes delivered so far
  uint64_t consumed = 0;     // its stored bytes fetched so far
  bool frame_done = false;
  std::vector<std::byte> in_buf, skip_buf;
  ZSTD_inBuffer in{nullptr, 0, 0};

  std::string what(const region_desc& r) const { return "region '" + r.name + "'"; }

  // Makes more stored bytes of region r available in `in`.
  status fetch(const region_desc& r) {
    const uint64_t left = r.stored_length - consumed;
    if (left == 0) {
      return corrupt(path, what(r) + ": zstd frame ends early (" + std::to_string(produced) + " of " +
                               std::to_string(r.length) + " bytes decompressed)");
    }
    if (memory) {  // no copy: the whole rest of the frame at once
      in = {memory->bytes().data() + r.stored_offset + consumed, static_cast<size_t>(left), 0};
    } else {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, kInputChunk));
      in_buf.resize(kInputChunk);
      CAIRN_RETURN_IF_ERROR(file->read_at(r.stored_offset + consumed, in_buf.data(), n));
      in = {in_buf.data(), n, 0};
    }
    consumed += in.size;
    bytes_read += in.size;
    return {};
  }

  status start(size_t index) {
    const region_desc& r = header.regions[index];
    if (!dctx) {
      dctx.reset(ZSTD_createDCtx());
      if (!dctx) return {errc::no_space, "cannot create a zstd decompression context"};
    }
    ZSTD_DCtx_reset(dctx.get(), ZSTD_reset_session_only);
    region = index;
    produced = consumed = 0;
    frame_done = false;
    in = {nullptr, 0, 0};
    CAIRN_RETURN_IF_ERROR(fetch(r));
    const unsigned long long fcs = ZSTD_getFrameContentSize(in.src, in.size);
    if (fcs == ZSTD_CONTENTSIZE_ERROR) return corrupt(path, what(r) + ": not a zstd frame");
    if (fcs == ZSTD_CONTENTSIZE_UNKNOWN) return corrupt(path, what(r) + ": zstd frame without its content size");
    if (fcs != r.length) {
      return corrupt(path, what(r) + ": decompressed size " + std::to_string(fcs) + " is not the region's length " +
                               std::to_string(r.length));
    }
    return {};
  }

  // Decompresses the next n bytes of the current region into dst.
  status next(std::byte* dst, size_t n) {
    const region_desc& r = header.regions[region];
    ZSTD_outBuffer out{dst, n, 0};
    while (out.pos < out.size) {
      if (frame_done) {
        return corrupt(path, what(r) + ": zstd frame ends after " + std::to_string(produced + out.pos) +
                                 " bytes, the region has " + std::to_string(r.length));
      }
      if (in.pos == in.size) CAIRN_RETURN_IF_ERROR(fetch(r));
      const size_t rc = ZSTD_decompressStream(dctx.get(), &out, &in);
      if (ZSTD_isError(rc)) return corrupt(path, what(r) + ": zstd: " + ZSTD_getErrorName(rc));
      if (rc == 0) frame_done = true;
    }
    produced += n;
    if (produced == r.length) return finish(r);
    return {};
  }

  // At the region's end: the frame must end there, with nothing after it.
  status finish(const region_desc& r) {
    while (!frame_done) {
      if (in.pos == in.size && consumed == r.stored_length) break;
      if (in.pos == in.size) CAIRN_RETURN_IF_ERROR(fetch(r));
      std::byte extra;
      ZSTD_outBuffer out{&extra, 1, 0};
      const size_t before = in.pos;
      const size_t rc = ZSTD_decompressStream(dctx.get(), &out, &in);
      if (ZSTD_isError(rc)) return corrupt(path, what(r) + ": zstd: " + ZSTD_getErrorName(rc));
      if (out.pos > 0) return corrupt(path, what(r) + ": zstd frame holds more than the region's length");
      if (rc == 0) frame_done = true;
      else if (in.pos == before) break;
    }
    if (!frame_done) return corrupt(path, what(r) + ": zstd frame is truncated");
    if (in.pos != in.size || consumed != r.stored_length) {
      return corrupt(path, what(r) + ": " + std::to_string(r.stored_length - consumed + (in.size - in.pos)) +
                               " stored bytes after the end of its zstd frame");
    }
    return {};
  }

  status read_compressed(size_t index, uint64_t rel, std::byte* dst, size_t len) {
    if (region != index || rel < produced) CAIRN_RETURN_IF_ERROR(start(index));
    while (produced < rel) {
      skip_buf.resize(kSkipChunk);
      CAIRN_RETURN_IF_ERROR(next(skip_buf.data(), static_cast<size_t>(std::min<uint64_t>(kSkipChunk, rel - produced))));
    }
    return next(dst, len);
  }
};

shard_reader::shard_reader(std::unique_ptr<state> s) : s_(std::move(s)) {}
shard_reader::~shard_reader() = default;
const shard_header& shard_reader::header() const { return s_->header; }
const std::string& shard_reader::path() const { return s_->path; }
uint64_t shard_reader::bytes_read() const { return s_->bytes_read; }

result<std::unique_ptr<shard_reader>> shard_reader::open(storage::storage_env* env, const std::string& path) {
  auto s = std::make_unique<state>();
  s->path = path;
  CAIRN_ASSIGN_OR_RETURN(s->file, env->open_read(path));
  CAIRN_ASSIGN_OR_RETURN(s->header, read_header(*s->file, path, &s->bytes_read));
  return std::unique_ptr<shard_reader>(new shard_reader(std::move(s)));
}

result<std::unique_ptr<shard_reader>> shard_reader::open(std::unique_ptr<storage::readable_file> file,
                                                         const std::string& where) {
  auto s = std::make_unique<state>();
  s->path = where;
  s->file = std::move(file);
  CAIRN_ASSIGN_OR_RETURN(s->header, read_header(*s->file, where, &s->bytes_read));
  return std::unique_ptr<shard_reader>(new shard_reader(std::move(s)));
}

result<std::unique_ptr<shard_reader>> shard_reader::open(std::span<const std::byte> file, const std::string& where) {
  auto s = std::make_unique<state>();
  s->path = where;
  auto f = std::make_unique<span_file>(file, where);
  s->memory = f.get();
  s->file = std::move(f);
  CAIRN_ASSIGN_OR_RETURN(s->header, read_header(*s->file, where, &s->bytes_read));
  return std::unique_ptr<shard_reader>(new shard_reader(std::move(s)));
}

status shard_reader::read(uint64_t offset, void* buf, size_t len) {
  const shard_header& h = s_->header;
  auto* dst = static_cast<std::byte*>(buf);
  if (!h.compressed()) {
    s_->bytes_read += len;
    return s_->file->read_at(offset, buf, len);
  }
  for (size_t i = 0; i < h.regions.size(); ++i) {
    const region_desc& r = h.regions[i];
    if (offset < r.offset || offset > r.offset + r.length || len > r.offset + r.length - offset) continue;
    if (len == 0) return {};
    const uint64_t rel = offset - r.offset;
    if (r.compression == kCompressNone) {
      s_->bytes_read += len;
      return s_->file->read_at(r.stored_offset + rel, buf, len);
    }
    return s_->read_compressed(i, rel, dst, len);
  }
  return {errc::invalid_argument, s_->path + ": bytes [" + std::to_string(offset) + ", " +
                                      std::to_string(offset + len) + ") are not inside one region"};
}

status shard_reader::read_region(size_t index, std::span<std::byte> out) {
  const shard_header& h = s_->header;
  if (index >= h.regions.size() || out.size() < h.regions[index].length)
    return {errc::invalid_argument, s_->path + ": no region " + std::to_string(index) + " of that size"};
  const region_desc& r = h.regions[index];
  // One pass over memory: each piece is hashed right after it is read,
  // while it is still in cache (512 MiB from tmpfs: 1.13x an unverified
  // read(2) of it; bench/verified_read_bench).
  constexpr uint64_t kPiece = 256u << 10;
  // A file whose every read is a round trip (an agent's memory) is read in
  // the larger pieces it asks for. (Reading the next piece on a second
  // thread while this one is hashed was slower on two cores: 92-145 against
  // 73-96 ms for 256 MiB over shm.)
  const uint64_t asked = s_->memory == nullptr ? s_->file->read_piece() : 0;
  const uint64_t piece = asked ? asked : kPiece;
  // The kernel copies slower into memory just past the source modulo a page
  // (util::kernel_copy_slow: malloc's and numpy's large blocks, 16 bytes past
  // a page, against region data that starts on one): read(2) from tmpfs
  // 1.3-3.5x, process_vm_readv out of an agent over shm 2.7x (198 against
  // 73 ms for 256 MiB, bench/run_agent_restart.py). So a large region read
  // from a file into such memory goes through a page-aligned buffer the size
  // of a piece: the kernel copies into it at full speed, the hash reads it
  // from cache, and non-temporal stores put it in place
  // (bench/verified_read_bench --offset 16). (An agent's lent image starts
  // on a page, as the file does.)
  bool bounce = s_->memory == nullptr && r.compression == kCompressNone && r.length >= 4 * kPiece &&
                util::kernel_copy_slow(out.data(), r.stored_offset);
  if (bounce && s_->bounce.size() < piece) {
    auto b = util::aligned_buffer::allocate(piece);
    bounce = static_cast<bool>(b);  // without it, straight in
    if (b) s_->bounce = std::move(b).value();
  }
  util::xxh3_stream hash;
  for (uint64_t at = 0; at < r.length; at += piece) {
    const uint64_t n = std::min(piece, r.length - at);
    if (bounce) {
      CAIRN_RETURN_IF_ERROR(read(r.offset + at, s_->bounce.data(), n));
      hash.update(s_->bounce.data(), n);
      util::stream_copy_piece(out.data() + at, s_->bounce.data(), n);
    } else {
      CAIRN_RETURN_IF_ERROR(read(r.offset + at, out.data() + at, n));
      hash.update(out.data() + at, n);
    }
  }
  if (hash.digest() != r.checksum) return corrupt(s_->path, "checksum mismatch in region '" + r.name + "'");
  return {};
}

namespace {

constexpr uint64_t kOverlapPiece = 32ull << 20;

// Reads the whole uncompressed image (pieces of kOverlapPiece, on a second
// thread) and verifies every region's checksum as the pieces arrive.
status read_and_verify(shard_reader& rd, const shard_header& h, std::span<std::byte> image) {
  util::byte_progress read;
  read.start();
  status read_st;                 // the reader's, read after join
  std::atomic<bool> stop{false};  // a mismatch: the rest need not be read
  std::thread reader([&] {
    util::name_this_thread("cairn-read");
    for (uint64_t at = 0; read_st && !stop && at < image.size(); at += kOverlapPiece) {
      const uint64_t n = std::min<uint64_t>(kOverlapPiece, image.size() - at);
      read_st = rd.read(at, image.data() + at, n);
      if (read_st) read.publish(at + n);
    }
    read.end();
  });
  status st;
  util::xxh3_stream hash;
  for (const auto& r : h.regions) {
    hash.reset();
    for (uint64_t at = r.offset; st && at < r.offset + r.length;) {
      const uint64_t end = std::min(r.offset + r.length, (at / kOverlapPiece + 1) * kOverlapPiece);
      if (read.wait_past(end - 1) < end) {
        st = status(errc::internal, "read ended early");  // replaced by the read's own error below
        break;
      }
      hash.update(image.data() + at, end - at);
      at = end;
    }
    if (!st) break;
    if (hash.digest() != r.checksum) {
      st = corrupt(rd.path(), "checksum mismatch in region '" + r.name + "'");
      break;
    }
  }
  stop = true;
  reader.join();
  if (!read_st) return read_st;
  return st;
}

result<shard_image> read_image(shard_reader& rd, const header_check& check) {
  const shard_header& h = rd.header();
  if (check) CAIRN_RETURN_IF_ERROR(check(h));
  shard_image out;
  out.header = h;
  shard_header plain = h;  // a compressed shard's image header, as encode_header wrote it before compression
  if (h.compressed()) {
    // Its checksum must be the one the compressed header records: checked
    // before the image is allocated (a forged header claims any size).
    std::vector<std::byte> head(h.data_offset);
    encode_header(plain, head);
    if (plain.header_checksum != h.header_checksum)
      return corrupt(rd.path(), "the rebuilt image header has checksum " + util::hex64(plain.header_checksum) +
                                    ", the file records " + util::hex64(h.header_checksum));
  }
  // A compressed image's pages are not touched in advance: only what its
  // frames fill uses memory (the rest is zero, as padding must be).
  CAIRN_ASSIGN_OR_RETURN(out.image, util::aligned_buffer::allocate(h.file_size, /*touch=*/!h.compressed()));
  std::span<std::byte> image = out.image.span().first(h.file_size);
  if (!h.compressed()) {
    // The file is the image. A large one is read in pieces by a second
    // thread while this one checksums the pieces already read: the
    // verification overlaps the read (a cold 512 MiB shard: its 35 ms of
    // hashing hide behind the device) instead of following it.
    if (image.size() < 2 * kOverlapPiece) {
      CAIRN_RETURN_IF_ERROR(rd.read(0, image.data(), image.size()));
    } else {
      CAIRN_RETURN_IF_ERROR(read_and_verify(rd, out.header, image));
      return out;
    }
  } else {
    plain = h;
    encode_header(plain, image);
    for (const auto& r : h.regions) CAIRN_RETURN_IF_ERROR(rd.read(r.offset, image.data() + r.offset, r.length));
    out.header = std::move(plain);  // describes the image returned
  }
  CAIRN_RETURN_IF_ERROR(verify_image(out.header, image, rd.path()));
  return out;
}

}  // namespace

header_check shard_identity_check(std::string where, uint32_t rank, uint32_t nranks, std::string name,
                                  int64_t version, const shard_entry* expect) {
  return [where = std::move(where), rank, nranks, name = std::move(name), version,
          expect](const shard_header& got) -> status {
    if (got.rank != rank || got.name != name || got.version != version)
      return {errc::corruption, where + ": header names another shard (rank " + std::to_string(got.rank) + ", '" +
                                    got.name + "' version " + std::to_string(got.version) + ")"};
    if (got.nranks != nranks)
      return {errc::invalid_argument, where + ": written by " + std::to_string(got.nranks) +
                                          " ranks; this job has " + std::to_string(nranks) +
                                          " (restart with the same number of ranks)"};
    // The MANIFEST records the image's header checksum and size, the same
    // for a compressed copy of the image.
    if (expect && (expect->header_checksum != got.header_checksum || expect->size != got.file_size))
      return {errc::corruption, where + ": does not match the version's MANIFEST (replaced after the commit)"};
    return {};
  };
}

result<shard_image> read_shard_image(storage::storage_env* env, const std::string& path, const header_check& check) {
  CAIRN_ASSIGN_OR_RETURN(auto rd, shard_reader::open(env, path));
  return read_image(*rd, check);
}

result<shard_image> read_shard_image(std::unique_ptr<storage::readable_file> file, const std::string& where,
                                     const header_check& check) {
  CAIRN_ASSIGN_OR_RETURN(auto rd, shard_reader::open(std::move(file), where));
  return read_image(*rd, check);
}

result<shard_image> map_shard_image(std::unique_ptr<storage::readable_file> file, const std::string& where,
                                    const header_check& check) {
  CAIRN_ASSIGN_OR_RETURN(shard_header h, read_header(*file, where));
  std::span<const std::byte> m = h.compressed() ? std::span<const std::byte>() : file->map();
  if (m.empty()) return read_shard_image(std::move(file), where, check);
  if (check) CAIRN_RETURN_IF_ERROR(check(h));
  CAIRN_RETURN_IF_ERROR(verify_image(h, m, where));
  shard_image out;
  out.header = std::move(h);
  out.mapped = std::move(file);
  out.mapped_bytes = m;
  return out;
}

result<shard_image> decode_shard_image(std::span<const std::byte> file, const std::string& where,
                                       const header_check& check) {
  CAIRN_ASSIGN_OR_RETURN(auto rd, shard_reader::open(file, where));
  return read_image(*rd, check);
}

}  // namespace cairn::format
