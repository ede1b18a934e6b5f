// agent_server's pimpl (agent_server.hpp), shared by the files that implement
// it; internal to cairn-agent, included by nothing else.
//
//   agent_server.cpp     the serving thread: receives, checks the seal, answers
//                        QUERY and RELEASE, writes the stats file; create/run/stop
//   agent_transfers.cpp  the transfers: READY and RESTORE_DONE on the serving
//                        thread, pulls, push checks and restores on the workers,
//                        cancellation of a gone incarnation
//   agent_store.cpp      what the agent holds: memory budget and spare buffers,
//                        held versions, restore lookups, the background writer
//
// Locks: jobs_mu before state_mu (never the other way); mu (the writer's)
// innermost. reply() takes jobs_mu, so it is never called under state_mu.
#ifndef CAIRN_TOOLS_AGENT_AGENT_SERVER_IMPL_HPP
#define CAIRN_TOOLS_AGENT_AGENT_SERVER_IMPL_HPP

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "agent_server.hpp"
#include "agents/data_protocol.hpp"
#include "engine/staging.hpp"
#include "fabric/fabric.hpp"
#include "fabric/transfer.hpp"
#include "format/shard.hpp"
#include "storage/storage_env.hpp"
#include "util/mutex.hpp"

namespace cairn::agents {

// Shared by the three files.
using clock_type = std::chrono::steady_clock;

inline void agent_log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void agent_log(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm {};
  gmtime_r(&ts.tv_sec, &tm);
  std::fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ cairn-agent: %s\n", tm.tm_year + 1900, tm.tm_mon + 1,
               tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, buf);
}

// One version of one rank, verified, in the agent's memory.
struct held_version {
  format::shard_header header;
  engine::aligned_buffer image;  // header.file_size bytes are the shard image
  double held_at = 0;            // wall clock
  double transfer_s = 0;
  std::span<std::byte> bytes() { return image.span().first(header.file_size); }
};

using stream_key = std::tuple<std::string, std::string, uint32_t>;  // run, name, rank

inline std::string describe(const format::shard_header& h) {
  return h.run + "/" + h.name + " v" + std::to_string(h.version) + " rank " + std::to_string(h.rank) + "/" +
         std::to_string(h.nranks);
}

inline std::string describe(const data_message& m) {
  return m.run + "/" + m.name + " v" + std::to_string(m.version) + " rank " + std::to_string(m.rank);
}

// A push the agent waits for, or a held image lent to a reader.
struct pending {
  std::shared_ptr<held_version> version;  // restore by read: the lent image
  engine::aligned_buffer buffer;          // push: where the rank writes
  fabric::memory_region mr;
  data_message request;
  fabric::fabric_addr peer = 0;
  clock_type::time_point deadline;
  clock_type::time_point started;
};

// Work for a worker: a pull (READY, modes pull and lend), the verification
// of a push (PUSH_DONE) or a restore (RESTORE).
struct job {
  data_message m;
  fabric::fabric_addr peer = 0;
};

struct agent_server::impl {
  agent_config cfg;
  std::unique_ptr<fabric::fabric_context> ctx;
  storage::storage_env* env = storage::storage_env::posix();
  std::string host;

  // What the agent holds: the fields below are guarded by state_mu.
  cairn::mutex state_mu;
  // Held versions, newest last.
  std::map<stream_key, std::deque<std::shared_ptr<held_version>>> held CAIRN_GUARDED_BY(state_mu);
  std::map<std::pair<std::string, uint64_t>, pending> pendings CAIRN_GUARDED_BY(state_mu);  // (peer name, request)
  // Memory of evicted versions, reused by the next pulls.
  static constexpr size_t kSpareBuffers = 4;
  std::vector<engine::aligned_buffer> spare CAIRN_GUARDED_BY(state_mu);
  uint64_t in_flight_bytes CAIRN_GUARDED_BY(state_mu) = 0;  // buffers of pulls in progress
  // Pulls accepted at READY and queued, not yet given their buffer: their
  // memory is counted from READY on, so that READYs arriving together cannot
  // all pass the budget.
  uint64_t reserved_bytes CAIRN_GUARDED_BY(state_mu) = 0;
  // Counters.
  uint64_t bytes_in CAIRN_GUARDED_BY(state_mu) = 0;    // images pulled or pushed into the agent
  uint64_t bytes_out CAIRN_GUARDED_BY(state_mu) = 0;   // images written back or read for restarts
  uint64_t checkpoints CAIRN_GUARDED_BY(state_mu) = 0;  // versions held
  uint64_t cancelled CAIRN_GUARDED_BY(state_mu) = 0;   // transfers cancelled because their application was gone
  uint64_t refused = 0;     // messages without the application's seal (dispatch thread only)
  uint64_t replayed = 0;    // sealed messages refused as replays or stale (dispatch thread only)
  agents::replay_guard fresh;  // dispatch thread only
  // Transfers into the agent by mode (pull: modes pull and lend; push):
  // held, their bytes and seconds (READY to held), and those not held
  // (refused, failed, cancelled).
  struct transfer_counts {
    uint64_t held = 0, bytes = 0, failures = 0;
    double seconds = 0;
  };
  transfer_counts pulls CAIRN_GUARDED_BY(state_mu), pushes CAIRN_GUARDED_BY(state_mu);
  transfer_counts& counts_of(transfer_mode mode) CAIRN_REQUIRES(state_mu) { return mode == transfer_mode::push ? pushes : pulls; }
  clock_type::time_point stats_due{};  // serving thread only

  // Workers: each serves one job at a time with lanes of its own, so a
  // transfer never waits behind another peer's. Fields GUARDED_BY(jobs_mu).
  struct worker {
    std::unique_ptr<fabric::transfer_engine> lanes;
    std::atomic<bool> abort{false};  // the lanes' fabric_options::abort
    bool busy = false;
    std::string peer, run;  // of the job in progress
    std::thread thread;
  };
  cairn::mutex jobs_mu;
  cairn::condition_variable jobs_cv;
  std::deque<job> jobs CAIRN_GUARDED_BY(jobs_mu);
  std::vector<std::unique_ptr<worker>> workers CAIRN_GUARDED_BY(jobs_mu);
  bool workers_stop CAIRN_GUARDED_BY(jobs_mu) = false;
  // Endpoints that sent READY, per run: the ranks of its current incarnation.
  std::map<std::string, std::set<std::string>> run_peers;
  // Endpoints found unreachable: never answered again (a send to them could
  // block the agent's endpoint).
  std::set<std::string> dead_peers;

  // Background writer.
  cairn::mutex mu;
  cairn::condition_variable cv;
  std::deque<std::shared_ptr<held_version>> to_write CAIRN_GUARDED_BY(mu);
  bool writer_stop CAIRN_GUARDED_BY(mu) = false;
  status writer_error CAIRN_GUARDED_BY(mu);  // first error, latched
  uint64_t stored_bytes = 0;  // writer thread only: bytes of shard files written
  uint64_t image_bytes = 0;   // writer thread only: bytes of the images they hold
  std::thread writer;

  ~impl();  // stops the workers and the writer (what it has queued is written)

  // ---- serving (agent_server.cpp) ----
  void stop_workers();                    // run() or ~impl
  bool is_dead(const std::string& peer);  // takes jobs_mu
  // Any thread; takes jobs_mu (is_dead), so never under state_mu.
  status reply(fabric::fabric_addr peer, const data_message& req, data_msg type, const status& st, uint64_t addr = 0,
               uint64_t key = 0, uint64_t length = 0, int64_t version = 0, const std::string& text = {});
  void handle_query(const data_message& m, fabric::fabric_addr peer);    // serving thread
  void handle_release(const data_message& m, fabric::fabric_addr peer);  // serving thread
  void write_stats();                                                    // serving thread
  void dispatch(const std::string& bytes);                               // serving thread

  // ---- transfers (agent_transfers.cpp) ----
  void cancel_incarnation(const std::string& run, const std::set<std::string>& peers, const std::string& why)
      CAIRN_REQUIRES(jobs_mu);
  void handle_ready(const data_message& m, fabric::fabric_addr peer);  // serving thread
  void run_pull(worker& w, const job& j);                              // worker w
  void run_push_done(const job& j);                                    // a worker
  void run_restore(worker& w, const job& j);                           // worker w
  void handle_restore_done(const data_message& m);                     // serving thread
  void expire_pendings();                                              // serving thread
  void worker_loop(worker& w);                                         // worker w's thread

  // ---- what the agent holds (agent_store.cpp) ----
  result<engine::aligned_buffer> take_buffer(uint64_t length) CAIRN_REQUIRES(state_mu);
  uint64_t memory_held() const CAIRN_REQUIRES(state_mu);
  status fits_budget(uint64_t length) CAIRN_REQUIRES(state_mu);
  void hold(std::shared_ptr<held_version> v) CAIRN_REQUIRES(state_mu);
  result<std::shared_ptr<held_version>> find(const data_message& m);  // takes state_mu
  status write_shard(held_version& v, const std::string& path);       // writer thread
  status persist(held_version& v);                                     // writer thread
  void writer_loop();                                                  // the writer thread
};

}  // namespace cairn::agents

#endif
