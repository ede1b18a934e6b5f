// cairn's one inter-rank data plane (src/fabric/), used by the remote
// checkpoint agents (src/agents, tools/agent), the aggregated flush
// (src/aggregate/leaders.cpp) and node-loss redundancy: move-only RAII
// wrappers over libfabric (fi_info, fabric, domain, address vector,
// reliable-datagram endpoint, completion queue, memory region) and one
// `fabric_context` that owns a complete endpoint and offers blocking RMA reads
// and writes plus small two-sided messages. The lanes and the image pull over
// it are fabric/transfer.hpp; what the messages say belongs to each user (the
// agents' protocol: agents/data_protocol.hpp). See
// docs/design/agents_data_plane.md.
//
// Portability: the provider is a configuration string ("tcp;ofi_rxm" on
// loopback here, "verbs;ofi_rxm", "cxi", "efa" on clusters). The code asks
// fi_getinfo for every memory-registration mode it can handle (FI_MR_LOCAL,
// FI_MR_VIRT_ADDR, FI_MR_ALLOCATED, FI_MR_PROV_KEY, FI_MR_ENDPOINT) and then
// follows the bits the provider reports, so nothing here is provider specific.
//
// Errors are cairn::status values carrying fi_strerror text; nothing throws.
// This header does not include libfabric: the handle types are only declared.
#ifndef CAIRN_FABRIC_FABRIC_HPP
#define CAIRN_FABRIC_FABRIC_HPP

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "cairn/status.hpp"

struct fi_info;
struct fid_fabric;
struct fid_domain;
struct fid_av;
struct fid_ep;
struct fid_cq;
struct fid_mr;

namespace cairn::fabric {

// A peer in a context's address vector (libfabric's fi_addr_t).
using fabric_addr = uint64_t;

namespace detail {
void close_fid(fid_fabric* p);
void close_fid(fid_domain* p);
void close_fid(fid_av* p);
void close_fid(fid_ep* p);
void close_fid(fid_cq* p);
void close_fid(fid_mr* p);
}  // namespace detail

// Owns one libfabric object and closes it (fi_close) on destruction. Move-only.
template <typename T>
class fid_handle {
 public:
  fid_handle() = default;
  explicit fid_handle(T* p) : p_(p) {}
  ~fid_handle() { reset(); }
  fid_handle(fid_handle&& o) noexcept : p_(o.release()) {}
  fid_handle& operator=(fid_handle&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.release();
    }
    return *this;
  }
  fid_handle(const fid_handle&) = delete;
  fid_handle& operator=(const fid_handle&) = delete;
  T* get() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  T* release() {
    T* p = p_;
    p_ = nullptr;
    return p;
  }
  void reset() {
    if (p_ != nullptr) detail::close_fid(p_);
    p_ = nullptr;
  }

 private:
  T* p_ = nullptr;
};

using fabric_handle = fid_handle<fid_fabric>;
using domain_handle = fid_handle<fid_domain>;
using av_handle = fid_handle<fid_av>;
using endpoint_handle = fid_handle<fid_ep>;
using cq_handle = fid_handle<fid_cq>;
using mr_handle = fid_handle<fid_mr>;

// Owns an fi_info list (fi_freeinfo). Move-only.
class info_handle {
 public:
  info_handle() = default;
  explicit info_handle(fi_info* p) : p_(p) {}
  ~info_handle();
  info_handle(info_handle&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  info_handle& operator=(info_handle&& o) noexcept;
  info_handle(const info_handle&) = delete;
  info_handle& operator=(const info_handle&) = delete;
  fi_info* get() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  fi_info* p_ = nullptr;
};

// What a memory region may be used for (a bit mask).
enum mr_access : unsigned {
  // Local buffer of this side's read, write, send or receive.
  kLocal = 1,
  // Target of a peer's RMA read (pull) or write (push).
  kRemoteRead = 2,
  kRemoteWrite = 4,
};

struct fabric_options {
  // libfabric provider (fi_info prov_name), e.g. "tcp;ofi_rxm", "verbs;ofi_rxm",
  // "cxi", "efa", "shm". Empty: libfabric's first choice.
  std::string provider = "tcp;ofi_rxm";
  // Local address to bind the endpoint to; empty: the provider's default.
  std::string node = "127.0.0.1";
  // Local port (service); empty: any free one (read the name afterwards).
  std::string service;
  // Domain (NIC) name, e.g. "mlx5_0"; empty: the first matching one.
  std::string domain;
  // true: FI_THREAD_SAFE, any method may be called from any thread at once.
  // false: FI_THREAD_DOMAIN, the caller guarantees that one thread at a time
  // uses the context (lets providers skip their locks).
  bool thread_safe = true;
  // A background thread that drives progress. Needed on the passive side of a
  // transfer (the memory a peer reads or writes) with providers whose data
  // progress is manual (tcp, shm, sockets: the target's CPU moves the bytes);
  // harmless with FI_PROGRESS_AUTO (verbs, cxi, efa).
  bool progress_thread = false;
  // RMA operations larger than this are split (0: the provider's max_msg_size).
  uint64_t max_chunk = 0;
  // RMA operations one call keeps in flight (0: min(64, tx queue size)).
  int max_outstanding = 0;
  // A blocking call fails when none of its operations completes for this long.
  double timeout_s = 30.0;
  // Behave as if the provider required FI_MR_LOCAL (register local buffers,
  // pass descriptors) even when it does not: exercises that path on loopback.
  bool force_local_mr = false;
  // When set and it becomes true, a blocking RMA call in progress fails with
  // `cancelled` (the context is then failed for good, as after a timeout):
  // how an owner cancels a transfer to a peer it learnt is gone. Not owned;
  // must outlive the context.
  const std::atomic<bool>* abort = nullptr;
};

// What the chosen provider reported (for logs, tests and the benchmark).
struct fabric_properties {
  std::string provider;
  std::string fabric;
  std::string domain;
  uint64_t mr_mode = 0;         // FI_MR_* bits in force
  std::string mr_mode_text;     // e.g. "FI_MR_LOCAL | FI_MR_VIRT_ADDR"
  uint64_t max_msg_size = 0;    // per operation (ep_attr)
  uint64_t chunk_bytes = 0;     // what RMA calls split at
  size_t tx_size = 0;           // transmit queue depth
  int max_outstanding = 0;      // RMA operations in flight per call
  bool manual_progress = false;  // FI_PROGRESS_MANUAL data progress
  bool delivery_complete = false;  // writes complete when placed in the target's memory
  bool needs_local_mr = false;     // FI_MR_LOCAL: local buffers must be registered
};

class fabric_context;
struct domain_state;

// A registered memory region. Move-only; closing it (destructor) revokes the
// key, after which peers' operations on it fail. It keeps its domain open
// (the domain closes after its last region), but FI_MR_ENDPOINT providers bind
// it to the context's endpoint: destroy regions before their context.
class memory_region {
 public:
  memory_region() = default;
  ~memory_region();
  memory_region(memory_region&&) noexcept;
  memory_region& operator=(memory_region&&) noexcept;

  // The key a peer passes to its read/write.
  uint64_t key() const { return key_; }
  // The address a peer uses for the region's first byte: the virtual address
  // with FI_MR_VIRT_ADDR providers, 0 (offsets) otherwise. Byte `i` of the
  // region is at remote_address() + i.
  uint64_t remote_address() const { return remote_address_; }
  // fi_mr_desc for local use (may be null when the provider needs none).
  void* descriptor() const { return desc_; }
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  explicit operator bool() const { return static_cast<bool>(mr_); }

 private:
  friend class fabric_context;
  std::shared_ptr<domain_state> domain_;  // closed after the region
  mr_handle mr_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  uint64_t key_ = 0;
  uint64_t remote_address_ = 0;
  void* desc_ = nullptr;
};

// One RMA operation: `len` bytes between local memory and the peer's
// (remote_addr, remote_key). local_mr is required when the provider needs
// local registration (fabric_properties::needs_local_mr) and must cover
// [local, local+len).
struct rma_op {
  std::byte* local = nullptr;
  size_t len = 0;
  uint64_t remote_addr = 0;
  uint64_t remote_key = 0;
  const memory_region* local_mr = nullptr;
};

// A fabric, domain, address vector, completion queue and one FI_EP_RDM
// endpoint, opened and enabled. Thread-safety: see fabric_options::thread_safe;
// destroy it only when no call is in progress.
//
// Blocking calls wait on the completion queue; they fail with io_error when no
// completion arrives for timeout_s (a peer that died, a network that is down).
// After such a timeout the context is failed for good: every later call
// returns the same error, and operations still posted may write into local
// buffers until the context is destroyed. So destroy the context before
// freeing or reusing memory a failed call used. An error completion (a wrong
// key, a refused connection) fails the call that posted it; whether the
// connection to that peer survives it depends on the provider (tcp;ofi_rxm
// 1.17 drops it for good on a remote access error, sockets keeps it), so
// callers that must go on with the peer use a new context (transfer_engine
// replaces a lane after any failed call).
class fabric_context {
 public:
  // Opens everything. not_supported when no provider matches (the message
  // names the provider and what was asked), io_error for other failures.
  static result<std::unique_ptr<fabric_context>> create(const fabric_options& options);
  ~fabric_context();
  fabric_context(const fabric_context&) = delete;
  fabric_context& operator=(const fabric_context&) = delete;

  // The endpoint's address (fi_getname), raw bytes: give it to peers out of
  // band (see to_hex), they pass it to insert_peer.
  const std::string& name() const;
  const fabric_properties& properties() const;
  const fabric_options& options() const;

  // Registers [ptr, ptr+len) for `access` (mr_access bits). With FI_MR_ALLOCATED
  // providers the memory must already be mapped (touched); keys are chosen by
  // the provider (FI_MR_PROV_KEY) or here, unique per context.
  result<memory_region> register_memory(void* ptr, size_t len, unsigned access);

  // Inserts a peer's name into the address vector (once; later calls return
  // the same address).
  result<fabric_addr> insert_peer(std::string_view name);

  // Blocking RMA: split into chunks of at most properties().chunk_bytes, up to
  // max_outstanding in flight, returns once all completed. The first failure
  // is returned (after the other operations of the call finished).
  status read(fabric_addr peer, std::span<const rma_op> ops);
  status write(fabric_addr peer, std::span<const rma_op> ops);
  status read(fabric_addr peer, std::byte* local, const memory_region* local_mr, size_t len, uint64_t remote_addr,
              uint64_t remote_key);
  status write(fabric_addr peer, std::byte* local, const memory_region* local_mr, size_t len, uint64_t remote_addr,
               uint64_t remote_key);

  // Two-sided messages of at most max_message_bytes(): send blocks until the
  // provider completed it; recv returns the next received message, or `again`
  // after timeout_s without one (negative: options().timeout_s).
  status send(fabric_addr peer, std::span<const std::byte> message);
  status send(fabric_addr peer, std::string_view message);
  result<std::string> recv(double timeout_s = -1);
  size_t max_message_bytes() const;
  // Received messages wait in an inbox until recv takes them. `keep` (may be
  // empty) is asked about each message as it arrives, on the thread that
  // completes it: a message it refuses is dropped at once and never queued,
  // so that a stranger's flood costs CPU, not memory, while the owner is not
  // receiving. The inbox also holds at most kMaxInbox messages: beyond that,
  // arrivals are dropped (counted by dropped()).
  static constexpr size_t kMaxInbox = 16384;
  void set_inbox_filter(std::function<bool(std::string_view)> keep);
  uint64_t dropped() const;

  // ok, or the error that failed the context for good (see above).
  status health() const;

  // Polls the completion queue once (for callers that want to drive progress
  // themselves; blocking calls do it already).
  status progress();

  // Raw handles for benchmarks that compare against plain libfabric loops.
  fid_ep* raw_endpoint() const;
  fid_cq* raw_cq() const;
  fid_domain* raw_domain() const;
  uint64_t raw_address(fabric_addr peer) const;  // fi_addr_t for raw fi_* calls

 private:
  struct impl;
  explicit fabric_context(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

// Names travel in files and messages as lower-case hex.
std::string to_hex(std::string_view bytes);
result<std::string> from_hex(std::string_view hex);

// A libfabric return code as a status: fi_strerror text, `what` first.
status fabric_error(int ret, std::string_view what);

// The node name of this process's shm endpoints, "cairn.<uid>.<pid
// namespace>.<pid>": shm names each endpoint's region in /dev/shm
// "<node>:<domain>:<endpoint>" and unlinks it when the endpoint closes, so a
// killed process leaves its regions (16 MiB each) behind. The first shm
// context of a process removes those of this user's dead processes in its pid
// namespace (remove_dead_shm_regions("/dev/shm")).
std::string shm_node_name();

// Unlinks the regular files in `dir` named "cairn.<uid>.<pid namespace>.<pid>:..."
// for this user and pid namespace whose process no longer exists and that this
// user owns; returns how many. A live process's, another user's or another pid
// namespace's stay.
size_t remove_dead_shm_regions(const std::string& dir);

// Whether `provider` can be opened here, with the reason when it cannot
// (tests skip themselves on not_supported).
status probe_provider(const fabric_options& options);

}  // namespace cairn::fabric

#endif
