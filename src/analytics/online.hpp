// Online comparison (docs/design/history.md §5): a running job compares each of
// its versions with the same version of a reference run, in the background.
// The rules are those of compare.hpp; this is the mismatch-only question ("has
// this version diverged beyond the tolerance?"), so it stops at the first
// mismatching element. Trees skip chunks whose exact leaves are equal, or
// whose tolerant leaves are equal when the tolerance proves them (compare.hpp).
//
// Thread-safety: compare() may run on several threads at once (it keeps no state).
#ifndef CAIRN_ANALYTICS_ONLINE_HPP
#define CAIRN_ANALYTICS_ONLINE_HPP

#include <cstdint>
#include <span>
#include <string>

#include "analytics/compare.hpp"
#include "cairn/status.hpp"
#include "format/shard.hpp"
#include "format/tree.hpp"
#include "storage/storage_env.hpp"

namespace cairn::analytics {

struct online_divergence {
  int64_t version = -1;
  uint32_t rank = 0;
  std::string name;    // checkpoint
  std::string region;
  uint64_t index = 0;  // element index in the region (the block for layout regions)
  std::string value, reference;  // the first mismatching pair, as text
  std::string kind;    // "mismatch" or "structural"
};

enum class online_outcome { equal, diverged, pending };

struct online_reference {
  std::string store;    // the reference run's store (persistent level)
  std::string scratch;  // its local level, tried first ("" = none)
  std::string run;
  tolerance tol;
};

// Compares this rank's shard (header + complete image, and its tree if any)
// with the reference's same version and rank. pending: the reference has not
// committed that version yet (retry later). Errors: the reference is unreadable.
result<online_outcome> compare_with_reference(storage::storage_env* env, const online_reference& ref,
                                              const format::shard_header& mine, std::span<const std::byte> image,
                                              const format::tree_file* my_tree, online_divergence* out);

}  // namespace cairn::analytics

#endif
