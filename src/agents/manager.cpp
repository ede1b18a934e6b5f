#include "agents/manager.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "agents/log.hpp"
#include "storage/storage_env.hpp"
#include "util/clock.hpp"
#include "util/hex.hpp"

extern char** environ;

namespace cairn::agents {
namespace {

using nlohmann::json;

std::string describe_exit(int st) {
  if (WIFEXITED(st)) return "exit status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return std::string("killed by signal ") + std::to_string(WTERMSIG(st));
  return "status " + std::to_string(st);
}

std::string substitute(std::string s, const std::map<std::string, std::string>& vars) {
  for (const auto& [k, v] : vars) {
    const std::string key = "{" + k + "}";
    for (size_t pos = s.find(key); pos != std::string::npos; pos = s.find(key, pos + v.size())) {
      s.replace(pos, key.size(), v);
    }
  }
  return s;
}

}  // namespace

manager_service::manager_service(manager_options o)
    : opt_(std::move(o)), loop_(opt_.secret, opt_.limits), sampler_(opt_.proc_root, opt_.sys_root, opt_.nominal_power_w) {}

manager_service::~manager_service() {
  loop_.attach(nullptr);
  // Never leave children behind unwatched when destroyed without run().
  for (auto& [id, a] : agents_) {
    if (a.pid > 0) {
      ::kill(a.pid, SIGKILL);
      ::waitpid(a.pid, nullptr, 0);
    }
  }
  for (auto& a : stopping_) {
    if (a.pid > 0) {
      ::kill(a.pid, SIGKILL);
      ::waitpid(a.pid, nullptr, 0);
    }
  }
}

result<std::unique_ptr<manager_service>> manager_service::open(manager_options o) {
  CAIRN_RETURN_IF_ERROR(crypto_init());
  if (o.secret.size() < kMinSecretSize) return status(errc::invalid_argument, "manager: no deployment secret");
  if (!valid_name(o.node_id)) {
    return status(errc::invalid_argument, "invalid node id '" + o.node_id + "' (1-128 of [A-Za-z0-9._:@-])");
  }
  if (o.run_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    o.run_dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/cairn-manager-" + o.node_id;
  }
  CAIRN_RETURN_IF_ERROR(storage::storage_env::posix()->make_dirs(o.run_dir));
  if (!o.agent_program.empty() && ::access(o.agent_program.c_str(), X_OK) != 0) {
    return status(errc::invalid_argument, "agent program " + o.agent_program + " is not executable");
  }
  std::unique_ptr<manager_service> m(new manager_service(std::move(o)));
  CAIRN_RETURN_IF_ERROR(m->loop_.listen(m->opt_.listen));
  if (m->opt_.metrics_listen) {
    manager_service* self = m.get();
    m->metrics_ = std::make_unique<metrics_http_server>([self]() { return self->openmetrics(); });
    CAIRN_RETURN_IF_ERROR(m->metrics_->listen(*m->opt_.metrics_listen));
    m->loop_.attach(m->metrics_.get());
    log_info("metrics at http://" + m->metrics_->listen_address() + "/metrics");
  }
  log_info("node " + m->opt_.node_id + " listening on " + m->address() + ", controller " +
           m->opt_.controller.to_string() + ", agents in " + m->opt_.run_dir +
           (m->opt_.agent_program.empty() ? " (no agent program: agents are recorded, not launched)"
                                          : ", program " + m->opt_.agent_program));
  return m;
}

std::vector<std::string> manager_service::agent_argv(const agent_proc& a) const {
  const std::string id = std::to_string(a.want.agent);
  std::map<std::string, std::string> vars = {
      {"agent", id},
      {"app", std::to_string(a.want.app)},
      {"app_name", a.want.app_name},
      {"node", opt_.node_id},
      {"controller", opt_.controller.to_string()},
      {"reserve", std::to_string(a.want.reserve)},
      {"run_dir", opt_.run_dir},
      {"stats_file", opt_.run_dir + "/agent-" + id + ".stats"},
      {"secret_file", opt_.secret_file},
      {"store", a.want.store},
  };
  std::vector<std::string> templ = opt_.agent_args;
  if (templ.empty()) {
    templ = {"--agent-id", "{agent}", "--app-id", "{app}",        "--app",        "{app_name}",
             "--node",     "{node}",  "--controller", "{controller}", "--stats-file", "{stats_file}"};
    if (!a.want.store.empty()) templ.insert(templ.end(), {"--persistent", "{store}"});
  }
  std::vector<std::string> argv = {opt_.agent_program};
  for (const auto& t : templ) argv.push_back(substitute(t, vars));
  if (!a.key.empty()) argv.insert(argv.end(), {"--key-fd", "3"});
  return argv;
}

void manager_service::start_agent(agent_proc& a, double now) {
  if (opt_.agent_program.empty()) {
    a.state = "unlaunched";
    return;
  }
  std::vector<std::string> args = agent_argv(a);
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const std::string log_path = opt_.run_dir + "/agent-" + std::to_string(a.want.agent) + ".log";
  (void)::unlink((opt_.run_dir + "/agent-" + std::to_string(a.want.agent) + ".stats").c_str());
  // Nothing the previous process reported (its endpoint above all) is true of the new one.
  a.endpoint.clear();
  a.has_stats = false;
  a.memory_held = a.bytes = a.checkpoints = a.prev_bytes = a.prev_checkpoints = 0;
  a.bw = a.rate = 0;

  // The key goes on a pipe the agent inherits as descriptor 3, written and
  // closed here before it starts (64 hex digits fit any pipe's buffer).
  int key_fd = -1;
  if (!a.key.empty()) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
      a.state = "failed";
      a.last_exit = std::string("no pipe for its key: ") + std::strerror(errno);
      a.next_start = now + 1;
      log_error("agent " + std::to_string(a.want.agent) + ": " + a.last_exit);
      return;
    }
    const std::string hex = util::hex_encode(a.key) + "\n";
    const bool written = ::write(p[1], hex.data(), hex.size()) == static_cast<ssize_t>(hex.size());
    ::close(p[1]);
    // Above 3, so that dup2 onto 3 clears close-on-exec whatever pipe2 returned.
    key_fd = ::fcntl(p[0], F_DUPFD_CLOEXEC, 10);
    ::close(p[0]);
    if (!written || key_fd < 0) {
      if (key_fd >= 0) ::close(key_fd);
      a.state = "failed";
      a.last_exit = "cannot hand it its key";
      a.next_start = now + 1;
      log_error("agent " + std::to_string(a.want.agent) + ": " + a.last_exit);
      return;
    }
  }
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  if (key_fd >= 0) posix_spawn_file_actions_adddup2(&fa, key_fd, 3);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGTERM, SIGINT, SIGPIPE, SIGCHLD, SIGHUP}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, opt_.agent_program.c_str(), &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (key_fd >= 0) ::close(key_fd);
  if (rc != 0) {
    a.pid = 0;
    a.state = "failed";
    a.last_exit = std::string("spawn failed: ") + std::strerror(rc);
    a.next_start = now + std::min(30.0, 1.0 * (1 << std::min(a.restarts, 5)));
    ++a.restarts;
    log_error("agent " + std::to_string(a.want.agent) + ": " + a.last_exit);
    return;
  }
  a.pid = pid;
  a.state = "running";
  a.has_stats = false;
  a.bw = a.rate = 0;
  log_info("started agent " + std::to_string(a.want.agent) + " of application " + a.want.app_name + " (" +
           std::to_string(a.want.app) + "), pid " + std::to_string(pid));
}

void manager_service::stop_agent(agent_proc& a, double now) {
  a.stopping = true;
  a.state = "stopping";
  a.kill_at = now + opt_.stop_grace_s;
  if (a.pid > 0) {
    ::kill(a.pid, SIGTERM);
    log_info("stopping agent " + std::to_string(a.want.agent) + " (pid " + std::to_string(a.pid) + ")");
  }
}

void manager_service::reap(double now) {
  for (auto& [id, a] : agents_) {
    if (a.pid <= 0) {
      if (a.state != "unlaunched" && now >= a.next_start && !opt_.agent_program.empty()) start_agent(a, now);
      continue;
    }
    int st = 0;
    pid_t r = ::waitpid(a.pid, &st, WNOHANG);
    if (r != a.pid) continue;
    a.pid = 0;
    a.state = "exited";
    a.endpoint.clear();  // nobody answers there any more
    a.last_exit = describe_exit(st);
    double delay = std::min(30.0, 1.0 * (1 << std::min(a.restarts, 5)));
    a.next_start = now + delay;
    ++a.restarts;
    log_warn("agent " + std::to_string(id) + " " + a.last_exit + "; restarting in " + std::to_string(delay) + " s");
  }
  for (auto it = stopping_.begin(); it != stopping_.end();) {
    if (it->pid <= 0) {
      it = stopping_.erase(it);
      continue;
    }
    int st = 0;
    if (::waitpid(it->pid, &st, WNOHANG) == it->pid) {
      log_info("agent " + std::to_string(it->want.agent) + " stopped (" + describe_exit(st) + ")");
      it = stopping_.erase(it);
      continue;
    }
    if (now >= it->kill_at && it->kill_at > 0) {
      ::kill(it->pid, SIGKILL);
      it->kill_at = 0;  // once
    }
    ++it;
  }
}

void manager_service::apply_update(const node_update& u) {
  const double now = util::now_s();
  std::set<uint64_t> want;
  for (const auto& d : u.agents) want.insert(d.agent);
  for (auto it = agents_.begin(); it != agents_.end();) {
    if (want.count(it->first)) {
      ++it;
      continue;
    }
    stop_agent(it->second, now);
    stopping_.push_back(it->second);
    it = agents_.erase(it);
  }
  for (const auto& d : u.agents) {
    auto it = agents_.find(d.agent);
    if (it != agents_.end()) {
      it->second.want = d;
      continue;
    }
    agent_proc& a = agents_[d.agent];
    a.want = d;
    if (!d.key_box.empty()) {
      std::string box;
      auto key = util::hex_decode(d.key_box, d.key_box.size() / 2, &box)
                     ? open_sealed(box_, box)
                     : result<std::string>(status(errc::invalid_argument, "its key box is not hex"));
      if (!key || key->size() != kAppKeySize) {
        // Never an agent without its key: it would serve anyone.
        a.state = "failed";
        a.last_exit = "no usable key for application " + d.app_name + ": " +
                      (key ? std::string("a key of the wrong size") : key.error().message());
        a.next_start = now + 1e9;
        log_error("agent " + std::to_string(d.agent) + ": " + a.last_exit);
        continue;
      }
      a.key = std::move(key).value();
    }
    start_agent(a, now);
  }
  heartbeat_s_ = std::max(0.01, u.heartbeat_ms / 1000.0);
}

result<agent_stats> parse_agent_stats(std::string_view text) {
  if (text.size() > 65536) return status(errc::invalid_argument, "agent stats: larger than 64 KiB");
  CAIRN_ASSIGN_OR_RETURN(json j, util::parse_json_object(std::string(text)));
  fields f(j, "agent stats");
  agent_stats st;
  f.u64("bytes_in", &st.bytes_in, false);
  f.u64("bytes_out", &st.bytes_out, false);
  f.u64("checkpoints", &st.checkpoints, false);
  f.u64("memory_held", &st.memory_held, false);
  f.u64("memory_budget", &st.memory_budget, false);
  f.u64("cancelled", &st.cancelled, false);
  f.str("endpoint", &st.endpoint, false, 1024);
  for (auto [mode, t] : {std::pair<std::string, agent_stats::transfers*>{"pull", &st.pulls}, {"push", &st.pushes}}) {
    f.u64((mode + "s").c_str(), &t->held, false);
    f.u64((mode + "_bytes").c_str(), &t->bytes, false);
    f.u64((mode + "_failures").c_str(), &t->failures, false);
    f.num((mode + "_seconds").c_str(), &t->seconds, false);
  }
  if (!f.ok()) return f.error();
  return st;
}

std::optional<agent_stats> manager_service::load_stats(const agent_proc& a) const {
  auto text = storage::storage_env::posix()->read_all(opt_.run_dir + "/agent-" + std::to_string(a.want.agent) + ".stats");
  if (!text) return std::nullopt;
  auto st = parse_agent_stats(*text);
  if (!st) return std::nullopt;
  return std::move(st).value();
}

void manager_service::read_stats(agent_proc& a, double now) {
  auto st = load_stats(a);
  if (!st) return;
  const uint64_t in = st->bytes_in, out = st->bytes_out, ck = st->checkpoints, held = st->memory_held;
  const std::string endpoint = st->endpoint;
  a.last = std::move(*st);
  if (a.has_stats && now > a.prev_t) {
    a.bw = static_cast<double>(in + out - std::min(in + out, a.prev_bytes)) / (now - a.prev_t);
    a.rate = static_cast<double>(ck - std::min(ck, a.prev_checkpoints)) / (now - a.prev_t);
  }
  a.prev_bytes = in + out;
  a.prev_checkpoints = ck;
  a.prev_t = now;
  a.bytes = in + out;
  a.checkpoints = ck;
  a.memory_held = held;
  a.endpoint = endpoint;
  a.has_stats = true;
}

json manager_service::node_body(double now, bool registering) {
  agent_counters counters;
  json reports = json::array();
  for (auto& [id, a] : agents_) {
    if (a.pid > 0) read_stats(a, now);
    if (a.has_stats) {
      counters.any = true;
      counters.bytes += a.bytes;
      counters.checkpoints += a.checkpoints;
    }
    agent_report r;
    r.agent = id;
    r.app = a.want.app;
    r.state = a.state;
    r.pid = a.pid;
    r.memory_held = a.memory_held;
    r.bw = a.bw;
    r.rate = a.rate;
    r.endpoint = a.endpoint;
    reports.push_back(to_json(r));
  }
  last_metrics_ = sampler_.sample(now, counters);
  json body = {{"node", opt_.node_id}, {"metrics", to_json(last_metrics_)}, {"agents", reports}};
  if (registering) {
    body["address"] = address();
    body["capacity"] = opt_.capacity;
    body["box_public"] = util::hex_encode(box_.public_key);
  }
  return body;
}

void manager_service::connect_controller(double now) {
  if (ctl_conn_ != 0 || now < next_connect_) return;
  auto c = loop_.connect(opt_.controller, "manager", opt_.node_id, 2000, opt_.service_secret);
  if (!c) {
    if (c.error().message() != last_connect_error_) {
      log_warn("cannot reach the controller: " + c.error().message() + " (agents keep running; retrying)");
      last_connect_error_ = c.error().message();
    }
    next_connect_ = now + backoff_;
    backoff_ = std::min(5.0, backoff_ * 2);
    return;
  }
  ctl_conn_ = *c;
  backoff_ = 0.5;
  last_connect_error_.clear();
  loop_.send(ctl_conn_, ctl_type::node_register, node_body(now, true));
}

void manager_service::on_message(uint64_t conn, ctl_message& m) {
  const double now = util::now_s();
  if (conn == ctl_conn_) {
    if (m.type == ctl_type::node_update) {
      auto u = parse_node_update(m.body);
      if (!u) {
        log_rejection(opt_.controller.to_string(), "bad_payload", u.error().message());
        return;
      }
      if (!registered_) {
        log_info("registered with the controller at " + opt_.controller.to_string() + ": " +
                 std::to_string(u->agents.size()) + " agents");
        next_heartbeat_ = now;
      }
      registered_ = true;
      apply_update(*u);
    } else if (m.type == ctl_type::error) {
      std::string code, text;
      fields f(m.body, "error");
      f.str("code", &code, false, 64);
      f.str("message", &text, false, 65536);
      if (code == "not_found" && !left_) {
        // The controller no longer knows this node (it was declared lost): register again.
        log_warn("controller: " + text + "; registering again");
        registered_ = false;
        loop_.send(ctl_conn_, ctl_type::node_register, node_body(now, true));
      } else {
        log_warn("controller error: " + code + ": " + text);
      }
    } else if (m.type == ctl_type::reply) {
      left_ = true;  // the only request answered with a plain reply is node_leave
    }
    return;
  }
  if (m.type == ctl_type::status) {
    loop_.send(conn, ctl_type::reply, local_status(now));
  } else {
    connection* c = loop_.find(conn);
    log_rejection(c != nullptr ? c->peer() : "?", "unexpected", std::string(type_name(m.type)) + " sent to a manager");
    loop_.send(conn, ctl_type::error,
               error_body(status(errc::invalid_argument, std::string(type_name(m.type)) + " is not a request to a manager")));
  }
}

void manager_service::on_closed(uint64_t conn) {
  if (conn != ctl_conn_) return;
  ctl_conn_ = 0;
  registered_ = false;
  next_connect_ = util::now_s() + backoff_;
  if (!left_) log_warn("lost the connection to the controller; agents keep running; reconnecting");
}

json manager_service::local_status(double now) {
  json list = json::array();
  for (const auto& [id, a] : agents_) {
    list.push_back({{"agent", id},
                    {"app", a.want.app},
                    {"app_name", a.want.app_name},
                    {"state", a.state},
                    {"pid", a.pid},
                    {"restarts", a.restarts},
                    {"last_exit", a.last_exit},
                    {"memory_held", a.memory_held},
                    {"memory_reserved", a.want.reserve}});
  }
  (void)now;
  return {{"node", opt_.node_id},
          {"address", address()},
          {"controller", opt_.controller.to_string()},
          {"connected", ctl_conn_ != 0},
          {"registered", registered_},
          {"run_dir", opt_.run_dir},
          {"agent_program", opt_.agent_program},
          {"metrics", to_json(last_metrics_)},
          {"agents", list}};
}

std::string manager_service::openmetrics() {
  using labels = openmetrics_builder::labels;
  const std::string& node = opt_.node_id;
  // The agents' counters as their stats files say now (a scrape between
  // heartbeats sees them fresh); the last reading of an agent not running.
  struct row {
    const agent_proc* a;
    agent_stats st;
  };
  std::vector<row> rows;
  std::map<std::string, uint64_t> states{{"starting", 0}, {"running", 0}, {"exited", 0}, {"failed", 0},
                                         {"unlaunched", 0}};
  uint64_t held = 0, reserved = 0;
  for (const auto& [id, a] : agents_) {
    std::optional<agent_stats> st = a.pid > 0 ? load_stats(a) : std::nullopt;
    rows.push_back({&a, st ? std::move(*st) : a.last});
    ++states[a.state];
    held += rows.back().st.memory_held;
    reserved += a.want.reserve;
  }
  openmetrics_builder b;
  const labels nl{{"node", node}};
  b.family("cairn_manager_connected", "gauge", "1 while the manager is registered with its controller.");
  b.sample(nl, uint64_t{ctl_conn_ != 0 && registered_ ? 1u : 0u});
  b.family("cairn_manager_capacity_agents", "gauge", "Agents the node takes (--capacity; 0: the controller's default).");
  b.sample(nl, uint64_t{opt_.capacity});
  b.family("cairn_manager_memory_total_bytes", "gauge", "The node's memory (MemTotal) at the last heartbeat.");
  b.sample(nl, last_metrics_.mem_total);
  b.family("cairn_manager_memory_available_bytes", "gauge", "The node's available memory (MemAvailable) at the last heartbeat.");
  b.sample(nl, last_metrics_.mem_free);
  b.family("cairn_manager_memory_held_bytes", "gauge", "Checkpoint memory the node's agents hold.");
  b.sample(nl, held);
  b.family("cairn_manager_memory_reserved_bytes", "gauge", "Memory the controller reserved for the node's agents.");
  b.sample(nl, reserved);
  b.family("cairn_manager_agents", "gauge", "The node's agents by state.");
  for (const auto& [st, n] : states) b.sample({{"node", node}, {"state", st}}, n);

  auto al = [&](const agent_proc& a) {
    return labels{{"node", node}, {"agent", std::to_string(a.want.agent)}, {"app", a.want.app_name}};
  };
  auto per_agent = [&](const char* name, const char* type, const char* help, auto get) {
    b.family(name, type, help);
    for (const row& r : rows) b.sample(al(*r.a), get(r));
  };
  per_agent("cairn_agent_memory_held_bytes", "gauge", "Checkpoint memory the agent holds.",
            [](const row& r) { return r.st.memory_held; });
  per_agent("cairn_agent_memory_reserved_bytes", "gauge", "Memory the controller reserved for the agent.",
            [](const row& r) { return r.a->want.reserve; });
  per_agent("cairn_agent_memory_budget_bytes", "gauge", "The agent's memory budget (0: no limit).",
            [](const row& r) { return r.st.memory_budget; });
  per_agent("cairn_agent_restarts", "counter", "Times the manager restarted the agent after it exited.",
            [](const row& r) { return static_cast<uint64_t>(r.a->restarts); });
  auto per_mode = [&](const char* name, const char* help, auto get) {
    b.family(name, "counter", help);
    for (const row& r : rows) {
      for (auto [mode, t] : {std::pair<const char*, const agent_stats::transfers*>{"pull", &r.st.pulls},
                             {"push", &r.st.pushes}}) {
        labels l = al(*r.a);
        l.emplace_back("mode", mode);
        b.sample(l, get(*t));
      }
    }
  };
  per_mode("cairn_agent_transfers", "Checkpoint images the agent received and holds (pull: pulled or lent; push: pushed).",
           [](const agent_stats::transfers& t) { return t.held; });
  per_mode("cairn_agent_transfer_bytes", "Bytes of those images.",
           [](const agent_stats::transfers& t) { return t.bytes; });
  per_mode("cairn_agent_transfer_seconds", "Seconds those transfers took (READY to held), summed.",
           [](const agent_stats::transfers& t) { return t.seconds; });
  per_mode("cairn_agent_transfer_failures", "Transfers not held: refused (memory), failed or cancelled.",
           [](const agent_stats::transfers& t) { return t.failures; });
  per_agent("cairn_agent_out_bytes", "counter", "Bytes the agent wrote to the store or sent back for restarts.",
            [](const row& r) { return r.st.bytes_out; });
  per_agent("cairn_agent_cancelled_transfers", "counter",
            "Transfers the agent cancelled because their application was gone.",
            [](const row& r) { return r.st.cancelled; });
  return b.finish();
}

void manager_service::tick(double now) {
  connect_controller(now);
  if (ctl_conn_ != 0 && registered_ && now >= next_heartbeat_) {
    loop_.send(ctl_conn_, ctl_type::heartbeat, node_body(now, false));
    next_heartbeat_ = now + heartbeat_s_;
  }
  reap(now);
}

void manager_service::run_once(int timeout_ms) {
  loop_.run_once(timeout_ms, *this);
  tick(util::now_s());
}

status manager_service::run(const std::atomic<bool>* stop) {
  while (!stop->load()) run_once(50);
  // Leave: the controller moves this node's agents elsewhere first.
  if (ctl_conn_ != 0 && registered_) {
    log_info("leaving: asking the controller to move this node's agents");
    loop_.send(ctl_conn_, ctl_type::node_leave, json{{"node", opt_.node_id}});
    const double until = util::now_s() + 5;
    while (!left_ && ctl_conn_ != 0 && util::now_s() < until) loop_.run_once(50, *this);
    if (!left_) log_warn("the controller did not confirm the leave; its heartbeat timeout will move the agents");
  }
  const double now = util::now_s();
  for (auto& [id, a] : agents_) {
    stop_agent(a, now);
    stopping_.push_back(a);
  }
  agents_.clear();
  const double until = now + opt_.stop_grace_s + 1;
  while (!stopping_.empty() && util::now_s() < until) {
    reap(util::now_s());
    if (!stopping_.empty()) ::usleep(20000);
  }
  for (auto& a : stopping_) {
    if (a.pid > 0) {
      ::kill(a.pid, SIGKILL);
      ::waitpid(a.pid, nullptr, 0);
    }
  }
  stopping_.clear();
  log_info("stopped");
  return {};
}

}  // namespace cairn::agents
