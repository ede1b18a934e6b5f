#include "fabric/fabric.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/random.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "fabric/libfabric.hpp"
#include "util/hex.hpp"
#include "util/mutex.hpp"

namespace cairn::fabric {

// The libfabric API version this code is written against; providers of any
// later release accept it.
#define CAIRN_FI_VERSION FI_VERSION(1, 11)

namespace detail {
void close_fid(fid_fabric* p) { (void)fi_close(&p->fid); }
void close_fid(fid_domain* p) { (void)fi_close(&p->fid); }
void close_fid(fid_av* p) { (void)fi_close(&p->fid); }
void close_fid(fid_ep* p) { (void)fi_close(&p->fid); }
void close_fid(fid_cq* p) { (void)fi_close(&p->fid); }
void close_fid(fid_mr* p) { (void)fi_close(&p->fid); }
}  // namespace detail

// An info_handle holds only what the loaded libfabric returned.
info_handle::~info_handle() {
  if (p_ != nullptr) libfabric_if_loaded()->freeinfo(p_);
}

info_handle& info_handle::operator=(info_handle&& o) noexcept {
  if (this != &o) {
    if (p_ != nullptr) libfabric_if_loaded()->freeinfo(p_);
    p_ = o.p_;
    o.p_ = nullptr;
  }
  return *this;
}

status fabric_error(int ret, std::string_view what) {
  const int err = ret < 0 ? -ret : ret;
  errc code = errc::io_error;
  switch (err) {
    case FI_ENODATA:
    case FI_ENOSYS:
    case FI_EOPNOTSUPP:
      code = errc::not_supported;
      break;
    case FI_EINVAL:
    case FI_EBADFLAGS:
      code = errc::invalid_argument;
      break;
    case FI_ENOMEM:
    case FI_ENOSPC:
      code = errc::no_space;
      break;
    default:
      break;
  }
  const libfabric_api* api = libfabric_if_loaded();
  return status(code, std::string(what) + ": " + (api ? api->strerror(err) : "libfabric error") + " (" +
                          std::to_string(-err) + ")");
}

std::string to_hex(std::string_view bytes) { return util::hex_encode(bytes); }

result<std::string> from_hex(std::string_view hex) {
  while (!hex.empty() && (hex.back() == '\n' || hex.back() == ' ' || hex.back() == '\r')) hex.remove_suffix(1);
  if (hex.empty() || hex.size() % 2 != 0)
    return status(errc::invalid_argument, "endpoint name: expected an even number of hex digits");
  std::string out;
  if (!util::hex_decode(hex, hex.size() / 2, &out)) return status(errc::invalid_argument, "endpoint name: not a hex digit");
  return out;
}

// What memory regions keep alive: the domain they belong to (closed after the
// last region) and the fabric under it.
struct domain_state {
  info_handle info;
  fabric_handle fabric;
  domain_handle domain;
  ~domain_state() {
    domain.reset();  // before the fabric
    fabric.reset();
  }
};

memory_region::~memory_region() { mr_.reset(); }
memory_region::memory_region(memory_region&& o) noexcept = default;
memory_region& memory_region::operator=(memory_region&& o) noexcept {
  if (this != &o) {
    mr_.reset();  // before a possibly last reference to the old domain goes
    mr_ = std::move(o.mr_);
    domain_ = std::move(o.domain_);
    data_ = o.data_;
    size_ = o.size_;
    key_ = o.key_;
    remote_address_ = o.remote_address_;
    desc_ = o.desc_;
  }
  return *this;
}

namespace {

using clock_type = std::chrono::steady_clock;

constexpr size_t kMessageBytes = 4096;  // capacity of one two-sided message
constexpr int kRecvPosted = 16;         // receive buffers kept posted
constexpr int kSendSlots = 8;           // sends in flight at once
constexpr int kPollBatch = 16;
constexpr int kWaitSliceMs = 100;  // longest block in fi_cq_sread (then re-check)

enum class op_kind { rma, send, recv };

// The context of one posted operation. fi_context2 comes first: providers
// with FI_CONTEXT/FI_CONTEXT2 mode use it as scratch, and the completion's
// op_context points back here. Slots live as long as the context, so a
// completion that arrives after its caller gave up (timeout) still lands in
// valid memory.
struct op_slot {
  fi_context2 fi_ctx;
  op_kind kind = op_kind::rma;
  bool busy = false;   // owned by a caller (posted or being harvested)
  bool done = false;   // completion (or error) seen
  int err = 0;         // FI_* error of the completion, 0 on success
  std::string err_text;
  size_t len = 0;       // bytes received (recv)
  std::byte* buf = nullptr;  // message buffer (send/recv slots)
};

std::string mr_mode_text(uint64_t mode) {
  std::string s;
  auto add = [&](uint64_t bit, const char* name) {
    if ((mode & bit) == 0) return;
    if (!s.empty()) s += " | ";
    s += name;
  };
  add(FI_MR_LOCAL, "FI_MR_LOCAL");
  add(FI_MR_RAW, "FI_MR_RAW");
  add(FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR");
  add(FI_MR_ALLOCATED, "FI_MR_ALLOCATED");
  add(FI_MR_PROV_KEY, "FI_MR_PROV_KEY");
  add(FI_MR_MMU_NOTIFY, "FI_MR_MMU_NOTIFY");
  add(FI_MR_RMA_EVENT, "FI_MR_RMA_EVENT");
  add(FI_MR_ENDPOINT, "FI_MR_ENDPOINT");
  add(FI_MR_HMEM, "FI_MR_HMEM");
  return s.empty() ? "none" : s;
}

// Hints for fi_getinfo: an RDM endpoint with messages and RMA both ways, and
// every registration mode this file implements, so providers that need them
// (verbs: LOCAL|VIRT_ADDR|ALLOCATED|PROV_KEY, cxi: ENDPOINT, efa: LOCAL) match.
info_handle make_hints(const libfabric_api& api, const fabric_options& o, bool delivery_complete) {
  fi_info* h = api.dupinfo(nullptr);  // fi_allocinfo
  if (h == nullptr) return info_handle();
  h->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->ep_attr->type = FI_EP_RDM;
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  h->domain_attr->threading = o.thread_safe ? FI_THREAD_SAFE : FI_THREAD_DOMAIN;
  if (delivery_complete) h->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  if (!o.provider.empty()) h->fabric_attr->prov_name = strdup(o.provider.c_str());
  if (!o.domain.empty()) h->domain_attr->name = strdup(o.domain.c_str());
  return info_handle(h);
}

std::string describe_request(const fabric_options& o) {
  std::string s = "provider '" + (o.provider.empty() ? std::string("(any)") : o.provider) + "'";
  if (!o.node.empty()) s += " at " + o.node;
  if (!o.service.empty()) s += ":" + o.service;
  if (!o.domain.empty()) s += " domain " + o.domain;
  return s;
}

// fi_getinfo with delivery-complete writes when the provider has them, else
// without (writes then end with an ordered read, see fence_writes).
status get_info(const fabric_options& o, info_handle* out, bool* delivery_complete) {
  CAIRN_ASSIGN_OR_RETURN(const libfabric_api* api, libfabric());
  int last = 0;
  for (bool dc : {true, false}) {
    info_handle hints = make_hints(*api, o, dc);
    if (!hints) return status(errc::no_space, "fi_allocinfo failed");
    fi_info* info = nullptr;
    const char* node = o.node.empty() ? nullptr : o.node.c_str();
    const char* service = o.service.empty() ? nullptr : o.service.c_str();
    uint64_t flags = (node != nullptr || service != nullptr) ? FI_SOURCE : 0;
    int ret = api->getinfo(CAIRN_FI_VERSION, node, service, flags, hints.get(), &info);
    if (ret == 0 && info != nullptr) {
      *out = info_handle(info);
      *delivery_complete = dc;
      return {};
    }
    last = ret;
    if (ret != -FI_ENODATA) break;
  }
  if (last == -FI_ENODATA)
    return status(errc::not_supported,
                  "no libfabric provider matches " + describe_request(o) +
                      " with FI_EP_RDM, messages and RMA read/write (check `fi_info -p \"" + o.provider +
                      "\"`; set the provider in the agent configuration)");
  return fabric_error(last, "fi_getinfo for " + describe_request(o));
}

}  // namespace

struct fabric_context::impl {
  fabric_options opts;
  fabric_properties props;
  std::shared_ptr<domain_state> dom;
  av_handle av;
  cq_handle cq;
  endpoint_handle ep;
  bool waitable = false;  // the CQ has a wait object: fi_cq_sread blocks
  std::string name;

  // Message buffers: [0, kRecvPosted) receive, then kSendSlots send buffers.
  std::vector<std::byte> msg_area;
  memory_region msg_mr;

  cairn::mutex mu;
  cairn::condition_variable cv;
  // Slots: stable addresses, owned here for the context's life.
  std::vector<std::unique_ptr<op_slot>> rma_slots CAIRN_GUARDED_BY(mu);
  std::vector<std::unique_ptr<op_slot>> send_slots CAIRN_GUARDED_BY(mu);
  std::vector<std::unique_ptr<op_slot>> recv_slots CAIRN_GUARDED_BY(mu);
  std::vector<op_slot*> repost CAIRN_GUARDED_BY(mu);  // receives to post again
  std::deque<std::string> inbox CAIRN_GUARDED_BY(mu);
  std::function<bool(std::string_view)> keep CAIRN_GUARDED_BY(mu);  // the inbox filter
  std::atomic<uint64_t> dropped{0};                  // messages refused by keep or a full inbox
  std::map<std::string, fabric_addr> peers CAIRN_GUARDED_BY(mu);  // name -> AV address
  bool polling CAIRN_GUARDED_BY(mu) = false;  // one thread reads the CQ at a time
  status failed CAIRN_GUARDED_BY(mu);  // latched fatal error (timeout, CQ failure)
  // Keys this side chooses (no FI_MR_PROV_KEY) are random within the
  // provider's key size: a peer cannot guess another registration's key.
  uint64_t key_mask = ~uint64_t{0};

  std::thread progress_thread;
  std::atomic<bool> stop{false};

  ~impl() {
    stop = true;
    if (progress_thread.joinable()) {
      if (waitable) (void)fi_cq_signal(cq.get());
      progress_thread.join();
    }
    // The endpoint first: it cancels what is still posted, so nothing writes
    // into buffers after this. FI_MR_ENDPOINT providers want the regions
    // bound to the endpoint closed before it.
    if (props.mr_mode & FI_MR_ENDPOINT) {
      msg_mr = memory_region();
      ep.reset();
    } else {
      ep.reset();
      msg_mr = memory_region();
    }
    cq.reset();
    av.reset();
  }

  std::chrono::nanoseconds timeout() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(opts.timeout_s));
  }

  // Posts receive buffers that a completion handed back.
  void post_receives() CAIRN_REQUIRES(mu) {
    while (!repost.empty()) {
      op_slot* s = repost.back();
      ssize_t ret = fi_recv(ep.get(), s->buf, kMessageBytes, msg_mr.descriptor(), FI_ADDR_UNSPEC, &s->fi_ctx);
      if (ret == -FI_EAGAIN) return;  // the next poll tries again
      if (ret != 0) {
        if (failed.is_ok()) failed = fabric_error(static_cast<int>(ret), "fi_recv");
        return;
      }
      repost.pop_back();
    }
  }

  // Handles one completion.
  void complete(op_slot* s, int err, std::string err_text, size_t len) CAIRN_REQUIRES(mu) {
    if (s->kind == op_kind::recv) {
      if (err == 0) {
        const std::string_view msg(reinterpret_cast<const char*>(s->buf), len);
        if ((keep && !keep(msg)) || inbox.size() >= fabric_context::kMaxInbox) {
          dropped.fetch_add(1, std::memory_order_relaxed);
        } else {
          inbox.emplace_back(msg);
        }
        repost.push_back(s);
      } else if (err != FI_ECANCELED) {
        repost.push_back(s);  // a failed receive is posted again
      }
      return;
    }
    s->done = true;
    s->err = err;
    s->err_text = std::move(err_text);
    s->len = len;
  }

  // Reads the CQ once, blocking up to wait_ms where the CQ can wait. Must be
  // called by the one thread that set `polling`; takes mu to dispatch.
  void poll_once(int wait_ms) {
    fi_cq_msg_entry entries[kPollBatch];
    ssize_t n = (waitable && wait_ms > 0) ? fi_cq_sread(cq.get(), entries, kPollBatch, nullptr, wait_ms)
                                          : fi_cq_read(cq.get(), entries, kPollBatch);
    // Nothing yet (some providers time out sread so), or a signal interrupted
    // the wait (SIGSTOP/SIGCONT, a profiler): neither is a failure.
    if (n == -FI_EAGAIN || n == -FI_ETIMEDOUT || n == -FI_EINTR) {
      if (!waitable && wait_ms > 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      cairn::lock_guard lk(mu);
      post_receives();
      return;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry e{};
      ssize_t r = fi_cq_readerr(cq.get(), &e, 0);
      cairn::lock_guard lk(mu);
      if (r < 0) {
        if (r != -FI_EAGAIN && failed.is_ok()) failed = fabric_error(static_cast<int>(r), "fi_cq_readerr");
        return;
      }
      char buf[256] = {0};
      const char* prov = fi_cq_strerror(cq.get(), e.prov_errno, e.err_data, buf, sizeof buf);
      std::string text = std::string(libfabric_if_loaded()->strerror(e.err)) + " (" + std::to_string(-e.err) + ")";
      if (prov != nullptr && *prov != '\0') text += ", provider: " + std::string(prov);
      if (e.op_context != nullptr) complete(static_cast<op_slot*>(e.op_context), e.err, std::move(text), e.len);
      post_receives();
      return;
    }
    cairn::lock_guard lk(mu);
    if (n < 0) {
      if (failed.is_ok()) failed = fabric_error(static_cast<int>(n), "reading the completion queue");
      return;
    }
    for (ssize_t i = 0; i < n; ++i)
      if (entries[i].op_context != nullptr) complete(static_cast<op_slot*>(entries[i].op_context), 0, {}, entries[i].len);
    post_receives();
  }

  // Drives progress from a waiting caller: becomes the poller if nobody is,
  // else waits for the poller's news. `lk` holds mu; it is held again on return.
  // The poll runs with mu released through the mutex itself (the analysis cannot
  // follow a lock passed by reference); `lk` still owns it when the caller resumes.
  void drive(cairn::unique_lock& lk, int wait_ms) CAIRN_REQUIRES(mu) {
    if (!polling) {
      polling = true;
      mu.unlock();
      poll_once(wait_ms);
      mu.lock();
      polling = false;
      cv.notify_all();
    } else {
      cv.wait_for(lk, std::chrono::milliseconds(std::max(1, wait_ms)));
    }
  }

  void progress_loop() {
    cairn::unique_lock lk(mu);
    while (!stop) drive(lk, kWaitSliceMs);
  }

  op_slot* acquire(std::vector<std::unique_ptr<op_slot>>& pool) {
    for (auto& s : pool)
      if (!s->busy) {
        s->busy = true;
        s->done = false;
        s->err = 0;
        s->err_text.clear();
        return s.get();
      }
    return nullptr;
  }

  status timed_out(const char* what) {
    return status(errc::io_error, std::string(what) + ": no completion for " + std::to_string(opts.timeout_s) +
                                      " s (peer gone or hung, network down?); this endpoint takes no more operations: "
                                      "close it before reusing the buffers of the call");
  }

  status rma(bool is_read, fabric_addr peer, std::span<const rma_op> ops);
  status fence_writes(fabric_addr peer, const rma_op& last);
};

fabric_context::fabric_context(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
fabric_context::~fabric_context() = default;

const std::string& fabric_context::name() const { return impl_->name; }
const fabric_properties& fabric_context::properties() const { return impl_->props; }
const fabric_options& fabric_context::options() const { return impl_->opts; }
size_t fabric_context::max_message_bytes() const { return kMessageBytes; }
fid_ep* fabric_context::raw_endpoint() const { return impl_->ep.get(); }
fid_cq* fabric_context::raw_cq() const { return impl_->cq.get(); }
fid_domain* fabric_context::raw_domain() const { return impl_->dom->domain.get(); }
uint64_t fabric_context::raw_address(fabric_addr peer) const { return peer; }

status probe_provider(const fabric_options& options) {
  info_handle info;
  bool dc = false;
  return get_info(options, &info, &dc);
}

result<std::unique_ptr<fabric_context>> fabric_context::create(const fabric_options& options) {
  if (options.timeout_s <= 0) return status(errc::invalid_argument, "fabric_options.timeout_s must be positive");
  auto p = std::make_unique<impl>();
  p->opts = options;
  p->dom = std::make_shared<domain_state>();
  bool dc = false;
  CAIRN_RETURN_IF_ERROR(get_info(options, &p->dom->info, &dc));
  fi_info* info = p->dom->info.get();
  const std::string where = describe_request(options);

  fabric_properties& pr = p->props;
  pr.provider = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : "";
  pr.fabric = info->fabric_attr->name ? info->fabric_attr->name : "";
  pr.domain = info->domain_attr->name ? info->domain_attr->name : "";
  pr.mr_mode = info->domain_attr->mr_mode;
  pr.mr_mode_text = mr_mode_text(pr.mr_mode);
  if (const size_t kb = info->domain_attr->mr_key_size; kb > 0 && kb < 8) p->key_mask = (uint64_t{1} << (8 * kb)) - 1;
  pr.max_msg_size = info->ep_attr->max_msg_size;
  pr.chunk_bytes = pr.max_msg_size;
  if (options.max_chunk > 0) pr.chunk_bytes = std::min<uint64_t>(pr.chunk_bytes, options.max_chunk);
  pr.tx_size = info->tx_attr->size;
  int depth = static_cast<int>(std::min<size_t>(pr.tx_size > 0 ? pr.tx_size : 64, 64));
  if (options.max_outstanding > 0) depth = std::min(depth, options.max_outstanding);
  // Leave room in the transmit queue for messages.
  pr.max_outstanding = std::max(1, depth);
  pr.manual_progress = info->domain_attr->data_progress == FI_PROGRESS_MANUAL;
  pr.delivery_complete = dc;
  pr.needs_local_mr = (pr.mr_mode & FI_MR_LOCAL) != 0 || options.force_local_mr;
  if (pr.mr_mode & FI_MR_RAW)
    return status(errc::not_supported, where + ": the provider needs raw (FI_MR_RAW) memory keys, not supported");
  if (pr.max_msg_size < kMessageBytes)
    return status(errc::not_supported, where + ": max_msg_size " + std::to_string(pr.max_msg_size) +
                                           " is below the message size " + std::to_string(kMessageBytes));

  fid_fabric* fab = nullptr;
  int ret = libfabric_if_loaded()->fabric(info->fabric_attr, &fab, nullptr);  // loaded by get_info
  if (ret != 0) return fabric_error(ret, "fi_fabric (" + where + ")");
  p->dom->fabric = fabric_handle(fab);

  fid_domain* domain = nullptr;
  ret = fi_domain(fab, info, &domain, nullptr);
  if (ret != 0) return fabric_error(ret, "fi_domain (" + where + ")");
  p->dom->domain = domain_handle(domain);

  fi_av_attr av_attr{};
  av_attr.type = info->domain_attr->av_type != FI_AV_UNSPEC ? info->domain_attr->av_type : FI_AV_TABLE;
  fid_av* av = nullptr;
  ret = fi_av_open(domain, &av_attr, &av, nullptr);
  if (ret != 0) return fabric_error(ret, "fi_av_open (" + where + ")");
  p->av = av_handle(av);

  // A CQ that can block on a file descriptor saves a spinning core and
  // honours sread's timeout. Other wait objects (some providers spin in
  // sched_yield and ignore the timeout) are not used: such CQs are polled.
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_MSG;
  cq_attr.size = std::max<size_t>(info->tx_attr->size + info->rx_attr->size, 256);
  cq_attr.wait_obj = FI_WAIT_FD;
  fid_cq* cq = nullptr;
  ret = fi_cq_open(domain, &cq_attr, &cq, nullptr);
  if (ret == 0) {
    p->waitable = true;
  } else {
    cq_attr.wait_obj = FI_WAIT_NONE;
    ret = fi_cq_open(domain, &cq_attr, &cq, nullptr);
    if (ret != 0) return fabric_error(ret, "fi_cq_open (" + where + ")");
  }
  p->cq = cq_handle(cq);

  fid_ep* ep = nullptr;
  ret = fi_endpoint(domain, info, &ep, nullptr);
  if (ret != 0) return fabric_error(ret, "fi_endpoint (" + where + ")");
  p->ep = endpoint_handle(ep);
  ret = fi_ep_bind(ep, &av->fid, 0);
  if (ret != 0) return fabric_error(ret, "binding the address vector");
  ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV);
  if (ret != 0) return fabric_error(ret, "binding the completion queue");
  ret = fi_enable(ep);
  if (ret != 0) return fabric_error(ret, "fi_enable (" + where + ")");

  char addr[512];
  size_t addrlen = sizeof addr;
  ret = fi_getname(&ep->fid, addr, &addrlen);
  if (ret != 0) return fabric_error(ret, "fi_getname");
  p->name.assign(addr, addrlen);

  auto ctx = std::unique_ptr<fabric_context>(new fabric_context(std::move(p)));
  impl& m = *ctx->impl_;

  // Messages: registered buffers (FI_MR_LOCAL providers need descriptors).
  m.msg_area.resize(kMessageBytes * (kRecvPosted + kSendSlots));
  CAIRN_ASSIGN_OR_RETURN(m.msg_mr, ctx->register_memory(m.msg_area.data(), m.msg_area.size(), kLocal));
  {
    cairn::lock_guard lk(m.mu);  // no other thread yet: taken for the analysis
    for (int i = 0; i < kRecvPosted; ++i) {
      auto s = std::make_unique<op_slot>();
      s->kind = op_kind::recv;
      s->busy = true;
      s->buf = m.msg_area.data() + i * kMessageBytes;
      m.repost.push_back(s.get());
      m.recv_slots.push_back(std::move(s));
    }
    for (int i = 0; i < kSendSlots; ++i) {
      auto s = std::make_unique<op_slot>();
      s->kind = op_kind::send;
      s->buf = m.msg_area.data() + (kRecvPosted + i) * kMessageBytes;
      m.send_slots.push_back(std::move(s));
    }
    for (int i = 0; i < m.props.max_outstanding; ++i) m.rma_slots.push_back(std::make_unique<op_slot>());
    m.post_receives();
    if (!m.failed.is_ok()) return m.failed;
  }
  if (options.progress_thread) m.progress_thread = std::thread([&m] { m.progress_loop(); });
  return ctx;
}

result<memory_region> fabric_context::register_memory(void* ptr, size_t len, unsigned access) {
  impl& m = *impl_;
  if (ptr == nullptr || len == 0) return status(errc::invalid_argument, "register_memory: empty buffer");
  uint64_t acc = 0;
  if (access & kLocal) acc |= FI_READ | FI_WRITE | FI_SEND | FI_RECV;
  if (access & kRemoteRead) acc |= FI_REMOTE_READ;
  if (access & kRemoteWrite) acc |= FI_REMOTE_WRITE;
  if (acc == 0) return status(errc::invalid_argument, "register_memory: no access requested");
  const uint64_t mode = m.props.mr_mode;
  // Without FI_MR_PROV_KEY the application picks keys, unique in the domain:
  // random ones (a key in use is refused, then another is drawn).
  fid_mr* mr = nullptr;
  int ret = 0;
  for (int attempt = 0; attempt < 8; ++attempt) {
    uint64_t requested_key = 0;
    if (!(mode & FI_MR_PROV_KEY)) {
      if (::getrandom(&requested_key, sizeof requested_key, 0) != sizeof requested_key)
        return status(errc::io_error, "getrandom for a memory key failed");
      requested_key &= m.key_mask;
    }
    ret = fi_mr_reg(m.dom->domain.get(), ptr, len, acc, 0, requested_key, 0, &mr, nullptr);
    if (ret != -FI_ENOKEY || (mode & FI_MR_PROV_KEY)) break;
  }
  if (ret != 0) return fabric_error(ret, "fi_mr_reg of " + std::to_string(len) + " bytes");
  memory_region r;
  r.domain_ = m.dom;
  r.mr_ = mr_handle(mr);
  if (mode & FI_MR_ENDPOINT) {
    ret = fi_mr_bind(mr, &m.ep.get()->fid, 0);
    if (ret != 0) return fabric_error(ret, "fi_mr_bind (FI_MR_ENDPOINT)");
    ret = fi_mr_enable(mr);
    if (ret != 0) return fabric_error(ret, "fi_mr_enable (FI_MR_ENDPOINT)");
  }
  r.key_ = fi_mr_key(mr);
  if (r.key_ == FI_KEY_NOTAVAIL) return status(errc::not_supported, "fi_mr_key: the provider has no 64-bit key");
  r.desc_ = fi_mr_desc(mr);
  r.data_ = static_cast<std::byte*>(ptr);
  r.size_ = len;
  r.remote_address_ = (mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(ptr) : 0;
  return r;
}

result<fabric_addr> fabric_context::insert_peer(std::string_view name) {
  impl& m = *impl_;
  if (name.empty()) return status(errc::invalid_argument, "insert_peer: empty name");
  cairn::lock_guard lk(m.mu);
  auto it = m.peers.find(std::string(name));
  if (it != m.peers.end()) return it->second;
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  int ret = fi_av_insert(m.av.get(), name.data(), 1, &addr, 0, nullptr);
  if (ret != 1) return fabric_error(ret < 0 ? ret : -FI_EINVAL, "fi_av_insert of peer " + to_hex(name));
  m.peers.emplace(std::string(name), addr);
  return static_cast<fabric_addr>(addr);
}

status fabric_context::impl::rma(bool is_read, fabric_addr peer, std::span<const rma_op> ops) {
  const char* what = is_read ? "fi_read" : "fi_write";
  // Pieces: every op split at the chunk size.
  struct piece {
    const rma_op* op;
    uint64_t off;
    uint64_t len;
  };
  std::vector<piece> pieces;
  for (const auto& op : ops) {
    if (op.len == 0) continue;
    if (op.local == nullptr) return status(errc::invalid_argument, std::string(what) + ": null local buffer");
    if (props.needs_local_mr && op.local_mr == nullptr)
      return status(errc::invalid_argument,
                    std::string(what) + ": provider " + props.provider + " needs registered local buffers (FI_MR_LOCAL)");
    if (op.local_mr != nullptr &&
        (op.local < op.local_mr->data() || op.local + op.len > op.local_mr->data() + op.local_mr->size()))
      return status(errc::invalid_argument, std::string(what) + ": local buffer outside its memory region");
    for (uint64_t off = 0; off < op.len; off += props.chunk_bytes)
      pieces.push_back({&op, off, std::min<uint64_t>(props.chunk_bytes, op.len - off)});
  }
  if (pieces.empty()) return {};

  std::vector<op_slot*> mine;
  mine.reserve(props.max_outstanding);
  status first;
  size_t next = 0;
  auto last_news = clock_type::now();
  cairn::unique_lock lk(mu);
  const fi_addr_t dest = peer;
  while (next < pieces.size() || !mine.empty()) {
    if (!failed.is_ok()) return failed;  // slots stay busy: the context is dead
    // Post while there is room.
    while (next < pieces.size() && first.is_ok()) {
      op_slot* s = acquire(rma_slots);
      if (s == nullptr) break;
      const piece& pc = pieces[next];
      std::byte* local = pc.op->local + pc.off;
      void* desc = pc.op->local_mr != nullptr ? pc.op->local_mr->descriptor() : nullptr;
      iovec iov{local, static_cast<size_t>(pc.len)};
      fi_rma_iov riov{pc.op->remote_addr + pc.off, static_cast<size_t>(pc.len), pc.op->remote_key};
      fi_msg_rma msg{};
      msg.msg_iov = &iov;
      msg.desc = &desc;
      msg.iov_count = 1;
      msg.addr = dest;
      msg.rma_iov = &riov;
      msg.rma_iov_count = 1;
      msg.context = &s->fi_ctx;
      uint64_t flags = FI_COMPLETION;
      if (!is_read && props.delivery_complete) flags |= FI_DELIVERY_COMPLETE;
      lk.unlock();
      ssize_t ret = is_read ? fi_readmsg(ep.get(), &msg, flags) : fi_writemsg(ep.get(), &msg, flags);
      lk.lock();
      if (ret == -FI_EAGAIN) {
        s->busy = false;
        break;  // queue full: progress first
      }
      if (ret != 0) {
        s->busy = false;
        first = fabric_error(static_cast<int>(ret), std::string(what) + " of " + std::to_string(pc.len) + " bytes");
        break;
      }
      mine.push_back(s);
      ++next;
    }
    if (!first.is_ok() && mine.empty()) break;
    // Harvest what completed.
    bool any = false;
    for (size_t i = 0; i < mine.size();) {
      op_slot* s = mine[i];
      if (!s->done) {
        ++i;
        continue;
      }
      any = true;
      if (s->err != 0 && first.is_ok())
        first = status(s->err == FI_EINVAL || s->err == FI_EACCES ? errc::invalid_argument : errc::io_error,
                       std::string(what) + " completed with an error: " + s->err_text);
      s->busy = false;
      mine[i] = mine.back();
      mine.pop_back();
    }
    auto now = clock_type::now();
    if (any) {
      last_news = now;
      continue;
    }
    if (opts.abort != nullptr && opts.abort->load()) {
      failed = status(errc::cancelled, std::string(what) + ": cancelled (the peer's application is gone); this endpoint "
                                                           "takes no more operations");
      return failed;
    }
    if (now - last_news > timeout()) {
      failed = timed_out(what);
      return failed;
    }
    drive(lk, mine.empty() ? 0 : kWaitSliceMs);
  }
  lk.unlock();
  if (first.is_ok() && !is_read && !props.delivery_complete) {
    const rma_op* last = nullptr;
    for (const auto& op : ops)
      if (op.len > 0) last = &op;
    if (last != nullptr) return fence_writes(peer, *last);
  }
  return first;
}

// Without FI_DELIVERY_COMPLETE a write completion only says the data left; a
// read of the last written byte, ordered after the writes (FI_ORDER_RAW),
// completes once they are placed in the target's memory.
status fabric_context::impl::fence_writes(fabric_addr peer, const rma_op& last) {
  fi_info* info = dom->info.get();
  if ((info->tx_attr->msg_order & FI_ORDER_RAW) == 0)
    return status(errc::not_supported, "provider " + props.provider +
                                           " has neither delivery-complete writes nor read-after-write ordering");
  rma_op op;
  op.local = last.local + last.len - 1;  // read the byte back over itself
  op.len = 1;
  op.remote_addr = last.remote_addr + last.len - 1;
  op.remote_key = last.remote_key;
  op.local_mr = last.local_mr;
  return rma(true, peer, std::span<const rma_op>(&op, 1));
}

status fabric_context::read(fabric_addr peer, std::span<const rma_op> ops) { return impl_->rma(true, peer, ops); }
status fabric_context::write(fabric_addr peer, std::span<const rma_op> ops) { return impl_->rma(false, peer, ops); }

status fabric_context::read(fabric_addr peer, std::byte* local, const memory_region* local_mr, size_t len,
                            uint64_t remote_addr, uint64_t remote_key) {
  rma_op op{local, len, remote_addr, remote_key, local_mr};
  return impl_->rma(true, peer, std::span<const rma_op>(&op, 1));
}

status fabric_context::write(fabric_addr peer, std::byte* local, const memory_region* local_mr, size_t len,
                             uint64_t remote_addr, uint64_t remote_key) {
  rma_op op{local, len, remote_addr, remote_key, local_mr};
  return impl_->rma(false, peer, std::span<const rma_op>(&op, 1));
}

status fabric_context::send(fabric_addr peer, std::string_view message) {
  return send(peer, std::as_bytes(std::span<const char>(message.data(), message.size())));
}

status fabric_context::send(fabric_addr peer, std::span<const std::byte> message) {
  impl& m = *impl_;
  if (message.size() > kMessageBytes)
    return status(errc::invalid_argument, "send: message of " + std::to_string(message.size()) + " bytes exceeds " +
                                              std::to_string(kMessageBytes));
  cairn::unique_lock lk(m.mu);
  const fi_addr_t dest = peer;
  auto start = clock_type::now();
  op_slot* s = nullptr;
  bool posted = false;
  while (true) {
    if (!m.failed.is_ok()) return m.failed;
    if (s == nullptr) {
      s = m.acquire(m.send_slots);
      if (s != nullptr) std::memcpy(s->buf, message.data(), message.size());
    }
    if (s != nullptr && !posted) {
      lk.unlock();
      // Explicit flags: a plain transmit completion, not the endpoint's
      // default delivery-complete (which would wait for the peer's progress).
      iovec iov{s->buf, message.size()};
      void* desc = m.msg_mr.descriptor();
      fi_msg msg{};
      msg.msg_iov = &iov;
      msg.desc = &desc;
      msg.iov_count = 1;
      msg.addr = dest;
      msg.context = &s->fi_ctx;
      ssize_t ret = fi_sendmsg(m.ep.get(), &msg, FI_COMPLETION);
      lk.lock();
      if (ret == 0) {
        posted = true;
        start = clock_type::now();
      } else if (ret != -FI_EAGAIN) {
        s->busy = false;
        return fabric_error(static_cast<int>(ret), "fi_send");
      }
    }
    if (posted && s->done) {
      s->busy = false;
      if (s->err != 0) return status(errc::io_error, "send completed with an error: " + s->err_text);
      return {};
    }
    if (clock_type::now() - start > m.timeout()) {
      if (!posted) {
        if (s != nullptr) s->busy = false;
        return status(errc::io_error, "send: transmit queue full for " + std::to_string(m.opts.timeout_s) + " s");
      }
      m.failed = m.timed_out("fi_send");
      return m.failed;
    }
    m.drive(lk, posted ? kWaitSliceMs : 0);
  }
}

void fabric_context::set_inbox_filter(std::function<bool(std::string_view)> keep) {
  cairn::lock_guard lk(impl_->mu);
  impl_->keep = std::move(keep);
}

uint64_t fabric_context::dropped() const { return impl_->dropped.load(std::memory_order_relaxed); }

result<std::string> fabric_context::recv(double timeout_s) {
  impl& m = *impl_;
  if (timeout_s < 0) timeout_s = m.opts.timeout_s;
  const auto deadline =
      clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(timeout_s));
  cairn::unique_lock lk(m.mu);
  while (m.inbox.empty()) {
    if (!m.failed.is_ok()) return m.failed;
    auto now = clock_type::now();
    if (now >= deadline) return status(errc::again, "recv: no message within " + std::to_string(timeout_s) + " s");
    auto left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    m.drive(lk, static_cast<int>(std::clamp<int64_t>(left_ms, 1, kWaitSliceMs)));
  }
  std::string msg = std::move(m.inbox.front());
  m.inbox.pop_front();
  return msg;
}

status fabric_context::health() const {
  cairn::lock_guard lk(impl_->mu);
  return impl_->failed;
}

status fabric_context::progress() {
  impl& m = *impl_;
  cairn::unique_lock lk(m.mu);
  if (!m.failed.is_ok()) return m.failed;
  if (!m.polling) m.drive(lk, 0);
  return m.failed;
}

}  // namespace cairn::fabric
