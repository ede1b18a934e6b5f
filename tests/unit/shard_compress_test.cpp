// Unit tests of compressed shards (format 3, src/format/shard_io): the
// round trip to the identical image, compressible and incompressible regions,
// partial reads, every kind of damage rejected with errc::corruption, and
// formats 1 and 2 read through the same functions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "analytics/history_diff.hpp"
#include "cairn.h"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"
#include "format/shard_io.hpp"
#include "storage/storage_env.hpp"
#include "test_store.hpp"
#include "util/hash.hpp"

namespace cairn {
namespace {

using format::shard_header;

// Offsets in the fixed header (docs/format/shard.md).
constexpr size_t kFormatVersionAt = 8;
constexpr size_t kHeaderBytesAt = 16;
constexpr size_t kChecksumAt = 56;

// An image of four regions: a smooth float64 field (compresses well), random
// bytes (does not), a scalar, and a smooth int32 ramp.
test::shard_image sample_image() {
  const std::vector<test::region_spec> regions = {{"field", CAIRN_FLOAT64, 256 * 256, {256, 256}, false},
                                                  {"noise", CAIRN_BYTE, 300000, {}, false},
                                                  {"step", CAIRN_INT64, 1, {}, false},
                                                  {"ramp", CAIRN_INT32, 50000, {}, true}};
  auto made = test::make_shard_image("run1", "heat", 3, 1, 2, regions);
  EXPECT_TRUE(made.is_ok()) << made.error().to_string();
  test::shard_image img = std::move(made).value();
  shard_header& h = img.header;
  // "noise" keeps make_shard_image's pseudo-random bytes; the others get
  // smooth data.
  auto* field = reinterpret_cast<double*>(img.bytes.data() + h.regions[0].offset);
  for (int i = 0; i < 256; ++i)
    for (int j = 0; j < 256; ++j) field[i * 256 + j] = std::sin(i * 0.05) * std::cos(j * 0.03) + 300.0;
  auto* ramp = reinterpret_cast<int32_t*>(img.bytes.data() + h.regions[3].offset);
  for (int i = 0; i < 50000; ++i) ramp[i] = i / 7;
  for (auto& r : h.regions) r.checksum = util::xxh3(img.bytes.data() + r.offset, r.length);
  format::encode_header(h, img.bytes);
  return img;
}

format::compressed_shard compress(const test::shard_image& img, format::compress_options o = {}) {
  auto c = format::compress_shard(img.header, img.bytes, o);
  EXPECT_TRUE(c.is_ok()) << c.error().to_string();
  return std::move(c).value();
}

std::vector<std::byte> file_bytes(const format::compressed_shard& c) {
  auto f = c.file();
  return {f.begin(), f.end()};
}

uint32_t header_bytes(const std::vector<std::byte>& b) {
  uint32_t hb = 0;
  std::memcpy(&hb, b.data() + kHeaderBytesAt, 4);
  return hb;
}

void reseal(std::vector<std::byte>& b) {
  const uint32_t hb = header_bytes(b);
  std::memset(b.data() + kChecksumAt, 0, 8);
  const uint64_t sum = util::xxh3(b.data(), hb);
  std::memcpy(b.data() + kChecksumAt, &sum, 8);
}

template <typename T>
void poke(std::vector<std::byte>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}

// Offset of the stored table (format 3): it ends the header, 16 bytes plus
// 16 per region.
size_t stored_table_at(const std::vector<std::byte>& b, size_t regions) {
  return header_bytes(b) - 16 - 16 * regions;
}
size_t stored_offset_at(const std::vector<std::byte>& b, size_t regions, size_t i) {
  return stored_table_at(b, regions) + 16 + 16 * i;
}

std::string message_of(const status& st) { return st ? std::string("ok") : st.message(); }
template <typename T>
std::string message_of(const result<T>& r) {
  return r ? std::string("ok") : r.error().message();
}

bool same_image(const format::shard_image& got, const test::shard_image& want) {
  return got.header.file_size == want.bytes.size() &&
         std::memcmp(got.image.data(), want.bytes.data(), want.bytes.size()) == 0;
}

TEST(ShardCompress, RoundTripGivesTheImageBitForBit) {
  const test::shard_image img = sample_image();
  const format::compressed_shard c = compress(img);
  const shard_header& h = c.header;
  EXPECT_EQ(h.format_version, format::kCompressedShardFormatVersion);
  EXPECT_TRUE(h.compressed());
  EXPECT_EQ(h.header_checksum, img.header.header_checksum);  // the identity MANIFESTs record
  EXPECT_EQ(h.file_size, img.header.file_size);
  EXPECT_LT(h.stored_size, img.header.file_size);
  EXPECT_EQ(h.stored_size % format::kAlign, 0u);
  ASSERT_EQ(h.regions.size(), 4u);
  EXPECT_EQ(h.regions[0].compression, format::kCompressZstd);
  EXPECT_LT(h.regions[0].stored_length, h.regions[0].length);  // float64 mantissas: little gain
  EXPECT_LT(h.regions[3].stored_length, h.regions[3].length / 20);
  EXPECT_EQ(h.regions[1].compression, format::kCompressNone);  // random: kept as is
  EXPECT_EQ(h.regions[1].stored_length, h.regions[1].length);
  EXPECT_EQ(h.regions[2].compression, format::kCompressNone);  // 8 bytes: a frame saves no page
  EXPECT_EQ(h.regions[3].compression, format::kCompressZstd);
  for (const auto& r : h.regions) EXPECT_EQ(r.stored_offset % format::kAlign, 0u) << r.name;

  auto back = format::decode_shard_image(c.file(), "mem");
  ASSERT_TRUE(back.is_ok()) << message_of(back);
  EXPECT_TRUE(same_image(*back, img));
  // The header returned describes the image: format 2, as the writer had it.
  EXPECT_EQ(back->header.format_version, format::kShardFormatVersion);
  EXPECT_EQ(back->header.header_checksum, img.header.header_checksum);
  EXPECT_EQ(back->header.regions[0].compression, format::kCompressNone);
  EXPECT_EQ(back->header.regions[0].offset, img.header.regions[0].offset);
}

TEST(ShardCompress, LevelsAndThreadsGiveTheSameImage) {
  const test::shard_image img = sample_image();
  for (format::compress_options o : {format::compress_options{3, 0}, format::compress_options{-5, 0},
                                     format::compress_options{1, 2}, format::compress_options{9, 0}}) {
    const format::compressed_shard c = compress(img, o);
    auto back = format::decode_shard_image(c.file(), "mem");
    ASSERT_TRUE(back.is_ok()) << "level " << o.level << ": " << message_of(back);
    EXPECT_TRUE(same_image(*back, img)) << "level " << o.level << " threads " << o.threads;
  }
}

TEST(ShardCompress, IncompressibleImageStaysReadable) {
  auto made = test::make_shard_image("r", "n", 1, 0, 1, {{"a", CAIRN_BYTE, 1 << 20, {}, false},
                                                          {"b", CAIRN_UINT64, 20000, {}, false}});
  ASSERT_TRUE(made.is_ok());
  const format::compressed_shard c = compress(*made);
  for (const auto& r : c.header.regions) EXPECT_EQ(r.compression, format::kCompressNone) << r.name;
  // Only the longer header costs: at most one page more than the image.
  EXPECT_LE(c.header.stored_size, made->header.file_size + format::kAlign);
  auto back = format::decode_shard_image(c.file(), "mem");
  ASSERT_TRUE(back.is_ok()) << message_of(back);
  EXPECT_TRUE(same_image(*back, *made));
}

TEST(ShardCompress, RefusesWhatItCannotWrite) {
  const test::shard_image img = sample_image();
  EXPECT_EQ(format::compress_shard(img.header, img.bytes, {0, 0}).error().code(), errc::invalid_argument);
  EXPECT_EQ(format::compress_shard(img.header, img.bytes, {99, 0}).error().code(), errc::invalid_argument);
  EXPECT_EQ(format::compress_shard(img.header, img.bytes, {1, -1}).error().code(), errc::invalid_argument);
  EXPECT_EQ(format::compress_shard(img.header, std::span(img.bytes).first(100), {}).error().code(),
            errc::invalid_argument);
  // An already compressed header.
  const format::compressed_shard c = compress(img);
  EXPECT_EQ(format::compress_shard(c.header, img.bytes, {}).error().code(), errc::invalid_argument);
  // A header that is not the image's (a format 1 image re-encodes differently).
  shard_header other = img.header;
  other.header_checksum ^= 1;
  EXPECT_EQ(format::compress_shard(other, img.bytes, {}).error().code(), errc::invalid_argument);
}

TEST(ShardCompress, ReaderReadsPartsInAnyOrder) {
  const test::shard_image img = sample_image();
  const format::compressed_shard c = compress(img);
  auto rd = format::shard_reader::open(c.file(), "mem");
  ASSERT_TRUE(rd.is_ok()) << message_of(rd);
  const auto& field = img.header.regions[0];
  std::mt19937_64 rng(7);
  std::vector<std::byte> buf(100000);
  for (int i = 0; i < 40; ++i) {
    const uint64_t len = rng() % 60000 + 1;
    const uint64_t off = field.offset + rng() % (field.length - len);
    ASSERT_TRUE((*rd)->read(off, buf.data(), len).is_ok()) << off;
    EXPECT_EQ(std::memcmp(buf.data(), img.bytes.data() + off, len), 0) << "offset " << off << " length " << len;
  }
  // A stored region, and a read that spans two regions.
  const auto& noise = img.header.regions[1];
  ASSERT_TRUE((*rd)->read(noise.offset + 5, buf.data(), 1000).is_ok());
  EXPECT_EQ(std::memcmp(buf.data(), img.bytes.data() + noise.offset + 5, 1000), 0);
  status st = (*rd)->read(field.offset + field.length - 8, buf.data(), 16);
  EXPECT_EQ(st.code(), errc::invalid_argument) << message_of(st);
  // Whole regions, verified.
  for (size_t i = 0; i < img.header.regions.size(); ++i) {
    std::vector<std::byte> out(img.header.regions[i].length);
    EXPECT_TRUE((*rd)->read_region(i, out).is_ok()) << i;
  }
}

class ShardCompressFiles : public ::testing::Test {
 protected:
  test::temp_dir dir_;
  storage::storage_env* env_ = storage::storage_env::posix();
  std::string path(const std::string& name) const { return storage::join(dir_.path(), name); }

  // Writes `bytes` as a file and reads it back as a whole shard.
  result<format::shard_image> read_back(const std::vector<std::byte>& bytes, size_t len = SIZE_MAX) {
    EXPECT_TRUE(test::write_file(path("s"), bytes.data(), std::min(len, bytes.size())).is_ok());
    return format::read_shard_image(env_, path("s"));
  }
};

TEST_F(ShardCompressFiles, FileRoundTripAndHeader) {
  const test::shard_image img = sample_image();
  const format::compressed_shard c = compress(img);
  auto back = read_back(file_bytes(c));
  ASSERT_TRUE(back.is_ok()) << message_of(back);
  EXPECT_TRUE(same_image(*back, img));
  auto h = format::read_header(env_, path("s"));
  ASSERT_TRUE(h.is_ok()) << message_of(h);
  EXPECT_EQ(h->format_version, 3u);
  EXPECT_EQ(h->stored_size, c.header.stored_size);
  EXPECT_EQ(h->stored_checksum, c.header.stored_checksum);
  EXPECT_EQ(h->header_checksum, img.header.header_checksum);
  EXPECT_EQ(h->file_size, img.header.file_size);
}

TEST_F(ShardCompressFiles, CheckRunsBeforeTheData) {
  const test::shard_image img = sample_image();
  ASSERT_TRUE(test::write_file(path("s"), img.bytes.data(), img.bytes.size()).is_ok());
  int calls = 0;
  auto r = format::read_shard_image(env_, path("s"), [&](const shard_header& h) {
    ++calls;
    return h.rank == 1 ? status(errc::invalid_argument, "wrong rank") : status();
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(r.error().code(), errc::invalid_argument);
  EXPECT_EQ(r.error().message(), "wrong rank");
}

// A large uncompressed shard is read in pieces on a second thread and
// checksummed as they arrive: the same image, and a byte flipped in a later
// piece (and in a region that spans pieces) still refused.
TEST_F(ShardCompressFiles, LargeImageVerifiedWhileItIsRead) {
  const std::vector<test::region_spec> regions = {{"a", CAIRN_BYTE, (40u << 20) + 123, {}, false},
                                                  {"b", CAIRN_FLOAT64, 5u << 20, {}, false},
                                                  {"c", CAIRN_INT32, 7, {}, false}};
  auto made = test::make_shard_image("run1", "big", 1, 0, 1, regions);
  ASSERT_TRUE(made.is_ok()) << made.error().to_string();
  const test::shard_image& img = *made;
  ASSERT_GT(img.bytes.size(), 64u << 20);
  auto back = read_back(img.bytes);
  ASSERT_TRUE(back.is_ok()) << message_of(back);
  ASSERT_EQ(back->bytes().size(), img.bytes.size());
  EXPECT_EQ(std::memcmp(back->bytes().data(), img.bytes.data(), img.bytes.size()), 0);
  for (uint64_t at : {img.header.regions[0].offset + (33u << 20), img.header.regions[1].offset + (30u << 20)}) {
    std::vector<std::byte> bad = img.bytes;
    bad[at] ^= std::byte{1};
    auto r = read_back(bad);
    ASSERT_FALSE(r.is_ok()) << at;
    EXPECT_EQ(r.error().code(), errc::corruption);
    EXPECT_NE(r.error().message().find("checksum mismatch in region"), std::string::npos) << message_of(r);
  }
  // Truncated: the read's own error, not a checksum mismatch.
  auto cut = read_back(img.bytes, img.bytes.size() - (10u << 20));
  ASSERT_FALSE(cut.is_ok());
}

// A file read in the pieces it asks for, as an agent's lent memory is.
struct asking_file final : storage::readable_file {
  asking_file(std::unique_ptr<storage::readable_file> f, uint64_t piece) : f(std::move(f)), piece(piece) {}
  status read_at(uint64_t offset, void* data, size_t len) const override {
    ++reads;
    return f->read_at(offset, data, len);
  }
  uint64_t size() const override { return f->size(); }
  uint64_t read_piece() const override { return piece; }
  std::unique_ptr<storage::readable_file> f;
  uint64_t piece;
  mutable int reads = 0;
};

// read_region (restart_verify = while) into memory that starts on a page
// (read straight in) and 16 bytes past one (through the reader's buffer:
// util::kernel_copy_slow), from a
// file read in the reader's pieces and from one that asks for its own (an
// agent's memory): the region's bytes, a region that ends in a partial piece,
// and a byte flipped in a later piece refused.
TEST_F(ShardCompressFiles, RegionReadIntoAlignedAndUnalignedMemory) {
  const std::vector<test::region_spec> regions = {{"a", CAIRN_BYTE, (3u << 20) + 12345, {}, false},
                                                  {"b", CAIRN_INT32, 7, {}, false}};
  auto made = test::make_shard_image("run1", "rr", 1, 0, 1, regions);
  ASSERT_TRUE(made.is_ok()) << made.error().to_string();
  const test::shard_image& img = *made;
  const format::region_desc& a = img.header.regions[0];
  std::vector<std::byte> mem(a.length + 8192);
  auto* aligned = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(mem.data()) + 4095) / 4096 * 4096);
  for (uint64_t asked : {uint64_t{0}, uint64_t{1} << 20})
  for (size_t skew : {0u, 16u}) {
    SCOPED_TRACE("skew " + std::to_string(skew) + ", pieces asked " + std::to_string(asked));
    std::vector<std::byte> bytes = img.bytes;
    for (bool damaged : {false, true}) {
      if (damaged) bytes[a.offset + a.length - 100] ^= std::byte{1};
      ASSERT_TRUE(test::write_file(path("s"), bytes.data(), bytes.size()).is_ok());
      auto f = env_->open_read(path("s"));
      ASSERT_TRUE(f.is_ok()) << message_of(f);
      auto file = std::make_unique<asking_file>(std::move(f).value(), asked);
      const asking_file* seen = file.get();
      auto rd = format::shard_reader::open(std::move(file), path("s"));
      ASSERT_TRUE(rd.is_ok()) << message_of(rd);
      const int header_reads = seen->reads;
      std::span<std::byte> out(aligned + skew, a.length);
      status st = (*rd)->read_region(0, out);
      if (damaged) {
        EXPECT_EQ(st.code(), errc::corruption);
        continue;
      }
      ASSERT_TRUE(st.is_ok()) << message_of(st);
      EXPECT_EQ(std::memcmp(out.data(), img.bytes.data() + a.offset, a.length), 0);
      if (asked) EXPECT_EQ(seen->reads - header_reads, 4);  // 3 MiB + 12345 bytes in pieces of 1 MiB
      std::vector<std::byte> small(img.header.regions[1].length);
      EXPECT_TRUE((*rd)->read_region(1, small).is_ok());
      EXPECT_EQ(std::memcmp(small.data(), img.bytes.data() + img.header.regions[1].offset, small.size()), 0);
    }
  }
}

// The node-local level's restart: an uncompressed shard verified where it
// lies (mapped, no copy), a damaged one refused, a compressed one read as
// read_shard_image reads it.
TEST_F(ShardCompressFiles, MappedImageIsVerifiedWhereItLies) {
  const test::shard_image img = sample_image();
  ASSERT_TRUE(test::write_file(path("s"), img.bytes.data(), img.bytes.size()).is_ok());
  auto open = [&] { return std::move(env_->open_read(path("s"))).value(); };
  int calls = 0;
  auto m = format::map_shard_image(open(), path("s"), [&](const shard_header&) { ++calls; return status(); });
  ASSERT_TRUE(m.is_ok()) << message_of(m);
  EXPECT_EQ(calls, 1);
  ASSERT_TRUE(m->mapped != nullptr);
  EXPECT_EQ(m->image.data(), nullptr);
  ASSERT_EQ(m->bytes().size(), img.bytes.size());
  EXPECT_EQ(std::memcmp(m->bytes().data(), img.bytes.data(), img.bytes.size()), 0);

  auto refused = format::map_shard_image(open(), path("s"), [](const shard_header&) {
    return status(errc::invalid_argument, "wrong rank");
  });
  EXPECT_EQ(refused.error().message(), "wrong rank");

  std::vector<std::byte> damaged(img.bytes.begin(), img.bytes.end());
  damaged[img.header.regions[0].offset + 100] ^= std::byte{1};
  ASSERT_TRUE(test::write_file(path("s"), damaged.data(), damaged.size()).is_ok());
  auto bad = format::map_shard_image(open(), path("s"));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.error().code(), errc::corruption);
  EXPECT_NE(bad.error().message().find("region 'field'"), std::string::npos) << message_of(bad);

  const std::vector<std::byte> c = file_bytes(compress(img));
  ASSERT_TRUE(test::write_file(path("s"), c.data(), c.size()).is_ok());
  auto z = format::map_shard_image(open(), path("s"));
  ASSERT_TRUE(z.is_ok()) << message_of(z);
  EXPECT_EQ(z->mapped, nullptr);
  EXPECT_TRUE(same_image(*z, img));
  EXPECT_EQ(std::memcmp(z->bytes().data(), img.bytes.data(), img.bytes.size()), 0);
}

TEST_F(ShardCompressFiles, TruncatedFile) {
  const std::vector<std::byte> b = file_bytes(compress(sample_image()));
  auto r = read_back(b, b.size() - format::kAlign);
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("bytes, header says " + std::to_string(b.size()) + " (truncated"), std::string::npos)
      << message_of(r);
  r = read_back(b, 100);  // inside the header
  EXPECT_EQ(r.error().code(), errc::corruption) << message_of(r);
}

TEST_F(ShardCompressFiles, StoredBytesPastTheEndOfTheFile) {
  const format::compressed_shard c = compress(sample_image());
  std::vector<std::byte> b = file_bytes(c);
  poke<uint64_t>(b, stored_offset_at(b, 4, 0) + 8, c.header.stored_size);  // stored_length of "field"
  reseal(b);
  auto r = read_back(b);
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("region 'field': stored bytes"), std::string::npos) << message_of(r);
  EXPECT_NE(message_of(r).find("run past the end of the file"), std::string::npos) << message_of(r);

  b = file_bytes(c);
  poke<uint64_t>(b, stored_table_at(b, 4), c.header.stored_size + format::kAlign);  // stored_size itself
  reseal(b);
  r = read_back(b);
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("truncated or overwritten"), std::string::npos) << message_of(r);
}

TEST_F(ShardCompressFiles, DecompressedSizeNotTheLength) {
  const test::shard_image img = sample_image();
  const format::compressed_shard c = compress(img);
  std::vector<std::byte> b = file_bytes(c);
  // Region "field"'s frame replaced by a frame of 8 bytes less.
  const auto& r0 = c.header.regions[0];
  auto shorter = img;
  shorter.header.regions[0].count -= 1;
  shorter.header.regions[0].length -= 8;
  shorter.header.regions[0].checksum =
      util::xxh3(img.bytes.data() + r0.offset, shorter.header.regions[0].length);
  format::encode_header(shorter.header, shorter.bytes);
  const format::compressed_shard cs = compress(shorter);
  const auto& s0 = cs.header.regions[0];
  ASSERT_EQ(s0.compression, format::kCompressZstd);
  ASSERT_LE(s0.stored_length, c.header.regions[1].stored_offset - r0.stored_offset);
  std::memcpy(b.data() + r0.stored_offset, cs.bytes.data() + s0.stored_offset, s0.stored_length);
  poke<uint64_t>(b, stored_offset_at(b, 4, 0) + 8, s0.stored_length);
  reseal(b);
  auto r = read_back(b);
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("region 'field': decompressed size " + std::to_string(r0.length - 8) +
                               " is not the region's length " + std::to_string(r0.length)),
            std::string::npos)
      << message_of(r);
}

TEST_F(ShardCompressFiles, DamagedFrameTruncatedFrameTrailingBytes) {
  const format::compressed_shard c = compress(sample_image());
  const auto& r0 = c.header.regions[0];
  // A flipped byte in the middle of the frame: zstd or the checksum notices.
  std::vector<std::byte> b = file_bytes(c);
  b[r0.stored_offset + r0.stored_length / 2] ^= std::byte{0x5a};
  auto r = read_back(b);
  EXPECT_EQ(r.error().code(), errc::corruption) << message_of(r);
  EXPECT_NE(message_of(r).find("region 'field'"), std::string::npos) << message_of(r);

  // The frame cut short (the table says fewer bytes).
  b = file_bytes(c);
  poke<uint64_t>(b, stored_offset_at(b, 4, 0) + 8, r0.stored_length - 10);
  reseal(b);
  r = read_back(b);
  EXPECT_EQ(r.error().code(), errc::corruption) << message_of(r);
  EXPECT_NE(message_of(r).find("region 'field'"), std::string::npos) << message_of(r);

  // Bytes after the frame inside the stored length.
  b = file_bytes(c);
  ASSERT_LT(r0.stored_length + 8, format::align_up(r0.stored_length));
  poke<uint64_t>(b, stored_offset_at(b, 4, 0) + 8, r0.stored_length + 8);
  reseal(b);
  r = read_back(b);
  EXPECT_EQ(r.error().code(), errc::corruption) << message_of(r);
  EXPECT_NE(message_of(r).find("stored bytes after the end of its zstd frame"), std::string::npos) << message_of(r);
}

TEST_F(ShardCompressFiles, RebuiltHeaderMustMatch) {
  const format::compressed_shard c = compress(sample_image());
  std::vector<std::byte> b = file_bytes(c);
  poke<uint64_t>(b, stored_table_at(b, 4) + 8, c.header.header_checksum ^ 0x100);
  reseal(b);
  auto r = read_back(b);
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("the rebuilt image header has checksum"), std::string::npos) << message_of(r);
}

TEST_F(ShardCompressFiles, StoredTableChecks) {
  const format::compressed_shard c = compress(sample_image());
  // A stored offset that is not 4 KiB aligned.
  std::vector<std::byte> b = file_bytes(c);
  poke<uint64_t>(b, stored_offset_at(b, 4, 1), c.header.regions[1].stored_offset + 8);
  reseal(b);
  auto r = format::decode_header(b, "f");
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("region 'noise': stored offset"), std::string::npos) << message_of(r);
  // A stored region whose stored length is not its length.
  b = file_bytes(c);
  poke<uint64_t>(b, stored_offset_at(b, 4, 1) + 8, c.header.regions[1].length - 1);
  reseal(b);
  r = format::decode_header(b, "f");
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("does not fit its compression"), std::string::npos) << message_of(r);
  // An unknown compression.
  b = file_bytes(c);
  const size_t compression_at = format::kFixedHeaderBytes + 8 + 4 + 4 + 4;  // run "run1", name "heat"
  ASSERT_EQ(static_cast<uint8_t>(b[compression_at]), format::kCompressZstd);
  b[compression_at] = std::byte{7};
  reseal(b);
  r = format::decode_header(b, "f");
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("region 'field' has an invalid table entry"), std::string::npos) << message_of(r);
  // Compression in a format 2 file.
  b = file_bytes(c);
  poke<uint32_t>(b, kFormatVersionAt, 2);
  reseal(b);
  r = format::decode_header(b, "f");
  EXPECT_EQ(r.error().code(), errc::corruption) << message_of(r);
  // A newer format.
  b = file_bytes(c);
  poke<uint32_t>(b, kFormatVersionAt, format::kNewestShardFormatVersion + 1);
  r = format::decode_header(b, "f");
  EXPECT_EQ(r.error().code(), errc::not_supported) << message_of(r);
}

TEST(ShardCompress, EveryFlippedHeaderByteIsDetected) {
  const std::vector<std::byte> good = file_bytes(compress(sample_image()));
  const uint32_t hb = header_bytes(good);
  for (size_t i = 0; i < hb; ++i) {
    std::vector<std::byte> b = good;
    b[i] ^= std::byte{0x01};
    auto r = format::decode_header(b, "f");
    EXPECT_FALSE(r.is_ok()) << "flipping header byte " << i << " went unnoticed";
  }
}

// Formats 1 and 2 go through the same reader and come back as they are.
TEST_F(ShardCompressFiles, OlderFormatsReadTheSameWay) {
  auto v1 = format::read_shard_image(env_, CAIRN_TEST_DATA_DIR "/shard_v1.bin");
  ASSERT_TRUE(v1.is_ok()) << message_of(v1);
  EXPECT_EQ(v1->header.format_version, 1u);
  auto raw = env_->read_all(CAIRN_TEST_DATA_DIR "/shard_v1.bin");
  ASSERT_TRUE(raw.is_ok());
  ASSERT_EQ(raw->size(), v1->header.file_size);
  EXPECT_EQ(std::memcmp(raw->data(), v1->image.data(), raw->size()), 0);
  double v[4];
  std::memcpy(v, v1->image.data() + v1->header.regions[1].offset, sizeof v);
  EXPECT_EQ(v[3], 1e300);
  auto rd = format::shard_reader::open(env_, CAIRN_TEST_DATA_DIR "/shard_v1.bin");
  ASSERT_TRUE(rd.is_ok());
  std::vector<std::byte> region(v1->header.regions[1].length);
  EXPECT_TRUE((*rd)->read_region(1, region).is_ok());

  const test::shard_image img = sample_image();
  auto v2 = read_back(img.bytes);
  ASSERT_TRUE(v2.is_ok()) << message_of(v2);
  EXPECT_EQ(v2->header.format_version, 2u);
  EXPECT_TRUE(same_image(*v2, img));
  // Damaged data in a format 2 file: the checksum.
  std::vector<std::byte> bad = img.bytes;
  bad[img.header.regions[2].offset] ^= std::byte{1};
  auto r = read_back(bad);
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("checksum mismatch in region 'step'"), std::string::npos) << message_of(r);
}

// A store of runs "a" and "b", version 1, one rank, sample_image()'s regions;
// run b's "field" differs from a's at elements 1000, 2001 and 60000.
// `compress` names the runs whose shard is written compressed.
format::compressed_shard compress_shard_for_test(const test::shard_image& img) { return compress(img); }

void write_diff_store(const std::string& root, const std::string& compress) {
  for (const std::string run : {"a", "b"}) {
    test::shard_image img = sample_image();
    shard_header& h = img.header;
    h.run = run;
    h.rank = 0;
    h.nranks = 1;
    if (run == "b") {
      auto* field = reinterpret_cast<double*>(img.bytes.data() + h.regions[0].offset);
      for (size_t i : {1000, 2001, 60000}) field[i] += 0.5;
      h.regions[0].checksum = util::xxh3(img.bytes.data() + h.regions[0].offset, h.regions[0].length);
    }
    format::encode_header(h, img.bytes);
    const std::string path = format::shard_path(root, run, "heat", h.version, h.rank);
    if (compress.find(run) != std::string::npos) {
      const format::compressed_shard c = compress_shard_for_test(img);
      ASSERT_TRUE(test::write_file(path, c.bytes.data(), c.header.stored_size).is_ok());
    } else {
      ASSERT_TRUE(test::write_file(path, img.bytes.data(), img.bytes.size()).is_ok());
    }
    format::manifest m;
    m.run = run;
    m.name = "heat";
    m.version = h.version;
    m.nranks = h.nranks;
    for (uint32_t r = 0; r < h.nranks; ++r) {
      format::shard_entry e;
      e.rank = r;
      e.size = h.file_size;             // the image's: the same compressed or not
      e.header_checksum = h.header_checksum;
      m.shards.push_back(e);
    }
    ASSERT_TRUE(storage::storage_env::posix()
                    ->write_atomic(format::manifest_path(root, run, "heat", h.version), format::encode_manifest(m),
                                   false)
                    .is_ok());
  }
}

// cairn diff (analytics::diff_runs) gives the same answer whichever runs are
// compressed, reading compressed regions in pieces.
TEST_F(ShardCompressFiles, HistoryDiffReadsCompressedShards) {
  auto diff = [&](const std::string& compress) {
    test::temp_dir store;
    write_diff_store(store.path(), compress);
    analytics::diff_options o;
    o.store = store.path();
    o.run_a = "a";
    o.run_b = "b";
    o.read_bytes = 64 << 10;  // several pieces per region
    auto r = analytics::diff_runs(o);
    EXPECT_TRUE(r.is_ok()) << message_of(r);
    return std::move(r).value();
  };
  for (const std::string compress : {"", "b", "ab"}) {
    analytics::diff_result r = diff(compress);
    SCOPED_TRACE("compressed runs: '" + compress + "'");
    ASSERT_EQ(r.checkpoints.size(), 1u);
    ASSERT_EQ(r.checkpoints[0].versions.size(), 1u);
    const auto& v = r.checkpoints[0].versions[0];
    EXPECT_TRUE(v.problems.empty()) << v.problems.front();
    ASSERT_EQ(v.regions.size(), 4u);
    const auto& field = v.regions[0];
    EXPECT_EQ(field.region, "field");
    EXPECT_EQ(field.stats.mismatch, 3u);
    EXPECT_EQ(field.stats.exact, 256u * 256 - 3);
    ASSERT_TRUE(field.first.has_value());
    EXPECT_EQ(field.first->index, 1000u);
    for (size_t i = 1; i < v.regions.size(); ++i) {
      EXPECT_EQ(v.regions[i].stats.mismatch, 0u) << v.regions[i].region;
      EXPECT_EQ(v.regions[i].stats.exact, v.regions[i].stats.elements()) << v.regions[i].region;
    }
    EXPECT_EQ(r.outcome(), "diverged");
  }
}

}  // namespace
}  // namespace cairn
