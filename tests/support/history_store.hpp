// Test support for history comparisons: writes shards whose region data the
// test chooses (with global layouts when asked), their hash trees and
// MANIFESTs, with the format module. Used by tests/unit/analytics_test.cpp and
// tests/integration/make_diff_store.cpp. Not part of libcairn.
#ifndef CAIRN_TESTS_SUPPORT_HISTORY_STORE_HPP
#define CAIRN_TESTS_SUPPORT_HISTORY_STORE_HPP

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cairn/status.hpp"
#include "format/manifest.hpp"

namespace cairn::test {

struct region_data {
  std::string name;
  uint8_t type = 0;
  std::vector<uint64_t> dims;    // block shape; empty = one-dimensional
  std::vector<uint64_t> global;  // with start: a global layout (kHasLayout)
  std::vector<uint64_t> start;
  bool column_major = false;
  std::vector<std::byte> bytes;  // the block's elements (count * element size)
};

struct tree_options {
  bool write = true;                    // write tree.<rank> beside the shard
  uint64_t chunk_bytes = 64 << 10;
  double quantum = 0;                   // tolerant leaves (0 = none)
};

// One version of one run: ranks[r] are rank r's regions.
struct history_version {
  std::string run;
  std::string name;
  int64_t version = 0;
  std::vector<std::vector<region_data>> ranks;
  tree_options tree;
  bool commit = true;  // write the MANIFEST
};

// Writes the shards (and trees, and MANIFEST) of v under root (the store or a
// scratch directory: with `manifest` false no MANIFEST is written there).
status write_history_version(const std::string& root, const history_version& v, bool manifest = true);

// Element count of a region from its bytes and type.
uint64_t element_count(const region_data& r);

}  // namespace cairn::test

#endif
