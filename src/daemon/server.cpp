#include "daemon/server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <list>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <nlohmann/json.hpp>
#include <sodium.h>
#include <thread>
#include <vector>

#include "daemon/protocol.hpp"
#include "engine/engine.hpp"
#include "engine/stages.hpp"
#include "format/commit.hpp"
#include "format/manifest.hpp"
#include "format/shard.hpp"
#include "storage/storage_env.hpp"
#include "util/clock.hpp"
#include "util/config.hpp"
#include "util/contain.hpp"
#include "util/cpu.hpp"
#include "util/hex.hpp"
#include "util/json.hpp"
#include "util/process.hpp"
#ifdef CAIRN_HAVE_FABRIC
#include "redundancy/stage.hpp"
#include "util/mutex.hpp"
#endif

namespace cairn::daemon {
namespace {

using nlohmann::json;

std::atomic<bool> g_terminate{false};    // SIGTERM received
std::atomic<bool> g_drain_over{false};  // the drain's time is up: drop queued work

void log(const char* fmt, const std::string& a, const std::string& b = {}) {
  std::fprintf(stderr, "cairnd[%d]: ", static_cast<int>(getpid()));
  std::fprintf(stderr, fmt, a.c_str(), b.c_str());
  std::fputc('\n', stderr);
}

// What every session of the daemon shares.
struct shared_state {
  std::string token;             // the execution's (server_options::token)
  std::atomic<int> admitted{0};  // sessions whose hello carried it
};

// A rank's connection and the engine that runs its versions.
class session {
 public:
  // Until its hello is admitted, a connection may send one frame of at most
  // kMaxMeta bytes, within the handshake's time.
  session(int fd, shared_state* shared) : ch_(fd, 4096 + kMaxMeta), shared_(shared) {}
  // Serves the connection to its end, finishes the work, commits what the
  // application left uncommitted if it died.
  void serve();

 private:
  // What the reporting stages need of a job beyond version_job.
  struct job : engine::version_job {
    uint64_t id = 0;
    std::shared_ptr<util::aligned_buffer> slot;  // image points into it: kept while the job lives
  };
  // Runs `inner` and reports its outcome to the rank as `report`; a
  // successful persistent write is kept as a commit candidate.
  class reporting final : public engine::stage {
   public:
    reporting(session* s, std::unique_ptr<engine::stage> inner, std::string report)
        : s_(s), inner_(std::move(inner)), report_(std::move(report)) {}
    const char* name() const override { return inner_->name(); }
    unsigned level() const override { return inner_->level(); }
    bool essential() const override { return inner_->essential(); }
    bool latches() const override { return inner_->latches(); }
    bool applies(const engine::version_job& j) const override { return inner_->applies(j); }
    status run(engine::version_job& j) override {
      status st = inner_->run(j);
      s_->report(static_cast<job&>(j), report_, st);
      if (st && level() == engine::kLevelPersistent) s_->wrote_persistent(j.header);
      return st;
    }

   private:
    session* s_;
    std::unique_ptr<engine::stage> inner_;
    std::string report_;
  };

  // The first frame: a hello with this execution's token, answered with a
  // welcome (or a refusal); false when the connection is not the job's.
  bool admit();
  status hello(const frame& f);
  // Builds the engine (the start frame: the redundancy set, if any).
  status start(const frame& f);
  status take_slot(frame& f);
  status release_slot(const frame& f);
  status take_job(const frame& f);
  status committed(const frame& f);
  void report(const job& j, const std::string& stage, const status& st);
  void wrote_persistent(const format::shard_header& h);
  void commit_leftovers();

  channel ch_;
  shared_state* shared_;
  config cfg_;
  int rank_ = -1;
  std::string executable_, mode_;
  std::string start_error_ = "no start from the rank";  // why engine_ is null
  std::unique_ptr<storage::storage_env> rate_env_;
  std::unique_ptr<engine::engine> engine_;
#ifdef CAIRN_HAVE_FABRIC
  std::shared_ptr<redundancy::plane> plane_;  // redundancy != none: this session's endpoint
#endif
  // Redundancy: what a protected version's MANIFEST records (the job's sets).
  std::optional<format::redundancy_info> redundancy_record_;
  std::map<uint64_t, std::shared_ptr<util::aligned_buffer>> slots_;
  cairn::mutex mu_;
  // Versions written to the persistent level and not yet committed by the
  // application, by (name, version).
  std::map<std::pair<std::string, int64_t>, format::shard_header> uncommitted_ CAIRN_GUARDED_BY(mu_);
};

void session::serve() {
  if (!admit()) return;
  bool goodbye = false;
  for (;;) {
    auto f = ch_.recv();
    if (!f) {
      // The rank is gone (or finalized and closed), or broke the framing:
      // nothing more can be read; what it handed over is finished below.
      if (f.error().code() != errc::not_found) log("rank %s: %s", std::to_string(rank_), f.error().to_string());
      break;
    }
    // A malformed frame is refused and logged; the session goes on.
    status st;
    switch (f->type) {
      case msg::start:
        st = start(*f);
        if (!st) start_error_ = st.to_string();
        break;
      case msg::slot: st = take_slot(*f); break;
      case msg::release: st = release_slot(*f); break;
      case msg::job: st = take_job(*f); break;
      case msg::committed: st = committed(*f); break;
      case msg::bye: goodbye = true; break;
      case msg::hello: st = status(errc::invalid_argument, "a second hello"); break;
      default: st = status(errc::invalid_argument, "a frame of unknown type " + std::to_string(int(f->type))); break;
    }
    if (f->fd >= 0) close(f->fd);  // a descriptor no handler took
    if (!st) log("rank %s: %s (frame refused)", std::to_string(rank_), st.to_string());
    if (goodbye) break;
  }
  if (!engine_) return;
  // After a goodbye the application waited for what it wanted; what is still
  // queued was abandoned by it. Without one, the application died: finish
  // everything, then commit what it could not.
  engine_->shutdown(/*drain=*/!goodbye && !g_drain_over.load());
  if (!goodbye) commit_leftovers();
}

bool session::admit() {
  // A connection that says nothing holds no rank's place for long.
  constexpr time_t kHandshakeS = 10;
  const int fd = ch_.fd();
  struct timeval tv {kHandshakeS, 0};
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  auto f = ch_.recv();
  status st;
  if (!f) st = f.take_status().with_context("before its hello");
  else if (f->type != msg::hello) st = status(errc::invalid_argument, "its first frame is not a hello");
  else st = hello(*f);
  if (!st) {
    log("a connection refused: %s%s", st.to_string(), "");
    return false;
  }
  struct timeval none {};
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  ch_.set_max_frame(kMaxFrame);
  shared_->admitted.fetch_add(1);
  return true;
}

status session::hello(const frame& f) {
  json w = {{"pid", static_cast<int>(getpid())}};
  // A refused hello is answered (the rank reports why) and ends the session.
  auto refuse = [&](status why) {
    w["error"] = why.message();
    w["code"] = static_cast<int>(why.code());
    rank_ = -1;
    (void)ch_.send({msg::welcome, util::dump_json(w), {}, -1});
    return why;
  };
  auto m = decode_hello(f.meta);
  if (!m) return refuse(m.take_status());
  // Another execution's rank (or anything else of this user that found the
  // socket) does not carry the token this daemon was started with.
  if (m->token.size() != shared_->token.size() ||
      sodium_memcmp(m->token.data(), shared_->token.data(), m->token.size()) != 0)
    return refuse({errc::invalid_argument, "the hello does not carry this execution's token: a rank of another job "
                                             "or execution reached this daemon"});
  rank_ = m->rank;
  executable_ = m->executable;
  auto c = config::from_values(m->config);
  if (!c) return refuse(c.take_status().with_context("the rank's configuration"));
  cfg_ = std::move(c).value();
  mode_ = cfg_.mode == engine_mode::sync ? "sync" : "thread";
  if (cfg_.redundancy != "none") {
#ifdef CAIRN_HAVE_FABRIC
    // The set's members encode over the daemons' endpoints: the rank
    // gathers every session's name and sends it back with its set (start).
    redundancy::plane_options o;
    o.provider = cfg_.agents_provider;
    o.bind = cfg_.agents_bind == "auto" ? "" : cfg_.agents_bind;
    o.what = "redundancy data plane (cairnd)";
    auto p = redundancy::plane::create(o);
    if (!p) return refuse(p.take_status().with_context("the redundancy data plane"));
    plane_ = std::move(p).value();
    w["plane"] = util::hex_encode(plane_->address());
#else
    return refuse({errc::not_supported, "redundancy needs the libfabric data plane, which this cairnd lacks"});
#endif
  }
  return ch_.send({msg::welcome, w.dump(), {}, -1});
}

status session::start(const frame& f) {
  if (engine_) return {errc::invalid_argument, "a second start frame"};
  CAIRN_ASSIGN_OR_RETURN(start_msg m, decode_start(f.meta));
  storage::storage_env* env = storage::storage_env::posix();
  storage::storage_env* flush_env = env;
  if (cfg_.io_rate_limit > 0) {
    rate_env_ = storage::make_rate_limited_env(env, cfg_.io_rate_limit);
    flush_env = rate_env_.get();
  }
  // The same graph as a rank's own engine: the image first (checksums and
  // hash trees in one pass), then the levels side by side, redundancy after
  // the local level.
  engine::level_paths paths{cfg_.run, cfg_.scratch, cfg_.persistent};
  engine::stage_graph g;
  const size_t image = g.add(std::make_unique<reporting>(
      this, engine::make_checksum_stage(cfg_.hash_trees, cfg_.hash_chunk, cfg_.hash_abs), "image"));
  size_t local = image;
  if (cfg_.local_enabled)
    local = g.add(std::make_unique<reporting>(this, engine::make_local_stage(env, paths), "local"), {image});
  if (m.redundancy) {
#ifdef CAIRN_HAVE_FABRIC
    auto& r = *m.redundancy;
    if (!plane_) return {errc::invalid_argument, "a redundancy set for a session without a plane"};
    redundancy::set_info set;
    auto kind = redundancy::parse_scheme(r.scheme);
    if (!kind) return kind.take_status();
    set.geo.kind = *kind;
    set.geo.k = r.k;
    set.geo.m = r.m;
    set.members = std::move(r.members);
    set.nodes = std::move(r.nodes);
    set.position = r.position;
    CAIRN_RETURN_IF_ERROR(plane_->join(static_cast<uint32_t>(rank_), r.peers, std::move(r.key)));
    if (r.has_record) {
      format::redundancy_info ri;
      ri.scheme = r.record_scheme;
      ri.description = r.record_description;
      ri.k = r.record_k;
      ri.m = r.record_m;
      ri.sets = std::move(r.record_sets);
      redundancy_record_ = std::move(ri);
    }
    g.add(std::make_unique<reporting>(this, redundancy::make_stage(env, paths, std::move(set), plane_, {}), "redundancy"),
          {local});
#else
    return {errc::not_supported, "redundancy needs the libfabric data plane, which this cairnd lacks"};
#endif
  }
  g.add(std::make_unique<reporting>(this, engine::make_persistent_stage(flush_env, paths, cfg_.direct_io), "persistent"),
        {image});
  if (!m.redundancy || redundancy_record_) {
    // The last writer of a version commits it (format::record_part), as a
    // rank's own engine would: whether or not the application calls cairn
    // again, lives, or is killed with this daemon a moment later. With
    // redundancy the MANIFEST records the job's sets, which the rank sent
    // (an older client that did not: the ranks, or commit_leftovers, commit).
    std::vector<size_t> levels(g.size());
    std::iota(levels.begin(), levels.end(), size_t{0});
    char host[256] = {0};
    (void)gethostname(host, sizeof host - 1);
    g.add(engine::make_commit_stage(
              env, cfg_.persistent,
              [this](const engine::version_job& j) {
                format::manifest t;
                t.run = j.header.run;
                t.name = j.header.name;
                t.version = j.header.version;
                t.nranks = j.header.nranks;
                t.executable = executable_;
                t.mode = mode_;
                if (redundancy_record_ && (j.wanted & engine::kLevelProtected)) t.redundancy = redundancy_record_;
                return t;
              },
              host),
          std::move(levels));
  }
  util::thread_setup setup{{}, cfg_.engine_priority, cfg_.engine_nice};
  engine_ = std::make_unique<engine::engine>(engine_mode::thread, cfg_.io_threads, setup, std::move(g));
  return {};
}

status session::take_slot(frame& f) {
  if (f.fd < 0) return {errc::invalid_argument, "a slot frame without its memory file"};
  CAIRN_ASSIGN_OR_RETURN(slot_msg m, decode_slot(f.meta));
  if (slots_.count(m.id)) return {errc::invalid_argument, "staging slot " + std::to_string(m.id) + " handed over twice"};
  // map_shared takes the descriptor (and checks the size against the file).
  CAIRN_ASSIGN_OR_RETURN(auto buf, util::aligned_buffer::map_shared(std::exchange(f.fd, -1), m.size));
  slots_[m.id] = std::make_shared<util::aligned_buffer>(std::move(buf));
  return {};
}

status session::release_slot(const frame& f) {
  CAIRN_ASSIGN_OR_RETURN(slot_msg m, decode_slot(f.meta));
  // Unmapped once no queued job of it is left (each holds the slot).
  if (slots_.erase(m.id) == 0) return {errc::invalid_argument, "release of unknown staging slot " + std::to_string(m.id)};
  return {};
}

status session::committed(const frame& f) {
  CAIRN_ASSIGN_OR_RETURN(committed_msg m, decode_committed(f.meta));
  cairn::lock_guard lk(mu_);
  uncommitted_.erase({m.name, m.version});
  return {};
}

status session::take_job(const frame& f) {
  CAIRN_ASSIGN_OR_RETURN(job_msg m, decode_job(f.meta));
  auto j = std::make_shared<job>();
  j->id = m.id;
  auto slot = slots_.find(m.slot);
  status st;
  // Every refused job is reported, so the rank's proxies never wait for it.
  if (!engine_) st = status(errc::internal, "the daemon's engine did not start: " + start_error_);
  else if (slot == slots_.end()) st = status(errc::internal, "a job in a staging slot the rank never handed over");
  if (st) {
    auto h = format::decode_header(std::as_bytes(std::span<const char>(f.payload.data(), f.payload.size())),
                                   "the planned header of job " + std::to_string(j->id));
    if (h) j->header = std::move(h).value();
    else st = h.take_status();
  }
  if (st && j->header.file_size > slot->second->size())
    st = status(errc::internal, "a job larger than its staging slot");
  if (!st) {
    report(*j, "image", st);  // the version fails on the rank with this message
    return st;
  }
  j->slot = slot->second;
  j->image = j->slot.get();
  j->wanted = m.wanted;
  j->captured_at = m.captured_at;
  j->capture_s = m.capture_s;
  j->done = engine::kLevelCaptured;
  engine_->submit(j);
  return {};
}

void session::report(const job& j, const std::string& stage, const status& st) {
  json m = {{"id", j.id}, {"stage", stage}, {"code", static_cast<int>(st.code())}, {"message", st.message()}};
  std::string payload;
  if (stage == "image") {
    m["checksum_s"] = j.checksum_s;
    m["hash_s"] = j.hash_s;
    if (st) payload = j.tree_image;
  } else if (stage == "local") {
    m["s"] = j.local_s;
  } else {
    m["s"] = j.persistent_s;
    m["at"] = j.persistent_at;
  }
  // A message may quote a path that is not UTF-8: replaced, never thrown on.
  (void)ch_.send({msg::stage, m.dump(-1, ' ', false, json::error_handler_t::replace), std::move(payload), -1});
  // (the rank may be gone: the work goes on)
}

void session::wrote_persistent(const format::shard_header& h) {
  cairn::lock_guard lk(mu_);
  uncommitted_[{h.name, h.version}] = h;
}

void session::commit_leftovers() {
  cairn::lock_guard lk(mu_);
  for (const auto& [key, h] : uncommitted_) {
    auto done = format::commit_if_complete(storage::storage_env::posix(), cfg_.persistent, h, executable_, mode_);
    const std::string what = "'" + h.name + "' version " + std::to_string(h.version) + " of run '" + h.run + "'";
    if (!done) log("rank %s: committing %s failed", std::to_string(rank_), what + ": " + done.error().to_string());
    else if (*done) log("committed %s%s after the application ended", what, "");
  }
  uncommitted_.clear();
}

}  // namespace

void install_drain_handler() {
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_terminate.store(true); };
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  // Blocked here and in every thread started later (they inherit the mask):
  // only run_server's wait takes it, so no session's read is interrupted.
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, nullptr);
}

int run_server(const server_options& o) {
  auto lfd = listen_on(o.socket);
  if (!lfd) {
    log("%s%s", lfd.error().to_string(), "");
    return 1;
  }
  struct running {
    std::thread t;
    std::atomic<bool> done{false};
    int wake = -1;  // a duplicate of the session's socket: shutting it down ends the session's wait
  };
  std::list<running> sessions;
  shared_state shared;
  shared.token = o.token;
  const double deadline = util::now_s() + o.connect_timeout;
  double drain_until = 0;
  sigset_t waiting;  // the mask while waiting: SIGTERM may arrive
  pthread_sigmask(SIG_SETMASK, nullptr, &waiting);
  sigdelset(&waiting, SIGTERM);
  for (;;) {
    // Ended sessions (refused connections among them) are joined as they go.
    for (auto it = sessions.begin(); it != sessions.end();) {
      if (!it->done.load()) {
        ++it;
        continue;
      }
      it->t.join();
      if (it->wake >= 0) close(it->wake);
      it = sessions.erase(it);
    }
    const int admitted = shared.admitted.load();
    const bool all_done = std::all_of(sessions.begin(), sessions.end(), [](const running& r) { return r.done.load(); });
    if (all_done && (admitted >= o.ranks || util::now_s() >= deadline || drain_until > 0)) break;
    if (g_terminate.load() && drain_until == 0) {
      drain_until = util::now_s() + o.drain_s;
      log("SIGTERM: finishing and committing what the job handed over (at most %s s)%s", std::to_string(o.drain_s));
    }
    if (drain_until > 0 && util::now_s() >= drain_until && !g_drain_over.load()) {
      g_drain_over.store(true);
      for (auto& r : sessions)
        if (!r.done.load()) (void)::shutdown(r.wake, SHUT_RDWR);
    }
    // Connections are taken until every rank of the node is admitted (a
    // refused one does not count), at most a bounded number at once.
    const auto open_now = std::count_if(sessions.begin(), sessions.end(), [](const running& r) { return !r.done.load(); });
    pollfd p{*lfd, POLLIN, 0};
    if (admitted >= o.ranks || drain_until > 0 || util::now_s() >= deadline || open_now >= 2 * o.ranks + 16)
      p.fd = -1;  // only wait for the sessions to end
    const timespec tick{0, 200'000'000};
    int n = ppoll(&p, 1, &tick, &waiting);
    if (n > 0 && (p.revents & POLLIN)) {
      int fd = accept4(*lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      // Only the job's user (another user could otherwise make this daemon
      // write where it likes, or take a rank's place).
      if (status who = check_peer_user(fd, "a connection"); !who) {
        log("%s%s", who.message(), "");
        close(fd);
        continue;
      }
      auto& r = sessions.emplace_back();
      r.wake = fcntl(fd, F_DUPFD_CLOEXEC, 0);
      r.t = std::thread([fd, &r, &shared] {
        util::name_this_thread("cairnd-session");
        // No exception ends the daemon (every session of the node with it).
        status st = util::contained("cairnd session", [fd, &shared] {
          session s(fd, &shared);
          s.serve();
          return status();
        });
        if (!st) log("%s%s", st.to_string(), "");
        r.done = true;
      });
    }
  }
  close(*lfd);
  for (auto& r : sessions) {
    r.t.join();
    if (r.wake >= 0) close(r.wake);
  }
  return 0;
}

}  // namespace cairn::daemon
