#include "agent_server.hpp"

#include <unistd.h>

#include <chrono>
#include <ctime>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "agents/data_protocol.hpp"
#include "engine/stages.hpp"
#include "engine/staging.hpp"
#include "format/commit.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"
#include "fabric/transfer.hpp"
#include "format/shard_io.hpp"
#include "storage/storage_env.hpp"
#include "util/clock.hpp"
#include "util/mutex.hpp"

namespace cairn::agents {

namespace {

using clock_type = std::chrono::steady_clock;

void agent_log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void agent_log(const char* fmt, ...) {
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

std::string describe(const format::shard_header& h) {
  return h.run + "/" + h.name + " v" + std::to_string(h.version) + " rank " + std::to_string(h.rank) + "/" +
         std::to_string(h.nranks);
}

std::string describe(const data_message& m) {
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

}  // namespace

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

  ~impl() {
    stop_workers();
    {
      cairn::lock_guard lk(mu);
      writer_stop = true;
    }
    cv.notify_all();
    if (writer.joinable()) writer.join();
    pendings.clear();  // regions before the endpoint
  }

  void stop_workers() {
    std::vector<worker*> all;  // made before the workers started: fixed from then on
    {
      cairn::lock_guard lk(jobs_mu);
      workers_stop = true;
      for (auto& w : workers) {
        w->abort = true;
        all.push_back(w.get());
      }
    }
    jobs_cv.notify_all();
    for (worker* w : all)
      if (w->thread.joinable()) w->thread.join();
  }

  // Cancels what an application incarnation still has queued or in flight:
  // the jobs of `run` from the endpoints in `peers` (all of the run's when
  // empty) that arrived before now. Held versions stay.
  void cancel_incarnation(const std::string& run, const std::set<std::string>& peers, const std::string& why) CAIRN_REQUIRES(jobs_mu) {
    auto of_it = [&](const std::string& r, const std::string& peer) {
      return r == run && (peers.empty() || peers.count(peer));
    };
    size_t dropped = 0, aborted = 0;
    uint64_t unreserved = 0;
    for (auto it = jobs.begin(); it != jobs.end();) {
      if (of_it(it->m.run, it->m.reply_to)) {
        if (it->m.type == data_msg::ready) unreserved += it->m.length;
        it = jobs.erase(it);
        ++dropped;
      } else {
        ++it;
      }
    }
    for (auto& w : workers)
      if (w->busy && of_it(w->run, w->peer) && !w->abort.exchange(true)) ++aborted;
    if (dropped + aborted == 0) return;
    {
      cairn::lock_guard lk(state_mu);
      reserved_bytes -= unreserved;
      cancelled += dropped + aborted;
    }
    agent_log("cancelled %zu queued and %zu running transfer(s) of run %s: %s", dropped, aborted, run.c_str(),
              why.c_str());
  }

  bool is_dead(const std::string& peer) {
    cairn::lock_guard lk(jobs_mu);
    return dead_peers.count(peer) != 0;
  }

  status reply(fabric::fabric_addr peer, const data_message& req, data_msg type, const status& st, uint64_t addr = 0,
               uint64_t key = 0, uint64_t length = 0, int64_t version = 0, const std::string& text = {}) {
    if (is_dead(req.reply_to)) return {};
    data_message r;
    r.type = type;
    r.mode = req.mode;
    r.request = req.request;
    r.session = req.session;
    r.sent_ns = agents::wall_ns();
    r.run = req.run;
    r.name = req.name;
    r.rank = req.rank;
    r.nranks = req.nranks;
    r.version = version != 0 ? version : req.version;
    r.addr = addr;
    r.key = key;
    r.length = length;
    r.code = static_cast<int32_t>(st.code());
    r.text = st.is_ok() ? text : st.message();
    r.reply_to = ctx->name();
    std::string bytes = encode_data_message(r);
    status s = ctx->send(peer, cfg.key.empty() ? bytes : fabric::seal(cfg.key, kFromAgent, std::move(bytes)));
    if (!s) agent_log("cannot reply %s to %s: %s", data_msg_name(type), describe(req).c_str(), s.to_string().c_str());
    return s;
  }

  // A buffer of at least `length` bytes: a spare one if any fits (the smallest
  // that does), else new memory.
  result<engine::aligned_buffer> take_buffer(uint64_t length) CAIRN_REQUIRES(state_mu) {
    size_t best = spare.size();
    for (size_t i = 0; i < spare.size(); ++i)
      if (spare[i].size() >= length && (best == spare.size() || spare[i].size() < spare[best].size())) best = i;
    if (best == spare.size()) return engine::aligned_buffer::allocate(length);
    engine::aligned_buffer b = std::move(spare[best]);
    spare.erase(spare.begin() + static_cast<std::ptrdiff_t>(best));
    return b;
  }

  // Bytes of memory the agent has: held images, pending pushes and lent
  // restores, pulls in flight or queued, spare buffers.
  uint64_t memory_held() const CAIRN_REQUIRES(state_mu) {
    uint64_t b = in_flight_bytes + reserved_bytes;
    for (const auto& [key, list] : held)
      for (const auto& v : list) b += v->image.size();
    for (const auto& [key, p] : pendings) b += p.buffer.size();
    for (const auto& x : spare) b += x.size();
    return b;
  }

  // Whether `length` more bytes fit the memory budget (spare buffers are
  // given back first).
  status fits_budget(uint64_t length) CAIRN_REQUIRES(state_mu) {
    if (cfg.memory_budget == 0) return {};
    while (memory_held() + length > cfg.memory_budget && !spare.empty()) spare.pop_back();
    const uint64_t now = memory_held();
    if (now + length <= cfg.memory_budget) return {};
    return status(errc::no_space, "agent memory budget of " + std::to_string(cfg.memory_budget) + " bytes exhausted (" +
                                      std::to_string(now) + " held, " + std::to_string(length) +
                                      " asked): raise --memory-budget, lower --keep, or add agents");
  }

  // Keeps a verified version: newest `keep` per stream stay in memory, and the
  // writer gets it for the store.
  void hold(std::shared_ptr<held_version> v) CAIRN_REQUIRES(state_mu) {
    auto& list = held[{v->header.run, v->header.name, v->header.rank}];
    // A version sent again replaces the older copy.
    for (auto it = list.begin(); it != list.end(); ++it)
      if ((*it)->header.version == v->header.version) {
        list.erase(it);
        break;
      }
    auto pos = list.begin();
    while (pos != list.end() && (*pos)->header.version < v->header.version) ++pos;
    list.insert(pos, v);
    while (static_cast<int>(list.size()) > cfg.keep) {
      // An evicted version the writer is done with gives its memory to the
      // next pull: fresh pages cost the kernel a zeroing pass each time.
      std::shared_ptr<held_version> old = std::move(list.front());
      list.pop_front();
      if (old.use_count() == 1 && spare.size() < kSpareBuffers) spare.push_back(std::move(old->image));
    }
    if (!cfg.persistent.empty()) {
      {
        cairn::lock_guard lk(mu);
        to_write.push_back(std::move(v));
      }
      cv.notify_all();
    }
  }

  // READY: a push gets its target here; a pull (or lend) is queued for a
  // worker. Serving thread.
  void handle_ready(const data_message& m, fabric::fabric_addr peer) {
    const data_msg answer = m.mode == transfer_mode::push ? data_msg::push_target : data_msg::held;
    if (m.length == 0 || m.length % format::kAlign != 0 || m.nranks == 0 || m.rank >= m.nranks) {
      (void)reply(peer, m, answer, status(errc::invalid_argument, "READY: bad length, rank or nranks"));
      return;
    }
    status room;
    {
      cairn::lock_guard lk(state_mu);
      room = fits_budget(m.length);
      if (!room) ++counts_of(m.mode).failures;
      else if (m.mode != transfer_mode::push) reserved_bytes += m.length;  // run_pull or cancel_incarnation gives it back
    }
    if (!room) {
      agent_log("%s not held: %s", describe(m).c_str(), room.message().c_str());
      (void)reply(peer, m, answer, room);  // not under state_mu: reply takes jobs_mu (the order is jobs_mu, state_mu)
      return;
    }
    {
      cairn::lock_guard lk(jobs_mu);
      run_peers[m.run].insert(m.reply_to);
      dead_peers.erase(m.reply_to);  // a name is never reused; harmless either way
      if (m.mode != transfer_mode::push) {
        jobs.push_back({m, peer});
        jobs_cv.notify_one();
        return;
      }
    }
    cairn::unique_lock lk(state_mu);
    auto buf = take_buffer(m.length);
    if (!buf) {
      ++pushes.failures;
      lk.unlock();
      (void)reply(peer, m, data_msg::push_target, buf.error().with_context("agent memory for " + describe(m)));
      return;
    }
    pending p;
    p.buffer = std::move(buf).value();
    auto mr = ctx->register_memory(p.buffer.data(), m.length, fabric::kRemoteWrite);
    if (!mr) {
      ++pushes.failures;
      lk.unlock();
      (void)reply(peer, m, data_msg::push_target, mr.error());
      return;
    }
    p.mr = std::move(mr).value();
    p.request = m;
    p.peer = peer;
    p.started = clock_type::now();
    p.deadline = p.started + std::chrono::duration_cast<clock_type::duration>(
                                 std::chrono::duration<double>(cfg.push_timeout_s));
    const uint64_t addr = p.mr.remote_address(), key = p.mr.key();
    pendings[{m.reply_to, m.request}] = std::move(p);
    lk.unlock();
    (void)reply(peer, m, data_msg::push_target, {}, addr, key, m.length);
  }

  // A pull (modes pull and lend), on worker w: the rank's image read with w's
  // lanes (lend: its regions from the application's own memory), verified,
  // held. A transfer that fails or makes no progress for the liveness
  // timeout marks the rank gone and cancels the rest of its incarnation.
  void run_pull(worker& w, const job& j) {
    const data_message& m = j.m;
    std::vector<fabric::lent_region> lent;
    if (m.mode == transfer_mode::lend) {
      auto l = decode_lent(m.text);
      if (!l) {
        {
          cairn::lock_guard lk(state_mu);
          reserved_bytes -= m.length;
          ++pulls.failures;
        }
        (void)reply(j.peer, m, data_msg::held, l.error());
        return;
      }
      lent = std::move(l).value();
    }
    auto v = std::make_shared<held_version>();
    {
      cairn::unique_lock lk(state_mu);
      reserved_bytes -= m.length;  // from here on the buffer is counted (in flight)
      auto buf = take_buffer(m.length);
      if (!buf) {
        ++pulls.failures;
        lk.unlock();  // never reply under state_mu (reply takes jobs_mu; the order is jobs_mu, state_mu)
        (void)reply(j.peer, m, data_msg::held, buf.error().with_context("agent memory for " + describe(m)));
        return;
      }
      v->image = std::move(buf).value();
      in_flight_bytes += v->image.size();
    }
    format::shard_header expect;
    expect.run = m.run;
    expect.name = m.name;
    expect.version = m.version;
    expect.rank = m.rank;
    expect.nranks = m.nranks;
    agent_log("pulling %s: %llu bytes, %d lane(s)", describe(m).c_str(), static_cast<unsigned long long>(m.length),
              w.lanes->threads());
    auto t0 = clock_type::now();
    auto h = fabric::pull_image(*w.lanes, fabric::remote_buffer{m.reply_to, m.addr, m.key, m.length}, v->image.span(),
                                &expect, lent);
    double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    cairn::unique_lock lk(state_mu);
    in_flight_bytes -= v->image.size();
    if (!h) {
      ++pulls.failures;
      if (spare.size() < kSpareBuffers) spare.push_back(std::move(v->image));
      lk.unlock();
      const errc code = h.error().code();
      if (code == errc::cancelled || w.abort.load()) {
        agent_log("%s not held: cancelled (%s)", describe(m).c_str(), h.error().message().c_str());
        // A rank known gone is not answered (reply() skips it); one that is
        // alive hears at once, and writes the version itself.
        (void)reply(j.peer, m, data_msg::held,
                    status(errc::cancelled, describe(m) + ": cancelled by the agent (another rank of the run is gone)"));
        return;
      }
      agent_log("%s not held: %s", describe(m).c_str(), h.error().to_string().c_str());
      if (code == errc::io_error) {
        // The rank does not answer: it is gone, and with it its job (MPI
        // takes the other ranks down): drop their queued and running pulls.
        cairn::lock_guard jl(jobs_mu);
        dead_peers.insert(m.reply_to);
        cancel_incarnation(m.run, run_peers[m.run], "rank " + std::to_string(m.rank) + " is unreachable (" +
                                                         h.error().message() + ")");
        return;
      }
      (void)reply(j.peer, m, data_msg::held, h.error());
      return;
    }
    v->header = std::move(h).value();
    v->held_at = util::wall_s();
    v->transfer_s = secs;
    bytes_in += m.length;
    ++checkpoints;
    ++pulls.held;
    pulls.bytes += m.length;
    pulls.seconds += secs;
    agent_log("held %s (%.1f MB/s)", describe(v->header).c_str(), m.length / 1e6 / std::max(secs, 1e-9));
    hold(v);
    lk.unlock();
    (void)reply(j.peer, m, data_msg::held, {});
  }

  // PUSH_DONE: the rank wrote its image into our buffer; verified on a
  // worker (a checksum pass over the image).
  void run_push_done(const job& j) {
    const data_message& m = j.m;
    pending p;
    bool known = false;
    {
      cairn::lock_guard lk(state_mu);
      auto it = pendings.find({m.reply_to, m.request});
      if (it != pendings.end() && it->second.buffer.data() != nullptr) {
        p = std::move(it->second);
        pendings.erase(it);
        known = true;
      }
    }
    if (!known) {
      (void)reply(j.peer, m, data_msg::held, status(errc::not_found, "PUSH_DONE for an unknown request"));
      return;
    }
    p.mr = fabric::memory_region();  // no more writes from the rank
    if (m.code != 0) {
      agent_log("%s not held: the rank's push failed: %s", describe(m).c_str(), m.text.c_str());
      cairn::lock_guard lk(state_mu);
      ++pushes.failures;
      return;
    }
    format::shard_header expect;
    expect.run = p.request.run;
    expect.name = p.request.name;
    expect.version = p.request.version;
    expect.rank = p.request.rank;
    expect.nranks = p.request.nranks;
    auto h = fabric::verify_shard_image(p.buffer.span().first(p.request.length),
                                        "image pushed for " + describe(p.request), &expect);
    if (!h) {
      agent_log("%s not held: %s", describe(p.request).c_str(), h.error().to_string().c_str());
      {
        cairn::lock_guard lk(state_mu);
        ++pushes.failures;
      }
      (void)reply(j.peer, m, data_msg::held, h.error());
      return;
    }
    // The rank wrote the header and the regions only; a reused buffer still
    // has old bytes in the alignment padding, which the format says is zero.
    fabric::zero_padding(*h, p.buffer.span().first(p.request.length));
    auto v = std::make_shared<held_version>();
    v->header = std::move(h).value();
    v->image = std::move(p.buffer);
    v->held_at = util::wall_s();
    v->transfer_s = std::chrono::duration<double>(clock_type::now() - p.started).count();
    {
      cairn::lock_guard lk(state_mu);
      bytes_in += v->header.file_size;
      ++checkpoints;
      ++pushes.held;
      pushes.bytes += v->header.file_size;
      pushes.seconds += v->transfer_s;
      hold(v);
    }
    agent_log("held %s (pushed)", describe(v->header).c_str());
    (void)reply(j.peer, m, data_msg::held, {});
  }

  // The held version a RESTORE asks for: memory first, then the store (read
  // without the lock: it may take a while).
  result<std::shared_ptr<held_version>> find(const data_message& m) {
    {
      cairn::lock_guard lk(state_mu);
      auto it = held.find({m.run, m.name, m.rank});
      if (it != held.end() && !it->second.empty()) {
        if (m.version < 0) return it->second.back();
        for (auto& v : it->second)
          if (v->header.version == m.version) return v;
      }
    }
    if (cfg.persistent.empty())
      return status(errc::not_found, describe(m) + " is not held by this agent");
    // From the store: committed versions only (a MANIFEST), newest first.
    std::vector<int64_t> versions = format::list_versions(env, cfg.persistent, m.run, m.name);
    for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
      if (m.version >= 0 && *v != m.version) continue;
      if (!env->exists(format::manifest_path(cfg.persistent, m.run, m.name, *v))) continue;
      const std::string path = format::shard_path(cfg.persistent, m.run, m.name, *v, m.rank);
      if (!env->exists(path)) continue;
      // Compressed or not, the image comes back as it was pulled (verified).
      auto s = format::read_shard_image(env, path);
      if (!s) {
        if (s.error().code() == errc::no_space) return s.take_status();
        agent_log("skipping %s: %s", path.c_str(), s.error().to_string().c_str());
        continue;
      }
      auto out = std::make_shared<held_version>();
      out->header = std::move(s->header);
      out->image = std::move(s->image);
      return out;
    }
    return status(errc::not_found, describe(m) + " is neither held nor committed in " + cfg.persistent);
  }

  // RESTORE, on worker w: pushed into the rank's buffer with w's lanes, or
  // lent for the rank to read until RESTORE_DONE.
  void run_restore(worker& w, const job& j) {
    const data_message& m = j.m;
    auto v = find(m);
    data_msg type = m.mode == transfer_mode::push ? data_msg::restored : data_msg::restore_source;
    if (!v) {
      (void)reply(j.peer, m, type, v.error());
      return;
    }
    std::shared_ptr<held_version> hv = *v;
    const uint64_t len = hv->header.file_size;
    if (m.mode == transfer_mode::push) {
      if (len > m.length) {
        (void)reply(j.peer, m, type,
                    status(errc::invalid_argument, describe(hv->header) + " needs " + std::to_string(len) +
                                                       " bytes, the rank offered " + std::to_string(m.length)));
        return;
      }
      auto ext = fabric::image_extents(hv->header);
      status st = w.lanes->push(fabric::remote_buffer{m.reply_to, m.addr, m.key, m.length}, hv->bytes(), ext);
      if (!st) agent_log("restore of %s failed: %s", describe(hv->header).c_str(), st.to_string().c_str());
      else agent_log("restored %s (written to the rank)", describe(hv->header).c_str());
      if (st) {
        cairn::lock_guard lk(state_mu);
        bytes_out += len;
      }
      (void)reply(j.peer, m, type, st, 0, 0, st.is_ok() ? len : 0, hv->header.version);
      return;
    }
    // By read: lend the image until RESTORE_DONE or the timeout.
    auto mr = ctx->register_memory(hv->image.data(), len, fabric::kRemoteRead);
    if (!mr) {
      (void)reply(j.peer, m, type, mr.error());
      return;
    }
    pending p;
    p.version = hv;
    p.mr = std::move(mr).value();
    p.request = m;
    p.peer = j.peer;
    p.started = clock_type::now();
    p.deadline =
        p.started + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(cfg.push_timeout_s));
    const uint64_t addr = p.mr.remote_address(), key = p.mr.key();
    {
      cairn::lock_guard lk(state_mu);
      pendings[{m.reply_to, m.request}] = std::move(p);
    }
    (void)reply(j.peer, m, type, {}, addr, key, len, hv->header.version);
  }

  void handle_restore_done(const data_message& m) {
    cairn::lock_guard lk(state_mu);
    auto it = pendings.find({m.reply_to, m.request});
    if (it == pendings.end()) return;
    agent_log("restored %s (read by the rank%s)", describe(it->second.version->header).c_str(),
        m.code == 0 ? "" : ", which reported an error");
    if (m.code == 0) bytes_out += it->second.version->header.file_size;
    pendings.erase(it);
  }

  // QUERY, answered at once (never behind a transfer). A query from an
  // endpoint the run has not used is the run's next incarnation (a restart):
  // what the previous one still has queued or in flight is cancelled.
  void handle_query(const data_message& m, fabric::fabric_addr peer) {
    {
      cairn::lock_guard lk(jobs_mu);
      auto& peers = run_peers[m.run];
      if (!peers.empty() && !peers.count(m.reply_to)) {
        cancel_incarnation(m.run, peers, "a new incarnation asks what the agent holds");
        for (const auto& old : peers) dead_peers.insert(old);
        peers.clear();
      }
    }
    std::vector<held_info> out;
    {
      cairn::lock_guard lk(state_mu);
      auto it = held.find({m.run, m.name, m.rank});
      if (it != held.end())
        for (const auto& v : it->second) out.push_back({v->header.version, v->header.file_size, v->header.attempt});
    }
    (void)reply(peer, m, data_msg::holding, {}, 0, 0, 0, 0, encode_held(out));
  }

  // The application ends without keeping its checkpoints (finalize without
  // IC_PERSIST): forget them, and do not write those still queued.
  void handle_release(const data_message& m, fabric::fabric_addr peer) {
    {
      cairn::lock_guard lk(jobs_mu);
      cancel_incarnation(m.run, {}, "released by the application");
      run_peers.erase(m.run);
    }
    int64_t dropped = 0;
    {
      cairn::lock_guard lk(state_mu);
      for (auto it = held.begin(); it != held.end();) {
        if (std::get<0>(it->first) == m.run && (m.name.empty() || std::get<1>(it->first) == m.name)) {
          dropped += static_cast<int64_t>(it->second.size());
          it = held.erase(it);
        } else {
          ++it;
        }
      }
    }
    {
      cairn::lock_guard lk(mu);
      std::erase_if(to_write, [&](const std::shared_ptr<held_version>& v) {
        return v->header.run == m.run && (m.name.empty() || v->header.name == m.name);
      });
    }
    agent_log("released %lld version(s) of run %s", static_cast<long long>(dropped), m.run.c_str());
    (void)reply(peer, m, data_msg::released, {}, 0, 0, 0, dropped);
  }

  void expire_pendings() {
    auto now = clock_type::now();
    cairn::lock_guard lk(state_mu);
    for (auto it = pendings.begin(); it != pendings.end();) {
      if (now < it->second.deadline) {
        ++it;
        continue;
      }
      agent_log("%s: no %s within %.0f s; dropped", describe(it->second.request).c_str(),
          it->second.version ? "RESTORE_DONE" : "PUSH_DONE", cfg.push_timeout_s);
      it = pendings.erase(it);
    }
  }

  void worker_loop(worker& w) {
    cairn::unique_lock lk(jobs_mu);
    for (;;) {
      jobs_cv.wait(lk, [&]() CAIRN_REQUIRES(jobs_mu) { return workers_stop || !jobs.empty(); });
      if (workers_stop) return;
      job j = std::move(jobs.front());
      jobs.pop_front();
      w.busy = true;
      w.peer = j.m.reply_to;
      w.run = j.m.run;
      w.abort = false;
      lk.unlock();
      switch (j.m.type) {
        case data_msg::ready: run_pull(w, j); break;
        case data_msg::push_done: run_push_done(j); break;
        case data_msg::restore: run_restore(w, j); break;
        default: break;
      }
      lk.lock();
      w.busy = false;
      w.abort = false;
    }
  }

  // The manager's view of this agent (see agent_config::stats_file).
  void write_stats() {
    if (cfg.stats_file.empty()) return;
    nlohmann::json j;
    {
      cairn::lock_guard lk(state_mu);
      j = {{"bytes_in", bytes_in},         {"bytes_out", bytes_out},        {"checkpoints", checkpoints},
           {"memory_held", memory_held()}, {"memory_budget", cfg.memory_budget}, {"cancelled", cancelled},
           {"refused", refused},
           {"replayed", replayed},
           {"endpoint", fabric::to_hex(ctx->name())}, {"provider", ctx->properties().provider}};
      for (const auto& [mode, c] : {std::pair<const char*, const transfer_counts*>{"pull", &pulls}, {"push", &pushes}}) {
        const std::string k(mode);
        j[k + "s"] = c->held;
        j[k + "_bytes"] = c->bytes;
        j[k + "_seconds"] = c->seconds;
        j[k + "_failures"] = c->failures;
      }
    }
    {
      cairn::lock_guard lk(jobs_mu);
      size_t busy = 0;
      for (const auto& w : workers) busy += w->busy ? 1 : 0;
      j["workers"] = workers.size();
      j["busy"] = busy;
      j["queued"] = jobs.size();
    }
    status st = env->write_atomic(cfg.stats_file, j.dump() + "\n", false);
    if (!st) agent_log("cannot write the stats file: %s", st.to_string().c_str());
    stats_due = clock_type::now() + std::chrono::seconds(1);
  }

  void dispatch(const std::string& bytes) {
    std::optional<std::string_view> in = bytes;
    if (!cfg.key.empty() && !(in = fabric::unseal(cfg.key, kToAgent, bytes))) {
      // Another application's rank, or a stranger on the network: nothing
      // of it reaches the application's versions (not even a RELEASE).
      if (refused++ == 0)
        agent_log("dropped a message without the application's seal (another application's, or a stranger's); "
                  "further ones are counted only (refused in the stats file)");
      return;
    }
    auto m = decode_data_message(*in);
    if (!m) {
      agent_log("ignoring a message: %s", m.error().to_string().c_str());
      return;
    }
    // Sealed, so from the application; unless someone recorded it and sends
    // it again (without a key anyone can forge a message, so nothing to check).
    if (!cfg.key.empty()) {
      if (status st = fresh.admit(*m, agents::wall_ns()); !st) {
        if (replayed++ == 0)
          agent_log("dropped a sealed %s of run %s: %s; further ones are counted only (replayed in the stats file)",
                    data_msg_name(m->type), m->run.c_str(), st.message().c_str());
        return;
      }
    }
    auto peer = ctx->insert_peer(m->reply_to);
    if (!peer) {
      agent_log("ignoring %s from an unusable address: %s", data_msg_name(m->type), peer.error().to_string().c_str());
      return;
    }
    switch (m->type) {
      case data_msg::ready: handle_ready(*m, *peer); break;
      case data_msg::push_done:
      case data_msg::restore: {
        cairn::lock_guard lk(jobs_mu);
        jobs.push_back({*m, *peer});
        jobs_cv.notify_one();
        break;
      }
      case data_msg::restore_done: handle_restore_done(*m); break;
      case data_msg::query: handle_query(*m, *peer); break;
      case data_msg::release: handle_release(*m, *peer); break;
      default: agent_log("ignoring unexpected %s", data_msg_name(m->type)); break;
    }
  }

  // ---- background writer ----

  // Writes v's image to path: compressed (format 3) unless compression is
  // off, or the image cannot be compressed (then as is, with a note).
  status write_shard(held_version& v, const std::string& path) {
    const auto& h = v.header;
    if (cfg.compress_level != 0) {
      format::compress_options co;
      co.level = cfg.compress_level;
      co.threads = cfg.compress_threads;
      auto c = format::compress_shard(h, v.bytes(), co);
      if (c) {
        stored_bytes += c->header.stored_size;
        image_bytes += h.file_size;
        return engine::write_shard_file(env, path, c->bytes.data(), c->header.stored_size, cfg.direct_io, true);
      }
      agent_log("%s is written uncompressed: %s", describe(h).c_str(), c.error().to_string().c_str());
    }
    stored_bytes += h.file_size;
    image_bytes += h.file_size;
    return engine::write_shard_file(env, path, v.image.data(), h.file_size, cfg.direct_io, true);
  }

  status persist(held_version& v) {
    const auto& h = v.header;
    const double t0 = util::now_s();
    const std::string path = format::shard_path(cfg.persistent, h.run, h.name, h.version, h.rank);
    CAIRN_RETURN_IF_ERROR(write_shard(v, path));
    // The last shard of a version to arrive (from whichever agent or rank
    // wrote it) commits the version.
    auto committed = format::commit_if_complete(env, cfg.persistent, h, "cairn-agent", "agent");
    if (!committed) return committed.take_status().with_context("commit of " + describe(h));
    if (*committed)
      agent_log("committed %s/%s v%lld to %s (%.3f s)", h.run.c_str(), h.name.c_str(),
                static_cast<long long>(h.version), cfg.persistent.c_str(), util::now_s() - t0);
    return {};
  }

  void writer_loop() {
    cairn::unique_lock lk(mu);
    while (true) {
      cv.wait(lk, [&]() CAIRN_REQUIRES(mu) { return writer_stop || !to_write.empty(); });
      if (to_write.empty()) {  // stop requested and nothing left
        if (image_bytes > 0)
          agent_log("wrote %llu bytes of shard files for %llu bytes of images (%s, ratio %.2f)",
                    static_cast<unsigned long long>(stored_bytes), static_cast<unsigned long long>(image_bytes),
                    cfg.compress_level != 0 ? ("zstd level " + std::to_string(cfg.compress_level)).c_str()
                                            : "uncompressed",
                    stored_bytes ? static_cast<double>(image_bytes) / static_cast<double>(stored_bytes) : 0.0);
        return;
      }
      auto v = std::move(to_write.front());
      to_write.pop_front();
      lk.unlock();
      status st = persist(*v);
      if (!st) agent_log("writing %s to %s failed: %s", describe(v->header).c_str(), cfg.persistent.c_str(),
                   st.to_string().c_str());
      v.reset();
      lk.lock();
      if (!st && writer_error.is_ok()) writer_error = st;
    }
  }
};

agent_server::agent_server(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
agent_server::~agent_server() = default;
const std::string& agent_server::name() const { return impl_->ctx->name(); }
const fabric::fabric_properties& agent_server::properties() const { return impl_->ctx->properties(); }

result<std::unique_ptr<agent_server>> agent_server::create(const agent_config& config) {
  if (config.keep < 1) return status(errc::invalid_argument, "keep must be at least 1");
  if (config.compress_level != 0)
    CAIRN_RETURN_IF_ERROR(format::check_compress_options({config.compress_level, config.compress_threads}));
  if (!config.key.empty() && config.key.size() != fabric::kPlaneKeyBytes)
    return status(errc::invalid_argument, "the application key must be " + std::to_string(fabric::kPlaneKeyBytes) +
                                              " bytes, not " + std::to_string(config.key.size()));
  auto p = std::make_unique<impl>();
  p->cfg = config;
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) == 0) p->host = host;
  fabric::fabric_options fo = config.fabric;
  fo.thread_safe = true;
  fo.progress_thread = true;  // ranks push into our memory while we serve others
  CAIRN_ASSIGN_OR_RETURN(p->ctx, fabric::fabric_context::create(fo));
  if (config.workers < 1) return status(errc::invalid_argument, "workers must be at least 1");
  if (config.liveness_timeout_s <= 0) return status(errc::invalid_argument, "the liveness timeout must be positive");
  cairn::unique_lock workers_lk(p->jobs_mu);  // the workers wait for it until they are all made
  for (int i = 0; i < config.workers; ++i) {
    auto w = std::make_unique<impl::worker>();
    fabric::transfer_options to;
    to.fabric = config.fabric;
    // A rank that makes no progress for this long is gone; the worker's
    // abort flag cancels a transfer of an incarnation known to be gone.
    to.fabric.timeout_s = config.liveness_timeout_s;
    to.fabric.abort = &w->abort;
    to.threads = config.threads;
    to.piece_bytes = config.piece_bytes;
    to.max_bytes_per_s = config.max_bytes_per_s;
    CAIRN_ASSIGN_OR_RETURN(w->lanes, fabric::transfer_engine::create(to));
    p->workers.push_back(std::move(w));
  }
  for (auto& w : p->workers) w->thread = std::thread([raw = p.get(), wp = w.get()] { raw->worker_loop(*wp); });
  workers_lk.unlock();
  if (!config.persistent.empty()) {
    CAIRN_RETURN_IF_ERROR(p->env->make_dirs(config.persistent));
    p->writer = std::thread([raw = p.get()] { raw->writer_loop(); });
  }
  return std::unique_ptr<agent_server>(new agent_server(std::move(p)));
}

status agent_server::run(const std::atomic<bool>& stop) {
  impl& m = *impl_;
  m.write_stats();
  while (!stop.load()) {
    auto bytes = m.ctx->recv(0.2);
    if (bytes) {
      m.dispatch(*bytes);
    } else if (bytes.error().code() != errc::again) {
      return bytes.take_status().with_context("agent endpoint");
    }
    m.expire_pendings();
    if (bytes || clock_type::now() >= m.stats_due) m.write_stats();
  }
  m.stop_workers();
  {
    cairn::lock_guard lk(m.mu);
    m.writer_stop = true;
  }
  m.cv.notify_all();
  if (m.writer.joinable()) m.writer.join();
  cairn::lock_guard lk(m.mu);
  return m.writer_error;
}

}  // namespace cairn::agents
