// The commit of a version at the persistent level (docs/format/store.md,
// "Commit"): the MANIFEST is written, synced and renamed into place once every
// rank's part of the version is durable, by whoever completes the version (a
// rank's engine thread, a checkpoint agent, the node daemon), never only at the
// application's next call.
#ifndef CAIRN_FORMAT_COMMIT_HPP
#define CAIRN_FORMAT_COMMIT_HPP

#include <cstdint>
#include <string>

#include "cairn/status.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"
#include "storage/storage_env.hpp"

namespace cairn::format {

// Makes the directory entries that name version `version` durable: fsyncs the
// checkpoint directory (it gained the version's directory) and, the first time
// this process commits under (run, name), the run directory, runs/ and the
// store (created by whichever process came first, maybe not synced yet). Call
// before writing anything that commits the version.
status sync_version_parents(storage::storage_env* env, const std::string& store, const std::string& run,
                            const std::string& name);

// Commits `m` (shards in rank order) unless its MANIFEST already lists exactly
// these shards: the parents made durable, then the MANIFEST written to a
// temporary name unique to this call, synced, renamed and its directory
// synced. Several writers may commit the same version at once: each rename
// replaces identical shards. Then removes the version's part records, of
// every attempt. Returns the committed_at of the MANIFEST left in place (this
// call's, or the one found).
result<double> write_commit(storage::storage_env* env, const std::string& store, manifest m);

// Call once this writer's part of a version (`part`: rank `part.entry.rank`
// of `tmpl`, the version's manifest without shards) is durable. Records the
// part in the version's directory (parts.<attempt:08x>/, not synced: only the
// MANIFEST is the commit) and, when this call completes the version, writes
// its MANIFEST from every part's record. Completion is found with a combining
// tree over the parts (fan-in kPartFanIn): a writer stats at most kPartFanIn
// siblings per level, O(log N) per part; only the committer reads the N
// records. Concurrent writers that complete at once may both commit (the same
// shards). Returns true when this call committed the version.
inline constexpr uint32_t kPartFanIn = 16;
result<bool> record_part(storage::storage_env* env, const std::string& store, const manifest& tmpl, uint32_t attempt,
                         const part_record& part);

// Removes the version in directory `vdir` in the order of docs/format/store.md:
// its MANIFEST withdrawn and the withdrawal made durable first (no crash
// leaves a MANIFEST naming removed shards), then the rest, then its entry.
status remove_version(storage::storage_env* env, const std::string& vdir);

// Call after the shard of `h` (one rank of a version) is durable in `store`.
// Writes the version's MANIFEST when every rank's shard is there, each a valid
// shard of the same run, name, version, rank count and attempt as `h`.
// Returns true when the version is committed (now, or already by another
// writer with exactly these shards); false when shards are missing or belong
// to another attempt (a failed execution's leftovers, replaced later). Safe
// against concurrent callers: they write identical content atomically.
// Reads every rank's header: for writers that cannot record parts (the
// agents, whose shards another writer may replace).
result<bool> commit_if_complete(storage::storage_env* env, const std::string& store, const shard_header& h,
                                const std::string& executable, const std::string& mode);

}  // namespace cairn::format

#endif
