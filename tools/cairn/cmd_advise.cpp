// cairn advise: paper 001's overhead model as a tool (docs/design/advise.md).
// Measures B_M and each level's B_IO with the ranks per node that will run,
// predicts the cost per checkpoint (t_O,s and t_O,a), recommends the
// checkpoint interval (Young, Daly) and the persistent level's frequency, and
// with --run compares the prediction with the run's measured stage costs from
// the catalog.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <optional>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "advise/measure.hpp"
#include "advise/model.hpp"
#include "commands.hpp"
#include "format/run_info.hpp"
#include "history/catalog.hpp"
#include "storage/geometry.hpp"
#include "output.hpp"
#include "store_scan.hpp"
#include "util/config.hpp"

namespace cairn::cli {
namespace {

using nlohmann::json;

// The run's measured costs: per stage, the mean over its committed versions
// and ranks (seconds per checkpoint and rank).
struct run_costs {
  std::string run;
  std::string mode;
  int64_t versions = 0;
  int64_t shards = 0;
  uint32_t nranks = 0;
  int nodes = 0;
  uint64_t mean_bytes = 0;
  std::map<std::string, double> stage_s;  // capture, checksum (with the hash trees), local, persistent
  int64_t executions = 0;
  double span_s = 0;  // first execution's start to the last one's end (or start)
  std::map<std::string, std::string> config;
};

result<run_costs> load_run(const std::string& store, const std::string& run) {
  CAIRN_ASSIGN_OR_RETURN(auto runs, select_runs(store, "", run));
  (void)runs;
  run_costs rc;
  rc.run = run;
  auto info = format::read_run_info(storage::storage_env::posix(), store, run);
  if (!info)
    return status(errc::not_found, "run '" + run + "' has no readable identity file (" + info.error().message() +
                                       "): it was not written by a cairn job, or the job never started");
  if (info->executions.empty()) return status(errc::not_found, "run '" + run + "' has no execution recorded");
  const auto& last = info->executions.back();
  rc.config = last.config;
  rc.nranks = last.nranks;
  rc.nodes = static_cast<int>(std::max<size_t>(1, last.nodes.size()));
  rc.executions = static_cast<int64_t>(info->executions.size());
  double end = last.ended_at > 0 ? last.ended_at : last.started_at;
  rc.span_s = end - info->executions.front().started_at;

  CAIRN_ASSIGN_OR_RETURN(auto cat, history::catalog::open(store));
  CAIRN_ASSIGN_OR_RETURN(auto versions, cat->list_versions(run));
  if (versions.empty())
    return status(errc::not_found, "run '" + run + "' has no committed version in the catalog of " + store +
                                       " (if it has checkpoints, run `cairn reindex " + store + "`)");
  uint64_t bytes = 0;
  double commit_sum = 0;
  for (const auto& v : versions) {
    CAIRN_ASSIGN_OR_RETURN(auto shards, cat->list_shards(run, v.name, v.version));
    rc.mode = v.mode;
    ++rc.versions;
    // The commit: from the last shard durable to the MANIFEST committed.
    double durable = 0;
    for (const auto& s : shards) durable = std::max(durable, s.persistent_at);
    if (durable > 0 && v.committed_at > durable) commit_sum += v.committed_at - durable;
    for (const auto& s : shards) {
      ++rc.shards;
      bytes += s.size;
      rc.stage_s["capture"] += s.capture_s;
      // One pass makes both (the model's "checksum"); runs recorded before
      // the fused pass add their separate hash-tree pass here too.
      rc.stage_s["checksum"] += s.checksum_s + s.hash_s;
      rc.stage_s["local"] += s.local_s;
      rc.stage_s["persistent"] += s.persistent_s;
    }
  }
  if (rc.shards == 0) return status(errc::not_found, "run '" + run + "' has no shard rows in the catalog");
  for (auto& [k, v] : rc.stage_s) v /= static_cast<double>(rc.shards);
  rc.stage_s["commit"] = commit_sum / static_cast<double>(rc.versions);
  rc.mean_bytes = bytes / static_cast<uint64_t>(rc.shards);
  return rc;
}

result<double> parse_bandwidth(const std::string& text, const char* what) {
  auto v = parse_size(text);
  if (!v || *v == 0)
    return status(errc::invalid_argument, std::string(what) + " '" + text +
                                              "' is not a positive number of bytes per second (e.g. 2G)");
  return static_cast<double>(*v);
}

std::string rate_text(double bytes_per_s) { return format_bytes(static_cast<uint64_t>(bytes_per_s)) + "/s"; }

std::string secs(double s) {
  char buf[64];
  if (s >= 100) std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s >= 1) std::snprintf(buf, sizeof buf, "%.2f s", s);
  else std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  return buf;
}

// The job's mean time between failures: given, from a node MTBF and the
// node count, or measured from a run's restarts; *source says which.
status failure_rate(const advise_options& o, const std::optional<run_costs>& rc, double* mtbf, std::string* source) {
  int sources = (o.mtbf_given ? 1 : 0) + (o.node_mtbf_given ? 1 : 0) + (o.mtbf_from_run ? 1 : 0);
  if (sources == 0)
    return {errc::invalid_argument, "no failure rate: give --mtbf SECONDS (the job's mean time between failures), "
                                    "--node-mtbf SECONDS --nodes N, or --mtbf-from-run with --run"};
  if (sources > 1) return {errc::invalid_argument, "give only one of --mtbf, --node-mtbf and --mtbf-from-run"};
  if (o.mtbf_given) {
    if (!(o.mtbf > 0) || std::isinf(o.mtbf))
      return {errc::invalid_argument, "--mtbf must be a positive number of seconds, not " + std::to_string(o.mtbf)};
    *mtbf = o.mtbf;
    *source = "given";
  } else if (o.node_mtbf_given) {
    if (o.nodes < 1) return {errc::invalid_argument, "--node-mtbf needs --nodes N (at least 1): the job's node count"};
    CAIRN_ASSIGN_OR_RETURN(*mtbf, advise::job_mtbf(o.node_mtbf, o.nodes));
    *source = "node MTBF / " + std::to_string(o.nodes) + " nodes";
  } else {
    if (!rc) return {errc::invalid_argument, "--mtbf-from-run needs --run RUN"};
    if (rc->executions < 2 || !(rc->span_s > 0))
      return {errc::invalid_argument, "run '" + rc->run + "' never restarted (" + std::to_string(rc->executions) +
                                          " execution): no failure rate to measure; give --mtbf"};
    *mtbf = rc->span_s / static_cast<double>(rc->executions - 1);
    *source = "run '" + rc->run + "': " + std::to_string(rc->executions - 1) + " restarts in " + secs(rc->span_s);
  }
  if (!(o.crash_fraction >= 0 && o.crash_fraction < 1))
    return {errc::invalid_argument, "--crash-fraction must be in [0, 1), not " + std::to_string(o.crash_fraction)};
  return {};
}

// The bandwidths the model needs: each given on the command line, else
// measured on this node (memory, the local level's directory, the store);
// *sources says which, *local_fs the local level's file system.
status measure_bandwidths(const advise_options& o, const advise::engine_shape& shape, const advise::workload& w,
                          const std::string& scratch, const std::string& persistent, advise::bandwidths* bw,
                          std::string* local_fs, json* sources) {
  advise::measure_options mo;
  mo.bytes_per_rank = w.bytes_per_rank;
  mo.ranks = w.ranks_per_node;
  mo.reps = o.reps;
  mo.hash_trees = shape.hash_trees;
  mo.hash_chunk = shape.hash_chunk;
  mo.hash_abs = shape.hash_abs;
  mo.progress = [](const std::string& step) { std::fprintf(stderr, "cairn advise: measuring %s\n", step.c_str()); };
  if (!o.checksum_bandwidth.empty() && o.memory_bandwidth.empty())
    return {errc::invalid_argument, "--checksum-bandwidth needs --memory-bandwidth (without it both are measured)"};
  if (!o.memory_bandwidth.empty()) {
    CAIRN_ASSIGN_OR_RETURN(bw->memory, parse_bandwidth(o.memory_bandwidth, "--memory-bandwidth"));
    bw->memory_cpu = bw->memory;
    if (!o.checksum_bandwidth.empty()) {
      CAIRN_ASSIGN_OR_RETURN(bw->checksum_cpu, parse_bandwidth(o.checksum_bandwidth, "--checksum-bandwidth"));
    }
    (*sources)["memory"] = "given";
  } else {
    CAIRN_ASSIGN_OR_RETURN(auto m, advise::measure_memory(mo));
    bw->memory = m.bandwidth;
    bw->memory_cpu = m.bandwidth_cpu;
    bw->checksum_cpu = m.checksum_cpu;
    (*sources)["memory"] = "measured";
  }
  if (shape.local) {
    if (!o.local_bandwidth.empty()) {
      CAIRN_ASSIGN_OR_RETURN(bw->local_io, parse_bandwidth(o.local_bandwidth, "--local-bandwidth"));
      bw->local_io_cpu = bw->local_io;
      (*sources)["local"] = "given";
      if (auto g = storage::detect_geometry(scratch)) *local_fs = g->fs;
    } else {
      CAIRN_RETURN_IF_ERROR(check_directory(scratch, "local level directory (--scratch)"));
      CAIRN_ASSIGN_OR_RETURN(auto m, advise::measure_io(storage::storage_env::posix(), scratch, false, false,
                                                                 shape.recycled_local, mo));
      bw->local_io = m.bandwidth;
      bw->local_io_cpu = m.bandwidth_cpu;
      *local_fs = m.fs;
      (*sources)["local"] = "measured";
    }
    bw->local_in_memory = *local_fs == "tmpfs";
  }
  if (o.commit_s < 0) return {errc::invalid_argument, "--commit-seconds must not be negative"};
  if (!o.persistent_bandwidth.empty()) {
    CAIRN_ASSIGN_OR_RETURN(bw->persistent_io, parse_bandwidth(o.persistent_bandwidth, "--persistent-bandwidth"));
    bw->commit_s = o.commit_s;
    (*sources)["persistent"] = "given";
  } else {
    CAIRN_RETURN_IF_ERROR(check_directory(persistent, "persistent level directory (STORE)"));
    CAIRN_ASSIGN_OR_RETURN(auto m,
                           advise::measure_io(storage::storage_env::posix(), persistent, shape.direct_io, true, false, mo));
    bw->persistent_io = m.bandwidth;
    bw->commit_s = m.commit_s;
    (*sources)["persistent"] = "measured";
  }
  return {};
}

status run_advise(const advise_options& o, json* out) {
  // ---- what will run: configuration, directories, size, ranks per node ----
  std::optional<run_costs> rc;
  std::map<std::string, std::string> values;
  config cfg;
  if (!o.run.empty()) {
    if (o.store.empty()) return {errc::invalid_argument, "--run needs the STORE that holds the run"};
    CAIRN_RETURN_IF_ERROR(check_store(o.store));
    CAIRN_ASSIGN_OR_RETURN(auto r, load_run(o.store, o.run));
    rc = std::move(r);
  }
  if (!o.config_file.empty() || !rc) {
    CAIRN_ASSIGN_OR_RETURN(cfg, config::load(o.config_file));
    values = cfg.values();
  } else {
    values = rc->config;
  }
  std::string persistent = !o.store.empty() ? o.store : values.count("persistent") ? values["persistent"] : cfg.persistent;
  auto persistent_geometry = storage::detect_geometry(persistent);
  CAIRN_ASSIGN_OR_RETURN(advise::engine_shape shape,
                         advise::shape_from_config(values, persistent_geometry ? persistent_geometry->fs : ""));
  std::string scratch = !o.scratch.empty() ? o.scratch : values.count("scratch") ? values["scratch"] : cfg.scratch;
  advise::workload w;
  if (!o.bytes.empty()) {
    auto b = parse_size(o.bytes);
    if (!b || *b == 0) return {errc::invalid_argument, "--bytes '" + o.bytes + "' is not a positive size (e.g. 64M)"};
    w.bytes_per_rank = *b;
  } else {
    w.bytes_per_rank = rc ? rc->mean_bytes : 64ull << 20;
  }
  if (o.ranks_per_node > 0) w.ranks_per_node = o.ranks_per_node;
  else if (rc) w.ranks_per_node = static_cast<int>((rc->nranks + rc->nodes - 1) / rc->nodes);
  if (w.ranks_per_node < 1) w.ranks_per_node = 1;

  // ---- failure rate: checked before anything is measured ----
  double mtbf = 0;
  std::string mtbf_source;
  CAIRN_RETURN_IF_ERROR(failure_rate(o, rc, &mtbf, &mtbf_source));

  // ---- bandwidths: given, else measured ----
  advise::bandwidths bw;
  json sources_j;
  std::string local_fs;
  CAIRN_RETURN_IF_ERROR(measure_bandwidths(o, shape, w, scratch, persistent, &bw, &local_fs, &sources_j));

  // ---- prediction, measurement, advice ----
  CAIRN_ASSIGN_OR_RETURN(advise::prediction p, advise::predict(shape, w, bw));
  auto stage_pred = [&](const std::string& s) {
    for (const auto& c : p.stages)
      if (c.stage == s) return c.seconds;
    return 0.0;
  };
  const int k = shape.local ? std::max(1, shape.persistent_interval) : 1;
  // The cost per checkpoint the application sees, and its level parts.
  auto costs = [&](auto stage) {
    double mem = stage("capture") + stage("checksum");
    double local = mem + stage("local");
    double persistent = stage("persistent") + stage("commit");
    double cost = shape.sync ? local + persistent / k : local;
    return std::array<double, 3>{cost, shape.local ? local : 0.0, shape.sync ? persistent : 0.0};
  };
  auto predicted = costs(stage_pred);
  const double cost_pred = shape.sync ? p.sync_s : p.async_s;
  double cost = cost_pred;
  // Thread mode: a local checkpoint costs the application t_O,a as a whole.
  double local_cost = shape.sync ? predicted[1] : (shape.local ? p.async_s : 0.0), persistent_cost = predicted[2];
  std::string cost_source = "predicted";
  json run_j;
  if (rc) {
    auto stage_meas = [&](const std::string& s) { return rc->stage_s.count(s) ? rc->stage_s.at(s) : 0.0; };
    auto measured = costs(stage_meas);
    // Thread mode: the blocked capture and the CPU passes, as the prediction counts them.
    cost = measured[0];
    local_cost = measured[1];
    persistent_cost = measured[2];
    cost_source = "measured (run " + rc->run + ")";
    json stages = json::array();
    for (const auto& c : p.stages) {
      double m = stage_meas(c.stage);
      stages.push_back({{"stage", c.stage}, {"bound", c.bound}, {"predicted_s", c.seconds}, {"measured_s", m},
                        {"ratio", m > 0 ? c.seconds / m : 0.0}});
    }
    double pred_cost = cost_pred;
    run_j = {{"run", rc->run}, {"mode", rc->mode}, {"versions", rc->versions}, {"shards", rc->shards},
             {"nranks", rc->nranks}, {"nodes", rc->nodes}, {"mean_shard_bytes", rc->mean_bytes},
             {"executions", rc->executions}, {"stages", stages}, {"measured_cost_s", measured[0]},
             {"predicted_cost_s", pred_cost}, {"ratio", measured[0] > 0 ? pred_cost / measured[0] : 0.0}};
  }
  if (!(cost > 0)) return {errc::invalid_argument, "the cost per checkpoint came out as 0: nothing to advise on"};
  CAIRN_ASSIGN_OR_RETURN(advise::interval_advice a,
                         advise::advise_interval(cost, mtbf, local_cost, persistent_cost, stage_pred("persistent"),
                                                 o.crash_fraction));

  json passes = json::array();
  for (const auto& ps : advise::memory_passes(shape))
    passes.push_back({{"stage", ps.stage}, {"traffic", ps.traffic}, {"cpu", ps.cpu}});
  json stages = json::array();
  for (const auto& c : p.stages) stages.push_back({{"stage", c.stage}, {"bound", c.bound}, {"seconds", c.seconds}});
  json& j = *out;
  j["configuration"] = {{"mode", shape.sync ? "sync" : "thread"}, {"hash_trees", shape.hash_trees},
                        {"local_enabled", shape.local}, {"direct_io", shape.direct_io},
                        {"persistent_interval", shape.persistent_interval},
                        {"source", rc && o.config_file.empty() ? "run " + rc->run : o.config_file.empty() ? "environment" : o.config_file},
                        {"scratch", scratch}, {"persistent", persistent}};
  j["workload"] = {{"bytes_per_rank", w.bytes_per_rank}, {"ranks_per_node", w.ranks_per_node},
                   {"bytes_per_node", w.bytes_per_rank * static_cast<uint64_t>(w.ranks_per_node)}};
  j["bandwidths"] = {{"memory", bw.memory}, {"memory_cpu", bw.memory_cpu}, {"checksum_cpu", bw.checksum_cpu},
                     {"local_io", bw.local_io}, {"local_io_cpu", bw.local_io_cpu},
                     {"persistent_io", bw.persistent_io}, {"local_fs", local_fs},
                     {"local_in_memory", bw.local_in_memory}, {"commit_s", bw.commit_s}, {"source", sources_j}};
  j["model"] = {{"m", p.m}, {"m_cpu", p.m_cpu}, {"passes", passes}, {"stages", stages},
                {"sync_s", p.sync_s}, {"sync_io_only_s", p.sync_io_only_s}, {"async_s", p.async_s},
                {"async_paper_s", p.async_paper_s}, {"blocked_async_s", p.blocked_async_s}};
  j["advice"] = {{"mtbf_s", a.mtbf_s}, {"mtbf_source", mtbf_source}, {"cost_s", a.cost_s},
                 {"cost_source", cost_source}, {"young_s", a.young_s}, {"daly_s", a.daly_s},
                 {"crash_fraction", a.crash_fraction}, {"local_interval_s", a.local_interval_s},
                 {"persistent_interval_s", a.persistent_interval_s}, {"persistent_interval", a.persistent_interval},
                 {"expected_overhead", a.expected_overhead}};
  if (rc) j["run"] = run_j;
  return {};
}

void print_text(const json& j) {
  const auto& c = j["configuration"];
  const auto& w = j["workload"];
  const auto& b = j["bandwidths"];
  const auto& m = j["model"];
  const auto& a = j["advice"];
  std::printf("configuration (%s): mode %s, hash trees %s, local level %s, direct I/O %s, persistent_interval %d\n",
              c["source"].get<std::string>().c_str(), c["mode"].get<std::string>().c_str(),
              c["hash_trees"].get<bool>() ? "on" : "off", c["local_enabled"].get<bool>() ? "on" : "off",
              c["direct_io"].get<bool>() ? "on" : "off", c["persistent_interval"].get<int>());
  std::printf("workload: %s per rank, %d ranks per node (S_node %s)\n",
              format_bytes(w["bytes_per_rank"].get<uint64_t>()).c_str(), w["ranks_per_node"].get<int>(),
              format_bytes(w["bytes_per_node"].get<uint64_t>()).c_str());
  std::printf("bandwidths: B_M %s (%s, %s over CPU time)", rate_text(b["memory"]).c_str(),
              b["source"]["memory"].get<std::string>().c_str(), rate_text(b["memory_cpu"]).c_str());
  if (b["checksum_cpu"].get<double>() > 0)
    std::printf(", checksum pass %s over CPU time", rate_text(b["checksum_cpu"]).c_str());
  if (c["local_enabled"].get<bool>())
    std::printf(", B_IO local %s (%s)", rate_text(b["local_io"]).c_str(),
                b["source"]["local"].get<std::string>().c_str());
  std::printf(", B_IO persistent %s (%s)\n", rate_text(b["persistent_io"]).c_str(),
              b["source"]["persistent"].get<std::string>().c_str());
  std::printf("\nmodel (paper 001), per checkpoint and rank: m = %g passes over the data (%g by a CPU)\n",
              m["m"].get<double>(), m["m_cpu"].get<double>());
  const bool with_run = j.contains("run");
  table t(with_run ? std::vector<std::string>{"stage", "bound", "predicted", "measured", "predicted/measured"}
                   : std::vector<std::string>{"stage", "bound", "predicted"},
          with_run ? std::vector<bool>{false, false, true, true, true} : std::vector<bool>{false, false, true});
  for (size_t i = 0; i < m["stages"].size(); ++i) {
    const auto& s = m["stages"][i];
    std::vector<std::string> row{s["stage"].get<std::string>(), s["bound"].get<std::string>(), secs(s["seconds"])};
    if (with_run) {
      const auto& r = j["run"]["stages"][i];
      char ratio[32];
      std::snprintf(ratio, sizeof ratio, "%.2f", r["ratio"].get<double>());
      row.push_back(r["measured_s"].get<double>() > 0 ? secs(r["measured_s"]) : "-");
      row.push_back(r["measured_s"].get<double>() > 0 ? ratio : "-");
    }
    t.add(row);
  }
  t.print(stdout);
  std::printf("synchronous  t_O,s = %s per checkpoint (the persistent write alone, S/B_IO: %s)\n",
              secs(m["sync_s"]).c_str(), secs(m["sync_io_only_s"]).c_str());
  std::printf("asynchronous t_O,a = %s per checkpoint (blocked in capture %s; the paper's m S_node/B_M with every "
              "pass: %s)\n",
              secs(m["async_s"]).c_str(), secs(m["blocked_async_s"]).c_str(), secs(m["async_paper_s"]).c_str());
  if (with_run) {
    const auto& r = j["run"];
    std::printf("run %s (%s mode, %lld versions, %u ranks on %d nodes): measured %s per checkpoint, predicted %s "
                "(%.2fx)\n",
                r["run"].get<std::string>().c_str(), r["mode"].get<std::string>().c_str(),
                static_cast<long long>(r["versions"].get<int64_t>()), r["nranks"].get<uint32_t>(),
                r["nodes"].get<int>(), secs(r["measured_cost_s"]).c_str(), secs(r["predicted_cost_s"]).c_str(),
                r["ratio"].get<double>());
  }
  std::printf("\nadvice: MTBF %s (%s), cost per checkpoint %s (%s)\n", secs(a["mtbf_s"]).c_str(),
              a["mtbf_source"].get<std::string>().c_str(), secs(a["cost_s"]).c_str(),
              a["cost_source"].get<std::string>().c_str());
  std::printf("  checkpoint every %s (Daly; Young: %s); expected loss %.2f %% of the run\n", secs(a["daly_s"]).c_str(),
              secs(a["young_s"]).c_str(), 100 * a["expected_overhead"].get<double>());
  if (c["local_enabled"].get<bool>()) {
    std::printf("  levels (%.0f %% of failures survived by the local level): local every %s, persistent every %s -> "
                "persistent_interval = %d\n",
                100 * a["crash_fraction"].get<double>(), secs(a["local_interval_s"]).c_str(),
                secs(a["persistent_interval_s"]).c_str(), a["persistent_interval"].get<int>());
  }
}

}  // namespace

int cmd_advise(const advise_options& o) {
  json j;
  if (status st = run_advise(o, &j); !st) {
    print_error(st);
    return exit_code_for(st);
  }
  if (o.json) print_json(j);
  else print_text(j);
  return kExitOk;
}

}  // namespace cairn::cli
