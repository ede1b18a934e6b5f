#include "agents/controller.hpp"

#include <algorithm>
#include <map>

#include "agents/log.hpp"
#include "util/clock.hpp"
#include "util/hex.hpp"

namespace cairn::agents {
namespace {

using nlohmann::json;

// The node's state a manager sends with node_register and heartbeat.
struct node_report {
  node_metrics metrics;
  std::vector<agent_report> agents;
};
result<node_report> parse_node_report(fields& f) {
  const json* mj = f.object("metrics");
  const json* aj = f.array("agents", false, kMaxAgentsPerMessage);
  if (!f.ok()) return f.error();
  node_report r;
  CAIRN_ASSIGN_OR_RETURN(r.metrics, parse_metrics(*mj));
  CAIRN_ASSIGN_OR_RETURN(r.agents, parse_reports(aj));
  return r;
}

}  // namespace

std::string controller_openmetrics(const controller_state& s) {
  using labels = openmetrics_builder::labels;
  struct node_sums {
    uint64_t agents = 0, held = 0, reserved = 0;
  };
  std::map<std::string, node_sums> per_node;
  std::map<uint64_t, uint64_t> per_app;
  std::map<std::string, uint64_t> per_state;
  for (const auto& [id, g] : s.agents()) {
    node_sums& n = per_node[g.node];
    ++n.agents;
    n.held += g.memory_held;
    n.reserved += g.reserve;
    ++per_app[g.app];
    ++per_state[g.state];
  }
  openmetrics_builder b;
  b.family("cairn_controller_nodes", "gauge", "Agent nodes the controller knows, by state.");
  std::map<std::string, uint64_t> node_states{{"up", 0}, {"recovering", 0}, {"leaving", 0}};
  for (const auto& [id, n] : s.nodes()) ++node_states[n.leaving ? "leaving" : (n.reported ? "up" : "recovering")];
  for (const auto& [st, count] : node_states) b.sample({{"state", st}}, count);

  auto per_node_family = [&](const char* name, const char* help, auto get) {
    b.family(name, "gauge", help);
    for (const auto& [id, n] : s.nodes()) {
      auto it = per_node.find(id);
      b.sample(labels{{"node", id}}, get(n, it == per_node.end() ? node_sums{} : it->second));
    }
  };
  using node = controller_state::node;
  per_node_family("cairn_controller_node_capacity_agents", "Agents the node takes.",
                  [](const node& n, const node_sums&) { return uint64_t{n.capacity}; });
  per_node_family("cairn_controller_node_agents", "Agents assigned to the node.",
                  [](const node&, const node_sums& a) { return a.agents; });
  per_node_family("cairn_controller_node_memory_total_bytes", "The node's memory (MemTotal) as its manager last reported.",
                  [](const node& n, const node_sums&) { return n.metrics.mem_total; });
  per_node_family("cairn_controller_node_memory_available_bytes",
                  "The node's available memory (MemAvailable) as its manager last reported.",
                  [](const node& n, const node_sums&) { return n.metrics.mem_free; });
  per_node_family("cairn_controller_node_memory_reserved_bytes", "Memory the controller reserved for the node's agents.",
                  [](const node&, const node_sums& a) { return a.reserved; });
  per_node_family("cairn_controller_node_memory_held_bytes", "Checkpoint memory the node's agents hold (last reports).",
                  [](const node&, const node_sums& a) { return a.held; });
  per_node_family("cairn_controller_node_bandwidth_bytes_per_second",
                  "Bytes per second in use on the node (its manager's last report).",
                  [](const node& n, const node_sums&) { return n.metrics.bw_in_use; });

  b.family("cairn_controller_agents", "gauge",
           "Agents by the state their manager last reported (assigned: not reported yet).");
  for (const auto& [st, count] : per_state) b.sample({{"state", st}}, count);
  b.family("cairn_controller_applications", "gauge", "Registered applications.");
  b.sample({}, static_cast<uint64_t>(s.apps().size()));
  b.family("cairn_controller_app_agents", "gauge", "Agents an application has.");
  for (const auto& [id, a] : s.apps()) {
    auto it = per_app.find(id);
    b.sample({{"app", a.name}}, it == per_app.end() ? uint64_t{0} : it->second);
  }
  b.family("cairn_controller_app_target_agents", "gauge", "Agents an application should have (its target).");
  for (const auto& [id, a] : s.apps()) b.sample({{"app", a.name}}, uint64_t{a.target});

  const controller_state::decision_counts& d = s.decisions();
  b.family("cairn_controller_agent_placements", "counter",
           "Agents placed on a node, moved to another (node left or lost, migration) or removed, since start.");
  b.sample({{"action", "placed"}}, d.agents_placed);
  b.sample({{"action", "moved"}}, d.agents_moved);
  b.sample({{"action", "removed"}}, d.agents_removed);
  b.family("cairn_controller_nodes_removed", "counter", "Nodes removed since start: left gracefully or lost.");
  b.sample({{"reason", "left"}}, d.nodes_left);
  b.sample({{"reason", "lost"}}, d.nodes_lost);
  b.family("cairn_controller_resize_requests", "counter",
           "Requests to change an application's agent count, by outcome of the break-even rule.");
  b.sample({{"outcome", "applied"}}, d.resize_applied);
  b.sample({{"outcome", "refused"}}, d.resize_refused);
  b.family("cairn_controller_expansions", "counter",
           "Applications short of their target given agents where the break-even rule said so.");
  b.sample({}, d.expansions);
  return b.finish();
}

controller_service::controller_service(controller_options o)
    : opt_(std::move(o)),
      loop_(opt_.secret, opt_.limits),
      state_(opt_.policy, [this](const json& rec) { return journal_append(rec); }) {}

controller_service::~controller_service() { loop_.attach(nullptr); }

status controller_service::journal_append(const json& rec) {
  if (!journal_) return {};  // replaying: the records come from the journal
  return journal_->append(rec);
}

result<std::unique_ptr<controller_service>> controller_service::open(controller_options o) {
  CAIRN_RETURN_IF_ERROR(crypto_init());
  if (o.secret.size() < kMinSecretSize) return status(errc::invalid_argument, "controller: no deployment secret");
  if (o.journal_path.empty()) return status(errc::invalid_argument, "controller: no journal path");
  CAIRN_RETURN_IF_ERROR(storage::storage_env::posix()->make_dirs(storage::dirname_of(o.journal_path)));
  std::unique_ptr<controller_service> c(new controller_service(std::move(o)));
  journal_replay stats;
  auto j = journal::open(
      storage::storage_env::posix(), c->opt_.journal_path, [&c](const json& rec) { return c->state_.apply(rec); },
      [&c]() { return c->state_.snapshot(); }, &stats);
  if (!j) return j.take_status();
  c->journal_ = std::move(*j);
  c->state_.recovered(util::now_s());
  (void)c->state_.take_dirty_nodes();
  if (stats.created) {
    log_info("new journal " + c->opt_.journal_path);
  } else {
    log_info("recovered from journal " + c->opt_.journal_path + ": " + std::to_string(stats.records) + " records, " +
             std::to_string(c->state_.nodes().size()) + " nodes, " + std::to_string(c->state_.apps().size()) +
             " applications, " + std::to_string(c->state_.agents().size()) + " agents; managers have " +
             std::to_string(c->opt_.policy.heartbeat_timeout_s) + " s to report");
    if (stats.torn_bytes > 0) {
      log_warn("journal ended in an incomplete record (" + std::to_string(stats.torn_bytes) +
               " bytes, a crash during an append): dropped");
    }
  }
  if (c->opt_.service_secret.empty() || c->opt_.service_secret == c->opt_.secret)
    log_warn("no service secret apart from the deployment secret: any application could register as a manager "
             "(give --service-secret-file to the controller and the managers)");
  else
    c->loop_.set_service_secret(c->opt_.service_secret);
  CAIRN_RETURN_IF_ERROR(c->loop_.listen(c->opt_.listen));
  if (c->opt_.metrics_listen) {
    controller_service* self = c.get();
    c->metrics_ = std::make_unique<metrics_http_server>([self]() { return controller_openmetrics(self->state_); });
    CAIRN_RETURN_IF_ERROR(c->metrics_->listen(*c->opt_.metrics_listen));
    c->loop_.attach(c->metrics_.get());
    log_info("metrics at http://" + c->metrics_->listen_address() + "/metrics");
  }
  log_info("listening on " + c->address() + " (strategy " + strategy_name(c->opt_.policy.strat) + ", distribution " +
           distribution_name(c->opt_.policy.dist) + ")");
  return c;
}

void controller_service::on_closed(uint64_t conn) {
  auto it = node_of_conn_.find(conn);
  if (it == node_of_conn_.end()) return;
  // The node stays: its heartbeat timeout decides whether it is lost.
  log_info("manager of node " + it->second + " disconnected");
  conn_of_node_.erase(it->second);
  node_of_conn_.erase(it);
}

void controller_service::on_message(uint64_t conn, ctl_message& m) {
  result<json> r = handle(conn, m);
  if (r) {
    loop_.send(conn, m.type == ctl_type::node_register || m.type == ctl_type::heartbeat ? ctl_type::node_update
                                                                                           : ctl_type::reply,
               *r);
  } else {
    const status& st = r.error();
    if (st.code() == errc::invalid_argument) {
      connection* c = loop_.find(conn);
      log_rejection(c != nullptr ? c->peer() : "?", "bad_payload", st.message());
    }
    loop_.send(conn, ctl_type::error, error_body(st));
  }
  push_updates();
}

json controller_service::update_for(const std::string& node) const {
  node_update u = state_.desired_for(node);
  const auto pk = node_box_key_.find(node);
  for (desired_agent& d : u.agents) {
    const std::string& key = state_.apps().at(d.app).key;
    if (key.empty() || pk == node_box_key_.end()) continue;
    if (auto box = seal_to(pk->second, key)) d.key_box = util::hex_encode(*box);
  }
  return to_json(u);
}

bool controller_service::separate_service_secret() const {
  return !opt_.service_secret.empty() && opt_.service_secret != opt_.secret;
}

status controller_service::check_app_caller(const connection* c, uint64_t app, const json& body,
                                            const char* what) const {
  if (!separate_service_secret() || (c != nullptr && c->service())) return {};
  auto it = state_.apps().find(app);
  if (it == state_.apps().end() || it->second.key.empty()) return {};  // not_found comes from the request itself
  std::string proof;
  const auto p = body.find("proof");
  if (p != body.end() && p->is_string() && util::hex_decode(p->get<std::string>(), 32, &proof) &&
      c != nullptr && tag_equal(proof, app_request_proof(it->second.key, app, c->binding(), what)))
    return {};
  log_rejection(c != nullptr ? c->peer() : "?", what, "application " + std::to_string(app) + ": no proof of its key");
  return status(errc::invalid_argument, std::string(what) + ": application " + std::to_string(app) + " (" +
                                            it->second.name +
                                            ") is changed only by its own job (which holds its key) or by the "
                                            "service (its secret)");
}

// Longer than 120 lines for a reason: the dispatch over the control
// messages, each case with its own checks of the caller beside it.
result<json> controller_service::handle(uint64_t conn, ctl_message& m) {
  connection* c = loop_.find(conn);
  const std::string role = c != nullptr ? c->role() : "";
  const double now = util::now_s();
  fields f(m.body, type_name(m.type));
  switch (m.type) {
    case ctl_type::node_register: {
      if (role != "manager") return status(errc::invalid_argument, "node_register is for managers");
      std::string id, address;
      uint32_t capacity = 0;
      f.str("node", &id, true, kMaxNameLength);
      f.str("address", &address, true, 256);
      f.u32("capacity", &capacity, false, 1u << 16);
      std::string box_hex, box_public;
      f.str("box_public", &box_hex, true, 128);
      CAIRN_ASSIGN_OR_RETURN(node_report report, parse_node_report(f));
      if (!util::hex_decode(box_hex, kBoxPublicKeySize, &box_public))
        return status(errc::invalid_argument, "node_register: box_public is not the hex of a 32-byte public key");
      auto held = conn_of_node_.find(id);
      if (held != conn_of_node_.end() && held->second != conn) {
        return status(errc::again, "node id " + id + " is in use by another connected manager");
      }
      bool known = state_.nodes().count(id) > 0;
      CAIRN_RETURN_IF_ERROR(state_.node_register(id, address, capacity, report.metrics, report.agents, now));
      conn_of_node_[id] = conn;
      node_of_conn_[conn] = id;
      node_box_key_[id] = box_public;
      log_info(std::string(known ? "node came back: " : "node joined: ") + id + " at " + address + ", capacity " +
               std::to_string(state_.nodes().at(id).capacity));
      (void)state_.take_dirty_nodes();  // every node gets its update below or on its heartbeat
      return update_for(id);
    }
    case ctl_type::heartbeat: {
      auto bound = node_of_conn_.find(conn);
      if (bound == node_of_conn_.end()) return status(errc::not_found, "heartbeat before node_register");
      CAIRN_ASSIGN_OR_RETURN(node_report report, parse_node_report(f));
      CAIRN_RETURN_IF_ERROR(state_.node_heartbeat(bound->second, report.metrics, report.agents, now));
      return update_for(bound->second);
    }
    case ctl_type::node_leave: {
      auto bound = node_of_conn_.find(conn);
      if (bound == node_of_conn_.end()) return status(errc::not_found, "node_leave before node_register");
      std::string id = bound->second;
      auto moved = state_.node_leave(id);
      if (!moved) return moved.take_status();
      conn_of_node_.erase(id);
      node_of_conn_.erase(bound);
      log_info("node left: " + id + ", " + std::to_string(*moved) + " agents moved to other nodes");
      return json{{"node", id}, {"moved", *moved}};
    }
    case ctl_type::app_register: {
      std::string name, s, d;
      uint32_t block = 0;
      f.str("name", &name, true, kMaxNameLength);
      const json* hj = f.object("hints", false);
      f.str("strategy", &s, false, 32);
      f.str("distribution", &d, false, 32);
      f.u32("block_size", &block, false, 1u << 16);
      std::string box_hex, proof_hex, box_public, proof;
      f.str("box_public", &box_hex, true, 128);
      f.str("proof", &proof_hex, false, 128);
      if (!f.ok()) return f.error();
      if (!util::hex_decode(box_hex, kBoxPublicKeySize, &box_public))
        return status(errc::invalid_argument, "app_register: box_public is not the hex of a 32-byte public key");
      if (!proof_hex.empty() && !util::hex_decode(proof_hex, 32, &proof))
        return status(errc::invalid_argument, "app_register: proof is not the hex of 32 bytes");
      app_hints hints;
      if (hj != nullptr) {
        auto h = parse_hints(*hj);
        if (!h) return h.take_status();
        hints = *h;
      }
      std::optional<strategy> ps;
      std::optional<distribution> pd;
      if (!s.empty() && !(ps = parse_strategy(s))) {
        return status(errc::invalid_argument, "unknown strategy '" + s + "' (bandwidth, memory, activity, power)");
      }
      if (!d.empty() && !(pd = parse_distribution(d))) {
        return status(errc::invalid_argument, "unknown distribution '" + d + "' (block, round_robin, fill)");
      }
      // A name registered before is a returning application (a restarted
      // job): its agents may hold its checkpoints, so its restart must not
      // take an agent's silence for "holds nothing".
      const auto known = std::find_if(state_.apps().begin(), state_.apps().end(),
                                      [&](const auto& kv) { return kv.second.name == name; });
      const bool returning = known != state_.apps().end();
      // Only who holds its key may come back as it: its agents hold its
      // checkpoints and would serve them to whoever holds the key.
      if (returning && !known->second.key.empty() &&
          !tag_equal(proof, app_key_proof(known->second.key, name, box_public))) {
        log_rejection(c != nullptr ? c->peer() : "?", "app_register",
                      "application " + name + (proof.empty() ? ": no proof of its key" : ": a wrong proof of its key"));
        return status(errc::busy,
                      "application '" + name + "' is registered already, and this client " +
                          (proof.empty() ? "does not hold its key" : "holds another key") +
                          " (the key its first job kept in the run directory, agents.key): "
                          "another job runs under this name, or the key file was lost; give the job another run "
                          "name, or unregister the old one with `cairn agents unregister`");
      }
      auto id = state_.app_register(name, hints, ps, pd, block > 0 ? std::optional<uint32_t>(block) : std::nullopt);
      if (!id) return id.take_status();
      const auto& a = state_.apps().at(*id);
      log_info("application registered: " + name + " as " + std::to_string(*id) + ": " + a.last_decision);
      json reply = state_.app_agents_json(*id);
      if (!a.key.empty()) {
        CAIRN_ASSIGN_OR_RETURN(std::string box, seal_to(box_public, a.key));
        reply["key_box"] = util::hex_encode(box);
      }
      reply["returning"] = returning;
      reply["checkpoints_done"] = a.checkpoints_done;
      return reply;
    }
    case ctl_type::app_unregister: {
      uint64_t id = 0;
      f.u64("app", &id);
      if (!f.ok()) return f.error();
      CAIRN_RETURN_IF_ERROR(check_app_caller(c, id, m.body, "app_unregister"));
      CAIRN_RETURN_IF_ERROR(state_.app_unregister(id));
      log_info("application " + std::to_string(id) + " unregistered");
      return json{{"app", id}};
    }
    case ctl_type::app_progress: {
      uint64_t id = 0, done = 0, bytes = 0;
      double transfer = 0, probe = 0;
      f.u64("app", &id);
      f.u64("checkpoints_done", &done);
      f.num("transfer_s", &transfer, false, 0, 1e7);
      f.num("probe_s", &probe, false, 0, 1e7);
      f.u64("checkpoint_bytes", &bytes, false, uint64_t{1} << 56);
      if (!f.ok()) return f.error();
      CAIRN_RETURN_IF_ERROR(check_app_caller(c, id, m.body, "app_progress"));
      CAIRN_RETURN_IF_ERROR(state_.app_progress(id, done, transfer, probe, bytes));
      return state_.app_agents_json(id);
    }
    case ctl_type::app_resize: {
      uint64_t id = 0;
      uint32_t count = 0;
      bool force = false;
      f.u64("app", &id);
      f.u32("agents", &count);
      f.boolean("force", &force, false);
      if (!f.ok()) return f.error();
      CAIRN_RETURN_IF_ERROR(check_app_caller(c, id, m.body, "app_resize"));
      auto d = state_.app_resize(id, count, force);
      if (!d) return d.take_status();
      log_info("application " + std::to_string(id) + " resize to " + std::to_string(count) + ": " +
               (d->applied ? "applied" : "refused") + " (" + d->reason + ")");
      json out = state_.app_agents_json(id);
      out["decision"] = d->to_json();
      return out;
    }
    case ctl_type::agent_migrate: {
      uint64_t agent = 0;
      std::string node;
      f.u64("agent", &agent);
      f.str("node", &node, false, kMaxNameLength);
      if (!f.ok()) return f.error();
      if (separate_service_secret() && (c == nullptr || !c->service()))
        return status(errc::invalid_argument, "agent_migrate is for the service (its secret), not applications");
      std::string from = state_.agents().count(agent) ? state_.agents().at(agent).node : "";
      auto to = state_.agent_migrate(agent, node);
      if (!to) return to.take_status();
      log_info("agent " + std::to_string(agent) + " migrated from " + from + " to " + *to);
      return json{{"agent", agent}, {"from", from}, {"node", *to}};
    }
    case ctl_type::app_agents: {
      uint64_t id = 0;
      f.u64("app", &id);
      if (!f.ok()) return f.error();
      if (!state_.apps().count(id)) return status(errc::not_found, "application " + std::to_string(id) + " is not registered");
      return state_.app_agents_json(id);
    }
    case ctl_type::status: {
      json j = state_.status_json(now);
      j["controller"] = {{"address", address()}, {"journal", opt_.journal_path}, {"connections", loop_.connections()}};
      for (auto& n : j["nodes"]) n["connected"] = conn_of_node_.count(n["node"].get<std::string>()) > 0;
      return j;
    }
    default:
      return status(errc::invalid_argument, std::string(type_name(m.type)) + " is not a request to the controller");
  }
}

void controller_service::push_updates() {
  for (const std::string& node : state_.take_dirty_nodes()) {
    auto it = conn_of_node_.find(node);
    if (it == conn_of_node_.end()) continue;
    if (!state_.nodes().count(node)) {
      // Removed while connected (declared lost, then heard from): it must register again.
      loop_.send(it->second, ctl_type::node_update, to_json(node_update{state_.generation(), 1000, {}}));
      continue;
    }
    loop_.send(it->second, ctl_type::node_update, update_for(node));
  }
}

void controller_service::tick(double now) {
  for (const std::string& id : state_.expire(now)) {
    log_warn("node lost: " + id + " (no heartbeat for " + std::to_string(opt_.policy.heartbeat_timeout_s) +
             " s); its agents were reassigned");
    auto it = conn_of_node_.find(id);
    if (it != conn_of_node_.end()) {
      node_of_conn_.erase(it->second);
      loop_.close(it->second, "node declared lost");
      conn_of_node_.erase(it);
    }
  }
  if (now >= next_fill_) {
    next_fill_ = now + std::max(0.5, opt_.policy.heartbeat_interval_s);
    status st = state_.fill_shortfalls();
    if (!st) log_error("expanding applications short of agents: " + st.message());
  }
  if (journal_->failed() || journal_->appended_since_rewrite() >= opt_.compact_after) {
    status st = journal_->rewrite(state_.snapshot());
    if (!st) log_error(st.message());
  }
  push_updates();
}

void controller_service::run_once(int timeout_ms) {
  loop_.run_once(timeout_ms, *this);
  tick(util::now_s());
}

status controller_service::run(const std::atomic<bool>* stop) {
  while (!stop->load()) run_once(100);
  log_info("stopping");
  return {};
}

}  // namespace cairn::agents
