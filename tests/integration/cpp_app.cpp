// cpp_app: the C++ API (cairn::client, include/cairn/cairn.hpp), single process.
//   cpp_app write   checkpoints versions 1..3 of "cpp" (waiting for the
//                   persistent level of each) and prints "cpp wrote 3"
//   cpp_app read    restarts: checks that restart_test finds 3, that a region
//                   protected with the wrong count gives invalid_argument and
//                   leaves every buffer untouched, then restores and compares
//                   every value with a fresh computation; prints
//                   "cpp restored 3 ok"
// Configuration comes from the environment (CAIRN_SCRATCH, CAIRN_PERSISTENT,
// CAIRN_RUN). Exit status 0 on success, 1 with a message on stderr otherwise.
#include <cairn/cairn.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace {

constexpr int kVersions = 3;
constexpr size_t kValues = 5000;

struct state {
  std::vector<double> values = std::vector<double>(kValues);
  std::vector<uint16_t> grid = std::vector<uint16_t>(6 * 7);
  int64_t step = 0;

  void advance() {
    ++step;
    for (size_t i = 0; i < values.size(); ++i) values[i] = values[i] * 0.5 + static_cast<double>(i) / (step + 1.0);
    for (size_t i = 0; i < grid.size(); ++i) grid[i] = static_cast<uint16_t>(grid[i] * 31 + i + step);
  }
  bool operator==(const state&) const = default;
};

int fail(const std::string& what, const cairn::status& st) {
  std::fprintf(stderr, "cpp_app: %s: %s\n", what.c_str(), st.to_string().c_str());
  return 1;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "cpp_app: %s\n", what.c_str());
  return 1;
}

cairn::status protect(cairn::client& c, state& s) {
  const uint64_t dims[2] = {6, 7};
  if (auto st = c.protect("values", std::span<double>(s.values)); !st) return st;
  if (auto st = c.protect("grid", s.grid.data(), CAIRN_UINT16, std::span<const uint64_t>(dims, 2), true); !st)
    return st;
  return c.protect("step", &s.step, 1, CAIRN_INT64);
}

int write() {
  auto c = cairn::client::create();
  if (!c) return fail("client::create", c.error());
  if (c->rank() != 0 || c->size() != 1) return fail("single-process client must be rank 0 of 1");
  state s;
  if (auto st = protect(*c, s); !st) return fail("protect", st);
  for (int v = 1; v <= kVersions; ++v) {
    s.advance();
    if (auto st = c->checkpoint("cpp", v); !st) return fail("checkpoint", st);
    if (auto st = c->wait("cpp", v, CAIRN_LEVEL_PERSISTENT); !st) return fail("wait", st);
    // Without agents configured a probe changes nothing and costs nothing.
    auto change = c->probe();
    if (!change) return fail("probe", change.error());
    if (*change != CAIRN_AGENTS_UNCHANGED) return fail("probe without agents reported a change");
    auto levels = c->test("cpp", v);
    if (!levels) return fail("test", levels.error());
    if (!(*levels & CAIRN_LEVEL_PERSISTENT) || !(*levels & CAIRN_LEVEL_LOCAL))
      return fail("test after wait(PERSISTENT) lacks the local or persistent bit: " + std::to_string(*levels));
  }
  // Versions must increase.
  if (auto st = c->checkpoint("cpp", kVersions); st.code() != cairn::errc::invalid_argument)
    return fail("checkpoint of a repeated version did not give invalid_argument", st);
  if (auto st = c->finalize(true); !st) return fail("finalize", st);
  std::printf("cpp wrote %d\n", kVersions);
  return 0;
}

int read() {
  auto c = cairn::client::create();
  if (!c) return fail("client::create", c.error());
  state s;
  if (auto st = protect(*c, s); !st) return fail("protect", st);
  auto v = c->restart_test("cpp");
  if (!v) return fail("restart_test", v.error());
  if (*v != kVersions) return fail("restart_test found version " + std::to_string(*v));

  // Wrong count: invalid_argument, nothing written.
  std::vector<double> longer(kValues + 1, -1.0);
  if (auto st = c->protect("values", std::span<double>(longer)); !st) return fail("protect", st);
  const state before = s;
  auto st = c->restart("cpp", *v);
  if (st.code() != cairn::errc::invalid_argument) return fail("restart with a wrong count", st);
  if (st.message().find("values") == std::string::npos)
    return fail("the wrong-count message does not name the region: " + st.message());
  if (!(s == before) || longer != std::vector<double>(kValues + 1, -1.0))
    return fail("a failed restart modified a buffer");

  if (auto st2 = protect(*c, s); !st2) return fail("protect", st2);
  if (auto st2 = c->restart("cpp", *v); !st2) return fail("restart", st2);
  state expect;
  for (int i = 0; i < kVersions; ++i) expect.advance();
  if (std::memcmp(s.values.data(), expect.values.data(), kValues * sizeof(double)) != 0 || s.grid != expect.grid ||
      s.step != expect.step)
    return fail("restored state differs from the state at version " + std::to_string(kVersions));
  if (auto st2 = c->finalize(true); !st2) return fail("finalize", st2);
  // A finalized client reports an error instead of crashing.
  if (auto st2 = c->checkpoint("cpp", 10); st2.is_ok()) return fail("checkpoint after finalize succeeded");
  std::printf("cpp restored %d ok\n", kVersions);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "write") return write();
  if (mode == "read") return read();
  std::fprintf(stderr, "usage: cpp_app write|read\n");
  return 2;
}
