// Opening a fabric context (src/fabric/fabric.hpp): the libfabric handle
// wrappers, error mapping and endpoint names, provider selection (fi_getinfo
// hints), fabric_context::create, memory registration and the peers' address
// vector. The data movement over an open context (RMA, messages, progress) is
// fabric_ops.cpp; the state both share is fabric_internal.hpp.
#include "fabric/fabric.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <dirent.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "fabric/fabric_internal.hpp"
#include "fabric/libfabric.hpp"
#include "util/hex.hpp"
#include "util/mutex.hpp"
#include "util/process.hpp"

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

bool is_shm(const fabric_options& o) { return o.provider == "shm" || o.provider.rfind("shm;", 0) == 0; }

std::string describe_request(const fabric_options& o) {
  std::string s = "provider '" + (o.provider.empty() ? std::string("(any)") : o.provider) + "'";
  if (is_shm(o)) s += " as " + shm_node_name();  // not at its bind address (get_info)
  else if (!o.node.empty()) s += " at " + o.node;
  if (!o.service.empty()) s += ":" + o.service;
  if (!o.domain.empty()) s += " domain " + o.domain;
  return s;
}

// The pid namespace of this process ("pid:[4026531836]" -> 4026531836), 0
// where /proc does not say.
uint64_t pid_namespace() {
  char link[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", link, sizeof link - 1);
  if (n <= 0) return 0;
  const char* open = std::strchr(link, '[');
  return open != nullptr ? std::strtoull(open + 1, nullptr, 10) : 0;
}

// What shm_node_name puts before the pid.
std::string shm_name_prefix() {
  return "cairn." + std::to_string(::getuid()) + "." + std::to_string(pid_namespace()) + ".";
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
    // shm names its endpoints "<node>:<domain>:<endpoint>": an IP address as
    // the node would give every endpoint of the host one name (the second
    // fi_enable fails with EBUSY), so shm gets shm_node_name instead.
    const std::string shm_name = is_shm(o) ? shm_node_name() : std::string();
    const char* node = is_shm(o) ? shm_name.c_str() : o.node.empty() ? nullptr : o.node.c_str();
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

std::string shm_node_name() { return shm_name_prefix() + std::to_string(::getpid()); }

size_t remove_dead_shm_regions(const std::string& dir) {
  const std::string prefix = shm_name_prefix();
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  size_t removed = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &end, 10);
    if (pid <= 0 || end == name.c_str() + prefix.size() || *end != ':') continue;
    if (!util::pid_gone(static_cast<int>(pid))) continue;  // alive, or not ours to judge
    struct stat st {};
    const std::string path = dir + "/" + name;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::getuid()) continue;
    if (::unlink(path.c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

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
  if (is_shm(options)) {
    // The regions killed processes left (shm unlinks a region only when its
    // endpoint closes), once per process.
    static std::once_flag swept;
    std::call_once(swept, [] { (void)remove_dead_shm_regions("/dev/shm"); });
  }
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

  // Providers open their resources from here to fi_enable (shm installs its
  // signal handlers at fi_endpoint): the application's dispositions stay.
  signal_dispositions_kept kept;
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
  if (options.progress_thread)
    m.progress_thread = std::thread([&m] {
      util::name_this_thread("cairn-fabric");
      m.progress_loop();
    });
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

}  // namespace cairn::fabric
