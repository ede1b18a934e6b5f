// cairn_make_diff_store STORE SCRATCH: writes the store that diff_test.sh
// compares with `cairn diff`. Every run has checkpoint "sim", versions 1 and 2,
// 64 KiB trees with quantum 1e-6, and two regions:
//   field  float64, global layout 64x1000 (512000 bytes), blocks of rows;
//   step   int64, per rank (the version number).
// Runs:
//   ref    2 ranks (rows 0-31, 32-63)
//   same   2 ranks, identical data; its version 2 is also in SCRATCH (local level)
//   close  2 ranks, every 3rd element of field + 1e-12 (within --abs 1e-6, rarely crossing a 1e-6 quantum)
//   far    2 ranks, version 2: field[40][7] = 99 (a mismatch on rank 1)
//   wide   3 ranks (rows 0-20, 21-41, 42-63), identical field; step per rank
//          (so not comparable with ref's 2 ranks)
//   typed  2 ranks, field stored as float32 (a structural difference)
//   short  2 ranks, version 1 only, plus version 3 without a MANIFEST
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cairn.h"
#include "history_store.hpp"

namespace {

using cairn::test::history_version;
using cairn::test::region_data;

constexpr uint64_t kRows = 64, kCols = 1000;

double value(int64_t version, uint64_t i) { return std::sin(0.001 * static_cast<double>(i) + version) * 100.0; }

cairn::status write_run(const std::string& root, const std::string& run, int64_t version,
                        const std::vector<uint64_t>& row_starts, bool as_float32, bool manifest = true,
                        bool commit = true) {
  history_version hv;
  hv.run = run;
  hv.name = "sim";
  hv.version = version;
  hv.tree.quantum = 1e-6;
  hv.commit = commit;
  const size_t nranks = row_starts.size();
  for (size_t r = 0; r < nranks; ++r) {
    const uint64_t r0 = row_starts[r], r1 = r + 1 < nranks ? row_starts[r + 1] : kRows;
    region_data field;
    field.name = "field";
    field.type = as_float32 ? CAIRN_FLOAT32 : CAIRN_FLOAT64;
    field.dims = {r1 - r0, kCols};
    field.global = {kRows, kCols};
    field.start = {r0, 0};
    for (uint64_t i = r0 * kCols; i < r1 * kCols; ++i) {
      double v = value(version, i);
      if (run == "close" && i % 3 == 0) v += 1e-12;
      if (run == "far" && version == 2 && i == 40 * kCols + 7) v = 99;
      if (as_float32) {
        float f = static_cast<float>(v);
        const auto* p = reinterpret_cast<const std::byte*>(&f);
        field.bytes.insert(field.bytes.end(), p, p + sizeof f);
      } else {
        const auto* p = reinterpret_cast<const std::byte*>(&v);
        field.bytes.insert(field.bytes.end(), p, p + sizeof v);
      }
    }
    region_data step;
    step.name = "step";
    step.type = CAIRN_INT64;
    const int64_t s = version;
    step.bytes.resize(8);
    std::memcpy(step.bytes.data(), &s, 8);
    hv.ranks.push_back({field, step});
  }
  return cairn::test::write_history_version(root, hv, manifest);
}

cairn::status build(const std::string& store, const std::string& scratch) {
  const std::vector<uint64_t> two = {0, 32}, three = {0, 21, 42};
  for (int64_t v : {1, 2}) {
    CAIRN_RETURN_IF_ERROR(write_run(store, "ref", v, two, false));
    CAIRN_RETURN_IF_ERROR(write_run(store, "same", v, two, false));
    CAIRN_RETURN_IF_ERROR(write_run(store, "close", v, two, false));
    CAIRN_RETURN_IF_ERROR(write_run(store, "far", v, two, false));
    CAIRN_RETURN_IF_ERROR(write_run(store, "wide", v, three, false));
    CAIRN_RETURN_IF_ERROR(write_run(store, "typed", v, two, true));
  }
  CAIRN_RETURN_IF_ERROR(write_run(scratch, "same", 2, two, false, false));
  CAIRN_RETURN_IF_ERROR(write_run(store, "short", 1, two, false));
  CAIRN_RETURN_IF_ERROR(write_run(store, "short", 3, two, false, true, false));
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s STORE SCRATCH\n", argv[0]);
    return 2;
  }
  cairn::status st = build(argv[1], argv[2]);
  if (!st) {
    std::fprintf(stderr, "cairn_make_diff_store: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
