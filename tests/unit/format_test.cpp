// Unit tests of src/format: shard header encode/decode and every validation
// path, manifest round trip and checksum trailer, store layout names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cairn.h"
#include "format/commit.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"
#include "format/torch_state.hpp"
#include "format/tree.hpp"
#include "storage/storage_env.hpp"
#include "test_store.hpp"
#include "util/hash.hpp"

namespace cairn {
namespace {

using format::shard_header;
using test::region_spec;

const std::vector<region_spec> kRegions = {{"temperature", CAIRN_FLOAT64, 32, {4, 8}, false},
                                           {"step", CAIRN_INT64, 1, {}, false},
                                           {"pos", CAIRN_FLOAT32, 300, {100, 3}, true}};

// Offsets in the fixed header (docs/format/shard.md).
constexpr size_t kFormatVersionAt = 8;
constexpr size_t kHeaderBytesAt = 16;
constexpr size_t kRegionCountAt = 20;
constexpr size_t kFileSizeAt = 32;
constexpr size_t kChecksumAt = 56;

test::shard_image image() {
  auto img = test::make_shard_image("run1", "ckpt", 7, 1, 4, kRegions);
  EXPECT_TRUE(img.is_ok()) << img.error().to_string();
  return std::move(img).value();
}

uint32_t header_bytes(const std::vector<std::byte>& b) {
  uint32_t hb = 0;
  std::memcpy(&hb, b.data() + kHeaderBytesAt, 4);
  return hb;
}

// Recomputes the header checksum after a deliberate edit, so that decode gets
// past the checksum to the check under test.
void reseal(std::vector<std::byte>& b) {
  uint32_t hb = header_bytes(b);
  std::memset(b.data() + kChecksumAt, 0, 8);
  uint64_t sum = util::xxh3(b.data(), hb);
  std::memcpy(b.data() + kChecksumAt, &sum, 8);
}

template <typename T>
void poke(std::vector<std::byte>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}

// Offset of the first region's table entry.
size_t first_region_at(const shard_header& h) { return format::kFixedHeaderBytes + h.run.size() + h.name.size(); }

std::string message_of(const result<shard_header>& r) { return r ? std::string("ok") : r.error().message(); }

TEST(FormatTypes, SizesAndNames) {
  EXPECT_EQ(format::type_size(CAIRN_BYTE), 1u);
  EXPECT_EQ(format::type_size(CAIRN_INT16), 2u);
  EXPECT_EQ(format::type_size(CAIRN_FLOAT32), 4u);
  EXPECT_EQ(format::type_size(CAIRN_FLOAT64), 8u);
  EXPECT_EQ(format::type_size(CAIRN_UINT64), 8u);
  EXPECT_EQ(format::type_size(11), 0u);
  EXPECT_STREQ(format::type_name(CAIRN_FLOAT64), "float64");
  EXPECT_STREQ(format::type_name(CAIRN_UINT8), "uint8");
  EXPECT_STREQ(format::type_name(200), "unknown");
  EXPECT_TRUE(format::type_is_float(CAIRN_FLOAT32));
  EXPECT_FALSE(format::type_is_float(CAIRN_INT64));
}

TEST(FormatLayout, PlanAlignsEveryRegion) {
  test::shard_image img = image();
  const shard_header& h = img.header;
  EXPECT_EQ(h.data_offset, format::kAlign);
  ASSERT_EQ(h.regions.size(), 3u);
  EXPECT_EQ(h.regions[0].offset, 4096u);
  EXPECT_EQ(h.regions[0].length, 32u * 8);
  EXPECT_EQ(h.regions[1].offset, 8192u);
  EXPECT_EQ(h.regions[1].length, 8u);
  EXPECT_EQ(h.regions[2].offset, 12288u);
  EXPECT_EQ(h.regions[2].length, 1200u);
  EXPECT_EQ(h.file_size, 16384u);
  EXPECT_EQ(img.bytes.size(), h.file_size);
}


// header_base_bytes and region_header_bytes add up to the header plan_layout
// lays out (the client sizes staging made ahead from them), with names, shapes
// and global layouts of many sizes: 300 regions take the header past a page.
TEST(FormatLayout, HeaderPartsAddUpToThePlannedHeader) {
  shard_header h;
  h.run = "a-run";
  h.name = "ck";
  for (int i = 0; i < 300; ++i) {
    format::region_desc d;
    d.name = "region-" + std::string(static_cast<size_t>(i % 17), 'x') + std::to_string(i);
    d.type = CAIRN_FLOAT32;
    d.count = 10 + static_cast<uint64_t>(i);
    if (i % 3 == 1) d.dims = {d.count};
    if (i % 3 == 2) {
      d.flags = format::kHasLayout;
      d.dims = {1, d.count};
      d.global = {4, 1000};
      d.start = {1, 0};
    }
    h.regions.push_back(d);
  }
  size_t parts = format::header_base_bytes(h.run, h.name);
  uint64_t data = 0;
  for (const auto& r : h.regions) {
    parts += format::region_header_bytes(r);
    data += format::align_up(r.count * format::type_size(r.type));
  }
  ASSERT_TRUE(format::plan_layout(h));
  EXPECT_GT(h.data_offset, format::kAlign);
  EXPECT_EQ(format::align_up(parts), h.data_offset);
  EXPECT_EQ(format::align_up(parts) + data, h.file_size);
}
TEST(FormatLayout, PlanRejectsBadRegions) {
  auto plan = [](std::vector<format::region_desc> regions, std::string run = "r") {
    shard_header h;
    h.run = std::move(run);
    h.name = "n";
    h.regions = std::move(regions);
    return format::plan_layout(h);
  };
  format::region_desc ok;
  ok.name = "a";
  ok.type = CAIRN_INT32;
  ok.count = 3;
  EXPECT_TRUE(plan({ok}).is_ok());

  format::region_desc bad_type = ok;
  bad_type.type = 42;
  status st = plan({bad_type});
  EXPECT_EQ(st.code(), errc::invalid_argument);
  EXPECT_NE(st.message().find("unknown type 42"), std::string::npos) << st.message();

  st = plan({ok, ok});
  EXPECT_EQ(st.code(), errc::invalid_argument);
  EXPECT_NE(st.message().find("appears twice"), std::string::npos) << st.message();

  format::region_desc unnamed = ok;
  unnamed.name = "";
  EXPECT_EQ(plan({unnamed}).code(), errc::invalid_argument);

  format::region_desc long_name = ok;
  long_name.name = std::string(256, 'x');
  EXPECT_EQ(plan({long_name}).code(), errc::invalid_argument);

  format::region_desc many_dims = ok;
  many_dims.dims.assign(9, 1);
  EXPECT_EQ(plan({many_dims}).code(), errc::invalid_argument);

  EXPECT_EQ(plan({ok}, std::string(256, 'r')).code(), errc::invalid_argument);
}

TEST(FormatShard, HeaderRoundTrip) {
  test::shard_image img = image();
  auto h = format::decode_header(img.bytes, "mem");
  ASSERT_TRUE(h.is_ok()) << h.error().to_string();
  const shard_header& want = img.header;
  EXPECT_EQ(h->run, "run1");
  EXPECT_EQ(h->name, "ckpt");
  EXPECT_EQ(h->version, 7);
  EXPECT_EQ(h->rank, 1u);
  EXPECT_EQ(h->nranks, 4u);
  EXPECT_EQ(h->flags, want.flags);
  EXPECT_EQ(h->data_offset, want.data_offset);
  EXPECT_EQ(h->file_size, want.file_size);
  EXPECT_EQ(h->header_checksum, want.header_checksum);
  EXPECT_NE(h->header_checksum, 0u);
  ASSERT_EQ(h->regions.size(), want.regions.size());
  for (size_t i = 0; i < want.regions.size(); ++i) {
    const auto& a = h->regions[i];
    const auto& b = want.regions[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.type, b.type);
    EXPECT_EQ(a.flags, b.flags);
    EXPECT_EQ(a.compression, 0);
    EXPECT_EQ(a.dims, b.dims);
    EXPECT_EQ(a.count, b.count);
    EXPECT_EQ(a.offset, b.offset);
    EXPECT_EQ(a.length, b.length);
    EXPECT_EQ(a.checksum, b.checksum);
  }
  EXPECT_EQ(h->regions[2].flags, format::kColumnMajor);
  EXPECT_TRUE(format::verify_image(*h, img.bytes, "mem").is_ok());
}

TEST(FormatShard, ShortBufferAsksForMore) {
  test::shard_image img = image();
  size_t need = 0;
  auto r = format::decode_header(std::span(img.bytes).first(10), "mem", &need);
  EXPECT_EQ(r.error().code(), errc::again);
  EXPECT_EQ(need, format::kFixedHeaderBytes);

  const uint32_t hb = header_bytes(img.bytes);
  ASSERT_GT(hb, format::kFixedHeaderBytes);
  r = format::decode_header(std::span(img.bytes).first(format::kFixedHeaderBytes), "mem", &need);
  EXPECT_EQ(r.error().code(), errc::again);
  EXPECT_EQ(need, hb);

  r = format::decode_header(std::span(img.bytes).first(hb), "mem", &need);
  EXPECT_TRUE(r.is_ok()) << message_of(r);
}

TEST(FormatShard, BadMagic) {
  test::shard_image img = image();
  img.bytes[0] = std::byte{'X'};
  auto r = format::decode_header(img.bytes, "f.shard");
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("f.shard: not a cairn shard (bad magic)"), std::string::npos) << message_of(r);
}

TEST(FormatShard, NewerFormatVersionIsNotSupported) {
  test::shard_image img = image();
  poke<uint32_t>(img.bytes, kFormatVersionAt, format::kNewestShardFormatVersion + 1);
  auto r = format::decode_header(img.bytes, "f.shard");
  EXPECT_EQ(r.error().code(), errc::not_supported);
  EXPECT_NE(message_of(r).find("shard format version " + std::to_string(format::kNewestShardFormatVersion + 1)),
            std::string::npos)
      << message_of(r);
}

// A shard written by format version 1 (tests/data/shard_v1.bin, from cairn 0.1
// before global layouts) stays readable.
TEST(FormatShard, VersionOneFileStaysReadable) {
  auto env = storage::storage_env::posix();
  auto h = format::read_header(env, CAIRN_TEST_DATA_DIR "/shard_v1.bin");
  ASSERT_TRUE(h.is_ok()) << message_of(h);
  EXPECT_EQ(h->run, "legacy");
  EXPECT_EQ(h->name, "ck");
  EXPECT_EQ(h->version, 7);
  ASSERT_EQ(h->regions.size(), 2u);
  EXPECT_EQ(h->regions[1].dims, (std::vector<uint64_t>{2, 2}));
  EXPECT_TRUE(h->regions[1].flags & format::kColumnMajor);
  EXPECT_TRUE(h->regions[1].global.empty());
  auto data = env->read_all(CAIRN_TEST_DATA_DIR "/shard_v1.bin");
  ASSERT_TRUE(data.is_ok());
  EXPECT_TRUE(format::verify_image(*h, std::as_bytes(std::span<const char>(data->data(), data->size())), "v1"));
  double v[4];
  std::memcpy(v, data->data() + h->regions[1].offset, sizeof v);
  EXPECT_EQ(v[3], 1e300);
}

TEST(FormatShard, GlobalLayoutRoundTripsAndIsValidated) {
  format::shard_header h;
  h.run = "r";
  h.name = "n";
  format::region_desc d;
  d.name = "grid";
  d.type = CAIRN_FLOAT64;
  d.dims = {3, 4};
  d.count = 12;
  d.flags = format::kHasLayout;
  d.global = {10, 4};
  d.start = {6, 0};
  h.regions.push_back(d);
  ASSERT_TRUE(format::plan_layout(h).is_ok());
  std::vector<std::byte> img(h.file_size);
  format::encode_header(h, img);
  auto back = format::decode_header(img, "g");
  ASSERT_TRUE(back.is_ok()) << message_of(back);
  EXPECT_EQ(back->regions[0].global, (std::vector<uint64_t>{10, 4}));
  EXPECT_EQ(back->regions[0].start, (std::vector<uint64_t>{6, 0}));

  format::shard_header bad = h;
  bad.regions[0].start = {8, 0};  // 8 + 3 > 10
  EXPECT_EQ(format::plan_layout(bad).code(), errc::invalid_argument);
  bad = h;
  bad.regions[0].global = {10};
  EXPECT_EQ(format::plan_layout(bad).code(), errc::invalid_argument);
}

TEST(FormatShard, EveryFlippedHeaderByteIsDetected) {
  const test::shard_image img = image();
  const uint32_t hb = header_bytes(img.bytes);
  for (size_t i = 0; i < hb; ++i) {
    std::vector<std::byte> b = img.bytes;
    b[i] ^= std::byte{0x01};
    auto r = format::decode_header(b, "f.shard");
    EXPECT_FALSE(r.is_ok()) << "flipping header byte " << i << " went unnoticed";
  }
}

TEST(FormatShard, FlippedChecksumFieldIsAMismatch) {
  test::shard_image img = image();
  img.bytes[kChecksumAt + 3] ^= std::byte{0x80};
  auto r = format::decode_header(img.bytes, "f.shard");
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("header checksum mismatch"), std::string::npos) << message_of(r);
}

TEST(FormatShard, InconsistentSizes) {
  test::shard_image img = image();
  poke<uint32_t>(img.bytes, kHeaderBytesAt, 10);  // smaller than the fixed header
  auto r = format::decode_header(img.bytes, "f.shard");
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("inconsistent header sizes"), std::string::npos) << message_of(r);
}

TEST(FormatShard, TruncatedRegionTable) {
  test::shard_image img = image();
  // One region more than the table holds: the parser runs off the end.
  poke<uint32_t>(img.bytes, kRegionCountAt, static_cast<uint32_t>(kRegions.size() + 1));
  reseal(img.bytes);
  auto r = format::decode_header(img.bytes, "f.shard");
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("truncated region table"), std::string::npos) << message_of(r);
}

TEST(FormatShard, RegionOutsideTheFile) {
  test::shard_image img = image();
  // Region 0's offset field: after name length(2), type, flags, compression,
  // ndims (1 each), reserved(2) and count(8).
  const size_t offset_at = first_region_at(img.header) + 8 + 8;
  poke<uint64_t>(img.bytes, offset_at, img.header.file_size);
  reseal(img.bytes);
  auto r = format::decode_header(img.bytes, "f.shard");
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("region 'temperature' has an invalid table entry"), std::string::npos)
      << message_of(r);
}

// Headers whose checksums an attacker re-sealed: names that would leave the
// directory a restore writes into, and shapes that do not hold the count.
TEST(FormatShard, ForgedNamesAndShapesAreRefused) {
  auto with_name = [](const std::string& from, const std::string& to) {
    test::shard_image img = image();
    auto* p = reinterpret_cast<char*>(img.bytes.data());
    const std::string_view hdr(p, header_bytes(img.bytes));
    const size_t at = hdr.find(from);
    EXPECT_NE(at, std::string_view::npos);
    std::memcpy(p + at, to.data(), to.size());
    reseal(img.bytes);
    return format::decode_header(img.bytes, "f.shard");
  };
  auto r = with_name("temperature", "x/../../pwn");
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("region 'x/../../pwn' contains '/'"), std::string::npos) << message_of(r);
  r = with_name("temperature", std::string("temp\x01rature", 11));
  EXPECT_EQ(r.error().code(), errc::corruption) << message_of(r);
  r = with_name("run1", "r/..");
  EXPECT_EQ(r.error().code(), errc::corruption) << message_of(r);
  r = with_name("ckpt", "..\xff\xfe");
  EXPECT_EQ(r.error().code(), errc::corruption) << message_of(r);

  test::shard_image img = image();
  // temperature's dims (4 x 8 = 32 elements), found in the table, made 5 x 8: 40 != 32.
  const uint64_t dims[2] = {4, 8};
  const auto* p = reinterpret_cast<const char*>(img.bytes.data());
  const size_t dims_at = std::string_view(p, header_bytes(img.bytes)).find(std::string_view(
      reinterpret_cast<const char*>(dims), sizeof dims));
  ASSERT_NE(dims_at, std::string_view::npos);
  poke<uint64_t>(img.bytes, dims_at, 5);
  reseal(img.bytes);
  r = format::decode_header(img.bytes, "f.shard");
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("dims hold 40 elements, the count says 32"), std::string::npos) << message_of(r);
  // A count whose byte length overflows.
  img = image();
  poke<uint64_t>(img.bytes, dims_at - 32, uint64_t{1} << 61);  // its count: before offset, length, checksum
  reseal(img.bytes);
  EXPECT_EQ(format::decode_header(img.bytes, "f.shard").error().code(), errc::corruption);
}

TEST(FormatShard, FileSizeSmallerThanTheRegions) {
  test::shard_image img = image();
  poke<uint64_t>(img.bytes, kFileSizeAt, img.header.file_size - format::kAlign);
  reseal(img.bytes);
  auto r = format::decode_header(img.bytes, "f.shard");
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("region 'pos' has an invalid table entry"), std::string::npos) << message_of(r);
}

TEST(FormatShard, LengthNotMatchingTheCount) {
  test::shard_image img = image();
  const size_t length_at = first_region_at(img.header) + 8 + 8 + 8;
  poke<uint64_t>(img.bytes, length_at, img.header.regions[0].length - 8);
  reseal(img.bytes);
  auto r = format::decode_header(img.bytes, "f.shard");
  EXPECT_EQ(r.error().code(), errc::corruption);
  EXPECT_NE(message_of(r).find("invalid table entry"), std::string::npos) << message_of(r);
}

TEST(FormatShard, VerifyImageFindsDamagedData) {
  test::shard_image img = image();
  img.bytes[img.header.regions[1].offset] ^= std::byte{0x10};
  status st = format::verify_image(img.header, img.bytes, "f.shard");
  EXPECT_EQ(st.code(), errc::corruption);
  EXPECT_NE(st.message().find("checksum mismatch in region 'step'"), std::string::npos) << st.message();

  st = format::verify_image(img.header, std::span(img.bytes).first(100), "f.shard");
  EXPECT_EQ(st.code(), errc::corruption);
}

class FormatFiles : public ::testing::Test {
 protected:
  test::temp_dir dir_;
  storage::storage_env* env_ = storage::storage_env::posix();
  std::string path(const std::string& name) const { return storage::join(dir_.path(), name); }
};

TEST_F(FormatFiles, ReadHeaderOfAFile) {
  test::shard_image img = image();
  ASSERT_TRUE(test::write_file(path("s"), img.bytes.data(), img.bytes.size()).is_ok());
  auto h = format::read_header(env_, path("s"));
  ASSERT_TRUE(h.is_ok()) << h.error().to_string();
  EXPECT_EQ(h->header_checksum, img.header.header_checksum);
  EXPECT_EQ(h->regions.size(), 3u);
}

TEST_F(FormatFiles, ReadHeaderOfATruncatedFile) {
  test::shard_image img = image();
  ASSERT_TRUE(test::write_file(path("s"), img.bytes.data(), img.bytes.size() - 4096).is_ok());
  auto h = format::read_header(env_, path("s"));
  EXPECT_EQ(h.error().code(), errc::corruption);
  EXPECT_NE(message_of(h).find("file is 12288 bytes, header says 16384"), std::string::npos) << message_of(h);

  // Cut inside the header itself.
  ASSERT_TRUE(test::write_file(path("t"), img.bytes.data(), 70).is_ok());
  h = format::read_header(env_, path("t"));
  EXPECT_EQ(h.error().code(), errc::corruption) << message_of(h);
  EXPECT_NE(message_of(h).find(path("t")), std::string::npos) << message_of(h);
}

TEST_F(FormatFiles, ReadHeaderOfAMissingFile) {
  auto h = format::read_header(env_, path("nothing"));
  EXPECT_EQ(h.error().code(), errc::not_found);
}

format::manifest sample_manifest() {
  format::manifest m;
  m.run = "run1";
  m.name = "ckpt";
  m.version = 42;
  m.nranks = 2;
  m.committed_at = 1700000123.456789;
  m.executable = "/usr/bin/app";
  m.mode = "thread";
  for (uint32_t r = 0; r < 2; ++r) {
    format::shard_entry e;
    e.rank = r;
    e.size = 16384 + r;
    e.header_checksum = 0xfedcba9876543210ULL + r;
    e.captured_at = 1700000120.125;
    e.capture_s = 0.001 * (r + 1);
    e.checksum_s = 0.0005;
    e.local_s = 0.25;
    e.persistent_s = 1.5;
    e.persistent_at = 1700000122.75;
    e.host = "node" + std::to_string(r);
    m.shards.push_back(e);
  }
  return m;
}

// A manifest text with the given body and a correct trailer.
std::string sealed(const std::string& body) {
  return body + "xxh3 " + util::hex64(util::xxh3(body.data(), body.size())) + "\n";
}

std::string body_of(const std::string& text) { return text.substr(0, text.rfind("xxh3 ")); }

TEST(FormatManifest, RoundTrip) {
  const format::manifest m = sample_manifest();
  const std::string text = format::encode_manifest(m);
  auto d = format::decode_manifest(text, "MANIFEST");
  ASSERT_TRUE(d.is_ok()) << d.error().to_string();
  EXPECT_EQ(d->run, m.run);
  EXPECT_EQ(d->name, m.name);
  EXPECT_EQ(d->version, m.version);
  EXPECT_EQ(d->nranks, m.nranks);
  EXPECT_EQ(d->committed_at, m.committed_at);
  EXPECT_EQ(d->executable, m.executable);
  EXPECT_EQ(d->mode, m.mode);
  ASSERT_EQ(d->shards.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& a = d->shards[i];
    const auto& b = m.shards[i];
    EXPECT_EQ(a.rank, b.rank);
    EXPECT_EQ(a.size, b.size);
    EXPECT_EQ(a.header_checksum, b.header_checksum);
    EXPECT_EQ(a.captured_at, b.captured_at);
    EXPECT_EQ(a.capture_s, b.capture_s);
    EXPECT_EQ(a.checksum_s, b.checksum_s);
    EXPECT_EQ(a.local_s, b.local_s);
    EXPECT_EQ(a.persistent_s, b.persistent_s);
    EXPECT_EQ(a.persistent_at, b.persistent_at);
    EXPECT_EQ(a.host, b.host);
  }
  // Encoding is deterministic.
  EXPECT_EQ(format::encode_manifest(*d), text);
}

TEST(FormatManifest, RedundancyRoundTrip) {
  format::manifest m = sample_manifest();
  format::redundancy_info r;
  r.scheme = "xor";
  r.description = "xor(k=2, m=1)";
  r.k = 2;
  r.m = 1;
  r.sets = {{0, 1}};
  m.redundancy = r;
  const std::string text = format::encode_manifest(m);
  EXPECT_NE(text.find("\"scheme\": \"xor\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"protected_at\": null"), std::string::npos) << text;  // not known at commit
  auto d = format::decode_manifest(text, "MANIFEST");
  ASSERT_TRUE(d.is_ok()) << d.error().to_string();
  ASSERT_TRUE(d->redundancy.has_value());
  EXPECT_EQ(d->redundancy->scheme, "xor");
  EXPECT_EQ(d->redundancy->description, "xor(k=2, m=1)");
  EXPECT_EQ(d->redundancy->k, 2u);
  EXPECT_EQ(d->redundancy->m, 1u);
  EXPECT_EQ(d->redundancy->sets, (std::vector<std::vector<uint32_t>>{{0, 1}}));
  EXPECT_EQ(d->redundancy->protected_at, 0.0);
  EXPECT_EQ(format::encode_manifest(*d), text);

  m.redundancy->protected_at = 1700000122.5;
  d = format::decode_manifest(format::encode_manifest(m), "MANIFEST");
  ASSERT_TRUE(d.is_ok()) << d.error().to_string();
  EXPECT_EQ(d->redundancy->protected_at, 1700000122.5);

  // Unprotected: no field at all, as before it was recorded.
  EXPECT_EQ(format::encode_manifest(sample_manifest()).find("redundancy"), std::string::npos);
}

// A format 1 manifest as an earlier release wrote it (no redundancy, no
// hash_s or tree): still read, with no redundancy recorded.
TEST(FormatManifest, EarlierReleaseWithoutRedundancyIsRead) {
  const std::string body = R"({
 "committed_at": 1700000123.5,
 "executable": "app",
 "format": "cairn-manifest",
 "format_version": 1,
 "mode": "thread",
 "name": "ckpt",
 "nranks": 1,
 "run": "run1",
 "shards": [
  {
   "capture_s": 0.001,
   "captured_at": 1700000120.0,
   "checksum_s": 0.0005,
   "file": "shard.000000",
   "header_checksum": "00000000deadbeef",
   "host": "node0",
   "local_s": 0.25,
   "persistent_at": 1700000122.75,
   "persistent_s": 1.5,
   "rank": 0,
   "size": 16384
  }
 ],
 "version": 7
}
)";
  auto d = format::decode_manifest(sealed(body), "MANIFEST");
  ASSERT_TRUE(d.is_ok()) << d.error().to_string();
  EXPECT_EQ(d->version, 7);
  EXPECT_EQ(d->shards[0].header_checksum, 0xdeadbeefULL);
  EXPECT_FALSE(d->redundancy.has_value());
}

TEST(FormatManifest, FlippedBodyByteIsAChecksumMismatch) {
  std::string text = format::encode_manifest(sample_manifest());
  size_t at = text.find("node1");
  ASSERT_NE(at, std::string::npos);
  text[at] = 'N';
  auto d = format::decode_manifest(text, "MANIFEST");
  EXPECT_EQ(d.error().code(), errc::corruption);
  EXPECT_EQ(d.error().message(), "MANIFEST: manifest checksum mismatch");
}

TEST(FormatManifest, DamagedTrailer) {
  const std::string text = format::encode_manifest(sample_manifest());

  std::string wrong = text;
  char& digit = wrong[wrong.size() - 2];
  digit = digit == '0' ? '1' : '0';
  EXPECT_EQ(format::decode_manifest(wrong, "M").error().message(), "M: manifest checksum mismatch");

  std::string not_hex = text;
  not_hex[not_hex.size() - 2] = 'z';
  EXPECT_EQ(format::decode_manifest(not_hex, "M").error().message(), "M: bad checksum trailer");

  // Truncated: the trailer line is gone or cut.
  EXPECT_EQ(format::decode_manifest(body_of(text), "M").error().code(), errc::corruption);
  auto cut = format::decode_manifest(text.substr(0, text.size() - 5), "M");
  EXPECT_EQ(cut.error().code(), errc::corruption);
  EXPECT_NE(cut.error().message().find("missing checksum trailer"), std::string::npos) << cut.error().message();
  EXPECT_EQ(format::decode_manifest("", "M").error().code(), errc::corruption);
}

TEST(FormatManifest, ValidChecksumButBadContent) {
  const std::string body = body_of(format::encode_manifest(sample_manifest()));

  std::string more_ranks = body;
  more_ranks.replace(more_ranks.find("\"nranks\": 2"), 11, "\"nranks\": 3");
  auto d = format::decode_manifest(sealed(more_ranks), "M");
  EXPECT_EQ(d.error().code(), errc::corruption);
  EXPECT_EQ(d.error().message(), "M: manifest lists 2 shards for 3 ranks");

  std::string newer = body;
  newer.replace(newer.find("\"format_version\": 1"), 19, "\"format_version\": 9");
  EXPECT_EQ(format::decode_manifest(sealed(newer), "M").error().code(), errc::not_supported);

  EXPECT_EQ(format::decode_manifest(sealed("{not json\n"), "M").error().code(), errc::corruption);
  EXPECT_EQ(format::decode_manifest(sealed("{\"format\": \"other\"}\n"), "M").error().code(), errc::corruption);
}

TEST_F(FormatFiles, ReadManifest) {
  const std::string text = format::encode_manifest(sample_manifest());
  ASSERT_TRUE(test::write_file(path("MANIFEST"), text.data(), text.size()).is_ok());
  auto m = format::read_manifest(env_, path("MANIFEST"));
  ASSERT_TRUE(m.is_ok()) << m.error().to_string();
  EXPECT_EQ(m->version, 42);
  EXPECT_EQ(format::read_manifest(env_, path("none")).error().code(), errc::not_found);
}

TEST(FormatStoreLayout, Paths) {
  EXPECT_EQ(format::runs_dir("/s"), "/s/runs");
  EXPECT_EQ(format::checkpoint_dir("/s", "r", "n"), "/s/runs/r/n");
  EXPECT_EQ(format::version_dir("/s", "r", "n", 42), "/s/runs/r/n/v000000000042");
  EXPECT_EQ(format::shard_file_name(3), "shard.000003");
  EXPECT_EQ(format::shard_path("/s/", "r", "n", 1, 12), "/s/runs/r/n/v000000000001/shard.000012");
  EXPECT_EQ(format::manifest_path("/s", "r", "n", 1), "/s/runs/r/n/v000000000001/MANIFEST");

  int64_t v = -1;
  EXPECT_TRUE(format::parse_version_dir("v000000000042", &v));
  EXPECT_EQ(v, 42);
  EXPECT_FALSE(format::parse_version_dir("v", &v));
  EXPECT_FALSE(format::parse_version_dir("x000000000042", &v));
  EXPECT_FALSE(format::parse_version_dir("v00000000004a", &v));
  // The whole int64 range: a nanosecond timestamp has 19 digits.
  EXPECT_EQ(format::version_dir_name(1764180000123456789), "v1764180000123456789");
  EXPECT_TRUE(format::parse_version_dir("v1764180000123456789", &v));
  EXPECT_EQ(v, 1764180000123456789);
  EXPECT_TRUE(format::parse_version_dir("v9223372036854775807", &v));
  EXPECT_EQ(v, INT64_MAX);
  EXPECT_FALSE(format::parse_version_dir("v9223372036854775808", &v));  // overflows
  EXPECT_TRUE(format::parse_version_dir("v00000000000000000000042", &v));
  EXPECT_EQ(v, 42);
  uint32_t rank = 99;
  EXPECT_TRUE(format::parse_shard_name("shard.000007", &rank));
  EXPECT_EQ(rank, 7u);
  EXPECT_FALSE(format::parse_shard_name("shard.000007.tmp", &rank));
  EXPECT_FALSE(format::parse_shard_name("MANIFEST", &rank));
}

// The commit by the last writer (format/commit.hpp): whichever part
// completes the version writes the MANIFEST, in any order of arrival, with
// a tree of several levels (more parts than the fan-in); another attempt's
// parts never complete it.
TEST_F(FormatFiles, LastPartCommitsTheVersion) {
  auto* env = storage::storage_env::posix();
  const uint32_t n = format::kPartFanIn * 2 + 3;  // two levels above the records
  format::manifest tmpl;
  tmpl.run = "r";
  tmpl.name = "n";
  tmpl.version = 1764180000123456789;
  tmpl.nranks = n;
  tmpl.executable = "app";
  tmpl.mode = "thread";
  std::vector<uint32_t> order(n);
  for (uint32_t i = 0; i < n; ++i) order[i] = (i * 11 + 3) % n;  // a permutation (gcd(11, 35) = 1)
  const std::string mpath = format::manifest_path(dir_.path(), "r", "n", tmpl.version);
  ASSERT_TRUE(env->make_dirs(format::version_dir(dir_.path(), "r", "n", tmpl.version)));
  // A failed attempt's parts lie there too: they count for nothing.
  for (uint32_t r = 0; r + 1 < n; ++r) {
    format::part_record p;
    p.entry.rank = r;
    p.entry.size = 1;
    ASSERT_TRUE(format::record_part(env, dir_.path(), tmpl, 0xdead, p));
  }
  int commits = 0;
  for (uint32_t i = 0; i < n; ++i) {
    format::part_record p;
    p.entry.rank = order[i];
    p.entry.size = 4096 + order[i];
    p.entry.header_checksum = 1000 + order[i];
    p.entry.host = "node" + std::to_string(order[i] % 3);
    auto done = format::record_part(env, dir_.path(), tmpl, 0xbeef, p);
    ASSERT_TRUE(done) << done.error().to_string();
    EXPECT_EQ(*done, i + 1 == n) << "part " << i;
    commits += *done ? 1 : 0;
    EXPECT_EQ(env->exists(mpath), i + 1 == n) << "part " << i;
  }
  EXPECT_EQ(commits, 1);
  auto m = format::read_manifest(env, mpath);
  ASSERT_TRUE(m) << m.error().to_string();
  ASSERT_EQ(m->nranks, n);
  for (uint32_t r = 0; r < n; ++r) {
    EXPECT_EQ(m->shards[r].size, 4096u + r);
    EXPECT_EQ(m->shards[r].header_checksum, 1000u + r);
    EXPECT_EQ(m->shards[r].host, "node" + std::to_string(r % 3));
  }
  EXPECT_FALSE(env->exists(format::version_dir(dir_.path(), "r", "n", tmpl.version) + "/parts.0000beef"));
  EXPECT_EQ(format::list_versions(env, dir_.path(), "r", "n"), std::vector<int64_t>{tmpl.version});
}

TEST_F(FormatFiles, ListVersions) {
  test::version_spec spec;
  spec.run = "r";
  spec.name = "n";
  spec.regions = {{"a", CAIRN_INT32, 4, {}, false}};
  for (int64_t v : {12, 3, 7}) {
    spec.version = v;
    ASSERT_TRUE(test::write_version(dir_.path(), spec).is_ok());
  }
  ASSERT_TRUE(env_->make_dirs(format::checkpoint_dir(dir_.path(), "r", "n") + "/junk").is_ok());
  EXPECT_EQ(format::list_versions(env_, dir_.path(), "r", "n"), (std::vector<int64_t>{3, 7, 12}));
  EXPECT_TRUE(format::list_versions(env_, dir_.path(), "r", "missing").empty());
  EXPECT_EQ(format::list_subdirs(env_, format::runs_dir(dir_.path())), std::vector<std::string>{"r"});
}

// ---- checksums and hash trees in one pass (format::checksum_and_tree) --------

// Regions of every shape the fused pass must get right: empty, one element,
// around a chunk boundary, several chunks and blocks, with a partial last
// chunk; float regions hold real values mixed with NaN, infinities and values
// out of the quantum's range (raw tokens), so tolerant leaves take every path.
struct fused_case {
  std::vector<region_spec> specs;
  std::vector<std::vector<std::byte>> data;
};

fused_case fused_regions(uint64_t chunk_bytes, uint64_t seed) {
  fused_case c;
  auto elems = [&](uint8_t type, int64_t delta) {
    int64_t n = static_cast<int64_t>(format::elements_per_chunk(chunk_bytes, type)) + delta;
    return static_cast<uint64_t>(std::max<int64_t>(n, 0));
  };
  const uint64_t per64 = format::elements_per_chunk(chunk_bytes, CAIRN_FLOAT64);
  c.specs = {{"empty", CAIRN_FLOAT64, 0, {}, false},
             {"empty_bytes", CAIRN_BYTE, 0, {}, false},
             {"one", CAIRN_FLOAT32, 1, {}, false},
             {"chunk_minus_one", CAIRN_FLOAT64, elems(CAIRN_FLOAT64, -1), {}, false},
             {"chunk", CAIRN_INT32, elems(CAIRN_INT32, 0), {}, false},
             {"chunk_plus_one", CAIRN_FLOAT32, elems(CAIRN_FLOAT32, 1), {}, false},
             {"bytes", CAIRN_BYTE, 3 * chunk_bytes + 17, {}, false},
             {"grid", CAIRN_FLOAT64, 5 * per64 + 3, {}, false},
             {"big", CAIRN_UINT8, 5 * format::kFusedBlock + 1234, {}, false}};
  for (const auto& sp : c.specs) {
    const size_t es = format::type_size(sp.type);
    std::vector<std::byte> d(sp.count * es);
    for (size_t i = 0; i < d.size(); ++i) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
      d[i] = static_cast<std::byte>(seed >> 56);
    }
    // Most float values real (some equal across chunks), the rest random bits.
    for (size_t i = 0; sp.type == CAIRN_FLOAT64 && i < sp.count; i += 1 + i % 3) {
      double v = std::sin(static_cast<double>(i)) * 100;
      std::memcpy(d.data() + i * 8, &v, 8);
    }
    for (size_t i = 0; sp.type == CAIRN_FLOAT32 && i < sp.count; i += 1 + i % 3) {
      float v = static_cast<float>(std::cos(static_cast<double>(i)) * 10);
      std::memcpy(d.data() + i * 4, &v, 4);
    }
    c.data.push_back(std::move(d));
  }
  if (c.specs.size() > 3 && c.data[3].size() >= 24) {  // the special values, once each
    const double special[3] = {std::nan(""), INFINITY, 1e300};
    std::memcpy(c.data[3].data(), special, sizeof special);
  }
  return c;
}

TEST(FusedPass, SameChecksumsAndTreesAsSeparatePasses) {
  for (uint64_t chunk : {uint64_t{64} << 10, uint64_t{4096}, uint64_t{1000}, uint64_t{200} << 10}) {
    for (double quantum : {0.0, 1e-3, 0.5}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + ", quantum " + std::to_string(quantum));
      fused_case c = fused_regions(chunk, chunk * 31 + static_cast<uint64_t>(quantum * 1000));
      auto img = test::make_shard_image("run1", "ckpt", 3, 0, 1, c.specs);
      ASSERT_TRUE(img.is_ok()) << img.error().to_string();
      format::shard_header h = img->header;
      std::vector<const std::byte*> regions;
      for (auto& d : c.data) regions.push_back(d.data());

      // Separate passes: today's checksum, then build_tree over the encoded header.
      format::shard_header want = h;
      for (size_t i = 0; i < want.regions.size(); ++i)
        want.regions[i].checksum = util::xxh3(regions[i], want.regions[i].length);
      std::vector<std::byte> want_image(want.file_size);
      format::encode_header(want, want_image);
      const std::string want_tree = format::encode_tree(format::build_tree(want, regions, chunk, quantum));

      // One pass.
      format::shard_header got = h;
      for (auto& r : got.regions) r.checksum = 0;
      format::tree_file tree;
      double trees_s = -1;
      format::checksum_and_tree(&got, regions, chunk, quantum, &tree, &trees_s);
      std::vector<std::byte> got_image(got.file_size);
      format::encode_header(got, got_image);
      tree.shard_header_checksum = got.header_checksum;
      for (size_t i = 0; i < got.regions.size(); ++i)
        EXPECT_EQ(got.regions[i].checksum, want.regions[i].checksum) << got.regions[i].name;
      EXPECT_EQ(got.header_checksum, want.header_checksum);
      EXPECT_TRUE(got_image == want_image);
      EXPECT_EQ(format::encode_tree(tree), want_tree);
      EXPECT_GE(trees_s, 0);
      // Tolerant leaves were really computed where they apply.
      const format::region_tree* grid = tree.find("grid");
      ASSERT_NE(grid, nullptr);
      EXPECT_EQ(grid->has_tolerant, quantum > 0);
      EXPECT_EQ(grid->exact.size(), 6u);

      // hash_trees off: the same checksums, no tree.
      format::shard_header only = h;
      for (auto& r : only.regions) r.checksum = 0;
      format::checksum_and_tree(&only, regions, chunk, quantum, nullptr);
      for (size_t i = 0; i < only.regions.size(); ++i)
        EXPECT_EQ(only.regions[i].checksum, want.regions[i].checksum) << only.regions[i].name;
    }
  }
}

// The pass behind a capture: `ready` is asked, region by region and in
// order, for no more than the region's bytes before they are read; the
// result is the pass's without it. A `ready` that refuses stops the pass.
TEST(FusedPass, ReadyIsAskedInOrderBeforeEachReadAndCanStopThePass) {
  for (bool trees : {false, true}) {
    SCOPED_TRACE(trees ? "with trees" : "checksums only");
    const uint64_t chunk = 200u << 10;
    fused_case c = fused_regions(chunk, 91);
    auto img = test::make_shard_image("run1", "ckpt", 3, 0, 1, c.specs);
    ASSERT_TRUE(img.is_ok()) << img.error().to_string();
    std::vector<const std::byte*> regions;
    for (auto& d : c.data) regions.push_back(d.data());
    format::shard_header want = img->header;
    format::tree_file want_tree;
    ASSERT_TRUE(format::checksum_and_tree(&want, regions, chunk, 0.0, trees ? &want_tree : nullptr));

    format::shard_header got = img->header;
    format::tree_file tree;
    size_t last_region = 0;
    uint64_t last_end = 0, calls = 0;
    bool in_order = true;
    ASSERT_TRUE(format::checksum_and_tree(&got, regions, chunk, 0.0, trees ? &tree : nullptr, nullptr,
                                          [&](size_t i, uint64_t end) {
                                            in_order &= i > last_region || (i == last_region && end >= last_end);
                                            in_order &= end <= got.regions[i].length;
                                            last_region = i;
                                            last_end = end;
                                            ++calls;
                                            return true;
                                          }));
    EXPECT_TRUE(in_order);
    EXPECT_GT(calls, got.regions.size());
    for (size_t i = 0; i < got.regions.size(); ++i)
      EXPECT_EQ(got.regions[i].checksum, want.regions[i].checksum) << got.regions[i].name;
    if (trees) {
      EXPECT_EQ(format::encode_tree(tree), format::encode_tree(want_tree));
    }

    // Refused in region 3: the pass stops there, with the regions before it done.
    format::shard_header stopped = img->header;
    for (auto& r : stopped.regions) r.checksum = 0;
    uint64_t asked_after = 0;
    EXPECT_FALSE(format::checksum_and_tree(&stopped, regions, chunk, 0.0, nullptr, nullptr,
                                           [&](size_t i, uint64_t) {
                                             if (i > 3) ++asked_after;
                                             return i < 3;
                                           }));
    EXPECT_EQ(asked_after, 0u);
    EXPECT_EQ(stopped.regions[2].checksum, want.regions[2].checksum);
    EXPECT_EQ(stopped.regions[3].checksum, 0u);
  }
}

// The keys of a cairn.pytorch state's tensors (docs/format/torch_state.md),
// as Python's json writes it (NaN and Infinity included), and what is not
// such a state: a clear error, never a crash.
TEST(FormatTorchState, KeysOfTensorRegions) {
  const std::string doc =
      R"({"format":"cairn-torch-state","format_version":1,"state":{"dict":[)"
      R"(["model",{"dict":[["fc1.weight",{"tensor":0,"dtype":"float32","shape":[4,3],"requires_grad":true}],)"
      R"(["empty",{"tensor":1,"dtype":"float32","shape":[0,4]}]],"ordered":true,"metadata":{"dict":[]}}],)"
      R"(["optimizer",{"dict":[["state",{"dict":[[0,{"dict":[["exp_avg",{"tensor":2,"dtype":"bfloat16","shape":[]}]]}]]}]]}],)"
      R"(["extra",{"dict":[["loss",NaN],["best",-Infinity],["s","NaN \" Infinity"],)"
      R"(["rng",{"tuple":["MT19937",{"tensor":3,"ndarray":true,"dtype":"<u4","shape":[624]},1,0,0.0]}],)"
      R"(["x",{"np_scalar":"<f8","value":0.5}]]}]]}})";
  auto keys = format::torch_state_keys(doc, "t");
  ASSERT_TRUE(keys) << keys.error().message();
  std::map<std::string, std::string> want = {
      {"t000000", "model.fc1.weight"}, {"t000002", "optimizer.state.0.exp_avg"}, {"t000003", "extra.rng.1"}};
  EXPECT_EQ(*keys, want);
}

TEST(FormatTorchState, WhatIsNotAStateIsRefusedSayingWhy) {
  auto code = [](const std::string& doc) {
    auto k = format::torch_state_keys(doc, "t");
    return k ? errc::ok : k.error().code();
  };
  const std::string head = R"({"format":"cairn-torch-state","format_version":1,"state":)";
  EXPECT_EQ(code("not json"), errc::corruption);
  EXPECT_EQ(code(R"({"format":"other","format_version":1,"state":null})"), errc::not_supported);
  EXPECT_EQ(code(R"({"format":"cairn-torch-state","format_version":2,"state":null})"), errc::not_supported);
  EXPECT_EQ(code(R"({"format":"cairn-torch-state","format_version":"1","state":null})"), errc::corruption);
  EXPECT_EQ(code(head + R"({"tensor":-1,"shape":[1]}})"), errc::corruption);
  EXPECT_EQ(code(head + R"({"tensor":0,"shape":[1.5]}})"), errc::corruption);
  EXPECT_EQ(code(head + R"({"list":[{"tensor":0,"shape":[1]},{"tensor":0,"shape":[2]}]}})"), errc::corruption);
  EXPECT_EQ(code(head + R"({"dict":[[true,1]]}})"), errc::corruption);
  EXPECT_EQ(code(head + R"({"dict":{"a":1}}})"), errc::corruption);
  EXPECT_EQ(code(head + R"({"unknown":1}})"), errc::corruption);
  std::string deep = head;
  for (int i = 0; i < 2000; ++i) deep += R"({"list":[)";
  deep += "1";
  for (int i = 0; i < 2000; ++i) deep += "]}";
  deep += "}";
  EXPECT_EQ(code(deep), errc::corruption);
  EXPECT_EQ(code(head + "null}"), errc::ok);
}

}  // namespace
}  // namespace cairn
