// Moving shard images between two ranks over fabric_context, for every user
// of the data plane (see docs/design/agents_data_plane.md):
//
//   transfer_engine   N lanes, each one thread with its own endpoint, that
//                     split an extent list among them (pull = RMA read from
//                     the peer, push = RMA write into the peer);
//   pull_image        the pulling side of an image: header block first, then
//                     the regions it names, then every checksum verified.
//
// Nothing here knows a protocol: who announces an image to whom, and how, is
// the user's (the agents: agents/data_protocol.hpp; the aggregated flush:
// aggregate/leaders.cpp).
//
// An image is a shard file's bytes (src/format/shard.hpp): header block, then
// each region at a 4 KiB-aligned offset; the application's staging slot holds
// exactly that (src/engine/staging.hpp), so one registration covers it.
#ifndef CAIRN_FABRIC_TRANSFER_HPP
#define CAIRN_FABRIC_TRANSFER_HPP

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fabric/fabric.hpp"
#include "cairn/status.hpp"
#include "format/shard.hpp"

namespace cairn::fabric {

// Bytes [offset, offset+length) of an image.
struct extent {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A peer's registered buffer: its endpoint name, and the address and key of
// the buffer's first byte (memory_region::remote_address/key) and its size.
struct remote_buffer {
  std::string peer;  // raw endpoint name
  uint64_t addr = 0;
  uint64_t key = 0;
  uint64_t length = 0;
};

// One peer's part of a transfer from several peers at once: the extents of
// `remote` read into (or written from) the same offsets of `local`.
struct transfer_part {
  remote_buffer remote;
  std::span<std::byte> local;
  std::span<const extent> extents;
};

struct transfer_options {
  // Provider, address, timeout of the lanes. thread_safe and progress_thread
  // are ignored: a lane is used by one thread at a time (FI_THREAD_DOMAIN) and
  // drives its own progress while it waits.
  fabric_options fabric;
  // Lanes (threads with an endpoint each), at least 1.
  int threads = 1;
  // Work is handed to lanes in pieces of this size (a multiple of 4 KiB keeps
  // lanes on separate pages); each lane keeps fabric.max_outstanding RMA
  // operations of at most fabric.max_chunk bytes in flight.
  uint64_t piece_bytes = 4ull << 20;
  // Cap on the bytes per second of one pull/push over all lanes (0: none), so
  // that an agent pulling from a running application limits its interference.
  double max_bytes_per_s = 0;
};

// Lanes for parallel RMA. Why one endpoint per thread rather than one shared
// endpoint with many operations in flight: each lane has its own completion
// queue and transmit queue, so threads never contend for a lock or a CQ, the
// provider may skip its own locking (FI_THREAD_DOMAIN), connection-based
// providers (tcp, verbs RC under ofi_rxm) get one connection per lane, i.e.
// parallel streams on parallel cores, and FI_MR_ENDPOINT providers need
// nothing special. Within a lane several operations stay in flight.
//
// Thread-safety: one pull/push at a time per engine (calls are serialised).
// A lane whose endpoint failed (timeout) is replaced before the call returns,
// so after an error the local buffer is no longer written to.
class transfer_engine {
 public:
  static result<std::unique_ptr<transfer_engine>> create(const transfer_options& options);
  ~transfer_engine();
  transfer_engine(const transfer_engine&) = delete;
  transfer_engine& operator=(const transfer_engine&) = delete;

  int threads() const;
  const fabric_properties& properties() const;  // of lane 0

  // Reads every extent of `src` into the same offsets of `local`
  // (local.size() >= every extent's end, src.length likewise).
  status pull(const remote_buffer& src, std::span<std::byte> local, std::span<const extent> extents);
  // Writes every extent of `local` into the same offsets of `dst`.
  status push(const remote_buffer& dst, std::span<std::byte> local, std::span<const extent> extents);
  // Reads every part at once: the lanes take the parts' pieces in turn (the
  // first piece of each part, then the second, ...), so that several peers
  // serve the call side by side. The first failure is returned.
  status pull(std::span<const transfer_part> parts);

 private:
  struct impl;
  explicit transfer_engine(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

// The extents worth moving in an image: the header block and every region
// (alignment padding is skipped), merged where adjacent.
std::vector<extent> image_extents(const format::shard_header& h);

// Zeroes the bytes of `image` that image_extents(h) does not cover (the
// alignment padding), so that it equals the shard file byte for byte.
void zero_padding(const format::shard_header& h, std::span<std::byte> image);

// Checks that `image` is a complete, intact shard image: header checksum and
// validity, file_size == image.size(), every region checksum (xxh3), and,
// when `expect` is given, that run/name/version/rank/nranks match it.
result<format::shard_header> verify_shard_image(std::span<const std::byte> image, const std::string& where,
                                                const format::shard_header* expect = nullptr);

// A region of an image that the peer exposes apart from the image (the
// agents' lend mode, agents_lend): region `index` is read from the peer's
// registered memory (addr, key) instead of from the image.
struct lent_region {
  uint32_t index = 0;
  uint64_t addr = 0;
  uint64_t key = 0;
};

// The pulling side of a whole image (an agent taking a checkpoint, a client
// restoring by read): reads src's header block, decodes it, checks it
// describes an image of exactly src.length bytes, reads the regions (a lent
// one from where `lent` says), zeroes the padding, and verifies every
// checksum. `local` must hold src.length bytes. Returns the verified header.
result<format::shard_header> pull_image(transfer_engine& lanes, const remote_buffer& src, std::span<std::byte> local,
                                        const format::shard_header* expect = nullptr,
                                        std::span<const lent_region> lent = {});

}  // namespace cairn::fabric

#endif
