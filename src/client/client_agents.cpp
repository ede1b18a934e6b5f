// Remote checkpoint agents, the client's collective side (docs/design/agents.md,
// "Client"): registration at init, cairn_probe, progress reports, finalize.
// Rank 0 alone talks to the controller and broadcasts what it learnt; every
// rank talks to its agent (agents_link.hpp).
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "agents/auth.hpp"
#include "client/client.hpp"
#include "format/layout.hpp"
#include "util/clock.hpp"
#include "util/mutex.hpp"

namespace cairn {

status client_impl::start_agents() {
  status st;
  std::string text;
  if (rank() == 0) {
    auto ctl = agents_control::open(cfg_);
    if (!ctl) {
      st = ctl.take_status();
    } else {
      control_ = std::move(ctl).value();
      agents::app_hints h;
      h.ranks = static_cast<uint32_t>(size());
      h.nodes = run_info_.executions.empty() ? 1 : static_cast<uint32_t>(run_info_.executions.back().hosts.size());
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
  CAIRN_RETURN_IF_ERROR(agree(st).with_context("agents"));
  comm_->broadcast(&text, 0);
  CAIRN_ASSIGN_OR_RETURN(agents_view_, agents_view::decode(text));
  // An agent that cannot be reached now is not fatal: this rank writes its
  // shards itself until a probe brings a working agent.
  status mine = agents_->use(agents_view_, rank(), size());
  if (!mine)
    std::fprintf(stderr, "cairn: rank %d: warning: %s; writing checkpoints to the persistent level instead\n", rank(),
                 mine.message().c_str());
  if (rank() == 0) {
    std::string nodes;
    for (const auto& a : agents_view_.agents) nodes += (nodes.empty() ? "" : ", ") + std::to_string(a.id) + "@" + a.node;
    if (agents_view_.agents.empty())
      std::fprintf(stderr, "cairn: warning: the controller at %s has no agent for run '%s' yet; ranks write the "
                           "persistent level themselves until cairn_probe finds agents\n",
                   control_->address().c_str(), cfg_.run.c_str());
    else if (!agents_view_.ready())
      std::fprintf(stderr, "cairn: warning: some agents of run '%s' did not start within agents_wait = %g s (%s)\n",
                   cfg_.run.c_str(), cfg_.agents_wait, nodes.c_str());
  }
  return {};
}

result<agents_view> client_impl::report_agents_progress() {
  // The slowest rank's last transfer is the application's transfer time.
  int64_t us = static_cast<int64_t>(agents_->last_transfer_s() * 1e6);
  double transfer_s = static_cast<double>(-comm_->min(-us)) / 1e6;
  // The size of one checkpoint of all ranks (the last one taken), which the
  // controller's count rule and memory reservations need.
  int64_t mine = static_cast<int64_t>(last_image_bytes_);
  std::vector<std::byte> all;
  comm_->gather(std::as_bytes(std::span<const int64_t>(&mine, 1)), &all);
  if (rank() != 0) return agents_view_;
  uint64_t total = 0;
  for (size_t i = 0; i + sizeof(int64_t) <= all.size(); i += sizeof(int64_t)) {
    int64_t x = 0;
    std::memcpy(&x, all.data() + i, sizeof x);
    total += static_cast<uint64_t>(std::max<int64_t>(0, x));
  }
  return control_->progress(agents_view_.app, checkpoints_taken_, transfer_s, last_probe_s_, total);
}

result<int> client_impl::probe() {
  if (finalized_) return status(errc::invalid_argument, "cairn_probe: handle already finalized");
  if (!agents_) return CAIRN_AGENTS_UNCHANGED;
  const double t0 = util::now_s();
  // One request does both: progress goes to the controller, the agents come back.
  auto v = report_agents_progress();
  std::string text;
  if (rank() == 0) {
    if (v && classify_change(agents_view_, *v) != CAIRN_AGENTS_UNCHANGED && !v->ready())
      v = control_->wait_ready(agents_view_.app, cfg_.agents_wait);
    if (!v) {
      // The controller restarting or unreachable must not disturb the
      // application: it keeps its agents and asks again at the next probe.
      std::fprintf(stderr, "cairn: warning: cairn_probe: %s; keeping the current agents\n", v.error().message().c_str());
    } else if (classify_change(agents_view_, *v) != CAIRN_AGENTS_UNCHANGED) {
      text = v->encode();
    }
  }
  comm_->broadcast(&text, 0);
  int change = CAIRN_AGENTS_UNCHANGED;
  if (!text.empty()) {
    CAIRN_ASSIGN_OR_RETURN(agents_view nv, agents_view::decode(text));
    nv.key = agents_view_.key;  // given at registration only
    change = classify_change(agents_view_, nv);
    agents_view_ = std::move(nv);
  }
  // A new set of agents, or (same agents) a rank whose agent failed tries again.
  if (change != CAIRN_AGENTS_UNCHANGED || (!agents_view_.agents.empty() && !agents_->has_agent())) {
    // Waits for a transfer in flight to the old agent to end.
    status mine = agents_->use(agents_view_, rank(), size());
    if (!mine) std::fprintf(stderr, "cairn: rank %d: warning: %s\n", rank(), mine.message().c_str());
  }
  // The cost of a reconfiguration (t_probe of the break-even rule) goes with the next report.
  if (change != CAIRN_AGENTS_UNCHANGED) last_probe_s_ = util::now_s() - t0;
  return change;
}

bool client_impl::committed_by_agents(const std::string& name, int64_t version) {
  return env_->exists(format::manifest_path(cfg_.persistent, cfg_.run, name, version));
}

status client_impl::finish_agents() {
  status first;
  if (cfg_.agents_persist) {
    // IC_PERSIST: the agents keep the checkpoints, i.e. write them. Wait until
    // the newest version of every name is committed before letting the
    // controller stop the agents (they get only a grace period to finish).
    const double limit = std::max(60.0, 4 * cfg_.agents_timeout);
    const double deadline = util::now_s() + limit;
    for (const auto& [name, version] : last_version_) {
      for (;;) {
        std::vector<int64_t> v = {committed_by_agents(name, version) ? 1 : 0, util::now_s() < deadline ? 1 : 0};
        comm_->allreduce_min(v);
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
    if (rank() == 0) {
      cairn::lock_guard lk(catalog_mu_);
      for (const auto& [key, rec] : records_) {
        if (!catalog_ || !committed_by_agents(key.first, key.second)) continue;
        status st = catalog_->index_version(env_, cfg_.run, key.first, key.second);
        if (!st) std::fprintf(stderr, "cairn: warning: catalog: %s\n", st.message().c_str());
      }
    }
  } else if (rank() == 0) {
    // Without IC_PERSIST the agents drop what they hold of this run.
    for (size_t i = 0; i < agents_->agent_count(); ++i) {
      status st = agents_->release(i, cfg_.run);
      if (!st) std::fprintf(stderr, "cairn: warning: agent %zu did not release run '%s': %s\n", i, cfg_.run.c_str(),
                            st.message().c_str());
    }
  }
  (void)comm_->min(0);  // every rank is done with its agent
  if (rank() == 0) {
    status st = control_->unregister(agents_view_.app);
    if (!st) std::fprintf(stderr, "cairn: warning: %s\n", st.message().c_str());
  }
  return first;
}

}  // namespace cairn
