// cairn-agent's transfers (agent_server_impl.hpp): READY (a push gets its
// target, a pull or lend is queued) and RESTORE_DONE on the serving thread;
// pulls, the checks of pushed images and restores on the workers, one job per
// worker at a time with lanes of its own. An image is held only once
// verified. A rank that does not answer marks its incarnation gone: its
// queued and running transfers are cancelled (cancel_incarnation, also used by
// QUERY and RELEASE); held versions stay. Pending pushes and lent restores
// not finished within push_timeout_s are dropped (expire_pendings).
#include <algorithm>
#include <chrono>
#include <vector>

#include "agent_server_impl.hpp"
#include "format/shard.hpp"
#include "util/clock.hpp"

namespace cairn::agents {

// Cancels what an application incarnation still has queued or in flight:
// the jobs of `run` from the endpoints in `peers` (all of the run's when
// empty) that arrived before now. Held versions stay.
void agent_server::impl::cancel_incarnation(const std::string& run, const std::set<std::string>& peers,
                                            const std::string& why) CAIRN_REQUIRES(jobs_mu) {
  auto of_it = [&](const std::string& r, const std::string& peer) {
    return r == run && (peers.empty() || peers.count(peer));
  };
  size_t dropped = 0, aborted = 0;
  uint64_t unreserved = 0;
  for (auto it = jobs.begin(); it != jobs.end();) {
    if (of_it(it->m.run, it->m.reply_to)) {
      if (it->m.type == data_msg::ready) unreserved += it->m.length;
      it = jobs.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  for (auto& w : workers)
    if (w->busy && of_it(w->run, w->peer) && !w->abort.exchange(true)) ++aborted;
  if (dropped + aborted == 0) return;
  {
    cairn::lock_guard lk(state_mu);
    reserved_bytes -= unreserved;
    cancelled += dropped + aborted;
  }
  agent_log("cancelled %zu queued and %zu running transfer(s) of run %s: %s", dropped, aborted, run.c_str(),
            why.c_str());
}

// READY: a push gets its target here; a pull (or lend) is queued for a
// worker. Serving thread.
void agent_server::impl::handle_ready(const data_message& m, fabric::fabric_addr peer) {
  const data_msg answer = m.mode == transfer_mode::push ? data_msg::push_target : data_msg::held;
  if (m.length == 0 || m.length % format::kAlign != 0 || m.nranks == 0 || m.rank >= m.nranks) {
    (void)reply(peer, m, answer, status(errc::invalid_argument, "READY: bad length, rank or nranks"));
    return;
  }
  status room;
  {
    cairn::lock_guard lk(state_mu);
    room = fits_budget(m.length);
    if (!room) ++counts_of(m.mode).failures;
    else if (m.mode != transfer_mode::push) reserved_bytes += m.length;  // run_pull or cancel_incarnation gives it back
  }
  if (!room) {
    agent_log("%s not held: %s", describe(m).c_str(), room.message().c_str());
    (void)reply(peer, m, answer, room);  // not under state_mu: reply takes jobs_mu (the order is jobs_mu, state_mu)
    return;
  }
  {
    cairn::lock_guard lk(jobs_mu);
    run_peers[m.run].insert(m.reply_to);
    dead_peers.erase(m.reply_to);  // a name is never reused; harmless either way
    if (m.mode != transfer_mode::push) {
      jobs.push_back({m, peer});
      jobs_cv.notify_one();
      return;
    }
  }
  cairn::unique_lock lk(state_mu);
  auto buf = take_buffer(m.length);
  if (!buf) {
    ++pushes.failures;
    lk.unlock();
    (void)reply(peer, m, data_msg::push_target, buf.error().with_context("agent memory for " + describe(m)));
    return;
  }
  pending p;
  p.buffer = std::move(buf).value();
  auto mr = ctx->register_memory(p.buffer.data(), m.length, fabric::kRemoteWrite);
  if (!mr) {
    ++pushes.failures;
    lk.unlock();
    (void)reply(peer, m, data_msg::push_target, mr.error());
    return;
  }
  p.mr = std::move(mr).value();
  p.request = m;
  p.peer = peer;
  p.started = clock_type::now();
  p.deadline = p.started + std::chrono::duration_cast<clock_type::duration>(
                               std::chrono::duration<double>(cfg.push_timeout_s));
  const uint64_t addr = p.mr.remote_address(), key = p.mr.key();
  pendings[{m.reply_to, m.request}] = std::move(p);
  lk.unlock();
  (void)reply(peer, m, data_msg::push_target, {}, addr, key, m.length);
}

// A pull (modes pull and lend), on worker w: the rank's image read with w's
// lanes (lend: its regions from the application's own memory), verified,
// held. A transfer that fails or makes no progress for the liveness
// timeout marks the rank gone and cancels the rest of its incarnation.
void agent_server::impl::run_pull(worker& w, const job& j) {
  const data_message& m = j.m;
  std::vector<fabric::lent_region> lent;
  if (m.mode == transfer_mode::lend) {
    auto l = decode_lent(m.text);
    if (!l) {
      {
        cairn::lock_guard lk(state_mu);
        reserved_bytes -= m.length;
        ++pulls.failures;
      }
      (void)reply(j.peer, m, data_msg::held, l.error());
      return;
    }
    lent = std::move(l).value();
  }
  auto v = std::make_shared<held_version>();
  {
    cairn::unique_lock lk(state_mu);
    reserved_bytes -= m.length;  // from here on the buffer is counted (in flight)
    auto buf = take_buffer(m.length);
    if (!buf) {
      ++pulls.failures;
      lk.unlock();  // never reply under state_mu (reply takes jobs_mu; the order is jobs_mu, state_mu)
      (void)reply(j.peer, m, data_msg::held, buf.error().with_context("agent memory for " + describe(m)));
      return;
    }
    v->image = std::move(buf).value();
    in_flight_bytes += v->image.size();
  }
  format::shard_header expect;
  expect.run = m.run;
  expect.name = m.name;
  expect.version = m.version;
  expect.rank = m.rank;
  expect.nranks = m.nranks;
  agent_log("pulling %s: %llu bytes, %d lane(s)", describe(m).c_str(), static_cast<unsigned long long>(m.length),
            w.lanes->threads());
  auto t0 = clock_type::now();
  auto h = fabric::pull_image(*w.lanes, fabric::remote_buffer{m.reply_to, m.addr, m.key, m.length}, v->image.span(),
                              &expect, lent);
  double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  cairn::unique_lock lk(state_mu);
  in_flight_bytes -= v->image.size();
  if (!h) {
    ++pulls.failures;
    if (spare.size() < kSpareBuffers) spare.push_back(std::move(v->image));
    lk.unlock();
    const errc code = h.error().code();
    if (code == errc::cancelled || w.abort.load()) {
      agent_log("%s not held: cancelled (%s)", describe(m).c_str(), h.error().message().c_str());
      // A rank known gone is not answered (reply() skips it); one that is
      // alive hears at once, and writes the version itself.
      (void)reply(j.peer, m, data_msg::held,
                  status(errc::cancelled, describe(m) + ": cancelled by the agent (another rank of the run is gone)"));
      return;
    }
    agent_log("%s not held: %s", describe(m).c_str(), h.error().to_string().c_str());
    if (code == errc::io_error) {
      // The rank does not answer: it is gone, and with it its job (MPI
      // takes the other ranks down): drop their queued and running pulls.
      cairn::lock_guard jl(jobs_mu);
      dead_peers.insert(m.reply_to);
      cancel_incarnation(m.run, run_peers[m.run], "rank " + std::to_string(m.rank) + " is unreachable (" +
                                                       h.error().message() + ")");
      return;
    }
    (void)reply(j.peer, m, data_msg::held, h.error());
    return;
  }
  v->header = std::move(h).value();
  v->held_at = util::wall_s();
  v->transfer_s = secs;
  bytes_in += m.length;
  ++checkpoints;
  ++pulls.held;
  pulls.bytes += m.length;
  pulls.seconds += secs;
  agent_log("held %s (%.1f MB/s)", describe(v->header).c_str(), m.length / 1e6 / std::max(secs, 1e-9));
  hold(v);
  lk.unlock();
  (void)reply(j.peer, m, data_msg::held, {});
}

// PUSH_DONE: the rank wrote its image into our buffer; verified on a
// worker (a checksum pass over the image).
void agent_server::impl::run_push_done(const job& j) {
  const data_message& m = j.m;
  pending p;
  bool known = false;
  {
    cairn::lock_guard lk(state_mu);
    auto it = pendings.find({m.reply_to, m.request});
    if (it != pendings.end() && it->second.buffer.data() != nullptr) {
      p = std::move(it->second);
      pendings.erase(it);
      known = true;
    }
  }
  if (!known) {
    (void)reply(j.peer, m, data_msg::held, status(errc::not_found, "PUSH_DONE for an unknown request"));
    return;
  }
  p.mr = fabric::memory_region();  // no more writes from the rank
  if (m.code != 0) {
    agent_log("%s not held: the rank's push failed: %s", describe(m).c_str(), m.text.c_str());
    cairn::lock_guard lk(state_mu);
    ++pushes.failures;
    return;
  }
  format::shard_header expect;
  expect.run = p.request.run;
  expect.name = p.request.name;
  expect.version = p.request.version;
  expect.rank = p.request.rank;
  expect.nranks = p.request.nranks;
  auto h = fabric::verify_shard_image(p.buffer.span().first(p.request.length),
                                      "image pushed for " + describe(p.request), &expect);
  if (!h) {
    agent_log("%s not held: %s", describe(p.request).c_str(), h.error().to_string().c_str());
    {
      cairn::lock_guard lk(state_mu);
      ++pushes.failures;
    }
    (void)reply(j.peer, m, data_msg::held, h.error());
    return;
  }
  // The rank wrote the header and the regions only; a reused buffer still
  // has old bytes in the alignment padding, which the format says is zero.
  fabric::zero_padding(*h, p.buffer.span().first(p.request.length));
  auto v = std::make_shared<held_version>();
  v->header = std::move(h).value();
  v->image = std::move(p.buffer);
  v->held_at = util::wall_s();
  v->transfer_s = std::chrono::duration<double>(clock_type::now() - p.started).count();
  {
    cairn::lock_guard lk(state_mu);
    bytes_in += v->header.file_size;
    ++checkpoints;
    ++pushes.held;
    pushes.bytes += v->header.file_size;
    pushes.seconds += v->transfer_s;
    hold(v);
  }
  agent_log("held %s (pushed)", describe(v->header).c_str());
  (void)reply(j.peer, m, data_msg::held, {});
}

// RESTORE, on worker w: pushed into the rank's buffer with w's lanes, or
// lent for the rank to read until RESTORE_DONE.
void agent_server::impl::run_restore(worker& w, const job& j) {
  const data_message& m = j.m;
  auto v = find(m);
  data_msg type = m.mode == transfer_mode::push ? data_msg::restored : data_msg::restore_source;
  if (!v) {
    (void)reply(j.peer, m, type, v.error());
    return;
  }
  std::shared_ptr<held_version> hv = *v;
  const uint64_t len = hv->header.file_size;
  if (m.mode == transfer_mode::push) {
    if (len > m.length) {
      (void)reply(j.peer, m, type,
                  status(errc::invalid_argument, describe(hv->header) + " needs " + std::to_string(len) +
                                                     " bytes, the rank offered " + std::to_string(m.length)));
      return;
    }
    auto ext = fabric::image_extents(hv->header);
    status st = w.lanes->push(fabric::remote_buffer{m.reply_to, m.addr, m.key, m.length}, hv->bytes(), ext);
    if (!st) agent_log("restore of %s failed: %s", describe(hv->header).c_str(), st.to_string().c_str());
    else agent_log("restored %s (written to the rank)", describe(hv->header).c_str());
    if (st) {
      cairn::lock_guard lk(state_mu);
      bytes_out += len;
    }
    (void)reply(j.peer, m, type, st, 0, 0, st.is_ok() ? len : 0, hv->header.version);
    return;
  }
  // By read: lend the image until RESTORE_DONE or the timeout.
  auto mr = ctx->register_memory(hv->image.data(), len, fabric::kRemoteRead);
  if (!mr) {
    (void)reply(j.peer, m, type, mr.error());
    return;
  }
  pending p;
  p.version = hv;
  p.mr = std::move(mr).value();
  p.request = m;
  p.peer = j.peer;
  p.started = clock_type::now();
  p.deadline =
      p.started + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(cfg.push_timeout_s));
  const uint64_t addr = p.mr.remote_address(), key = p.mr.key();
  {
    cairn::lock_guard lk(state_mu);
    pendings[{m.reply_to, m.request}] = std::move(p);
  }
  (void)reply(j.peer, m, type, {}, addr, key, len, hv->header.version);
}

void agent_server::impl::handle_restore_done(const data_message& m) {
  cairn::lock_guard lk(state_mu);
  auto it = pendings.find({m.reply_to, m.request});
  if (it == pendings.end()) return;
  agent_log("restored %s (read by the rank%s)", describe(it->second.version->header).c_str(),
      m.code == 0 ? "" : ", which reported an error");
  if (m.code == 0) bytes_out += it->second.version->header.file_size;
  pendings.erase(it);
}

void agent_server::impl::expire_pendings() {
  auto now = clock_type::now();
  cairn::lock_guard lk(state_mu);
  for (auto it = pendings.begin(); it != pendings.end();) {
    if (now < it->second.deadline) {
      ++it;
      continue;
    }
    agent_log("%s: no %s within %.0f s; dropped", describe(it->second.request).c_str(),
        it->second.version ? "RESTORE_DONE" : "PUSH_DONE", cfg.push_timeout_s);
    it = pendings.erase(it);
  }
}

void agent_server::impl::worker_loop(worker& w) {
  cairn::unique_lock lk(jobs_mu);
  for (;;) {
    jobs_cv.wait(lk, [&]() CAIRN_REQUIRES(jobs_mu) { return workers_stop || !jobs.empty(); });
    if (workers_stop) return;
    job j = std::move(jobs.front());
    jobs.pop_front();
    w.busy = true;
    w.peer = j.m.reply_to;
    w.run = j.m.run;
    w.abort = false;
    lk.unlock();
    switch (j.m.type) {
      case data_msg::ready: run_pull(w, j); break;
      case data_msg::push_done: run_push_done(j); break;
      case data_msg::restore: run_restore(w, j); break;
      default: break;
    }
    lk.lock();
    w.busy = false;
    w.abort = false;
  }
}

}  // namespace cairn::agents
