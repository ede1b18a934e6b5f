#include "format/tree.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "format/layout.hpp"
#include "util/clock.hpp"
#include "util/hash.hpp"

namespace cairn::format {
namespace {

constexpr int64_t kNanToken = INT64_MIN;
constexpr int64_t kPosInfToken = INT64_MIN + 1;
constexpr int64_t kNegInfToken = INT64_MIN + 2;
constexpr int64_t kRawToken = INT64_MIN + 3;  // value kept as raw bits in the side stream
constexpr double kMaxIndex = 4611686018427387904.0;  // 2^62

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

class reader {
 public:
  explicit reader(std::span<const std::byte> b) : b_(b) {}
  template <typename T>
  bool get(T* v) {
    if (sizeof(T) > b_.size() - pos_) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_bytes(size_t n, void* out) {
    if (n > b_.size() - pos_) return false;  // (no overflow: pos_ <= size)
    if (n > 0) std::memcpy(out, b_.data() + pos_, n);  // (out may be null when n is 0)
    pos_ += n;
    return true;
  }

 private:
  std::span<const std::byte> b_;
  size_t pos_ = 0;
};

template <typename F>
uint64_t tolerant_leaf_typed(const F* v, uint64_t n, double quantum) {
  std::vector<int64_t> idx(n);
  std::vector<F> side;
  for (uint64_t i = 0; i < n; ++i) {
    int64_t q = quantize(static_cast<double>(v[i]), quantum);
    if (q == kRawToken) side.push_back(v[i]);
    idx[i] = q;
  }
  uint64_t h = util::xxh3(idx.data(), idx.size() * sizeof(int64_t));
  if (!side.empty()) {
    uint64_t pair[2] = {h, util::xxh3(side.data(), side.size() * sizeof(F))};
    h = util::xxh3(pair, sizeof pair);
  }
  return h;
}

}  // namespace

const region_tree* tree_file::find(const std::string& region) const {
  for (auto& r : regions)
    if (r.name == region) return &r;
  return nullptr;
}

uint64_t elements_per_chunk(uint64_t chunk_bytes, uint8_t type) {
  uint64_t es = type_size(type);
  if (es == 0) es = 1;
  uint64_t n = chunk_bytes / es;
  return n == 0 ? 1 : n;
}

int64_t quantize(double v, double quantum) {
  if (std::isnan(v)) return kNanToken;
  if (std::isinf(v)) return v > 0 ? kPosInfToken : kNegInfToken;
  double x = std::floor(v / quantum);
  // Out of range (or quantum so small that the division overflows): keep the raw value.
  if (!(std::fabs(x) < kMaxIndex)) return kRawToken;
  return static_cast<int64_t>(x);
}

uint64_t exact_leaf(const std::byte* data, uint64_t n, uint8_t type) {
  return util::xxh3(data, n * type_size(type));
}

uint64_t tolerant_leaf(const std::byte* data, uint64_t n, uint8_t type, double quantum) {
  if (type == 9) return tolerant_leaf_typed(reinterpret_cast<const float*>(data), n, quantum);
  if (type == 10) return tolerant_leaf_typed(reinterpret_cast<const double*>(data), n, quantum);
  return exact_leaf(data, n, type);
}

uint64_t merkle_root(std::span<const uint64_t> leaves) {
  if (leaves.empty()) return util::xxh3(nullptr, 0);
  std::vector<uint64_t> level(leaves.begin(), leaves.end());
  while (level.size() > 1) {
    std::vector<uint64_t> up;
    up.reserve((level.size() + kTreeFanout - 1) / kTreeFanout);
    for (size_t i = 0; i < level.size(); i += kTreeFanout) {
      size_t n = std::min<size_t>(kTreeFanout, level.size() - i);
      up.push_back(util::xxh3(level.data() + i, n * sizeof(uint64_t)));
    }
    level = std::move(up);
  }
  return level[0];
}

namespace {
// A region's tree before its leaves: what it describes, and whether it has
// tolerant leaves.
region_tree empty_tree(const region_desc& r, double quantum) {
  region_tree rt;
  rt.name = r.name;
  rt.type = r.type;
  rt.count = r.count;
  rt.has_tolerant = quantum > 0 && type_is_float(r.type);
  return rt;
}
}  // namespace

tree_file build_tree(const shard_header& h, std::span<const std::byte> image, uint64_t chunk_bytes, double quantum) {
  std::vector<const std::byte*> regions;
  for (const auto& r : h.regions) regions.push_back(image.data() + r.offset);
  return build_tree(h, regions, chunk_bytes, quantum);
}

tree_file build_tree(const shard_header& h, std::span<const std::byte* const> regions, uint64_t chunk_bytes,
                     double quantum) {
  tree_file t;
  t.chunk_bytes = chunk_bytes;
  t.quantum = quantum;
  t.shard_header_checksum = h.header_checksum;
  for (size_t i = 0; i < h.regions.size(); ++i) {
    const auto& r = h.regions[i];
    region_tree rt = empty_tree(r, quantum);
    const uint64_t per = elements_per_chunk(chunk_bytes, r.type);
    const uint64_t es = type_size(r.type);
    for (uint64_t first = 0; first < r.count; first += per) {
      uint64_t n = std::min(per, r.count - first);
      const std::byte* p = regions[i] + first * es;
      rt.exact.push_back(exact_leaf(p, n, r.type));
      if (rt.has_tolerant) rt.tolerant.push_back(tolerant_leaf(p, n, r.type, quantum));
    }
    rt.exact_root = merkle_root(rt.exact);
    rt.tolerant_root = rt.has_tolerant ? merkle_root(rt.tolerant) : 0;
    t.regions.push_back(std::move(rt));
  }
  return t;
}

bool checksum_and_tree(shard_header* h, std::span<const std::byte* const> regions, uint64_t chunk_bytes,
                       double quantum, tree_file* tree, double* leaves_s, const ready_fn& ready) {
  double leaves = 0;
  if (tree) {
    tree->chunk_bytes = chunk_bytes;
    tree->quantum = quantum;
    tree->regions.clear();
  }
  util::xxh3_stream sum;       // the region's checksum
  util::xxh3_stream big_leaf;  // an exact leaf of a chunk larger than a block
  for (size_t i = 0; i < h->regions.size(); ++i) {
    auto& r = h->regions[i];
    const std::byte* data = regions[i];
    sum.reset();
    uint64_t covered = 0;  // bytes fed to the checksum so far
    auto wait = [&](uint64_t end) { return !ready || ready(i, end); };
    if (tree) {
      region_tree rt = empty_tree(r, quantum);
      const uint64_t per = elements_per_chunk(chunk_bytes, r.type);
      const uint64_t es = type_size(r.type);
      rt.exact.reserve((r.count + per - 1) / per);
      if (rt.has_tolerant) rt.tolerant.reserve(rt.exact.capacity());
      for (uint64_t first = 0; first < r.count; first += per) {
        const uint64_t n = std::min(per, r.count - first);
        const std::byte* p = data + first * es;
        const uint64_t bytes = n * es;
        // The checksum reads the chunk from memory first; the leaves then
        // hash it from cache, and only their time is the trees' cost.
        if (bytes <= kFusedBlock) {
          if (!wait(first * es + bytes)) return false;
          sum.update(p, bytes);
          const double t0 = util::now_s();
          rt.exact.push_back(exact_leaf(p, n, r.type));
          if (rt.has_tolerant) rt.tolerant.push_back(tolerant_leaf(p, n, r.type, quantum));
          leaves += util::now_s() - t0;
        } else {
          // A chunk larger than the cache block: both hashes stream over it
          // block by block (a streamed xxh3 equals the one-shot one).
          big_leaf.reset();
          for (uint64_t off = 0; off < bytes; off += kFusedBlock) {
            const uint64_t b = std::min(kFusedBlock, bytes - off);
            if (!wait(first * es + off + b)) return false;
            sum.update(p + off, b);
            const double t0 = util::now_s();
            big_leaf.update(p + off, b);
            leaves += util::now_s() - t0;
          }
          const double t0 = util::now_s();
          rt.exact.push_back(big_leaf.digest());
          if (rt.has_tolerant) rt.tolerant.push_back(tolerant_leaf(p, n, r.type, quantum));
          leaves += util::now_s() - t0;
        }
        covered += bytes;
      }
      const double t0 = util::now_s();
      rt.exact_root = merkle_root(rt.exact);
      rt.tolerant_root = rt.has_tolerant ? merkle_root(rt.tolerant) : 0;
      leaves += util::now_s() - t0;
      tree->regions.push_back(std::move(rt));
    }
    // Without a tree (or bytes past count * type_size, which a planned header
    // never has): the rest in blocks.
    for (uint64_t off = covered; off < r.length; off += kFusedBlock) {
      const uint64_t b = std::min(kFusedBlock, r.length - off);
      if (!wait(off + b)) return false;
      sum.update(data + off, b);
    }
    r.checksum = sum.digest();
  }
  if (leaves_s) *leaves_s = leaves;
  return true;
}

std::string encode_tree(const tree_file& t) {
  std::string out;
  out.append(kTreeMagic, 8);
  put<uint32_t>(out, kTreeFormatVersion);
  put<uint32_t>(out, static_cast<uint32_t>(t.regions.size()));
  put<uint64_t>(out, t.chunk_bytes);
  put<double>(out, t.quantum);
  put<uint64_t>(out, t.shard_header_checksum);
  for (auto& r : t.regions) {
    put<uint16_t>(out, static_cast<uint16_t>(r.name.size()));
    put<uint8_t>(out, r.type);
    put<uint8_t>(out, r.has_tolerant ? 1 : 0);
    put<uint32_t>(out, 0);
    put<uint64_t>(out, r.count);
    put<uint64_t>(out, r.exact.size());
    put<uint64_t>(out, r.exact_root);
    put<uint64_t>(out, r.tolerant_root);
    out.append(r.name);
    out.append(reinterpret_cast<const char*>(r.exact.data()), r.exact.size() * 8);
    out.append(reinterpret_cast<const char*>(r.tolerant.data()), r.tolerant.size() * 8);
  }
  put<uint64_t>(out, util::xxh3(out.data(), out.size()));
  return out;
}

result<tree_file> decode_tree(std::span<const std::byte> bytes, const std::string& where) {
  auto corrupt = [&](const std::string& what) {
    return status(errc::corruption, where + ": " + what + " (the tree is ignored; comparisons read the data)");
  };
  if (bytes.size() < 8 + 8 + 8 || std::memcmp(bytes.data(), kTreeMagic, 8) != 0) return corrupt("not a cairn tree file");
  uint64_t want = 0;
  std::memcpy(&want, bytes.data() + bytes.size() - 8, 8);
  if (util::xxh3(bytes.data(), bytes.size() - 8) != want) return corrupt("tree checksum mismatch");
  reader rd(bytes.subspan(8, bytes.size() - 16));
  uint32_t fmt = 0, nreg = 0;
  tree_file t;
  if (!rd.get(&fmt) || fmt != kTreeFormatVersion)
    return status(errc::not_supported, where + ": tree format version " + std::to_string(fmt) + " not readable");
  if (!rd.get(&nreg) || !rd.get(&t.chunk_bytes) || !rd.get(&t.quantum) || !rd.get(&t.shard_header_checksum) ||
      t.chunk_bytes == 0)
    return corrupt("truncated tree header");
  for (uint32_t i = 0; i < nreg; ++i) {
    region_tree r;
    uint16_t nl = 0;
    uint8_t tol = 0;
    uint32_t res = 0;
    uint64_t nchunks = 0;
    if (!rd.get(&nl) || !rd.get(&r.type) || !rd.get(&tol) || !rd.get(&res) || !rd.get(&r.count) ||
        !rd.get(&nchunks) || !rd.get(&r.exact_root) || !rd.get(&r.tolerant_root) || nchunks > bytes.size() / 8)
      return corrupt("truncated region entry");
    r.name.resize(nl);
    r.has_tolerant = tol != 0;
    r.exact.resize(nchunks);
    if (r.has_tolerant) r.tolerant.resize(nchunks);
    if (!rd.get_bytes(nl, r.name.data()) || !rd.get_bytes(nchunks * 8, r.exact.data()) ||
        !rd.get_bytes(r.tolerant.size() * 8, r.tolerant.data()))
      return corrupt("truncated leaves of region '" + r.name + "'");
    uint64_t per = elements_per_chunk(t.chunk_bytes, r.type);
    if (type_size(r.type) == 0 || nchunks != (r.count + per - 1) / per) return corrupt("inconsistent region '" + r.name + "'");
    t.regions.push_back(std::move(r));
  }
  return t;
}

result<tree_file> read_tree(storage::storage_env* env, const std::string& path) {
  CAIRN_ASSIGN_OR_RETURN(std::string data, env->read_all(path));
  return decode_tree(std::as_bytes(std::span<const char>(data.data(), data.size())), path);
}

std::string tree_file_name(uint32_t rank) {
  std::string s = shard_file_name(rank);
  return "tree" + s.substr(5);  // shard.000003 -> tree.000003
}

}  // namespace cairn::format
