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
// Thread-safety: one thread at a time (the engine's stage, or the rebuild on
// the application thread); the endpoint's progress thread serves peers'
// reads of this rank's registered memory meanwhile.
#ifndef CAIRN_FABRIC_MAILBOX_HPP
#define CAIRN_FABRIC_MAILBOX_HPP

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
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
  const std::string& name() const { return ctx_->name(); }
  const mailbox_options& options() const { return opts_; }
  fabric_context& context() { return *ctx_; }

  // The job: this rank, every rank's endpoint name in rank order, and the
  // job's key (kPlaneKeyBytes). Before any send or await.
  status join(uint32_t self, std::vector<std::string> names, std::string key);

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

  // Messages dropped for a missing or wrong tag, since create.
  uint64_t refused() const { return refused_->load(); }

 private:
  result<fabric_addr> peer(uint32_t rank);
  mailbox_options opts_;
  std::unique_ptr<fabric_context> ctx_;
  std::unique_ptr<transfer_engine> lanes_;
  uint32_t self_ = 0;
  std::string key_;
  std::vector<std::string> peers_;
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
