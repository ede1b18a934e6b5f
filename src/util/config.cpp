#include "util/config.hpp"

#include "util/hash.hpp"
#include "util/names.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <functional>
#include <sstream>
#include <toml++/toml.h>

extern char** environ;

namespace cairn {
namespace {

struct key_def {
  const char* name;
  const char* help;
  std::function<status(config&, const std::string&)> set;
  std::function<std::string(const config&)> get;
};

status bad_value(const std::string& key, const std::string& value, const char* expected) {
  return {errc::invalid_argument,
          "configuration key '" + key + "': bad value '" + value + "' (expected " + expected + ")"};
}

result<int64_t> parse_int(const std::string& key, const std::string& v, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi) {
    return bad_value(key, v, ("an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]").c_str());
  }
  return static_cast<int64_t>(x);
}

result<bool> parse_bool(const std::string& key, const std::string& v) {
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  return bad_value(key, v, "true or false");
}

status parse_double(const std::string& key, const std::string& v, double* out) {
  char* end = nullptr;
  double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(d >= 0) || std::isinf(d))
    return bad_value(key, v, "a non-negative number such as 1e-9");
  *out = d;
  return {};
}

// A key whose values are the spellings of an enumeration: each spelling
// written once, for parsing and for describing.
template <typename E>
key_def enum_key(const char* name, const char* help, E config::*member,
                 std::vector<std::pair<const char*, E>> choices) {
  auto set = [name, member, choices](config& c, const std::string& v) -> status {
    std::string expected;
    for (auto& [n, e] : choices) {
      if (v == n) { c.*member = e; return {}; }
      if (!expected.empty()) expected += ", ";
      expected += n;
    }
    return bad_value(name, v, ("one of " + expected).c_str());
  };
  auto get = [member, choices](const config& c) {
    for (auto& [n, e] : choices)
      if (c.*member == e) return std::string(n);
    return std::string(choices.front().first);
  };
  return {name, help, std::move(set), std::move(get)};
}

status set_int(const std::string& k, const std::string& v, int lo, int hi, int* out) {
  auto r = parse_int(k, v, lo, hi);
  if (!r) return r.take_status();
  *out = static_cast<int>(*r);
  return {};
}

// Longer than 120 lines for a reason: the table of every configuration key
// with its parser, one entry per key.
const std::vector<key_def>& keys() {
  static const std::vector<key_def> defs = {
      {"run", "run id", [](config& c, const std::string& v) -> status {
         CAIRN_RETURN_IF_ERROR(util::check_name("configuration key 'run': run", v));
         c.run = v; c.run_set = true; return {}; }, [](const config& c) { return c.run; }},
      {"run_scope", "what the default run names: job (program, directory, Slurm job and step) or program",
       [](config& c, const std::string& v) -> status {
         if (v != "job" && v != "program") return bad_value("run_scope", v, "job or program");
         c.run_scope_job = v == "job";
         return {}; }, [](const config& c) { return std::string(c.run_scope_job ? "job" : "program"); }},
      {"lease_timeout", "seconds after which an unrenewed run lease is abandoned",
       [](config& c, const std::string& v) -> status {
         CAIRN_RETURN_IF_ERROR(parse_double("lease_timeout", v, &c.lease_timeout));
         if (c.lease_timeout <= 0) return bad_value("lease_timeout", v, "a positive number of seconds");
         return {}; },
       [](const config& c) { std::ostringstream os; os << c.lease_timeout; return os.str(); }},
      {"application", "application name", [](config& c, const std::string& v) -> status {
         CAIRN_RETURN_IF_ERROR(util::check_text("configuration key 'application'", v));
         c.application = v; return {}; }, [](const config& c) { return c.application; }},
      {"code_version", "code version", [](config& c, const std::string& v) -> status {
         CAIRN_RETURN_IF_ERROR(util::check_text("configuration key 'code_version'", v));
         c.code_version = v; return {}; }, [](const config& c) { return c.code_version; }},
      {"tags", "key=value tags", [](config& c, const std::string& v) -> status {
         std::stringstream ss(v);
         std::string kv;
         while (std::getline(ss, kv, ','))
           if (kv.find('=') == std::string::npos || kv.front() == '=')
             return bad_value("tags", v, "comma-separated key=value pairs");
         CAIRN_RETURN_IF_ERROR(util::check_text("configuration key 'tags'", v));
         c.tags = v; return {}; }, [](const config& c) { return c.tags; }},
      {"scratch", "node-local level directory", [](config& c, const std::string& v) -> status {
         if (v.empty()) return bad_value("scratch", v, "a directory path");
         c.scratch = v; return {}; }, [](const config& c) { return c.scratch; }},
      {"persistent", "persistent level directory", [](config& c, const std::string& v) -> status {
         if (v.empty()) return bad_value("persistent", v, "a directory path");
         c.persistent = v; return {}; }, [](const config& c) { return c.persistent; }},
      enum_key<engine_mode>("mode", "thread or sync", &config::mode,
                            {{"thread", engine_mode::thread}, {"sync", engine_mode::sync}}),
      enum_key<engine_host>("engine_host",
                            "where the engine runs: thread (in the application) or daemon (cairnd, one per node)",
                            &config::engine_host, {{"thread", engine_host::thread}, {"daemon", engine_host::daemon}}),
      {"daemon_program", "path of the cairnd program (engine_host = daemon)", [](config& c, const std::string& v) -> status {
         c.daemon_program = v; return {}; }, [](const config& c) { return c.daemon_program; }},
      {"daemon_drain_s", "seconds cairnd goes on after SIGTERM to finish and commit what it holds",
       [](config& c, const std::string& v) { return parse_double("daemon_drain_s", v, &c.daemon_drain_s); },
       [](const config& c) { std::ostringstream os; os << c.daemon_drain_s; return os.str(); }},
      {"io_threads", "engine worker threads", [](config& c, const std::string& v) {
         return set_int("io_threads", v, 1, 256, &c.io_threads); },
       [](const config& c) { return std::to_string(c.io_threads); }},
      enum_key<placement>("placement", "CPU placement of engine threads", &config::placement,
                          {{"none", placement::none}, {"core", placement::core}, {"socket", placement::socket},
                           {"node", placement::node}}),
      enum_key<capture_overlap>("write_during_capture",
                                "checksum pass and persistent write during the capture: auto, true or false",
                                &config::write_during_capture,
                                {{"auto", capture_overlap::automatic}, {"true", capture_overlap::on},
                                 {"false", capture_overlap::off}}),
      enum_key<capture_method>("capture", "how a checkpoint captures the regions: copy, cow, auto or copy_or_cow",
                               &config::capture,
                               {{"copy", capture_method::copy}, {"cow", capture_method::cow},
                                {"auto", capture_method::automatic}, {"copy_or_cow", capture_method::copy_or_cow}}),
      enum_key<restart_verification>("restart_verify",
                                     "when a restart from the node-local level verifies the data: before or while",
                                     &config::restart_verify,
                                     {{"before", restart_verification::before},
                                      {"while", restart_verification::during}}),
      enum_key<thread_priority>("engine_priority", "scheduling of engine threads: normal, batch or idle",
                                &config::engine_priority,
                                {{"normal", thread_priority::normal}, {"batch", thread_priority::batch},
                                 {"idle", thread_priority::idle}}),
      {"engine_nice", "nice increment of engine threads (0..19)", [](config& c, const std::string& v) {
         return set_int("engine_nice", v, 0, 19, &c.engine_nice); },
       [](const config& c) { return std::to_string(c.engine_nice); }},
      {"keep_local", "versions kept locally (0 = all)", [](config& c, const std::string& v) {
         return set_int("keep_local", v, 0, 1 << 30, &c.keep_local); },
       [](const config& c) { return std::to_string(c.keep_local); }},
      {"keep_persistent", "versions of each checkpoint kept at the persistent level, newest first (0 = all, for history runs)", [](config& c, const std::string& v) {
         return set_int("keep_persistent", v, 0, 1 << 30, &c.keep_persistent); },
       [](const config& c) { return std::to_string(c.keep_persistent); }},
      {"redundancy", "node-loss redundancy: none, partner, xor or rs", [](config& c, const std::string& v) -> status {
         if (v != "none" && v != "partner" && v != "xor" && v != "rs")
           return bad_value("redundancy", v, "none, partner, xor or rs");
         c.redundancy = v; return {}; }, [](const config& c) { return c.redundancy; }},
      {"redundancy_set", "ranks per redundancy set (on distinct nodes)", [](config& c, const std::string& v) {
         return set_int("redundancy_set", v, 2, 1 << 16, &c.redundancy_set); },
       [](const config& c) { return std::to_string(c.redundancy_set); }},
      {"rs_parity", "parity blocks per set with redundancy = rs", [](config& c, const std::string& v) {
         return set_int("rs_parity", v, 1, 32, &c.rs_parity); },
       [](const config& c) { return std::to_string(c.rs_parity); }},
      {"redundancy_interval", "protect every k-th version at L2", [](config& c, const std::string& v) {
         return set_int("redundancy_interval", v, 1, 1 << 30, &c.redundancy_interval); },
       [](const config& c) { return std::to_string(c.redundancy_interval); }},
      {"redundancy_required",
       "a job that cannot hold the redundancy scheme fails at init (true, the default) or runs without it, said "
       "once (false)",
       [](config& c, const std::string& v) -> status {
         auto r = parse_bool("redundancy_required", v);
         if (!r) return r.take_status();
         c.redundancy_required = *r;
         return {};
       },
       [](const config& c) { return std::string(c.redundancy_required ? "true" : "false"); }},
      {"persistent_interval", "flush every k-th version", [](config& c, const std::string& v) {
         return set_int("persistent_interval", v, 1, 1 << 30, &c.persistent_interval); },
       [](const config& c) { return std::to_string(c.persistent_interval); }},
      {"staging_limit", "staging memory bytes", [](config& c, const std::string& v) -> status {
         auto r = parse_size(v);
         if (!r) return bad_value("staging_limit", v, "a size such as 512M or 2G, or 0");
         c.staging_limit = *r; return {}; }, [](const config& c) { return std::to_string(c.staging_limit); }},
      {"staging_slots", "staging slots when staging_limit is 0", [](config& c, const std::string& v) {
         return set_int("staging_slots", v, 1, 64, &c.staging_slots); },
       [](const config& c) { return std::to_string(c.staging_slots); }},
      enum_key<staging_policy>("staging_policy", "block or eagain", &config::staging_policy,
                               {{"block", staging_policy::block}, {"eagain", staging_policy::eagain}}),
      {"io_rate_limit", "persistent level write bandwidth cap per rank", [](config& c, const std::string& v) -> status {
         auto r = parse_size(v);
         if (!r) return bad_value("io_rate_limit", v, "bytes per second such as 200M or 1G, or 0 (no cap)");
         c.io_rate_limit = *r; return {}; }, [](const config& c) { return std::to_string(c.io_rate_limit); }},
      {"direct_io", "O_DIRECT for the persistent level", [](config& c, const std::string& v) -> status {
         auto r = parse_bool("direct_io", v); if (!r) return r.take_status(); c.direct_io = *r; return {}; },
       [](const config& c) { return std::string(c.direct_io ? "true" : "false"); }},
      enum_key<persistent_layout>("persistent_layout", "auto, file_per_process or aggregated", &config::persistent_layout,
                                  {{"auto", persistent_layout::automatic},
                                   {"file_per_process", persistent_layout::file_per_process},
                                   {"aggregated", persistent_layout::aggregated}}),
      {"aggregate_files", "data files per aggregated version (auto: leaders one per node up to the storage targets)", [](config& c, const std::string& v) -> status {
         if (v == "auto") { c.aggregate_files = 0; return {}; }
         auto r = parse_int("aggregate_files", v, 1, 1 << 24);
         if (!r) return bad_value("aggregate_files", v, "auto or an integer from 1 to the number of ranks");
         c.aggregate_files = static_cast<uint32_t>(*r); return {}; },
       [](const config& c) { return c.aggregate_files == 0 ? std::string("auto") : std::to_string(c.aggregate_files); }},
      enum_key<aggregate_strategy>("aggregate_strategy", "posix_shared, aligned, mpiio or leaders",
                                   &config::aggregate_strategy,
                                   {{"posix_shared", aggregate_strategy::posix_shared},
                                    {"aligned", aggregate_strategy::aligned}, {"mpiio", aggregate_strategy::mpiio},
                                    {"leaders", aggregate_strategy::leaders}}),
      {"stripe_size", "stripe size of aggregated files (0: detected)", [](config& c, const std::string& v) -> status {
         auto r = parse_size(v);
         if (!r || (*r % 4096) != 0) return bad_value("stripe_size", v, "0 or a multiple of 4 KiB such as 1M");
         c.stripe_size = *r; return {}; }, [](const config& c) { return std::to_string(c.stripe_size); }},
      {"stripe_count", "stripe count of aggregated files (0: detected)", [](config& c, const std::string& v) -> status {
         auto r = parse_int("stripe_count", v, 0, 1 << 16); if (!r) return r.take_status();
         c.stripe_count = static_cast<uint32_t>(*r); return {}; }, [](const config& c) { return std::to_string(c.stripe_count); }},
      {"node_id", "this rank's node (empty: the host name)", [](config& c, const std::string& v) -> status {
         if (!v.empty()) CAIRN_RETURN_IF_ERROR(util::check_name("configuration key 'node_id': node", v));
         c.node_id = v; return {}; }, [](const config& c) { return c.node_id; }},
      {"ranks_per_node", "emulate nodes of this many consecutive ranks (0: off)", [](config& c, const std::string& v) {
         return set_int("ranks_per_node", v, 0, 1 << 20, &c.ranks_per_node); },
       [](const config& c) { return std::to_string(c.ranks_per_node); }},
      {"local_enabled", "write the local level", [](config& c, const std::string& v) -> status {
         auto r = parse_bool("local_enabled", v); if (!r) return r.take_status(); c.local_enabled = *r; return {}; },
       [](const config& c) { return std::string(c.local_enabled ? "true" : "false"); }},
      {"keep_local_after_finalize",
       "keep the node-local versions of a run that finished normally (default false: finalize removes them once "
       "every checkpoint's newest version is committed at the persistent level)",
       [](config& c, const std::string& v) -> status {
         auto r = parse_bool("keep_local_after_finalize", v);
         if (!r) return r.take_status();
         c.keep_local_after_finalize = *r;
         return {};
       },
       [](const config& c) { return std::string(c.keep_local_after_finalize ? "true" : "false"); }},
      {"hash_trees", "hash trees of every version", [](config& c, const std::string& v) -> status {
         auto r = parse_bool("hash_trees", v); if (!r) return r.take_status(); c.hash_trees = *r; return {}; },
       [](const config& c) { return std::string(c.hash_trees ? "true" : "false"); }},
      {"hash_chunk", "bytes per tree leaf", [](config& c, const std::string& v) -> status {
         auto r = parse_size(v);
         if (!r || *r < 64 || *r > (1ull << 30) || *r % 8 != 0)
           return bad_value("hash_chunk", v, "a size between 64 and 1G, a multiple of 8");
         c.hash_chunk = *r; return {}; }, [](const config& c) { return std::to_string(c.hash_chunk); }},
      {"hash_abs", "quantum of tolerant tree leaves", [](config& c, const std::string& v) {
         return parse_double("hash_abs", v, &c.hash_abs); },
       [](const config& c) { std::ostringstream os; os << c.hash_abs; return os.str(); }},
      {"reference_run", "run to compare with online", [](config& c, const std::string& v) -> status {
         if (v.find('/') != std::string::npos) return bad_value("reference_run", v, "a run id without '/'");
         c.reference_run = v; return {}; }, [](const config& c) { return c.reference_run; }},
      {"reference_store", "store of the reference run", [](config& c, const std::string& v) -> status {
         c.reference_store = v; return {}; }, [](const config& c) { return c.reference_store; }},
      enum_key<divergence_action>("on_divergence", "continue or stop", &config::on_divergence,
                                  {{"continue", divergence_action::cont}, {"stop", divergence_action::stop}}),
      {"compare_abs", "absolute tolerance", [](config& c, const std::string& v) {
         return parse_double("compare_abs", v, &c.compare_abs); },
       [](const config& c) { std::ostringstream os; os << c.compare_abs; return os.str(); }},
      {"compare_rel", "relative tolerance", [](config& c, const std::string& v) {
         return parse_double("compare_rel", v, &c.compare_rel); },
       [](const config& c) { std::ostringstream os; os << c.compare_rel; return os.str(); }},
      {"compare_ulps", "tolerance in ulps", [](config& c, const std::string& v) -> status {
         auto r = parse_int("compare_ulps", v, 0, INT64_MAX); if (!r) return r.take_status();
         c.compare_ulps = static_cast<uint64_t>(*r); return {}; },
       [](const config& c) { return std::to_string(c.compare_ulps); }},
      {"agents", "controller address of remote checkpoint agents (host:port; empty = off)",
       [](config& c, const std::string& v) -> status { c.agents = v; return {}; },
       [](const config& c) { return c.agents; }},
      {"agents_secret_file", "deployment secret of the agents", [](config& c, const std::string& v) -> status {
         c.agents_secret_file = v; return {}; }, [](const config& c) { return c.agents_secret_file; }},
      enum_key<agents_transfer>("agents_mode", "pull or push", &config::agents_mode,
                                {{"pull", agents_transfer::pull}, {"push", agents_transfer::push}}),
      {"agents_blocking", "checkpoint returns once agents hold the data", [](config& c, const std::string& v) -> status {
         auto r = parse_bool("agents_blocking", v); if (!r) return r.take_status(); c.agents_blocking = *r; return {}; },
       [](const config& c) { return std::string(c.agents_blocking ? "true" : "false"); }},
      {"agents_lend", "agents pull straight from the protected regions (no staging copy)",
       [](config& c, const std::string& v) -> status {
         auto r = parse_bool("agents_lend", v); if (!r) return r.take_status(); c.agents_lend = *r; return {}; },
       [](const config& c) { return std::string(c.agents_lend ? "true" : "false"); }},
      {"agents_persist", "agents keep (write) the checkpoints after finalize", [](config& c, const std::string& v) -> status {
         auto r = parse_bool("agents_persist", v); if (!r) return r.take_status(); c.agents_persist = *r; return {}; },
       [](const config& c) { return std::string(c.agents_persist ? "true" : "false"); }},
      {"agents_provider", "libfabric provider", [](config& c, const std::string& v) -> status {
         if (v.empty()) return bad_value("agents_provider", v, "a provider such as tcp;ofi_rxm or verbs;ofi_rxm");
         c.agents_provider = v; return {}; }, [](const config& c) { return c.agents_provider; }},
      {"agents_bind", "local address of the data-plane endpoint (auto: the route to the controller)", [](config& c, const std::string& v) -> status {
         c.agents_bind = v; return {}; }, [](const config& c) { return c.agents_bind; }},
      {"agents_timeout", "seconds to wait for an agent's reply", [](config& c, const std::string& v) {
         return parse_double("agents_timeout", v, &c.agents_timeout); },
       [](const config& c) { std::ostringstream os; os << c.agents_timeout; return os.str(); }},
      {"agents_wait", "seconds init and probe wait for assigned agents to start", [](config& c, const std::string& v) {
         return parse_double("agents_wait", v, &c.agents_wait); },
       [](const config& c) { std::ostringstream os; os << c.agents_wait; return os.str(); }},
      {"agents_restart_wait", "seconds a restart waits for agents that do not answer", [](config& c, const std::string& v) {
         return parse_double("agents_restart_wait", v, &c.agents_restart_wait); },
       [](const config& c) { std::ostringstream os; os << c.agents_restart_wait; return os.str(); }},
      {"agents_allow_missing", "restart without agents that do not answer (their versions are ignored)",
       [](config& c, const std::string& v) -> status {
         auto r = parse_bool("agents_allow_missing", v); if (!r) return r.take_status();
         c.agents_allow_missing = *r; return {}; },
       [](const config& c) { return std::string(c.agents_allow_missing ? "true" : "false"); }},
      {"agents_interval", "hint: seconds between checkpoints", [](config& c, const std::string& v) {
         return parse_double("agents_interval", v, &c.agents_interval); },
       [](const config& c) { std::ostringstream os; os << c.agents_interval; return os.str(); }},
      {"agents_checkpoints", "hint: checkpoints the run will take (0 = unknown)", [](config& c, const std::string& v) -> status {
         auto r = parse_int("agents_checkpoints", v, 0, INT64_MAX); if (!r) return r.take_status();
         c.agents_checkpoints = static_cast<uint64_t>(*r); return {}; },
       [](const config& c) { return std::to_string(c.agents_checkpoints); }},
      {"warning_signals", "signals that announce the job's end", [](config& c, const std::string& v) -> status {
         c.warning_signals = v; return {}; }, [](const config& c) { return c.warning_signals; }},
      {"deadline", "the job's end: Unix seconds or +seconds after init", [](config& c, const std::string& v) -> status {
         c.deadline = v; return {}; }, [](const config& c) { return c.deadline; }},
      {"deadline_margin", "seconds added to the time to durable", [](config& c, const std::string& v) {
         return parse_double("deadline_margin", v, &c.deadline_margin); },
       [](const config& c) { std::ostringstream os; os << c.deadline_margin; return os.str(); }},
      {"mtbf", "the job's mean time between failures in seconds (cairn_advice; 0: unknown)",
       [](config& c, const std::string& v) { return parse_double("mtbf", v, &c.mtbf); },
       [](const config& c) { std::ostringstream os; os << c.mtbf; return os.str(); }},
      {"deadline_factor", "factor on the measured time to durable", [](config& c, const std::string& v) {
         return parse_double("deadline_factor", v, &c.deadline_factor); },
       [](const config& c) { std::ostringstream os; os << c.deadline_factor; return os.str(); }},
      {"metrics_dir", "directory of the OpenMetrics textfiles (node exporter)", [](config& c, const std::string& v) -> status {
         c.metrics_dir = v; return {}; }, [](const config& c) { return c.metrics_dir; }},
      {"fault_inject", "test hook", [](config& c, const std::string& v) -> status { c.fault_inject = v; return {}; },
       [](const config& c) { return c.fault_inject; }},
  };
  return defs;
}

const key_def* find_key(const std::string& name) {
  for (auto& k : keys()) if (name == k.name) return &k;
  return nullptr;
}

std::string known_keys() {
  std::string s;
  for (auto& k : keys()) {
    if (std::string(k.name) == "fault_inject") continue;
    if (!s.empty()) s += ", ";
    s += k.name;
  }
  return s;
}

std::string toml_value_text(const toml::node& n) {
  if (auto s = n.as_string()) return s->get();
  if (auto i = n.as_integer()) return std::to_string(i->get());
  if (auto b = n.as_boolean()) return b->get() ? "true" : "false";
  if (auto f = n.as_floating_point()) return std::to_string(f->get());
  return "<unsupported type>";
}

// The program a run is named after: its name and the path that tells it
// apart from others of the same name. For an interpreter, the script (python
// and python3 running train.py are one program, two scripts of one name in
// two directories are two); else the executable.
struct program_identity {
  std::string name;
  std::string path;
};

std::string resolved(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

program_identity this_program() {
  program_identity id;
  id.name = program_invocation_short_name ? program_invocation_short_name : "";
  id.path = resolved("/proc/self/exe");
  std::vector<std::string> argv;
  if (std::FILE* f = std::fopen("/proc/self/cmdline", "rb")) {
    std::string cur;
    for (int ch; (ch = std::fgetc(f)) != EOF;) {
      if (ch == 0) argv.push_back(std::move(cur)), cur.clear();
      else cur.push_back(static_cast<char>(ch));
    }
    std::fclose(f);
  }
  static const char* const kInterpreters[] = {"python", "pypy", "perl", "ruby", "Rscript", "julia", "node"};
  const bool interpreter = std::any_of(std::begin(kInterpreters), std::end(kInterpreters), [&](const char* p) {
    return id.name.rfind(p, 0) == 0 &&
           id.name.find_first_not_of("0123456789.", std::strlen(p)) == std::string::npos;
  });
  if (interpreter) {
    for (size_t i = 1; i < argv.size(); ++i) {
      const std::string& a = argv[i];
      if (a == "-m" || a == "-c" || a == "-e") {
        // python -m pkg.mod: the module; -c / -e: the interpreter itself.
        if (a == "-m" && i + 1 < argv.size()) id.name = argv[i + 1], id.path = "-m " + argv[i + 1];
        break;
      }
      if (a == "-W" || a == "-X") {  // options that take a value
        ++i;
        continue;
      }
      if (a.empty() || a[0] == '-') continue;
      id.path = resolved(a);
      const size_t slash = a.find_last_of('/');
      id.name = slash == std::string::npos ? a : a.substr(slash + 1);
      if (const size_t dot = id.name.find_last_of('.'); dot != std::string::npos && dot > 0) id.name.resize(dot);
      break;
    }
  }
  // A run id is a file name: what the rules refuse becomes '_'.
  for (char& ch : id.name)
    if (ch == '/' || static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '_';
  if (id.name.size() > 64) id.name.resize(64);
  if (id.name.empty() || id.name == "." || id.name == ".." || !util::valid_utf8(id.name)) id.name = "default";
  return id;
}

std::string default_run_name(bool with_job) {
  const program_identity id = this_program();
  char cwd[PATH_MAX];
  std::string where = id.path + '\0' + (::getcwd(cwd, sizeof cwd) ? cwd : "");
  char digest[16];
  std::snprintf(digest, sizeof digest, "%08x", static_cast<unsigned>(util::xxh3(where.data(), where.size())));
  std::string run = id.name + "-" + digest;
  // Under a batch job the job (and step) too: two jobs, or two steps of one
  // allocation, never share a run by accident; a requeued job keeps its id
  // and its steps' numbers and finds its checkpoints.
  auto plain = [](const char* s) { return s && *s && std::string(s).find('/') == std::string::npos; };
  const char* job = std::getenv("SLURM_JOB_ID");
  if (with_job && plain(job)) {
    run += std::string("-") + job;
    const char* step = std::getenv("SLURM_STEP_ID");
    // Not the batch script's or the extern step's pseudo ids.
    if (plain(step) && std::strtoull(step, nullptr, 10) < 4294967290ull) run += std::string(".") + step;
  }
  return run;
}

std::string default_scratch() {
  std::string base = "/dev/shm";
  if (access(base.c_str(), W_OK) != 0) {
    const char* t = std::getenv("TMPDIR");
    base = (t && *t) ? t : "/tmp";
  }
  return base + "/cairn-" + std::to_string(getuid());
}

}  // namespace

result<uint64_t> parse_size(const std::string& text) {
  if (text.empty()) return status(errc::invalid_argument, "empty size");
  errno = 0;
  char* end = nullptr;
  unsigned long long x = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || errno != 0 || text[0] == '-') return status(errc::invalid_argument, "bad size '" + text + "'");
  std::string suffix(end);
  uint64_t mult = 1;
  if (suffix.empty() || suffix == "B") mult = 1;
  else if (suffix == "K" || suffix == "KiB" || suffix == "k") mult = 1ull << 10;
  else if (suffix == "M" || suffix == "MiB") mult = 1ull << 20;
  else if (suffix == "G" || suffix == "GiB") mult = 1ull << 30;
  else if (suffix == "T" || suffix == "TiB") mult = 1ull << 40;
  else return status(errc::invalid_argument, "bad size suffix in '" + text + "' (use K, M, G or T)");
  return static_cast<uint64_t>(x * mult);
}

result<config> config::load(const std::string& path) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    if (kv.rfind("CAIRN_", 0) != 0) continue;
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return load(path, env);
}

result<config> config::load(const std::string& path, const std::map<std::string, std::string>& env) {
  config c;
  c.application = this_program().name;
  c.scratch = default_scratch();
  if (!path.empty()) {
    toml::table tbl;
    try {
      tbl = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
      std::ostringstream os;
      os << "configuration file '" << path << "': " << e.description() << " at line "
         << e.source().begin.line << ", column " << e.source().begin.column;
      return status(errc::invalid_argument, os.str());
    }
    for (auto&& [k, node] : tbl) {
      std::string key(k.str());
      const key_def* def = find_key(key);
      if (def == nullptr) {
        return status(errc::invalid_argument, "configuration file '" + path + "': unknown key '" + key +
                                                  "' (known keys: " + known_keys() + ")");
      }
      status st = def->set(c, toml_value_text(node));
      if (!st) return st.with_context("configuration file '" + path + "'");
    }
  }
  for (auto& [name, value] : env) {
    if (name == "CAIRN_CONFIG") continue;  // read by callers to find the file
    std::string key = name.substr(6);
    for (auto& ch : key) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const key_def* def = find_key(key);
    if (def == nullptr) {
      return status(errc::invalid_argument, "environment variable " + name + ": unknown configuration key '" + key +
                                                "' (known keys: " + known_keys() + ")");
    }
    status st = def->set(c, value);
    if (!st) return st.with_context("environment variable " + name);
  }
  if (!c.run_set) c.run = default_run_name(c.run_scope_job);
  return c;
}

result<config> config::from_values(const std::map<std::string, std::string>& values) {
  config c;
  for (auto& [key, value] : values) {
    const key_def* def = find_key(key);
    if (def == nullptr) return status(errc::invalid_argument, "unknown configuration key '" + key + "'");
    CAIRN_RETURN_IF_ERROR(def->set(c, value));
  }
  return c;
}

cairn::persistent_layout config::resolved_layout(const std::string& fs) const {
  if (persistent_layout != persistent_layout::automatic) return persistent_layout;
  return agents.empty() && (fs == "cephfs" || fs == "lustre") ? persistent_layout::aggregated
                                                             : persistent_layout::file_per_process;
}

std::map<std::string, std::string> config::values() const {
  std::map<std::string, std::string> out;
  for (auto& k : keys())
    if (std::string(k.name) != "fault_inject") out[k.name] = k.get(*this);
  return out;
}

std::string config::describe() const {
  std::string s;
  for (auto& k : keys()) {
    if (std::string(k.name) == "fault_inject" && fault_inject.empty()) continue;
    s += std::string(k.name) + " = " + k.get(*this) + "\n";
  }
  return s;
}

}  // namespace cairn
