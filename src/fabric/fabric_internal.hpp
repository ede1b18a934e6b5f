// Internal to the fabric context unit (fabric.cpp, fabric_ops.cpp); nothing
// else includes it. Defines fabric_context::impl, the state a context owns
// (fabric.hpp states the contract), with the operation slots completions
// point back to and the completion-queue progress engine both parts drive
// (post_receives, complete, poll_once, drive, progress_loop):
//  - fabric.cpp: handle wrappers, error mapping, endpoint names, provider
//    selection, fabric_context::create, memory registration and peers;
//  - fabric_ops.cpp: RMA reads and writes, messages and the inbox, health
//    and explicit progress.
// These names live in cairn::fabric beside domain_state because
// fabric_context::impl, which uses them, has to.
//
// Thread-safety: fields marked CAIRN_GUARDED_BY(mu) are used with impl::mu
// held; one thread at a time reads the completion queue (the one that set
// `polling`).
#ifndef CAIRN_FABRIC_FABRIC_INTERNAL_HPP
#define CAIRN_FABRIC_FABRIC_INTERNAL_HPP

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fabric/fabric.hpp"
#include "fabric/libfabric.hpp"
#include "util/mutex.hpp"

namespace cairn::fabric {

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

using clock_type = std::chrono::steady_clock;

inline constexpr size_t kMessageBytes = 4096;  // capacity of one two-sided message
inline constexpr int kRecvPosted = 16;         // receive buffers kept posted
inline constexpr int kSendSlots = 8;           // sends in flight at once
inline constexpr int kPollBatch = 16;
inline constexpr int kWaitSliceMs = 100;  // longest block in fi_cq_sread (then re-check)

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

}  // namespace cairn::fabric

#endif
