// The client's side of remote checkpoint agents (docs/design/agents.md,
// "Client"): the control plane to the controller (rank 0 only: register,
// probe, progress, unregister) and the data plane to the agents (every rank:
// hand a version to its agent, ask agents what they hold, restore from them).
// The data plane needs libfabric (CAIRN_HAVE_FABRIC); without it creating one
// fails with not_supported and a message that says how to build with it.
#ifndef CAIRN_CLIENT_AGENTS_LINK_HPP
#define CAIRN_CLIENT_AGENTS_LINK_HPP

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "agents/net.hpp"
#include "agents/placement.hpp"
#include "cairn/status.hpp"
#include "engine/engine.hpp"
#include "engine/staging.hpp"
#include "format/shard.hpp"
#include "util/config.hpp"

namespace cairn {

// One agent of the application, as the controller reports it.
struct agent_ref {
  uint64_t id = 0;
  std::string node;
  std::string endpoint;  // data-plane address, hex (empty until the agent runs)
};

// The application's agents at one generation of the controller's decisions.
struct agents_view {
  uint64_t app = 0;
  uint64_t generation = 0;
  uint32_t target = 0;
  std::vector<agent_ref> agents;
  // From the registration: the controller knew this application before (a
  // restarted job), and how many checkpoints it reported to have taken.
  bool returning = false;
  uint64_t checkpoints_done = 0;
  // The application's data-plane key (auth.hpp "application keys"): from
  // the registration's sealed box, broadcast to the ranks with the view
  // (never in a controller's reply in the clear). Empty: none (unsealed).
  std::string key;

  // Every agent has a data-plane address.
  bool ready() const;
  std::string encode() const;  // JSON, for broadcasting to the ranks
  static result<agents_view> decode(const std::string& text);
  static result<agents_view> from_reply(const nlohmann::json& body);
};

// What changed between two views (cairn_probe's answer).
int classify_change(const agents_view& before, const agents_view& after);

// The local address this host uses to reach `controller` (HOST:PORT): the
// default data-plane address of the ranks (agents_bind = auto), on the
// assumption that agents sit on the network the controller is reached by.
// 127.0.0.1 when it cannot be determined.
std::string route_source_address(const std::string& controller);

// The agent that serves `rank` among k agents: ranks are split in k
// contiguous blocks (agent i serves ranks [i*n/k, (i+1)*n/k)).
size_t agent_for_rank(int rank, int nranks, size_t k);

// Control plane. Thread-safety: one call at a time (rank 0's application thread).
class agents_control {
 public:
  static result<agents_control> open(const config& cfg);

  // held_key: the application's key from an earlier registration (its run
  // directory's agents.key), which a returning application must prove it
  // holds; empty for a new one. The view's key is the one the controller sent.
  result<agents_view> register_app(const std::string& name, const agents::app_hints& hints,
                                   const std::string& held_key);
  result<agents_view> fetch(uint64_t app);
  // fetch() until every agent has an endpoint or `timeout_s` passed; returns
  // the last view either way.
  result<agents_view> wait_ready(uint64_t app, double timeout_s);
  // Reports progress; the reply is the application's agents (as fetch()).
  result<agents_view> progress(uint64_t app, uint64_t checkpoints_done, double transfer_s, double probe_s,
                               uint64_t checkpoint_bytes);
  status unregister(uint64_t app);
  const std::string& address() const { return address_text_; }

 private:
  // `finish` (if any) completes the body for the connection (agents::control_call_bound).
  result<nlohmann::json> call(agents::ctl_type t, nlohmann::json body, const agents::body_finish& finish = {});
  // A request that changes the application: its body gets the application's
  // request proof for the connection (once registered with a key).
  result<nlohmann::json> call_as_app(agents::ctl_type t, nlohmann::json body, uint64_t app);
  agents::net_address address_;
  std::string address_text_;
  std::string secret_;
  std::string key_;  // the application's, from register_app
  int timeout_ms_ = 10000;
};

// A version an agent holds for this rank.
struct agent_holding {
  int64_t version = 0;
  uint64_t length = 0;
  uint32_t attempt = 0;
  size_t agent = 0;  // index into the view's agents
};

// What the agents answered to a QUERY.
struct agents_holdings {
  std::vector<agent_holding> holdings;
  // Agents that did not answer within the wait (what they hold is unknown).
  struct silent_agent {
    agent_ref agent;
    std::string why;
    std::string describe() const { return "agent " + std::to_string(agent.id) + " on " + agent.node + ": " + why; }
  };
  std::vector<silent_agent> unreachable;
};

// Data plane of one rank. Thread-safety: every method may be called from any
// thread; calls are serialised (a probe waits for a transfer in flight).
class agents_data {
 public:
  static result<std::unique_ptr<agents_data>> create(const config& cfg);
  virtual ~agents_data() = default;

  // Uses `v` from now on: this rank's agent is v.agents[agent_for_rank(...)].
  virtual status use(const agents_view& v, int rank, int nranks) = 0;
  // Whether this rank has a usable agent (one assigned, not failed since the
  // last use()).
  virtual bool has_agent() = 0;
  // Hands a checksummed image to this rank's agent and waits until it holds
  // it. A failure marks the agent failed until the next use(). `lent`
  // (agents_lend; empty otherwise) gives, per region of h, the application
  // memory the agent reads it from instead of the image (null: the image);
  // those regions are registered once and kept registered until forget_lent().
  virtual status checkpoint(std::span<std::byte> image, const format::shard_header& h,
                            std::span<const std::byte* const> lent) = 0;
  // Drops the registrations of lent memory (a region was protected again or
  // unprotected: the memory may go away).
  virtual void forget_lent() = 0;
  // Seconds the last successful checkpoint() took (0 before the first).
  virtual double last_transfer_s() = 0;
  // Versions of (run, name, rank) any agent of the view holds in memory.
  // An agent that does not answer is asked again until `wait_s` passed, then
  // listed as unreachable: silence is never taken for "holds nothing".
  virtual agents_holdings held(const std::string& run, const std::string& name, uint32_t rank, double wait_s) = 0;
  // Fetches one of them into *image (allocated here), verified.
  virtual result<format::shard_header> restore(const agent_holding& h, const std::string& run, const std::string& name,
                                               uint32_t rank, engine::aligned_buffer* image) = 0;
  // One of them lent for reading, as a file whose ranges are read from the
  // agent's memory when asked, unverified (restart_verify = while: the
  // regions go straight into the application's memory, verified as they
  // arrive); the loan ends when the file is destroyed, which must happen
  // before this object's.
  virtual result<std::unique_ptr<storage::readable_file>> open_held(const agent_holding& h, const std::string& run,
                                                                    const std::string& name, uint32_t rank) = 0;
  // Tells agent `index` to drop what it holds of `run`.
  virtual status release(size_t index, const std::string& run) = 0;
  virtual size_t agent_count() = 0;
};

// The agents' part of the stage graph (the client chains them: agents, then
// unlend when regions are lent, then the fallback, then the node-local level).
// The agents stage hands the image to this rank's agent; its completion is the
// PROTECTED level (and CAPTURED for lent regions). A failure (no agent, agent
// gone) is not the application's error: the level is marked failed, and the
// fallback stage writes that version to `store` itself and commits it with
// whichever writer completes it. `data` outlives the stages.
std::unique_ptr<engine::stage> make_agents_stage(agents_data* data, storage::storage_env* env, std::string store);
std::unique_ptr<engine::stage> make_agents_fallback_stage(storage::storage_env* env, std::string store,
                                                          bool direct_io);

}  // namespace cairn

#endif
