// Committing a version whose shards were written by several independent
// writers (the checkpoint agents of one application, or a rank that wrote its
// own shard because its agent was gone): whoever writes the last shard of a
// version commits it. See docs/design/agents.md ("Commit by the last writer").
#ifndef CAIRN_FORMAT_COMMIT_HPP
#define CAIRN_FORMAT_COMMIT_HPP

#include <cstdint>
#include <string>

#include "cairn/status.hpp"
#include "format/shard.hpp"
#include "storage/storage_env.hpp"

namespace cairn::format {

// Call after the shard of `h` (one rank of a version) is durable in `store`.
// Writes the version's MANIFEST when every rank's shard is there, each a valid
// shard of the same run, name, version, rank count and attempt as `h`.
// Returns true when the version is committed (now, or already by another
// writer with exactly these shards); false when shards are missing or belong
// to another attempt (a failed execution's leftovers, replaced later). Safe
// against concurrent callers: they write identical content atomically.
result<bool> commit_if_complete(storage::storage_env* env, const std::string& store, const shard_header& h,
                                const std::string& executable, const std::string& mode);

}  // namespace cairn::format

#endif
