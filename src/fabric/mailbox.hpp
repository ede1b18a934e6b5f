// One rank's end of a job's data plane between its own ranks (the leaders of
// the aggregated flush, the members of a redundancy set): a fabric endpoint,
// the job's peers in rank order, READY/HELD messages (fabric/message.hpp)
// sealed with the job's key, and lanes that pull what a READY exposes.
//
// Authentication (docs/design/security.md, "Data planes"): every message is
// sealed (fabric/seal.hpp) with the receiver's rank as context, under a key one rank of the
// job draws at init and the job shares over its communicator (MPI) or, in
// daemon mode, hands its daemons in their admitted session. A message
// without a valid tag (another job's endpoint, a stranger on the network, a
// message meant for another rank) is dropped and counted, and never reaches
// a mailbox: the pulls a READY asks for come only from the job's own ranks.
// Ranks of one job share the key and trust each other.
//
// Freshness: a seal says who sent a message, not when. Each mailbox draws a
// random session when it is made; its address (what the job exchanges and
// join takes) carries it beside the endpoint name, and every message carries
// the sender's session and a request number that grows with each send. A
// receiver takes a message from rank r only under the session r joined with
// and only once per request (a window of the last 64), so a recording of the
// job's own traffic, replayed later in the job or against a plane made again,
// is dropped and counted (replayed()).
//
// Thread-safety: one thread at a time (the engine's stage, or the rebuild on
// the application thread); the endpoint's progress thread serves peers'
// reads of this rank's registered memory meanwhile.
#ifndef CAIRN_FABRIC_MAILBOX_HPP
#define CAIRN_FABRIC_MAILBOX_HPP

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "cairn/status.hpp"
#include "fabric/fabric.hpp"
#include "fabric/message.hpp"
#include "fabric/seal.hpp"
#include "fabric/transfer.hpp"

namespace cairn::fabric {

struct mailbox_options {
  std::string provider = "tcp;ofi_rxm";
  std::string bind;         // local address; empty: the provider's default
  int lanes = 2;            // threads pulling in parallel
  double timeout_s = 120;   // no message and no completion for this long: the peer is gone
  std::string what = "data plane";  // for messages ("aggregation data plane")
};

class mailbox {
 public:
  static result<std::shared_ptr<mailbox>> create(const mailbox_options& o);
  // What the job's other ranks need to reach this mailbox (session, then the
  // endpoint name): exchanged by the job and handed to join in rank order.
  const std::string& address() const { return address_; }
  const mailbox_options& options() const { return opts_; }
  fabric_context& context() { return *ctx_; }

  // The job: this rank, every rank's address() in rank order, and the job's
  // key (kPlaneKeyBytes). Before any send or await.
  status join(uint32_t self, const std::vector<std::string>& addresses, std::string key);

  // Sends m, sealed, to `rank` (m.request is set here).
  status send(uint32_t rank, fabric::data_message m);
  // The next READY or HELD of (name, version) from `from`; drops messages of
  // older versions of name. Gives up when `cancelled` becomes true, or
  // nothing at all arrives for timeout_s.
  result<data_message> await(data_msg want, const std::string& name, int64_t version, uint32_t from,
                             const std::atomic<bool>& cancelled);
  // Whether that message arrived already (await returns it at once).
  bool arrived(data_msg want, const std::string& name, int64_t version, uint32_t from) const;
  // Reads [addr, addr+len) of `rank`'s registered buffer `key` into local.
  status pull(uint32_t rank, uint64_t addr, uint64_t key, std::byte* local, uint64_t len);
  // Several such reads at once, from several ranks side by side (transfer_engine::pull of parts).
  struct read {
    uint32_t rank = 0;
    uint64_t addr = 0, key = 0;
    std::byte* local = nullptr;
    uint64_t len = 0;
  };
  status pull(std::span<const read> reads);

  // Messages dropped for a missing or wrong tag, since create.
  uint64_t refused() const { return refused_->load(); }
  // Sealed messages dropped as replays (another session of the sender's
  // rank, or a request already taken), since create.
  uint64_t replayed() const { return replayed_; }

 private:
  // The requests taken from one rank: the highest, and a bit for each of
  // the 63 below it.
  struct window {
    uint64_t top = 0;
    uint64_t seen = 0;
    bool take(uint64_t request);
  };
  result<fabric_addr> peer(uint32_t rank);
  // Whether m (sealed under the job's key) is fresh: counts it otherwise.
  bool fresh(const data_message& m);
  mailbox_options opts_;
  std::unique_ptr<fabric_context> ctx_;
  std::unique_ptr<transfer_engine> lanes_;
  uint32_t self_ = 0;
  std::string key_;
  uint64_t session_ = 0;
  std::string address_;
  std::vector<std::string> peers_;        // endpoint names
  std::vector<uint64_t> sessions_;        // each rank's session
  std::vector<window> taken_;             // each rank's requests taken
  uint64_t replayed_ = 0;
  std::vector<fabric_addr> addrs_;
  std::vector<bool> inserted_;
  uint64_t next_request_ = 1;
  // Shared with the fabric's inbox filter, which drops unsealed messages as
  // they arrive (on the progress thread, which may outlive members).
  std::shared_ptr<std::atomic<uint64_t>> refused_ = std::make_shared<std::atomic<uint64_t>>(0);
  // Messages that arrived before they were asked for: (name, version, rank).
  std::map<std::tuple<std::string, int64_t, uint32_t>, data_message> ready_, held_;
};

}  // namespace cairn::fabric

#endif
