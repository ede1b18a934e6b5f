// compress_bench: what zstd compression of shards (format 3, what cairn-agent
// writes with --compress) gains and costs, against memcpy measured in the
// same run.
//
// Each data set is one shard image of --size bytes (default 64 MiB) holding
// one float64 region (a 2D field, rows of 4096) or random bytes:
//   heat2d-front  a plate heated from its top edge as heat2d computes it after
//                 a few hundred Jacobi steps: a smooth profile over the first
//                 quarter of the rows, exact zeros below (the heat has not
//                 arrived yet)
//   smooth+noise  a smooth field (three modes) over the whole plate, with
//                 relative noise of 1e-6 (the low mantissa bits are random, as
//                 in most late-run floating-point state)
//   random        random bytes (incompressible: stored as is)
// For every level (and thread count), the median of --reps runs of:
//   compress     format::compress_shard of the image (zstd of each region)
//   decompress   shard_reader::read of every region into a ready buffer
//   restart      format::decode_shard_image: allocation, decompression, header
//                rebuild and checksum verification (what restart does after
//                reading the file)
//   memcpy       of the image into a ready buffer: the reference
// GB/s are 10^9 bytes of the uncompressed image per second; ratio = image
// bytes / file bytes; "x memcpy" = the rate over memcpy's rate.
//
// usage: compress_bench [--size BYTES] [--levels 1,3] [--threads 0] [--reps 5]
//                       [--data heat2d-front,smooth+noise,random]
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cairn.h"
#include "format/shard.hpp"
#include "format/shard_io.hpp"
#include "util/aligned_buffer.hpp"
#include "util/hash.hpp"

namespace {

using namespace cairn;
using clock_type = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "compress_bench: %s\n", what.c_str());
  std::exit(1);
}

uint64_t parse_bytes(std::string s) {
  uint64_t mult = 1;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) mult = 1ull << 10;
  if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) mult = 1ull << 20;
  if (!s.empty() && (s.back() == 'G' || s.back() == 'g')) mult = 1ull << 30;
  if (mult != 1) s.pop_back();
  return std::stoull(s) * mult;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

double seconds(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct image {
  format::shard_header header;
  util::aligned_buffer bytes;
  std::span<const std::byte> span() const { return {bytes.data(), header.file_size}; }
};

// One region of `size` bytes (minus the header page) filled by `kind`.
image make_image(const std::string& kind, uint64_t size) {
  image img;
  format::shard_header& h = img.header;
  h.run = "bench";
  h.name = kind;
  format::region_desc r;
  r.name = "field";
  const uint64_t payload = size - format::kAlign;
  if (kind == "random") {
    r.type = CAIRN_BYTE;
    r.count = payload;
  } else {
    r.type = CAIRN_FLOAT64;
    r.count = payload / 8;
    r.dims = {r.count / 4096, 4096};
    r.count = r.dims[0] * r.dims[1];
  }
  h.regions.push_back(r);
  if (status st = format::plan_layout(h); !st) die(st.to_string());
  auto buf = util::aligned_buffer::allocate(h.file_size);
  if (!buf) die(buf.error().to_string());
  img.bytes = std::move(buf).value();
  std::byte* data = img.bytes.data() + h.regions[0].offset;
  std::mt19937_64 rng(42);
  if (kind == "random") {
    for (uint64_t i = 0; i + 8 <= payload; i += 8) {
      const uint64_t x = rng();
      std::memcpy(data + i, &x, 8);
    }
  } else {
    auto* f = reinterpret_cast<double*>(data);
    const uint64_t rows = h.regions[0].dims[0], cols = 4096;
    const double pi = 3.14159265358979323846;
    std::normal_distribution<double> noise(0.0, 1.0);
    for (uint64_t i = 0; i < rows; ++i) {
      for (uint64_t j = 0; j < cols; ++j) {
        const double x = static_cast<double>(j) / (cols - 1), y = static_cast<double>(i) / (rows - 1);
        double v;
        if (kind == "heat2d-front") {
          // Diffusion from the hot top edge; Jacobi moves the front one row
          // per step, so past it the values are exactly 0.
          v = i < rows / 4 ? std::erfc(y * 8.0) * std::sin(pi * x) : 0.0;
        } else if (kind == "smooth+noise") {
          v = std::sin(pi * x) * std::exp(-3.0 * y) + 0.3 * std::sin(5 * pi * x) * std::sin(3 * pi * y) +
              0.05 * std::cos(11 * pi * (x + y));
          v *= 1.0 + 1e-6 * noise(rng);
        } else {
          die("unknown data set '" + kind + "' (heat2d-front, smooth+noise, random)");
        }
        f[i * cols + j] = v;
      }
    }
  }
  h.regions[0].checksum = util::xxh3(data, h.regions[0].length);
  format::encode_header(h, img.bytes.span());
  return img;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t size = 64ull << 20;
  std::vector<int> levels = {1, 3};
  std::vector<int> threads = {0};
  std::vector<std::string> sets = {"heat2d-front", "smooth+noise", "random"};
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--size") size = parse_bytes(next());
    else if (a == "--levels") { levels.clear(); for (auto& s : split(next())) levels.push_back(std::stoi(s)); }
    else if (a == "--threads") { threads.clear(); for (auto& s : split(next())) threads.push_back(std::stoi(s)); }
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--data") sets = split(next());
    else die("unknown argument " + a + " (see the comment at the top of bench/compress_bench.cpp)");
  }
  if (size < 2 * format::kAlign || reps < 1) die("--size must be at least 8K and --reps at least 1");

  std::printf("compress_bench: %.0f MiB images, %d reps (medians), zstd %s\n", size / 1048576.0, reps,
              ZSTD_versionString());
  std::printf("%-13s %5s %7s %7s %9s %9s %9s %9s %9s %9s\n", "data", "level", "threads", "ratio", "memcpy",
              "compress", "x memcpy", "decomp", "x memcpy", "restart");
  std::printf("%-13s %5s %7s %7s %9s %9s %9s %9s %9s %9s\n", "", "", "", "", "GB/s", "GB/s", "", "GB/s", "", "GB/s");
  for (const std::string& kind : sets) {
    image img = make_image(kind, size);
    const uint64_t n = img.header.file_size;
    auto dst = util::aligned_buffer::allocate(n);
    if (!dst) die(dst.error().to_string());
    for (int level : levels) {
      for (int t : threads) {
        std::vector<double> t_copy, t_comp, t_decomp, t_restart;
        double ratio = 0;
        for (int rep = 0; rep < reps; ++rep) {
          auto t0 = clock_type::now();
          std::memcpy(dst->data(), img.bytes.data(), n);
          t_copy.push_back(seconds(t0));

          t0 = clock_type::now();
          auto c = format::compress_shard(img.header, img.span(), {level, t});
          t_comp.push_back(seconds(t0));
          if (!c) die(c.error().to_string());
          ratio = static_cast<double>(n) / static_cast<double>(c->header.stored_size);

          auto rd = format::shard_reader::open(c->file(), "bench");
          if (!rd) die(rd.error().to_string());
          t0 = clock_type::now();
          for (const auto& r : img.header.regions) {
            if (status st = (*rd)->read(r.offset, dst->data() + r.offset, r.length); !st) die(st.to_string());
          }
          t_decomp.push_back(seconds(t0));
          if (std::memcmp(dst->data() + img.header.regions[0].offset, img.bytes.data() + img.header.regions[0].offset,
                          img.header.regions[0].length) != 0)
            die("decompressed data differ");

          t0 = clock_type::now();
          auto back = format::decode_shard_image(c->file(), "bench");
          t_restart.push_back(seconds(t0));
          if (!back) die(back.error().to_string());
        }
        const double gb = static_cast<double>(n) / 1e9;
        const double copy = gb / median(t_copy), comp = gb / median(t_comp), dec = gb / median(t_decomp),
                     rest = gb / median(t_restart);
        std::printf("%-13s %5d %7d %7.2f %9.2f %9.3f %9.3f %9.3f %9.3f %9.3f\n", kind.c_str(), level, t, ratio, copy,
                    comp, comp / copy, dec, dec / copy, rest);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
