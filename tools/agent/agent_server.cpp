// cairn-agent's serving side (agent_server.hpp). create() opens the endpoint
// and starts the workers and the writer. run() is the serving thread: it
// receives every message, drops unsealed and replayed ones (counted, logged
// once), answers QUERY and RELEASE at once, hands READY and RESTORE_DONE to
// agent_transfers.cpp, queues PUSH_DONE and RESTORE for the workers, and
// rewrites the stats file after every message and once a second. On stop it
// joins the workers, lets the writer finish its queue and returns the writer's
// latched error. reply() is here too; the workers call it as well. The impl
// shared with the other files is in agent_server_impl.hpp.
#include "agent_server.hpp"

#include <unistd.h>

#include <chrono>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "agent_server_impl.hpp"
#include "format/shard_io.hpp"

namespace cairn::agents {

agent_server::impl::~impl() {
  stop_workers();
  {
    cairn::lock_guard lk(mu);
    writer_stop = true;
  }
  cv.notify_all();
  if (writer.joinable()) writer.join();
  pendings.clear();  // regions before the endpoint
}

void agent_server::impl::stop_workers() {
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

bool agent_server::impl::is_dead(const std::string& peer) {
  cairn::lock_guard lk(jobs_mu);
  return dead_peers.count(peer) != 0;
}

status agent_server::impl::reply(fabric::fabric_addr peer, const data_message& req, data_msg type,
                                 const status& st, uint64_t addr, uint64_t key, uint64_t length,
                                 int64_t version, const std::string& text) {
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

// QUERY, answered at once (never behind a transfer). A query from an
// endpoint the run has not used is the run's next incarnation (a restart):
// what the previous one still has queued or in flight is cancelled.
void agent_server::impl::handle_query(const data_message& m, fabric::fabric_addr peer) {
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
void agent_server::impl::handle_release(const data_message& m, fabric::fabric_addr peer) {
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

// The manager's view of this agent (see agent_config::stats_file).
void agent_server::impl::write_stats() {
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

void agent_server::impl::dispatch(const std::string& bytes) {
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
