#include "client/batch_job.hpp"

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include "util/mutex.hpp"

namespace cairn::batch {
namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "the signal handler needs a lock-free counter");

// Written before the handler is installed and read only by it (sigaction
// orders the two); restored after it is removed.
std::atomic<uint64_t> g_warnings{0};

struct sigaction g_old[NSIG];
cairn::mutex g_mu;
int g_installed[NSIG] CAIRN_GUARDED_BY(g_mu);  // reference count per signal
std::vector<std::vector<int>> g_stack CAIRN_GUARDED_BY(g_mu);  // the signals of each install, for release

void on_warning(int sig, siginfo_t* info, void* ctx) {
  const int saved = errno;
  g_warnings.fetch_add(1, std::memory_order_relaxed);
  // The application's own handler runs too (chained, not replaced).
  const struct sigaction& old = g_old[sig];
  if (old.sa_flags & SA_SIGINFO) {
    if (old.sa_sigaction != nullptr) old.sa_sigaction(sig, info, ctx);
  } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN && old.sa_handler != nullptr) {
    old.sa_handler(sig);
  }
  // The default action is not taken: a process warned by SIGTERM or SIGUSR1
  // goes on until it has checkpointed; the batch system's SIGKILL ends it. A
  // default action re-raised here would end a rank warned before it first
  // asked (Slurm sends --signal=USR1@T at once when less than T is left).
  errno = saved;
}

struct named {
  const char* name;
  int sig;
};
constexpr named kNames[] = {{"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"INT", SIGINT},
                            {"HUP", SIGHUP},   {"XCPU", SIGXCPU}, {"ALRM", SIGALRM}, {"CONT", SIGCONT},
                            {"QUIT", SIGQUIT}, {"URG", SIGURG}};

}  // namespace

bool in_batch_job() {
  const char* j = std::getenv("SLURM_JOB_ID");
  return j && *j;
}

result<std::vector<int>> parse_signals(const std::string& text, bool in_batch_job) {
  if (text == "auto") return parse_signals(in_batch_job ? "USR1,TERM" : "USR1");
  std::vector<int> out;
  if (text.empty() || text == "none") return out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? text.size() + 1 : comma + 1;
    std::string name = item;
    for (auto& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (name.rfind("SIG", 0) == 0) name = name.substr(3);
    int sig = 0;
    for (const auto& n : kNames)
      if (name == n.name) sig = n.sig;
    if (sig == 0 && !name.empty() && name.find_first_not_of("0123456789") == std::string::npos) {
      long x = std::strtol(name.c_str(), nullptr, 10);
      if (x > 0 && x < NSIG && x != SIGKILL && x != SIGSTOP) sig = static_cast<int>(x);
    }
    if (sig == 0)
      return status(errc::invalid_argument,
                    "configuration key 'warning_signals': bad signal '" + item +
                        "' (expected names such as USR1, TERM, XCPU or numbers, separated by commas; 'none' for no signal)");
    out.push_back(sig);
  }
  return out;
}

status install_warning_handler(const std::vector<int>& signals) {
  cairn::lock_guard lk(g_mu);
  std::vector<int> done;
  for (int sig : signals) {
    if (sig <= 0 || sig >= NSIG) return {errc::invalid_argument, "signal " + std::to_string(sig) + " out of range"};
    bool dup = false;
    for (int d : done) dup = dup || d == sig;
    if (dup) continue;
    if (g_installed[sig]++ == 0) {
      struct sigaction sa {};
      sa.sa_sigaction = on_warning;
      sa.sa_flags = SA_SIGINFO | SA_RESTART;
      sigemptyset(&sa.sa_mask);
      struct sigaction old {};
      if (sigaction(sig, nullptr, &old) != 0 || (g_old[sig] = old, sigaction(sig, &sa, nullptr) != 0)) {
        const int e = errno;
        --g_installed[sig];
        for (int d : done)
          if (--g_installed[d] == 0) sigaction(d, &g_old[d], nullptr);
        return {errc::io_error, "installing the handler of warning signal " + std::to_string(sig) + ": " +
                                    std::strerror(e)};
      }
    }
    done.push_back(sig);
  }
  g_stack.push_back(std::move(done));
  return {};
}

void release_warning_handler() {
  cairn::lock_guard lk(g_mu);
  if (g_stack.empty()) return;
  for (int sig : g_stack.back()) {
    if (--g_installed[sig] != 0) continue;
    // Put the application's action back, unless it replaced ours meanwhile.
    struct sigaction cur {};
    if (sigaction(sig, nullptr, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_warning)
      sigaction(sig, &g_old[sig], nullptr);
  }
  g_stack.pop_back();
}

uint64_t warnings_received() { return g_warnings.load(std::memory_order_relaxed); }

result<std::optional<double>> job_end_time(const std::string& deadline, double now) {
  if (!deadline.empty()) {
    const bool relative = deadline[0] == '+';
    const std::string num = relative ? deadline.substr(1) : deadline;
    char* end = nullptr;
    double x = std::strtod(num.c_str(), &end);
    if (num.empty() || *end != '\0' || !(x >= 0) || std::isinf(x))
      return status(errc::invalid_argument, "configuration key 'deadline': bad value '" + deadline +
                                                "' (expected Unix seconds, or +SECONDS from the start of the process)");
    return std::optional<double>(relative ? now + x : x);
  }
  if (const char* e = std::getenv("SLURM_JOB_END_TIME"); e && *e) {
    char* end = nullptr;
    double x = std::strtod(e, &end);
    if (*end == '\0' && x > 0 && !std::isinf(x)) return std::optional<double>(x);
  }
  return std::optional<double>();
}

std::string node_identity(const std::string& configured, const std::string& host) {
  if (!configured.empty()) return configured;
  if (const char* n = std::getenv("SLURMD_NODENAME"); n && *n) return n;
  if (const char* n = std::getenv("SLURM_NODEID"); n && *n) return std::string("node") + n;
  return host;
}

std::string job_id() {
  const char* j = std::getenv("SLURM_JOB_ID");
  return j ? j : "";
}

}  // namespace cairn::batch
