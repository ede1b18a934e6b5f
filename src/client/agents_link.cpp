#include "client/agents_link.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "agents/auth.hpp"
#include "agents/protocol.hpp"
#include "agents/wire.hpp"
#include "cairn.h"
#include "engine/stages.hpp"
#include "format/commit.hpp"
#include "format/layout.hpp"
#include "format/tree.hpp"
#include "util/clock.hpp"
#include "util/hex.hpp"
#include "util/json.hpp"

#ifdef CAIRN_HAVE_FABRIC
#include "agents/data_protocol.hpp"
#include "fabric/fabric.hpp"
#include "util/mutex.hpp"
#endif

namespace cairn {

namespace {
// Agents mode (docs/design/agents.md, "Client"): hands the image to this
// rank's agent; its completion is the PROTECTED level. A failure (no agent,
// agent gone) is not the application's error: the level is marked failed and
// the next stage writes the shard itself.
class agents_stage final : public engine::stage {
 public:
  agents_stage(agents_data* data, storage::storage_env* env, std::string store)
      : data_(data), env_(env), store_(std::move(store)) {}
  const char* name() const override { return "agents"; }
  unsigned level() const override { return CAIRN_LEVEL_PROTECTED; }
  // The agents hold the lent regions: the application has its memory back.
  unsigned completes(const engine::version_job& job) const override {
    return CAIRN_LEVEL_PROTECTED | (job.lent.empty() ? 0u : CAIRN_LEVEL_CAPTURED);
  }
  bool latches() const override { return false; }
  status run(engine::version_job& job) override {
    if (!data_->has_agent()) return {errc::not_found, "no checkpoint agent serves this rank"};
    CAIRN_RETURN_IF_ERROR(data_->checkpoint({job.image->data(), job.header.file_size}, job.header, job.lent));
    if (!job.tree_image.empty()) {
      // The agents keep shard images; the small hash tree goes beside the shard
      // they will write (not durable: a missing tree only slows comparisons).
      const auto& h = job.header;
      const std::string dir = format::version_dir(store_, h.run, h.name, h.version);
      status st = env_->make_dirs(dir);
      if (st) st = env_->write_atomic(storage::join(dir, format::tree_file_name(h.rank)), job.tree_image, false);
      if (!st) std::fprintf(stderr, "cairn: warning: hash tree of '%s' version %lld not written: %s\n", h.name.c_str(),
                            static_cast<long long>(h.version), st.message().c_str());
    }
    return {};
  }

 private:
  agents_data* data_;
  storage::storage_env* env_;
  std::string store_;
};

// Agents mode: a version the agent did not take is written to the persistent
// level by the rank itself, and committed by whichever writer completes it.
class agents_fallback_stage final : public engine::stage {
 public:
  agents_fallback_stage(storage::storage_env* env, std::string store, bool direct)
      : env_(env), store_(std::move(store)), direct_(direct) {}
  const char* name() const override { return "persistent (no agent)"; }
  bool applies(const engine::version_job& job) const override {
    return (job.failed & CAIRN_LEVEL_PROTECTED) != 0;  // set by the agents stage, on this thread
  }
  status run(engine::version_job& job) override {
    const auto& h = job.header;
    const double t0 = util::now_s();
    CAIRN_RETURN_IF_ERROR(engine::write_shard_file(env_, format::shard_path(store_, h.run, h.name, h.version, h.rank),
                                                   job.image->data(), h.file_size, direct_, true, job.tree_image));
    job.persistent_s = util::now_s() - t0;
    job.persistent_at = util::wall_s();
    return format::commit_if_complete(env_, store_, h, program_invocation_short_name, "rank").take_status();
  }

 private:
  storage::storage_env* env_;
  std::string store_;
  bool direct_;
};
}  // namespace

std::unique_ptr<engine::stage> make_agents_stage(agents_data* data, storage::storage_env* env, std::string store) {
  return std::make_unique<agents_stage>(data, env, std::move(store));
}

std::unique_ptr<engine::stage> make_agents_fallback_stage(storage::storage_env* env, std::string store,
                                                          bool direct_io) {
  return std::make_unique<agents_fallback_stage>(env, std::move(store), direct_io);
}


using nlohmann::json;

// ---- views ----------------------------------------------------------------------

bool agents_view::ready() const {
  return std::all_of(agents.begin(), agents.end(), [](const agent_ref& a) { return !a.endpoint.empty(); });
}

std::string agents_view::encode() const {
  json list = json::array();
  for (const auto& a : agents) list.push_back({{"agent", a.id}, {"node", a.node}, {"endpoint", a.endpoint}});
  json j = {{"app", app},       {"generation", generation}, {"target", target},
            {"agents", list}, {"returning", returning},   {"checkpoints_done", checkpoints_done}};
  if (!key.empty()) j["key"] = util::hex_encode(key);
  return j.dump();
}

result<agents_view> agents_view::from_reply(const json& body) {
  try {
    agents_view v;
    v.app = util::int_at<uint64_t>(body, "app");
    v.generation = util::int_at<uint64_t>(body, "generation");
    v.target = util::int_or<uint32_t>(body, "target", 0);
    v.returning = body.value("returning", false);
    v.checkpoints_done = util::int_or<uint64_t>(body, "checkpoints_done", 0);
    for (const auto& a : body.at("agents")) {
      agent_ref r;
      r.id = util::int_at<uint64_t>(a, "agent");
      r.node = a.value("node", "");
      r.endpoint = a.value("endpoint", "");
      v.agents.push_back(std::move(r));
    }
    if (const std::string k = body.value("key", ""); !k.empty() && !util::hex_decode(k, agents::kAppKeySize, &v.key))
      return status(errc::corruption, "agent list: a key that is not 32 bytes of hex");
    return v;
  } catch (const std::exception& e) {
    return status(errc::corruption, std::string("controller reply: malformed agent list: ") + e.what());
  }
}

result<agents_view> agents_view::decode(const std::string& text) {
  try {
    return from_reply(json::parse(text));
  } catch (const std::exception& e) {
    return status(errc::corruption, std::string("agent list: ") + e.what());
  }
}

int classify_change(const agents_view& before, const agents_view& after) {
  std::set<uint64_t> a, b;
  for (const auto& r : before.agents) a.insert(r.id);
  for (const auto& r : after.agents) b.insert(r.id);
  if (b.size() > a.size()) return CAIRN_AGENTS_EXPANDED;
  if (b.size() < a.size()) return CAIRN_AGENTS_REDUCED;
  if (a != b) return CAIRN_AGENTS_MIGRATED;
  // Same agents; an agent restarted by its manager has a new address.
  for (size_t i = 0; i < before.agents.size(); ++i)
    if (before.agents[i].endpoint != after.agents[i].endpoint) return CAIRN_AGENTS_MIGRATED;
  return CAIRN_AGENTS_UNCHANGED;
}

size_t agent_for_rank(int rank, int nranks, size_t k) {
  if (k == 0 || nranks <= 0) return 0;
  return static_cast<size_t>(static_cast<uint64_t>(rank) * k / static_cast<uint64_t>(nranks));
}

// ---- control plane --------------------------------------------------------------

result<agents_control> agents_control::open(const config& cfg) {
  agents_control c;
  auto a = agents::parse_address(cfg.agents);
  if (!a) return a.error().with_context("configuration key 'agents' (CAIRN_AGENTS)");
  c.address_ = *a;
  c.address_text_ = cfg.agents;
  std::string warning;
  auto secret = agents::load_deployment_secret(cfg.agents_secret_file, &warning);
  if (!secret) return secret.error().with_context("agents_secret_file (CAIRN_AGENTS_SECRET_FILE)");
  c.secret_ = std::move(secret).value();
  c.timeout_ms_ = static_cast<int>(std::clamp(cfg.agents_timeout, 1.0, 3600.0) * 1000);
  return c;
}

result<json> agents_control::call(agents::ctl_type t, json body, const agents::body_finish& finish) {
  auto r = agents::control_call_bound(address_, secret_, "client", t, std::move(body), finish, timeout_ms_);
  if (!r) return r.error().with_context(std::string("controller ") + address_text_ + ", " + agents::type_name(t));
  return r;
}

result<agents_view> agents_control::register_app(const std::string& name, const agents::app_hints& hints,
                                                 const std::string& held_key) {
  // The key comes back sealed to a key pair drawn for this registration.
  const agents::box_keypair kp = agents::new_box_keypair();
  json req = {{"name", name}, {"hints", agents::to_json(hints)}, {"box_public", util::hex_encode(kp.public_key)}};
  if (!held_key.empty()) req["proof"] = util::hex_encode(agents::app_key_proof(held_key, name, kp.public_key));
  CAIRN_ASSIGN_OR_RETURN(json body, call(agents::ctl_type::app_register, req));
  std::string box_hex = body.value("key_box", ""), box;
  body.erase("key_box");
  CAIRN_ASSIGN_OR_RETURN(agents_view v, agents_view::from_reply(body));
  if (!box_hex.empty()) {
    if (!util::hex_decode(box_hex, box_hex.size() / 2, &box))
      return status(errc::corruption, "controller reply: a key box that is not hex");
    auto key = agents::open_sealed(kp, box);
    if (!key) return key.take_status().with_context("controller reply: the application key");
    v.key = std::move(key).value();
    if (v.key.size() != agents::kAppKeySize)
      return status(errc::corruption, "controller reply: an application key of " + std::to_string(v.key.size()) +
                                          " bytes");
  }
  key_ = v.key;
  return v;
}

result<json> agents_control::call_as_app(agents::ctl_type t, json body, uint64_t app) {
  agents::body_finish prove;
  if (!key_.empty())
    prove = [this, app, t](json& b, std::string_view binding) {
      b["proof"] = util::hex_encode(agents::app_request_proof(key_, app, binding, agents::type_name(t)));
    };
  return call(t, std::move(body), prove);
}

result<agents_view> agents_control::fetch(uint64_t app) {
  CAIRN_ASSIGN_OR_RETURN(json body, call(agents::ctl_type::app_agents, {{"app", app}}));
  return agents_view::from_reply(body);
}

result<agents_view> agents_control::wait_ready(uint64_t app, double timeout_s) {
  const double deadline = util::now_s() + timeout_s;
  for (;;) {
    CAIRN_ASSIGN_OR_RETURN(agents_view v, fetch(app));
    if (v.ready() || util::now_s() >= deadline) return v;
    struct timespec ts {0, 100 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
}

result<agents_view> agents_control::progress(uint64_t app, uint64_t checkpoints_done, double transfer_s,
                                             double probe_s, uint64_t checkpoint_bytes) {
  json body = {{"app", app}, {"checkpoints_done", checkpoints_done}};
  if (checkpoint_bytes > 0) body["checkpoint_bytes"] = checkpoint_bytes;
  if (transfer_s > 0) body["transfer_s"] = transfer_s;
  if (probe_s > 0) body["probe_s"] = probe_s;
  CAIRN_ASSIGN_OR_RETURN(json reply, call_as_app(agents::ctl_type::app_progress, std::move(body), app));
  return agents_view::from_reply(reply);
}

status agents_control::unregister(uint64_t app) {
  return call_as_app(agents::ctl_type::app_unregister, {{"app", app}}, app).take_status();
}

// ---- data plane -------------------------------------------------------------------

std::string route_source_address(const std::string& controller) {
  auto a = agents::parse_address(controller);
  if (!a) return "127.0.0.1";
  struct addrinfo hints {};
  hints.ai_socktype = SOCK_DGRAM;
  struct addrinfo* res = nullptr;
  if (getaddrinfo(a->host.c_str(), std::to_string(a->port).c_str(), &hints, &res) != 0 || res == nullptr)
    return "127.0.0.1";
  std::string out = "127.0.0.1";
  // A UDP connect sends nothing; it only picks the route and its source address.
  int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    struct sockaddr_storage ss {};
    socklen_t len = sizeof ss;
    char buf[INET6_ADDRSTRLEN] = {0};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      const void* src = ss.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr)
                                                 : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr);
      if (inet_ntop(ss.ss_family, src, buf, sizeof buf)) out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  return out;
}

#ifdef CAIRN_HAVE_FABRIC
namespace {

class fabric_agents_data final : public agents_data {
 public:
  explicit fabric_agents_data(const config& cfg) {
    opts_.fabric.provider = cfg.agents_provider;
    opts_.fabric.node = cfg.agents_bind == "auto" ? route_source_address(cfg.agents) : cfg.agents_bind;
    opts_.fabric.timeout_s = cfg.agents_timeout;
    opts_.reply_timeout_s = cfg.agents_timeout;
    mode_ = cfg.agents_mode == agents_transfer::push ? agents::transfer_mode::push : agents::transfer_mode::pull;
  }

  status use(const agents_view& v, int rank, int nranks) override {
    cairn::lock_guard lk(mu_);
    // Keep the connections to agents that stay at the same address.
    std::vector<std::unique_ptr<agents::agent_client>> clients(v.agents.size());
    for (size_t i = 0; i < v.agents.size(); ++i)
      for (size_t j = 0; j < view_.agents.size(); ++j)
        if (clients_[j] && view_.agents[j].id == v.agents[i].id && view_.agents[j].endpoint == v.agents[i].endpoint)
          clients[i] = std::move(clients_[j]);
    view_ = v;
    clients_ = std::move(clients);
    mine_ = v.agents.empty() ? SIZE_MAX : agent_for_rank(rank, nranks, v.agents.size());
    failed_ = false;
    if (mine_ == SIZE_MAX) return {};
    auto c = client(mine_);
    if (!c) {
      failed_ = true;
      return c.take_status();
    }
    return {};
  }

  bool has_agent() override {
    cairn::lock_guard lk(mu_);
    return mine_ != SIZE_MAX && !failed_;
  }

  void forget_lent() override {
    cairn::lock_guard lk(mu_);
    for (auto& c : clients_)
      if (c) c->forget_lent();
  }

  status checkpoint(std::span<std::byte> image, const format::shard_header& h,
                    std::span<const std::byte* const> lent) override {
    cairn::lock_guard lk(mu_);
    if (mine_ == SIZE_MAX) return {errc::not_found, "no checkpoint agent is assigned to this rank"};
    if (failed_) return {errc::io_error, "agent " + std::to_string(view_.agents[mine_].id) + " failed earlier (call cairn_probe)"};
    auto c = client(mine_);
    if (!c) {
      failed_ = true;
      return c.take_status();
    }
    const double t0 = util::now_s();
    status st = lent.empty() ? (*c)->checkpoint(image, h, mode_) : (*c)->checkpoint(image, h, lent);
    if (!st) {
      failed_ = true;
      clients_[mine_].reset();  // its endpoint may be wedged; a new one next time
      st = st.with_context("agent " + std::to_string(view_.agents[mine_].id) + " on " + view_.agents[mine_].node);
      // Said once per failure: the rank now writes its shards itself.
      std::fprintf(stderr, "cairn: rank %u: warning: %s; writing checkpoints to the persistent level until "
                           "cairn_probe brings a working agent\n", h.rank, st.message().c_str());
      return st;
    }
    last_s_ = util::now_s() - t0;
    return {};
  }

  double last_transfer_s() override {
    cairn::lock_guard lk(mu_);
    return last_s_;
  }

  agents_holdings held(const std::string& run, const std::string& name, uint32_t rank, double wait_s) override {
    cairn::lock_guard lk(mu_);
    agents_holdings out;
    const double deadline = util::now_s() + wait_s;
    for (size_t i = 0; i < view_.agents.size(); ++i) {
      const agent_ref& a = view_.agents[i];
      status why;
      for (int attempt = 0;; ++attempt) {
        auto c = client(i);
        if (c) (*c)->prepare_lanes();  // a restore follows: its lanes open while the agent answers
        auto list = c ? (*c)->held(run, name, rank) : result<std::vector<agents::held_info>>(c.error());
        if (list) {
          for (const auto& h : *list) out.holdings.push_back({h.version, h.length, h.attempt, i});
          why = status();
          break;
        }
        why = list.error();
        clients_[i].reset();  // a new endpoint for the next try
        if (util::now_s() >= deadline) break;
        if (attempt == 0)
          std::fprintf(stderr, "cairn: rank %u: agent %llu on %s does not answer (%s); asking again for up to %.0f s\n",
                       rank, static_cast<unsigned long long>(a.id), a.node.c_str(), why.message().c_str(),
                       std::max(0.0, deadline - util::now_s()));
        struct timespec ts {0, 200 * 1000 * 1000};
        nanosleep(&ts, nullptr);
      }
      if (!why.is_ok())
        out.unreachable.push_back({a, why.message()});
    }
    return out;
  }

  result<format::shard_header> restore(const agent_holding& h, const std::string& run, const std::string& name,
                                       uint32_t rank, engine::aligned_buffer* image) override {
    cairn::lock_guard lk(mu_);
    if (h.agent >= view_.agents.size()) return status(errc::not_found, "agent index out of range");
    CAIRN_ASSIGN_OR_RETURN(agents::agent_client * c, client(h.agent));
    CAIRN_ASSIGN_OR_RETURN(engine::aligned_buffer buf, engine::aligned_buffer::allocate(h.length));
    auto r = c->restore(run, name, rank, h.version, buf.span().first(h.length), mode_);
    if (!r) {
      clients_[h.agent].reset();
      return r.error().with_context("agent " + std::to_string(view_.agents[h.agent].id));
    }
    if (r->version != h.version || r->header.attempt != h.attempt)
      return status(errc::corruption, "agent " + std::to_string(view_.agents[h.agent].id) +
                                          " returned another copy than it listed (version or attempt changed)");
    *image = std::move(buf);
    return r->header;
  }

  result<std::unique_ptr<storage::readable_file>> open_held(const agent_holding& h, const std::string& run,
                                                            const std::string& name, uint32_t rank) override {
    cairn::lock_guard lk(mu_);
    if (h.agent >= view_.agents.size()) return status(errc::not_found, "agent index out of range");
    const std::string who = "agent " + std::to_string(view_.agents[h.agent].id);
    CAIRN_ASSIGN_OR_RETURN(agents::agent_client * c, client(h.agent));
    auto lease = c->open_restore(run, name, rank, h.version);
    if (!lease) {
      clients_[h.agent].reset();
      return lease.error().with_context(who);
    }
    if (lease->version != h.version) {
      status st(errc::corruption, who + " lent another version than it listed");
      c->close_restore(*lease, st);
      return st;
    }
    return std::unique_ptr<storage::readable_file>(
        std::make_unique<held_file>(this, h.agent, c, std::move(lease).value()));
  }

  status release(size_t index, const std::string& run) override {
    cairn::lock_guard lk(mu_);
    if (index >= view_.agents.size()) return {};
    CAIRN_ASSIGN_OR_RETURN(agents::agent_client * c, client(index));
    return c->release(run).take_status();
  }

  size_t agent_count() override {
    cairn::lock_guard lk(mu_);
    return view_.agents.size();
  }

 private:
  // The connection to agent i, made on first use.
  result<agents::agent_client*> client(size_t i) CAIRN_REQUIRES(mu_) {
    if (clients_[i]) return clients_[i].get();
    const agent_ref& a = view_.agents[i];
    if (a.endpoint.empty())
      return status(errc::again, "agent " + std::to_string(a.id) + " on " + a.node + " is not running yet");
    auto name = fabric::from_hex(a.endpoint);
    if (!name) return name.error().with_context("address of agent " + std::to_string(a.id));
    agents::client_options o = opts_;
    o.key = view_.key;
    auto c = agents::agent_client::create(o, *name);
    if (!c) return c.error().with_context("connecting to agent " + std::to_string(a.id) + " on " + a.node);
    clients_[i] = std::move(c).value();
    return clients_[i].get();
  }

  // A held version lent by agent `index` through client `c` (the one that
  // asked: a client made again since then no longer reads it).
  struct held_file final : storage::readable_file {
    held_file(fabric_agents_data* owner, size_t index, agents::agent_client* c, agents::restore_lease l)
        : owner(owner), index(index), client(c), lease(std::move(l)) {}
    ~held_file() override {
      cairn::lock_guard lk(owner->mu_);
      if (owner->clients_[index].get() == client) client->close_restore(lease, failed);
    }
    status read_at(uint64_t offset, void* data, size_t len) const override {
      cairn::lock_guard lk(owner->mu_);
      if (owner->clients_[index].get() != client)
        return status(errc::io_error, "the connection to the agent that lent it was closed");
      status st = client->read_restored(lease, offset, {static_cast<std::byte*>(data), len});
      if (!st) failed = st;
      return st;
    }
    uint64_t size() const override { return lease.length; }
    // Pieces of this size per read (each a round trip to the agent).
    uint64_t read_piece() const override { return uint64_t{4} << 20; }
    fabric_agents_data* owner;
    size_t index;
    agents::agent_client* client;
    agents::restore_lease lease;
    mutable status failed;
  };

  cairn::mutex mu_;
  agents::client_options opts_;
  agents::transfer_mode mode_ = agents::transfer_mode::pull;
  agents_view view_ CAIRN_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<agents::agent_client>> clients_ CAIRN_GUARDED_BY(mu_);  // one per view_.agents
  size_t mine_ CAIRN_GUARDED_BY(mu_) = SIZE_MAX;
  bool failed_ CAIRN_GUARDED_BY(mu_) = false;
  double last_s_ CAIRN_GUARDED_BY(mu_) = 0;
};

}  // namespace
#endif

result<std::unique_ptr<agents_data>> agents_data::create(const config& cfg) {
#ifdef CAIRN_HAVE_FABRIC
  return std::unique_ptr<agents_data>(new fabric_agents_data(cfg));
#else
  (void)cfg;
  return status(errc::not_supported,
                "configuration key 'agents' is set but this libcairn was built without libfabric "
                "(install libfabric-dev and rebuild with -DCAIRN_ENABLE_FABRIC=ON)");
#endif
}

}  // namespace cairn
