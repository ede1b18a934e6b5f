// What cairn learns from the batch system it runs under (docs/design/core.md,
// "Batch jobs"): the warning signals that announce the end of a job (Slurm's
// --signal=USR1@T, SIGTERM at preemption and at the time limit), the job's
// end time, its id and the node a rank runs on.
#ifndef CAIRN_CLIENT_BATCH_JOB_HPP
#define CAIRN_CLIENT_BATCH_JOB_HPP

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cairn/status.hpp"

namespace cairn::batch {

// Parses "USR1,TERM" (names with or without SIG, or numbers; "none" or empty
// = no signal) into signal numbers. "auto": USR1 and TERM inside a batch job
// (`in_batch_job`: SLURM_JOB_ID set), where SIGTERM announces preemption or
// cancellation and SIGKILL follows; USR1 alone elsewhere, so that `kill PID`
// still ends an interactive run. invalid_argument names the bad entry.
result<std::vector<int>> parse_signals(const std::string& text, bool in_batch_job = false);
// True inside a Slurm job (SLURM_JOB_ID set).
bool in_batch_job();

// Installs the warning handler for `signals` (process-wide, reference counted
// over handles: the first install saves the previous actions, the last
// release restores them). The handler only increments an async-signal-safe
// counter, then calls the previous handler of the signal if the application
// had one (SIG_DFL and SIG_IGN are not re-run: a process told SIGTERM keeps
// running until it checkpointed, and the batch system's SIGKILL ends it).
// A signal already handled by cairn is not installed twice.
// Not thread-safe against concurrent install/release (cairn_init/finalize).
status install_warning_handler(const std::vector<int>& signals);
void release_warning_handler();

// Warning signals received by this process since it started (any of them).
uint64_t warnings_received();

// The job's end as a Unix time: `deadline` when configured ("" = none;
// "+S" = S seconds after `now`; else Unix seconds), otherwise Slurm's
// SLURM_JOB_END_TIME, otherwise nothing. invalid_argument on a bad value.
result<std::optional<double>> job_end_time(const std::string& deadline, double now);

// This rank's node (failure domain): `configured` when set, else Slurm's
// SLURMD_NODENAME, else "node<SLURM_NODEID>", else `host`.
std::string node_identity(const std::string& configured, const std::string& host);

// The batch job id (SLURM_JOB_ID), empty outside a job.
std::string job_id();

}  // namespace cairn::batch

#endif
