// Data movement over an open fabric context (src/fabric/fabric.hpp): blocking
// RMA reads and writes split into chunks (with the read-after-write fence for
// providers without delivery-complete writes), two-sided messages (send, the
// filtered inbox, recv), health and explicit progress. Opening the context is
// fabric.cpp; the state both share is fabric_internal.hpp.
#include "fabric/fabric.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "fabric/fabric_internal.hpp"
#include "util/mutex.hpp"

namespace cairn::fabric {

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
