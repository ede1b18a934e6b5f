// The remote checkpoint agents as a level: see agents_level.hpp.
#include "client/agents_level.hpp"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "agents/auth.hpp"
#include "client/version_record.hpp"
#include "engine/stages.hpp"
#include "format/layout.hpp"
#include "util/clock.hpp"

namespace cairn {

result<std::unique_ptr<agents_level>> agents_level::create(level_host* host) {
  const config& cfg = host->cfg();
  if (cfg.agents_lend) {
    // Lent regions are read by the agents once; anything that reads them
    // later (after the application may have changed them) cannot be allowed.
    std::string why;
    if (cfg.agents.empty()) why = "it needs remote checkpoint agents (set agents)";
    else if (cfg.agents_mode != agents_transfer::pull) why = "it needs agents_mode = pull (the agents read the regions)";
    else if (cfg.local_enabled) why = "the local level would read the regions after the agents (set local_enabled = false)";
    else if (!cfg.reference_run.empty()) why = "the online comparison would read the regions after the agents";
    if (!why.empty()) return status(errc::invalid_argument, "configuration key 'agents_lend': " + why);
  }
  if (cfg.agents.empty()) return std::unique_ptr<agents_level>();
  if (cfg.persistent_layout == persistent_layout::aggregated)
    return status(errc::invalid_argument, "persistent_layout = aggregated does not combine with agents (the agents "
                                          "write the persistent level themselves, a file per rank): choose one");
  if (cfg.redundancy != "none")
    return status(errc::invalid_argument, "redundancy = " + cfg.redundancy + " does not combine with checkpoint "
                                          "agents (both are level L2): choose one");
  CAIRN_ASSIGN_OR_RETURN(auto data, agents_data::create(cfg));
  return std::unique_ptr<agents_level>(new agents_level(host, std::move(data)));
}

status agents_level::add_stages(graph_points& g) {
  // A chain: the fallback writes only what the agents did not take, and a
  // lent image is complete only after the agents stage (or unlend).
  g.graph->add(make_agents_stage(data_.get(), host_->env(), cfg_.persistent));
  if (cfg_.agents_lend) g.graph->add(engine::make_unlend_stage());
  g.graph->add(make_agents_fallback_stage(g.flush_env, cfg_.persistent, cfg_.direct_io));
  if (cfg_.local_enabled) g.graph->add(engine::make_local_stage(host_->env(), g.paths, g.recycler));
  return {};
}

status agents_level::start(graph_points&) {
  const int rank = host_->rank();
  status st;
  std::string text;
  if (rank == 0) {
    auto ctl = agents_control::open(cfg_);
    if (!ctl) {
      st = ctl.take_status();
    } else {
      control_ = std::move(ctl).value();
      agents::app_hints h;
      h.ranks = static_cast<uint32_t>(host_->size());
      h.nodes = host_->node_count();
      h.interval_s = cfg_.agents_interval;
      h.checkpoints = cfg_.agents_checkpoints;
      std::error_code ec;
      auto store = std::filesystem::absolute(cfg_.persistent, ec);
      h.store = ec ? cfg_.persistent : store.lexically_normal().string();
      // The key the run's earlier jobs kept: the proof that this job may
      // have their agents (and what they hold) back.
      const std::string key_file = agents::app_key_file(cfg_.persistent, cfg_.run);
      const std::string held = agents::load_app_key(key_file);
      auto v = control_->register_app(cfg_.run, h, held);
      if (v && !v->key.empty() && v->key != held) {
        if (status w = agents::save_app_key(key_file, v->key); !w)
          std::fprintf(stderr, "cairn: warning: %s: the next job of run '%s' cannot get its agents back\n",
                       w.message().c_str(), cfg_.run.c_str());
      }
      if (v && !v->ready()) {
        std::string key = v->key;
        v = control_->wait_ready(v->app, cfg_.agents_wait);
        if (v) v->key = std::move(key);
      }
      if (!v) st = v.take_status();
      else text = v->encode();
    }
  }
  CAIRN_RETURN_IF_ERROR(host_->agree(st).with_context("agents"));
  host_->comm().broadcast(&text, 0);
  CAIRN_ASSIGN_OR_RETURN(view_, agents_view::decode(text));
  // An agent that cannot be reached now is not fatal: this rank writes its
  // shards itself until a probe brings a working agent.
  status mine = data_->use(view_, rank, host_->size());
  if (!mine)
    std::fprintf(stderr, "cairn: rank %d: warning: %s; writing checkpoints to the persistent level instead\n", rank,
                 mine.message().c_str());
  if (rank == 0) {
    std::string nodes;
    for (const auto& a : view_.agents) nodes += (nodes.empty() ? "" : ", ") + std::to_string(a.id) + "@" + a.node;
    if (view_.agents.empty())
      std::fprintf(stderr, "cairn: warning: the controller at %s has no agent for run '%s' yet; ranks write the "
                           "persistent level themselves until cairn_probe finds agents\n",
                   control_->address().c_str(), cfg_.run.c_str());
    else if (!view_.ready())
      std::fprintf(stderr, "cairn: warning: some agents of run '%s' did not start within agents_wait = %g s (%s)\n",
                   cfg_.run.c_str(), cfg_.agents_wait, nodes.c_str());
  }
  return {};
}

// Lent memory stays registered while it stays protected (the registration
// cache); a region that moves or goes drops every registration.
void agents_level::regions_changed() { data_->forget_lent(); }

int64_t agents_level::committed_floor(const std::string& name, int64_t floor, std::string* what) {
  // Agent memory: the newest version every rank's agents hold from one
  // execution (what a restart would have used).
  if (!holdings_.count(name) && !view_.returning) return floor;
  comm::communicator& comm = host_->comm();
  auto it = holdings_.find(name);
  // What restart_test learnt, or a query now (an agent that does not
  // answer holds nothing this check can see; the restart reported it).
  std::vector<agent_holding> held =
      it != holdings_.end() ? it->second.holdings
                            : data_->held(cfg_.run, name, static_cast<uint32_t>(host_->rank()), 0).holdings;
  std::set<int64_t> excluded;
  int64_t cap = INT64_MAX;
  for (;;) {
    const agent_holding* mine = nullptr;
    for (const auto& h : held)
      if (h.version <= cap && !excluded.count(h.version) && (!mine || h.version > mine->version)) mine = &h;
    int64_t g = comm.min(mine ? mine->version : -1);
    if (g < 0 || g <= floor) return floor;
    cap = g;
    // Every rank holds g, from the same execution?
    uint32_t a = 0;
    for (const auto& h : held)
      if (h.version == g) a = h.attempt;
    std::vector<int64_t> v = {mine && mine->version == g ? 1 : 0, a, -static_cast<int64_t>(a)};
    comm.allreduce_min(v);
    if (v[0] == 0) continue;  // some rank holds only newer versions: look at g again with them
    if (v[1] == -v[2] && v[1] != 0) {
      *what = "version " + std::to_string(g) + " held in the memory of its checkpoint agents";
      return g;
    }
    excluded.insert(g);
  }
}

// The agents (or the fallback) write the persistent level: the version is
// PROTECTED once an agent holds it (or this rank wrote it).
unsigned agents_level::wants(uint64_t) const { return CAIRN_LEVEL_PROTECTED; }

// agents_lend: contiguous regions stay where they are; the agents read them.
bool agents_level::lends() { return cfg_.agents_lend && data_->has_agent(); }

void agents_level::submitted(version_record& rec) {
  ++checkpoints_taken_;
  last_image_bytes_ = rec.job->header.file_size;
  schedule_retention(rec.name);
  // Blocking agents mode: return once the agent holds the version (or it
  // was written by this rank instead).
  if (cfg_.agents_blocking) host_->engine().wait_levels(*rec.job, CAIRN_LEVEL_PROTECTED);
}

void agents_level::schedule_retention(const std::string& name) {
  if (host_->rank() != 0 || cfg_.keep_persistent <= 0) return;
  const size_t keep = static_cast<size_t>(cfg_.keep_persistent);
  host_->engine().submit_task([this, name, keep]() -> status {
    // The agents commit in the background: what is committed now decides.
    // Every writer writes versions in order, so none still writes a version
    // older than a committed one.
    std::vector<int64_t> done;
    for (int64_t v : format::list_versions(host_->env(), cfg_.persistent, cfg_.run, name))
      if (committed(name, v)) done.push_back(v);
    if (done.size() <= keep) return {};
    return host_->remove_persistent_below(name, done[done.size() - keep]);
  });
}

bool agents_level::committed(const std::string& name, int64_t version) {
  return host_->env()->exists(format::manifest_path(cfg_.persistent, cfg_.run, name, version));
}

// The MANIFEST is looked for until it is seen once.
unsigned agents_level::reached(version_record& rec) {
  if (!rec.committed_seen) rec.committed_seen = committed(rec.name, rec.version);
  return rec.committed_seen ? CAIRN_LEVEL_PERSISTENT : 0;
}

std::optional<status> agents_level::wait(version_record& rec, unsigned level) {
  if (level != CAIRN_LEVEL_PERSISTENT) return std::nullopt;
  // The agents write and commit in the background (or this rank did, when
  // its agent did not take the version): wait for the commit.
  const double limit = std::max(60.0, 4 * cfg_.agents_timeout);
  const double deadline = util::now_s() + limit;
  (void)host_->wait_level(rec, CAIRN_LEVEL_PROTECTED);  // held, or written by this rank
  for (;;) {
    // Ranks agree on every round, so they make the same collective calls.
    std::vector<int64_t> v = {committed(rec.name, rec.version) ? 1 : 0, util::now_s() < deadline ? 1 : 0};
    host_->comm().allreduce_min(v);
    if (v[0]) return status();
    if (!v[1])
      return status(errc::io_error, "checkpoint '" + rec.name + "' version " + std::to_string(rec.version) +
                                        ": not committed at the persistent level within " +
                                        std::to_string(static_cast<int>(limit)) +
                                        " s (see the agents' logs and 'cairn agents status')");
    CAIRN_RETURN_IF_ERROR(host_->progress_round());
    struct timespec ts {0, 20 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
}

void agents_level::candidates(const std::string& name, std::set<int64_t>* out) {
  // What the agents hold in memory, committed or not yet written. Only a
  // returning application's agents can hold its versions: the others are
  // asked once, and their silence means nothing.
  const uint32_t me = static_cast<uint32_t>(host_->rank());
  auto& held = holdings_[name];
  held = data_->held(cfg_.run, name, me, view_.returning ? cfg_.agents_restart_wait : 0);
  if (!view_.returning || cfg_.agents_allow_missing) {
    if (view_.returning)
      for (const auto& u : held.unreachable)
        std::fprintf(stderr, "cairn: rank %u: warning: restarting without %s (agents_allow_missing = true)\n", me,
                     u.describe().c_str());
    held.unreachable.clear();
  }
  for (const auto& h : held.holdings) out->insert(h.version);
}

status agents_level::restart_allowed(const std::string& name) {
  // Agents that may hold the newest versions and did not answer: restarting
  // from an older level would silently forget them.
  const auto it = holdings_.find(name);
  const bool silent = it != holdings_.end() && !it->second.unreachable.empty();
  if (host_->comm().min(silent ? 0 : 1) == 1 || forget_lost(name)) return {};
  std::string list;
  if (silent)
    for (const auto& u : it->second.unreachable) list += (list.empty() ? "" : "; ") + u.describe();
  return {errc::unusable, "run '" + cfg_.run + "' is known to the agents controller, but checkpoint agents that may "
                          "hold its newest versions of '" + name + "' in memory did not answer within "
                          "agents_restart_wait = " + std::to_string(static_cast<int>(cfg_.agents_restart_wait)) +
                              " s (" + host_->exchange_message(silent, list) +
                              "); restart when they answer (see 'cairn agents status'), or set agents_allow_missing "
                              "= true to restart from what the other levels hold"};
}

bool agents_level::forget_lost(const std::string& name) {
  // The controller's current view: a silent agent it no longer lists where
  // this job knew it (its node died or left, and it was moved or dropped)
  // took its memory with it: nothing of it can be waited for.
  std::string text;
  if (host_->rank() == 0) {
    auto v = control_->fetch(view_.app);
    if (v) text = v->encode();
  }
  host_->comm().broadcast(&text, 0);
  auto current = agents_view::decode(text);
  auto& silent = holdings_[name].unreachable;
  bool all_lost = current.is_ok();
  for (const auto& u : silent) {
    bool listed = false;
    if (current)
      for (const auto& a : current->agents)
        listed |= a.id == u.agent.id && a.node == u.agent.node && a.endpoint == u.agent.endpoint;
    all_lost &= !listed;
  }
  if (host_->comm().min(all_lost ? 1 : 0) == 0) return false;
  for (const auto& u : silent)
    std::fprintf(stderr, "cairn: rank %d: warning: %s, and the controller no longer has it there: what it held is "
                         "lost with it; restarting from the other levels\n", host_->rank(), u.describe().c_str());
  silent.clear();
  return true;
}

status agents_level::load(const std::string& name, int64_t version, format::shard_image* out, std::string* why) {
  // Agent memory: faster than the persistent level, and it may hold
  // versions not written yet.
  const uint32_t me = static_cast<uint32_t>(host_->rank());
  const uint32_t n = static_cast<uint32_t>(host_->size());
  if (!holdings_.count(name)) holdings_[name] = data_->held(cfg_.run, name, me, 0);
  std::vector<agent_holding> copies;
  for (const auto& h : holdings_[name].holdings)
    if (h.version == version) copies.push_back(h);
  status worst(errc::not_found, "not held");
  for (const auto& h : copies) {
    *out = format::shard_image();
    auto got = data_->restore(h, cfg_.run, name, me, &out->image);
    status st = got ? status() : got.error();
    if (st && (got->rank != me || got->name != name || got->version != version || got->run != cfg_.run))
      st = status(errc::corruption, "the agent returned another shard (run '" + got->run + "', '" + got->name +
                                        "' version " + std::to_string(got->version) + " rank " +
                                        std::to_string(got->rank) + ")");
    else if (st && got->nranks != n)
      st = status(errc::invalid_argument, "agent copy written by " + std::to_string(got->nranks) +
                                              " ranks; this job has " + std::to_string(n));
    if (st) {
      out->header = std::move(got).value();
      return {};
    }
    std::fprintf(stderr, "cairn: rank %u: agent copy of '%s' version %lld unusable: %s\n", me, name.c_str(),
                 static_cast<long long>(version), st.message().c_str());
    *why += (why->empty() ? "" : "; ") + std::string("agents: ") + st.message();
    if (worst.code() == errc::not_found) worst = st;
  }
  *out = format::shard_image();
  return worst;
}

result<std::unique_ptr<format::shard_reader>> agents_level::open_unverified(const std::string& name,
                                                                           int64_t version) {
  const uint32_t me = static_cast<uint32_t>(host_->rank());
  if (!holdings_.count(name)) holdings_[name] = data_->held(cfg_.run, name, me, 0);
  status worst(errc::not_found, "not held");
  for (const auto& h : holdings_[name].holdings) {
    if (h.version != version) continue;
    const std::string where = "agent copy of '" + name + "' version " + std::to_string(version);
    auto file = data_->open_held(h, cfg_.run, name, me);
    auto rd = file ? format::shard_reader::open(std::move(file).value(), where)
                   : result<std::unique_ptr<format::shard_reader>>(file.error());
    if (rd) return rd;
    std::fprintf(stderr, "cairn: rank %u: %s cannot be read in place: %s\n", me, where.c_str(),
                 rd.error().message().c_str());
    worst = rd.error();
  }
  return worst;
}

result<agents_view> agents_level::report_progress() {
  comm::communicator& comm = host_->comm();
  // The slowest rank's last transfer is the application's transfer time.
  int64_t us = static_cast<int64_t>(data_->last_transfer_s() * 1e6);
  double transfer_s = static_cast<double>(-comm.min(-us)) / 1e6;
  // The size of one checkpoint of all ranks (the last one taken), which the
  // controller's count rule and memory reservations need.
  int64_t mine = static_cast<int64_t>(last_image_bytes_);
  std::vector<std::byte> all;
  comm.gather(std::as_bytes(std::span<const int64_t>(&mine, 1)), &all);
  if (host_->rank() != 0) return view_;
  uint64_t total = 0;
  for (size_t i = 0; i + sizeof(int64_t) <= all.size(); i += sizeof(int64_t)) {
    int64_t x = 0;
    std::memcpy(&x, all.data() + i, sizeof x);
    total += static_cast<uint64_t>(std::max<int64_t>(0, x));
  }
  return control_->progress(view_.app, checkpoints_taken_, transfer_s, last_probe_s_, total);
}

result<int> agents_level::probe() {
  const double t0 = util::now_s();
  // One request does both: progress goes to the controller, the agents come back.
  auto v = report_progress();
  std::string text;
  if (host_->rank() == 0) {
    if (v && classify_change(view_, *v) != CAIRN_AGENTS_UNCHANGED && !v->ready())
      v = control_->wait_ready(view_.app, cfg_.agents_wait);
    if (!v) {
      // The controller restarting or unreachable must not disturb the
      // application: it keeps its agents and asks again at the next probe.
      std::fprintf(stderr, "cairn: warning: cairn_probe: %s; keeping the current agents\n", v.error().message().c_str());
    } else if (classify_change(view_, *v) != CAIRN_AGENTS_UNCHANGED) {
      text = v->encode();
    }
  }
  host_->comm().broadcast(&text, 0);
  int change = CAIRN_AGENTS_UNCHANGED;
  if (!text.empty()) {
    CAIRN_ASSIGN_OR_RETURN(agents_view nv, agents_view::decode(text));
    nv.key = view_.key;  // given at registration only
    change = classify_change(view_, nv);
    view_ = std::move(nv);
  }
  // A new set of agents, or (same agents) a rank whose agent failed tries again.
  if (change != CAIRN_AGENTS_UNCHANGED || (!view_.agents.empty() && !data_->has_agent())) {
    // Waits for a transfer in flight to the old agent to end.
    status mine = data_->use(view_, host_->rank(), host_->size());
    if (!mine) std::fprintf(stderr, "cairn: rank %d: warning: %s\n", host_->rank(), mine.message().c_str());
  }
  // The cost of a reconfiguration (t_probe of the break-even rule) goes with the next report.
  if (change != CAIRN_AGENTS_UNCHANGED) last_probe_s_ = util::now_s() - t0;
  return change;
}

bool agents_level::handed_over(const std::string& name, int64_t version) {
  for (version_record* rec : host_->pending()) {
    if (rec->name != name || rec->version != version) continue;
    unsigned done = 0, failed = 0;
    bool finished = false;
    status e;
    host_->engine().levels(*rec->job, &done, &failed, &finished, &e);
    // Held by its agent, or written by this rank itself (the fallback).
    return (done & CAIRN_LEVEL_PROTECTED) != 0 || (finished && e.is_ok());
  }
  return true;  // not pending: every stage of it ran
}

status agents_level::finish(bool waited) {
  comm::communicator& comm = host_->comm();
  const int rank = host_->rank();
  status first;
  if (cfg_.agents_persist) {
    // IC_PERSIST: the agents keep the checkpoints, i.e. write them. Wait until
    // the newest version of every name is committed before letting the
    // controller stop the agents (they get only a grace period to finish).
    const double limit = std::max(60.0, 4 * cfg_.agents_timeout);
    const double deadline = util::now_s() + limit;
    for (const auto& [name, version] : host_->newest_versions()) {
      // Finalized without waiting (cairn_finalize(c, 0)), a version some rank
      // abandoned before its agent held it can never be committed: waiting
      // for it would only end in an error after `limit`. One every rank
      // handed over is the agents' to commit, and is waited for.
      if (!waited && comm.min(handed_over(name, version) ? 1 : 0) == 0) continue;
      for (;;) {
        std::vector<int64_t> v = {committed(name, version) ? 1 : 0, util::now_s() < deadline ? 1 : 0};
        comm.allreduce_min(v);
        if (v[0]) break;
        if (!v[1]) {
          first = status(errc::io_error, "finalize: '" + name + "' version " + std::to_string(version) +
                                             " was not committed by the agents within " +
                                             std::to_string(static_cast<int>(limit)) + " s");
          break;
        }
        struct timespec ts {0, 20 * 1000 * 1000};
        nanosleep(&ts, nullptr);
      }
    }
    // The agents committed these versions; the catalog learns of them here
    // (`cairn reindex` would find them too).
    if (rank == 0)
      for (const auto& [name, version] : host_->tracked_versions())
        if (committed(name, version)) host_->index_committed(name, version);
  } else if (rank == 0) {
    // Without IC_PERSIST the agents drop what they hold of this run.
    for (size_t i = 0; i < data_->agent_count(); ++i) {
      status st = data_->release(i, cfg_.run);
      if (!st) std::fprintf(stderr, "cairn: warning: agent %zu did not release run '%s': %s\n", i, cfg_.run.c_str(),
                            st.message().c_str());
    }
  }
  (void)comm.min(0);  // every rank is done with its agent
  if (rank == 0) {
    status st = control_->unregister(view_.app);
    if (!st) std::fprintf(stderr, "cairn: warning: %s\n", st.message().c_str());
  }
  return first;
}

}  // namespace cairn
