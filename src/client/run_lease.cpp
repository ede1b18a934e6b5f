#include "client/run_lease.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>

#include <nlohmann/json.hpp>

#include "format/layout.hpp"
#include "storage/storage_env.hpp"
#include "util/clock.hpp"
#include "util/names.hpp"
#include "util/mutex.hpp"
#include "util/process.hpp"

namespace cairn {
namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string this_host() {
  char h[256] = {0};
  (void)gethostname(h, sizeof h - 1);
  return h;
}

std::string encode(const lease_holder& h) {
  nlohmann::json j = {{"id", h.id},   {"host", h.host},       {"pid", h.pid},
                      {"job", h.job}, {"step", h.step},       {"program", h.program},
                      {"started_at", h.started_at}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// The holder named by the lease at `path`; not_found when there is none. A
// lease that cannot be decoded (a crash while it was written cannot leave
// one: it is linked into place whole) is a holder of unknown identity.
result<lease_holder> read_holder(const std::string& path) {
  auto text = storage::storage_env::posix()->read_all(path);
  if (!text) return text.take_status();
  lease_holder h;
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return h;
  auto str = [&](const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string(); };
  h.id = str("id");
  h.host = str("host");
  h.job = str("job");
  h.step = str("step");
  h.program = str("program");
  if (j.contains("pid") && j["pid"].is_number_integer()) h.pid = j["pid"].get<int>();
  if (j.contains("started_at") && j["started_at"].is_number()) h.started_at = j["started_at"].get<double>();
  return h;
}

// The lease's identity and last renewal (inode and mtime), as seen here.
struct stamp {
  ino_t ino = 0;
  struct timespec mtime {};
  bool operator==(const stamp& o) const {
    return ino == o.ino && mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec;
  }
};
bool stamp_of(const std::string& path, stamp* out) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  out->ino = st.st_ino;
  out->mtime = st.st_mtim;
  return true;
}

// Known dead without waiting: on this host with its pid gone (or a zombie,
// or recycled for another program), or an earlier execution of this very job
// step (Slurm starts a requeued job only after the earlier one ended).
bool known_dead(const lease_holder& h, const lease_holder& me) {
  if (h.id.empty()) return false;
  if (h.host == me.host && h.pid > 0 && util::pid_gone(h.pid, h.program)) return true;
  return !me.job.empty() && h.job == me.job && h.step == me.step && h.id != me.id;
}

// This execution as a lease names it.
lease_holder this_execution() {
  lease_holder me;
  me.host = this_host();
  me.pid = static_cast<int>(::getpid());
  me.job = env_or_empty("SLURM_JOB_ID");
  me.step = env_or_empty("SLURM_STEP_ID");
  me.program = program_invocation_short_name ? program_invocation_short_name : "";
  me.started_at = util::wall_s();
  std::random_device rd;
  char id[40];
  std::snprintf(id, sizeof id, "%08x%08x-%d", rd(), rd(), me.pid);
  me.id = id;
  return me;
}

}  // namespace

result<lease_probe> probe_lease(const std::string& store, const std::string& run, double timeout_s) {
  const std::string path = storage::join(storage::join(format::runs_dir(store), run), kLeaseFileName);
  lease_probe out;
  auto holder = read_holder(path);
  if (!holder) {
    if (holder.error().code() == errc::not_found) return out;
    return holder.take_status().with_context("the lease of run '" + run + "'");
  }
  out.holder = std::move(*holder);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return lease_probe{};  // released meanwhile
    return status::from_errno(errno, "the lease of run '" + run + "': stat " + path);
  }
  out.silent_s = std::max(0.0, util::wall_s() - (static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9));
  const lease_holder me = this_execution();
  // On this host the pid decides (known_dead checks it); elsewhere, the renewals do.
  const bool here = out.holder.host == me.host && out.holder.pid > 0;
  if (known_dead(out.holder, me) || (!here && out.silent_s > timeout_s)) {
    out.state = lease_state::abandoned;
  } else {
    out.state = lease_state::live;
  }
  return out;
}

std::string lease_holder::describe() const {
  if (id.empty()) return "an execution that left an unreadable lease";
  std::string s = "'" + util::escaped(program) + "' (pid " + std::to_string(pid) + " on host " + util::escaped(host);
  if (!job.empty()) s += ", Slurm job " + job + (step.empty() ? "" : " step " + step);
  if (started_at > 0) {
    const time_t t = static_cast<time_t>(started_at);
    char when[64];
    struct tm tm {};
    gmtime_r(&t, &tm);
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
    s += ", started " + std::string(when);
  }
  return s + ")";
}

run_lease::run_lease(std::string path, lease_holder me, double timeout_s)
    : path_(std::move(path)), me_(std::move(me)), timeout_s_(timeout_s) {
  renewer_ = std::thread([this] { renew_loop(); });
}

run_lease::~run_lease() {
  {
    cairn::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (renewer_.joinable()) renewer_.join();
}

void run_lease::renew_loop() {
  util::name_this_thread("cairn-lease");
  const auto period = std::chrono::duration<double>(timeout_s_ / 4);
  cairn::unique_lock lk(mu_);
  bool warned = false;
  while (!cv_.wait_for(lk, period, [this]() CAIRN_REQUIRES(mu_) { return stop_; })) {
    auto h = read_holder(path_);
    if (h && h->id == me_.id) {
      (void)::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);
    } else if (!warned) {
      warned = true;
      std::fprintf(stderr, "cairn: warning: the lease of this run (%s) %s; another execution may write the run\n",
                   path_.c_str(), h ? ("now names " + h->describe()).c_str() : "is gone");
    }
  }
}

void run_lease::release() {
  {
    cairn::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (renewer_.joinable()) renewer_.join();
  auto h = read_holder(path_);
  if (h && h->id == me_.id) {
    (void)::unlink(path_.c_str());
    (void)storage::storage_env::posix()->sync_dir(storage::dirname_of(path_));
  }
}

result<std::unique_ptr<run_lease>> run_lease::acquire(const std::string& store, const std::string& run,
                                                      double timeout_s) {
  auto* env = storage::storage_env::posix();
  const std::string dir = storage::join(format::runs_dir(store), run);
  CAIRN_RETURN_IF_ERROR(env->make_dirs(dir));
  const std::string path = storage::join(dir, kLeaseFileName);
  lease_holder me = this_execution();
  const std::string text = encode(me);
  const std::string tmp = path + ".tmp." + me.id;
  bool told = false;
  for (;;) {
    // The whole lease, durable, then linked into place: link fails with
    // EEXIST while there is a holder (atomic on NFS, Lustre, CephFS).
    CAIRN_RETURN_IF_ERROR(env->write_atomic(tmp, text, true));
    const int linked = ::link(tmp.c_str(), path.c_str());
    const int err = errno;
    (void)::unlink(tmp.c_str());
    if (linked == 0) {
      CAIRN_RETURN_IF_ERROR(env->sync_dir(dir));
      return std::unique_ptr<run_lease>(new run_lease(path, std::move(me), timeout_s));
    }
    if (err != EEXIST) return status::from_errno(err, "the lease of run '" + run + "': link " + path);
    auto holder = read_holder(path);
    if (!holder) {
      if (holder.error().code() == errc::not_found) continue;  // released meanwhile
      return holder.take_status().with_context("the lease of run '" + run + "'");
    }
    // Alive unless known dead, or silent (no renewal, as seen from here) for
    // timeout_s.
    bool dead = known_dead(*holder, me);
    if (!dead) {
      stamp first;
      if (!stamp_of(path, &first)) continue;
      if (!told) {
        told = true;
        std::fprintf(stderr,
                     "cairn: run '%s' has a lease held by %s; waiting up to %.0f s to see whether it is renewed\n",
                     run.c_str(), holder->describe().c_str(), timeout_s);
      }
      const double until = util::now_s() + timeout_s;
      bool renewed = false;
      while (util::now_s() < until) {
        struct timespec ts {0, 100 * 1000 * 1000};
        nanosleep(&ts, nullptr);
        // A holder that ends meanwhile (the ranks of a killed mpirun linger
        // for a moment) is taken over at once.
        if (known_dead(*holder, me)) break;
        stamp now;
        if (!stamp_of(path, &now) || !(now == first)) {
          renewed = true;
          break;
        }
      }
      if (renewed) {
        auto again = read_holder(path);
        if (!again && again.error().code() == errc::not_found) continue;  // released: take it
        return status(errc::busy,
                      "run '" + run + "' is being written by another execution: " + holder->describe() +
                          ". Two executions of one run would overwrite each other's checkpoints: wait for it to "
                          "end, or give this one another run (CAIRN_RUN). The lease is " + path);
      }
      dead = true;
    }
    // Move the dead holder's lease aside, and check it was the one judged
    // dead (not a new holder that took it meanwhile); then take it.
    const std::string aside = path + ".stale." + me.id;
    if (::rename(path.c_str(), aside.c_str()) != 0) {
      if (errno == ENOENT) continue;  // someone else moved it
      return status::from_errno(errno, "the lease of run '" + run + "': rename " + path);
    }
    auto moved = read_holder(aside);
    if (moved && moved->id != holder->id) {
      // A live lease: put it back (unless it was replaced again) and judge anew.
      (void)::link(aside.c_str(), path.c_str());
      (void)::unlink(aside.c_str());
      continue;
    }
    (void)::unlink(aside.c_str());
    std::fprintf(stderr, "cairn: run '%s': took over the lease of %s, which ended without releasing it\n",
                 run.c_str(), holder->describe().c_str());
  }
}

}  // namespace cairn
