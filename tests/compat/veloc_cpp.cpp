// A VELOC C++ application (in the spirit of VELOC's test/cpp_test.cpp),
// built with mpicxx and only -I/-l flags pointing at the drop-in: raw and
// serialized regions in two named groups and the default group, an observer,
// checkpoint_wait, and restarts in this process and in the next.
//   veloc_cpp CFG first    checkpoints, changes everything, restores it
//   veloc_cpp CFG again    a new process: restart_test and restart only
// Prints "ok <what>" per check and "C++ test passed" at the end; "FAIL <what>"
// and exit 1 otherwise.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "veloc.hpp"

namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// A map written as text (what a serialization library would do).
veloc::client_t::serializer_t save(const std::map<int, std::string>& m) {
  return [&m](std::ostream& out) {
    out << m.size() << '\n';
    for (const auto& [k, v] : m) out << k << ' ' << v.size() << ' ' << v << '\n';
  };
}
veloc::client_t::deserializer_t load(std::map<int, std::string>& m) {
  return [&m](std::istream& in) {
    size_t n = 0;
    if (!(in >> n)) return false;
    m.clear();
    for (size_t i = 0; i < n; ++i) {
      int k = 0;
      size_t len = 0;
      if (!(in >> k >> len)) return false;
      in.get();
      std::string v(len, '\0');
      if (!in.read(v.data(), static_cast<std::streamsize>(len))) return false;
      m[k] = v;
    }
    return true;
  };
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CFG first|again\n", argv[0]);
    return 2;
  }
  const bool first = std::strcmp(argv[2], "first") == 0;
  veloc::client_t* ckpt = veloc::get_client(MPI_COMM_WORLD, argv[1]);
  if (ckpt == nullptr) {
    std::printf("FAIL get_client\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  check(veloc::get_client(MPI_COMM_WORLD, argv[1]) == ckpt, "get_client returns the same client");
  std::vector<std::string> seen;
  ckpt->register_observer(VELOC_OBSERVE_CKPT_END,
                          [&seen](const std::string& name, int v) { seen.push_back(name + ":" + std::to_string(v)); });

  const int k0 = 7 + rank;
  const std::map<int, std::string> map0 = {{1, "one"}, {2, std::string(1000, 'x')}, {3 + rank, "rank"}};
  std::vector<double> field0(4096);
  for (size_t i = 0; i < field0.size(); ++i) field0[i] = 0.5 * static_cast<double>(i) + rank;

  int k = first ? k0 : 0;
  std::map<int, std::string> map = first ? map0 : std::map<int, std::string>{};
  std::vector<double> field = first ? field0 : std::vector<double>(field0.size(), 0.0);
  check(ckpt->mem_protect(0, &k, 1, sizeof k, "group_a"), "protect raw in group_a");
  check(ckpt->mem_protect(1, save(map), load(map), "group_a"), "protect serialized in group_a");
  check(ckpt->mem_protect(0, field.data(), field.size(), sizeof(double)), "protect raw in the default group");
  check(ckpt->mem_protect(5, save(map), load(map), "group_b"), "protect serialized in group_b");

  if (first) {
    check(ckpt->checkpoint("group_a", 0), "checkpoint group_a");
    check(ckpt->checkpoint("group_b", 3), "checkpoint group_b");
    check(ckpt->checkpoint("plain", 2), "checkpoint plain (the default group)");
    check(seen == std::vector<std::string>{"group_a:0", "group_b:3", "plain:2"}, "the observer saw every checkpoint");
    k = 0;
    map.clear();
    map[9] = "changed";
    std::fill(field.begin(), field.end(), -1.0);
    check(ckpt->checkpoint_wait(), "checkpoint_wait");
    check(ckpt->checkpoint_finished(), "checkpoint_finished after the wait");
  }
  check(ckpt->restart_test("group_a", 0) == 0, "restart_test group_a");
  check(ckpt->restart_test("plain", 0) == 2, "restart_test plain");
  check(ckpt->restart("group_a", 0), "restart group_a");
  check(k == k0 && map == map0, "group_a restored (raw and serialized)");
  map.clear();
  check(ckpt->restart_begin("group_b", 3) && ckpt->recover_size(5) > 0 && ckpt->recover_mem(VELOC_RECOVER_ALL, {}) &&
            ckpt->restart_end(true),
        "restart group_b in steps");
  check(map == map0, "group_b restored");
  check(ckpt->restart("plain", 2), "restart plain");
  check(field == field0, "the default group restored");
  check(ckpt->restart_test("group_a", 0, 1 - rank) == VELOC_FAILURE, "another rank's checkpoint is refused");

  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0 && all == 0) std::printf("C++ test passed\n");
  delete ckpt;  // waits and ends the library, before MPI_Finalize
  MPI_Finalize();
  return all == 0 ? 0 : 1;
}
