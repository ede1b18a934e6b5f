// cairn_make_store STORE [SCRATCH]: writes the small store that cli_test.sh
// inspects, with the format module. Everything in it is deterministic (data,
// checksums, timestamps), so the CLI's output can be asserted exactly.
//
// STORE/runs/
//   alpha/heat       2 ranks, regions temperature (float64 4x8), step (int64)
//     v1 committed   2023-11-14T22:15:00Z
//     v2 incomplete  rank 0 only (debris of a crash: older than v3)
//     v3 committed   2023-11-14T22:18:20Z, plus a stray shard.000001.tmp
//     v4 incomplete  rank 0 and shard.000001.tmp (a job still writing it)
//   alpha/particles  1 rank, region pos (float32 100x3, column-major)
//     v10 committed  2023-11-14T22:30:00Z
//   beta/heat        1 rank, regions temperature (float64 8x8), step (int64)
//     v1, v2 committed
// SCRATCH (if given) holds the local level: alpha/heat v3 (both ranks) and v4
// (rank 0), beta/heat v2.
#include <cstdio>
#include <string>

#include "cairn.h"
#include "format/layout.hpp"
#include "test_store.hpp"

namespace {

using cairn::test::region_spec;
using cairn::test::version_spec;

constexpr double kT0 = 1700000000.0;  // 2023-11-14T22:13:20Z

cairn::status build(const std::string& store, const std::string& scratch) {
  const std::vector<region_spec> alpha_heat = {{"temperature", CAIRN_FLOAT64, 32, {4, 8}, false},
                                               {"step", CAIRN_INT64, 1, {}, false}};
  const std::vector<region_spec> particles = {{"pos", CAIRN_FLOAT32, 300, {100, 3}, true}};
  const std::vector<region_spec> beta_heat = {{"temperature", CAIRN_FLOAT64, 64, {8, 8}, false},
                                              {"step", CAIRN_INT64, 1, {}, false}};
  auto alpha = [&](const std::string& name, int64_t v, uint32_t nranks, const std::vector<region_spec>& r) {
    version_spec s;
    s.run = "alpha";
    s.name = name;
    s.version = v;
    s.nranks = nranks;
    s.regions = r;
    s.executable = "/opt/alpha/bin/alpha";
    s.mode = "thread";
    s.committed_at = kT0 + 100.0 * static_cast<double>(v);
    return s;
  };
  auto beta = [&](int64_t v) {
    version_spec s;
    s.run = "beta";
    s.name = "heat";
    s.version = v;
    s.nranks = 1;
    s.regions = beta_heat;
    s.executable = "/opt/beta/bin/beta";
    s.mode = "sync";
    s.committed_at = kT0 + 1000.0 + 100.0 * static_cast<double>(v);
    return s;
  };

  CAIRN_RETURN_IF_ERROR(cairn::test::write_version(store, alpha("heat", 1, 2, alpha_heat)));
  version_spec v2 = alpha("heat", 2, 2, alpha_heat);
  v2.ranks = {0};
  v2.commit = false;
  CAIRN_RETURN_IF_ERROR(cairn::test::write_version(store, v2));
  CAIRN_RETURN_IF_ERROR(cairn::test::write_version(store, alpha("heat", 3, 2, alpha_heat)));
  const std::string stray = cairn::format::shard_path(store, "alpha", "heat", 3, 1) + ".tmp";
  CAIRN_RETURN_IF_ERROR(cairn::test::write_file(stray, "partial", 7));
  version_spec v4 = alpha("heat", 4, 2, alpha_heat);
  v4.ranks = {0};
  v4.commit = false;
  CAIRN_RETURN_IF_ERROR(cairn::test::write_version(store, v4));
  const std::string writing = cairn::format::shard_path(store, "alpha", "heat", 4, 1) + ".tmp";
  CAIRN_RETURN_IF_ERROR(cairn::test::write_file(writing, "partial", 7));
  version_spec p = alpha("particles", 10, 1, particles);
  p.committed_at = kT0 + 1000.0;
  CAIRN_RETURN_IF_ERROR(cairn::test::write_version(store, p));
  CAIRN_RETURN_IF_ERROR(cairn::test::write_version(store, beta(1)));
  CAIRN_RETURN_IF_ERROR(cairn::test::write_version(store, beta(2)));

  if (!scratch.empty()) {
    version_spec l3 = alpha("heat", 3, 2, alpha_heat);
    l3.commit = false;
    CAIRN_RETURN_IF_ERROR(cairn::test::write_version(scratch, l3));
    version_spec l4 = v4;
    CAIRN_RETURN_IF_ERROR(cairn::test::write_version(scratch, l4));
    version_spec lb = beta(2);
    lb.commit = false;
    CAIRN_RETURN_IF_ERROR(cairn::test::write_version(scratch, lb));
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: cairn_make_store STORE [SCRATCH]\n");
    return 2;
  }
  cairn::status st = build(argv[1], argc == 3 ? argv[2] : "");
  if (!st) {
    std::fprintf(stderr, "cairn_make_store: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
