#include "format/shard.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <set>

#include "util/hash.hpp"
#include "util/names.hpp"

namespace cairn::format {
namespace {

template <typename T>
void put(std::byte*& p, T v) {
  std::memcpy(p, &v, sizeof v);  // little-endian hosts only (checked in plan_layout)
  p += sizeof v;
}

class reader {
 public:
  reader(std::span<const std::byte> b) : b_(b) {}
  template <typename T>
  bool get(T* v) {
    if (sizeof(T) > b_.size() - pos_) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_str(size_t n, std::string* s) {
    if (n > b_.size() - pos_) return false;  // (no overflow: pos_ <= size)
    s->assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::span<const std::byte> b_;
  size_t pos_ = 0;
};

constexpr size_t kRegionFixedBytes = 8 + 4 * 8;
// Format 3's stored table: stored_size and the image's header checksum, then
// stored_offset and stored_length per region.
constexpr size_t kStoredFixedBytes = 16;
constexpr size_t kStoredRegionBytes = 16;

}  // namespace

size_t header_base_bytes(const std::string& run, const std::string& name) {
  return kFixedHeaderBytes + 8 + run.size() + name.size();
}

size_t region_header_bytes(const region_desc& r) {
  return kRegionFixedBytes + 8 * (r.dims.size() + r.global.size() + r.start.size()) + r.name.size();
}

namespace {

// Bytes of the image's (format 2) header.
size_t header_bytes(const shard_header& h) {
  size_t n = header_base_bytes(h.run, h.name);
  for (auto& r : h.regions) n += region_header_bytes(r);
  return n;
}

size_t stored_table_bytes(size_t regions) { return kStoredFixedBytes + kStoredRegionBytes * regions; }

constexpr size_t kChecksumOffset = 56;

}  // namespace

size_t type_size(uint8_t type) {
  static const size_t sizes[] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 4, 8};
  return type < sizeof sizes / sizeof sizes[0] ? sizes[type] : 0;
}

const char* type_name(uint8_t type) {
  static const char* names[] = {"byte", "int8", "int16", "int32", "int64", "uint8",
                                "uint16", "uint32", "uint64", "float32", "float64"};
  return type < sizeof names / sizeof names[0] ? names[type] : "unknown";
}

bool type_is_float(uint8_t type) { return type == 9 || type == 10; }

status plan_layout(shard_header& h) {
  static_assert(std::endian::native == std::endian::little, "cairn's formats are little-endian");
  if (h.run.size() > kMaxNameBytes || h.name.size() > kMaxNameBytes)
    return {errc::invalid_argument, "run or checkpoint name longer than 255 bytes"};
  std::set<std::string> seen;
  for (auto& r : h.regions) {
    if (type_size(r.type) == 0) return {errc::invalid_argument, "region '" + r.name + "': unknown type " + std::to_string(r.type)};
    if (r.name.empty() || r.name.size() > kMaxNameBytes)
      return {errc::invalid_argument, "region name '" + r.name + "' must be 1 to 255 bytes"};
    if (r.dims.size() > static_cast<size_t>(kMaxDims))
      return {errc::invalid_argument, "region '" + r.name + "': more than 8 dimensions"};
    if (!seen.insert(r.name).second) return {errc::invalid_argument, "region '" + r.name + "' appears twice"};
    if ((r.flags & kHasLayout) != 0) {
      if (r.dims.empty() || r.global.size() != r.dims.size() || r.start.size() != r.dims.size())
        return {errc::invalid_argument, "region '" + r.name + "': a global layout needs shape, global shape and start of equal rank"};
      for (size_t i = 0; i < r.dims.size(); ++i)
        if (r.start[i] + r.dims[i] > r.global[i])
          return {errc::invalid_argument, "region '" + r.name + "': block exceeds the global shape in dimension " + std::to_string(i)};
    } else if (!r.global.empty() || !r.start.empty()) {
      return {errc::invalid_argument, "region '" + r.name + "': global shape without the layout flag"};
    }
  }
  uint64_t off = align_up(header_bytes(h));
  h.data_offset = off;
  for (auto& r : h.regions) {
    r.length = r.count * type_size(r.type);
    r.offset = off;
    r.compression = kCompressNone;
    r.stored_offset = r.offset;
    r.stored_length = r.length;
    off = align_up(off + r.length);
  }
  h.file_size = off;
  h.stored_size = off;
  h.format_version = kShardFormatVersion;
  return {};
}

namespace {

// Writes the fixed header, names and region table as format `fmt` (checksum
// field 0) and returns the position after the table. The image's header
// (format 2) always says compression 0.
std::byte* encode_table(const shard_header& h, uint32_t fmt, size_t hb, std::byte* p) {
  std::memcpy(p, kShardMagic, 8);
  p += 8;
  put<uint32_t>(p, fmt);
  put<uint32_t>(p, h.flags);
  put<uint32_t>(p, static_cast<uint32_t>(hb));
  put<uint32_t>(p, static_cast<uint32_t>(h.regions.size()));
  put<uint64_t>(p, h.data_offset);
  put<uint64_t>(p, h.file_size);
  put<int64_t>(p, h.version);
  put<uint32_t>(p, h.rank);
  put<uint32_t>(p, h.nranks);
  put<uint64_t>(p, 0);  // header checksum, filled by the caller
  put<uint16_t>(p, static_cast<uint16_t>(h.run.size()));
  put<uint16_t>(p, static_cast<uint16_t>(h.name.size()));
  put<uint32_t>(p, h.attempt);
  std::memcpy(p, h.run.data(), h.run.size());
  p += h.run.size();
  std::memcpy(p, h.name.data(), h.name.size());
  p += h.name.size();
  for (auto& r : h.regions) {
    put<uint16_t>(p, static_cast<uint16_t>(r.name.size()));
    put<uint8_t>(p, r.type);
    put<uint8_t>(p, r.flags);
    put<uint8_t>(p, fmt >= kCompressedShardFormatVersion ? r.compression : uint8_t{kCompressNone});
    put<uint8_t>(p, static_cast<uint8_t>(r.dims.size()));
    put<uint16_t>(p, 0);
    put<uint64_t>(p, r.count);
    put<uint64_t>(p, r.offset);
    put<uint64_t>(p, r.length);
    put<uint64_t>(p, r.checksum);
    for (uint64_t d : r.dims) put<uint64_t>(p, d);
    for (uint64_t d : r.global) put<uint64_t>(p, d);
    for (uint64_t d : r.start) put<uint64_t>(p, d);
    std::memcpy(p, r.name.data(), r.name.size());
    p += r.name.size();
  }
  return p;
}

uint64_t seal(std::byte* out, size_t hb) {
  uint64_t sum = util::xxh3(out, hb);
  std::memcpy(out + kChecksumOffset, &sum, 8);
  return sum;
}

}  // namespace

void encode_header(shard_header& h, std::span<std::byte> out) {
  size_t hb = header_bytes(h);
  std::memset(out.data(), 0, h.data_offset);
  encode_table(h, kShardFormatVersion, hb, out.data());
  h.header_checksum = seal(out.data(), hb);
  h.format_version = kShardFormatVersion;
  h.stored_checksum = h.header_checksum;
  h.stored_size = h.file_size;
  for (auto& r : h.regions) {
    r.compression = kCompressNone;
    r.stored_offset = r.offset;
    r.stored_length = r.length;
  }
}

size_t compressed_header_bytes(const shard_header& h) { return header_bytes(h) + stored_table_bytes(h.regions.size()); }

void encode_compressed_header(shard_header& h, std::span<std::byte> out) {
  const size_t hb = compressed_header_bytes(h);
  std::memset(out.data(), 0, hb);
  std::byte* p = encode_table(h, kCompressedShardFormatVersion, hb, out.data());
  put<uint64_t>(p, h.stored_size);
  put<uint64_t>(p, h.header_checksum);  // the image's: what MANIFESTs and trees record
  for (auto& r : h.regions) {
    put<uint64_t>(p, r.stored_offset);
    put<uint64_t>(p, r.stored_length);
  }
  h.format_version = kCompressedShardFormatVersion;
  h.stored_checksum = seal(out.data(), hb);
}

// Longer than 120 lines for a reason: the one decoder of the header, its
// checks in the order of the format's fields (docs/format/shard.md).
result<shard_header> decode_header(std::span<const std::byte> buf, const std::string& where, size_t* need) {
  auto corrupt = [&](const std::string& what) {
    return status(errc::corruption, where + ": " + what + " (the shard is damaged; restart uses another level or an older version)");
  };
  if (buf.size() < kFixedHeaderBytes) {
    if (need) *need = kFixedHeaderBytes;
    return status(errc::again, where + ": header needs more bytes");
  }
  if (std::memcmp(buf.data(), kShardMagic, 8) != 0) return corrupt("not a cairn shard (bad magic)");
  reader rd(buf.subspan(8));
  shard_header h;
  uint32_t fmt = 0, hb = 0, nreg = 0;
  rd.get(&fmt);
  if (fmt < 1 || fmt > kNewestShardFormatVersion) {
    return status(errc::not_supported, where + ": shard format version " + std::to_string(fmt) +
                                           " is not readable by this cairn (reads versions 1 to " +
                                           std::to_string(kNewestShardFormatVersion) + "; upgrade cairn)");
  }
  const bool compressed = fmt >= kCompressedShardFormatVersion;
  h.format_version = fmt;
  rd.get(&h.flags);
  rd.get(&hb);
  rd.get(&nreg);
  rd.get(&h.data_offset);
  rd.get(&h.file_size);
  rd.get(&h.version);
  rd.get(&h.rank);
  rd.get(&h.nranks);
  rd.get(&h.header_checksum);
  // A compressed file's header (format 3) is longer than the image's and may
  // reach past the image's data_offset: its own data start after it.
  if (hb < kFixedHeaderBytes || (!compressed && hb > h.data_offset) || h.data_offset > h.file_size ||
      hb > (64u << 20))
    return corrupt("inconsistent header sizes");
  if (buf.size() < hb) {
    if (need) *need = hb;
    return status(errc::again, where + ": header needs more bytes");
  }
  std::string copy(reinterpret_cast<const char*>(buf.data()), hb);
  std::memset(copy.data() + kChecksumOffset, 0, 8);
  if (util::xxh3(copy.data(), copy.size()) != h.header_checksum) return corrupt("header checksum mismatch");
  reader rest(buf.subspan(kFixedHeaderBytes, hb - kFixedHeaderBytes));
  uint16_t run_len = 0, name_len = 0;
  if (!rest.get(&run_len) || !rest.get(&name_len) || !rest.get(&h.attempt) || !rest.get_str(run_len, &h.run) ||
      !rest.get_str(name_len, &h.name))
    return corrupt("truncated header");
  // Names become paths (a file-mode region becomes a file): the rules of
  // util::check_name, whoever wrote the header (docs/design/security.md).
  for (auto [what, name] : {std::pair<const char*, const std::string*>{"run", &h.run}, {"checkpoint", &h.name}})
    if (status st = util::check_name(what, *name); !st) return corrupt(st.message());
  for (uint32_t i = 0; i < nreg; ++i) {
    region_desc r;
    uint16_t nl = 0, res16 = 0;
    uint8_t ndims = 0;
    if (!rest.get(&nl) || !rest.get(&r.type) || !rest.get(&r.flags) || !rest.get(&r.compression) ||
        !rest.get(&ndims) || !rest.get(&res16) || !rest.get(&r.count) || !rest.get(&r.offset) ||
        !rest.get(&r.length) || !rest.get(&r.checksum) || ndims > kMaxDims)
      return corrupt("truncated region table");
    r.dims.resize(ndims);
    for (auto& d : r.dims)
      if (!rest.get(&d)) return corrupt("truncated region table");
    if (fmt >= 2 && (r.flags & kHasLayout)) {
      r.global.resize(ndims);
      r.start.resize(ndims);
      for (auto& d : r.global)
        if (!rest.get(&d)) return corrupt("truncated region table");
      for (auto& d : r.start)
        if (!rest.get(&d)) return corrupt("truncated region table");
      for (size_t k = 0; k < ndims; ++k)
        if (r.start[k] > r.global[k] || r.dims[k] > r.global[k] - r.start[k] || ndims == 0)
          return corrupt("region #" + std::to_string(i) + " lies outside its global shape");
    } else if (fmt < 2 && (r.flags & kHasLayout)) {
      return corrupt("region '" + r.name + "' has a layout flag in a format 1 shard");
    }
    if (!rest.get_str(nl, &r.name)) return corrupt("truncated region table");
    if (status st = util::check_name("region", r.name); !st) return corrupt(st.message());
    const bool known_compression =
        r.compression == kCompressNone || (compressed && r.compression == kCompressZstd);
    const uint64_t ts = type_size(r.type);
    if (ts == 0 || r.count > UINT64_MAX / ts || r.length != r.count * ts || r.offset < h.data_offset ||
        r.offset > h.file_size || r.length > h.file_size - r.offset || !known_compression)
      return corrupt("region '" + util::escaped(r.name) + "' has an invalid table entry");
    // A shape must hold exactly `count` elements (restart on another rank
    // count reads blocks by their dims).
    if (!r.dims.empty()) {
      uint64_t product = 1;
      for (uint64_t d : r.dims) {
        if (d != 0 && product > UINT64_MAX / d) return corrupt("region '" + util::escaped(r.name) + "': dims overflow");
        product *= d;
      }
      if (product != r.count)
        return corrupt("region '" + util::escaped(r.name) + "': dims hold " + std::to_string(product) +
                       " elements, the count says " + std::to_string(r.count));
    }
    r.stored_offset = r.offset;
    r.stored_length = r.length;
    h.regions.push_back(std::move(r));
  }
  h.stored_size = h.file_size;
  h.stored_checksum = h.header_checksum;
  if (!compressed) return h;

  // Format 3: the stored table. The checksum at offset 56 is the file's own;
  // the header checksum of the shard (its identity) is the image's.
  uint64_t image_checksum = 0;
  if (!rest.get(&h.stored_size) || !rest.get(&image_checksum)) return corrupt("truncated stored table");
  h.stored_checksum = h.header_checksum;
  h.header_checksum = image_checksum;
  const uint64_t data_start = align_up(hb);
  if (h.stored_size % kAlign != 0 || data_start > h.stored_size)
    return corrupt("stored size " + std::to_string(h.stored_size) + " is not a multiple of 4096 past the header");
  // Where plan_layout puts it (the image's header, then its data): a reader
  // rebuilds that header in data_offset bytes before it allocates the image.
  if (h.data_offset != align_up(header_bytes(h)))
    return corrupt("the image's data offset " + std::to_string(h.data_offset) + " is not where its header ends");
  for (auto& r : h.regions) {
    if (!rest.get(&r.stored_offset) || !rest.get(&r.stored_length)) return corrupt("truncated stored table");
    if (r.stored_offset % kAlign != 0 || r.stored_offset < data_start)
      return corrupt("region '" + r.name + "': stored offset " + std::to_string(r.stored_offset) +
                     " is not a 4096-aligned offset after the header");
    if (r.stored_offset > h.stored_size || r.stored_length > h.stored_size - r.stored_offset)
      return corrupt("region '" + r.name + "': stored bytes [" + std::to_string(r.stored_offset) + ", " +
                     std::to_string(r.stored_offset + r.stored_length) + ") run past the end of the file (" +
                     std::to_string(h.stored_size) + " bytes)");
    if (r.compression == kCompressNone ? r.stored_length != r.length : (r.stored_length == 0 && r.length != 0))
      return corrupt("region '" + r.name + "': stored length " + std::to_string(r.stored_length) +
                     " does not fit its compression (length " + std::to_string(r.length) + ")");
  }
  if (rest.pos() != hb - kFixedHeaderBytes) return corrupt("header_bytes does not end at the stored table");
  return h;
}

result<shard_header> read_header(const storage::readable_file& f, const std::string& path, uint64_t* bytes_read) {
  const uint64_t size = f.size();
  // One page holds most headers; a longer one takes a second read.
  std::vector<std::byte> buf(std::min<uint64_t>(size, kAlign));
  CAIRN_RETURN_IF_ERROR(f.read_at(0, buf.data(), buf.size()));
  if (bytes_read) *bytes_read += buf.size();
  size_t need = 0;
  auto h = decode_header(buf, path, &need);
  if (!h && h.error().code() == errc::again) {
    if (need > size) return status(errc::corruption, path + ": truncated header");
    const size_t have = buf.size();
    buf.resize(need);
    CAIRN_RETURN_IF_ERROR(f.read_at(have, buf.data() + have, need - have));
    if (bytes_read) *bytes_read += need - have;
    h = decode_header(buf, path);
  }
  if (!h) return h;
  if (h->stored_size != size) {
    return status(errc::corruption, path + ": file is " + std::to_string(size) + " bytes, header says " +
                                        std::to_string(h->stored_size) + " (truncated or overwritten)");
  }
  return h;
}

result<shard_header> read_header(storage::storage_env* env, const std::string& path) {
  CAIRN_ASSIGN_OR_RETURN(auto f, env->open_read(path));
  return read_header(*f, path);
}

status verify_image(const shard_header& h, std::span<const std::byte> image, const std::string& where) {
  if (image.size() < h.file_size) return {errc::corruption, where + ": image shorter than the file size"};
  for (auto& r : h.regions) {
    if (util::xxh3(image.data() + r.offset, r.length) != r.checksum) {
      return {errc::corruption, where + ": checksum mismatch in region '" + r.name +
                                    "' (the shard is damaged; restart uses another level or an older version)"};
    }
  }
  return {};
}

}  // namespace cairn::format
