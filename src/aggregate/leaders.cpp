#include "aggregate/leaders.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <future>
#include <map>
#include <set>
#include <tuple>

#include "agents/data_protocol.hpp"
#include "cairn.h"
#include "fabric/fabric.hpp"
#include "fabric/transfer.hpp"
#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/shard.hpp"
#include "util/hash.hpp"
#include "util/aligned_buffer.hpp"
#include "util/clock.hpp"

namespace cairn::aggregate {

using agents::data_message;
using agents::data_msg;

class data_plane {
 public:
  data_plane_options opts;
  std::unique_ptr<fabric::fabric_context> ctx;       // messages; the target of the leaders' reads
  std::unique_ptr<fabric::transfer_engine> lanes;    // a leader's pulls
  std::vector<std::string> peers;                    // endpoint names, rank order
  std::vector<fabric::fabric_addr> addrs;            // inserted on first use (0 = not yet)
  std::vector<bool> inserted;
  util::aligned_buffer windows[2];                   // a leader's bounce buffers (pull one, write the other), reused
  uint64_t next_request = 1;
  // Messages that arrived before the stage asked for them: (name, version,
  // rank) -> the message. READY comes from senders, HELD from leaders.
  std::map<std::tuple<std::string, int64_t, uint32_t>, data_message> ready, held;

  result<fabric::fabric_addr> peer(uint32_t rank) {
    if (rank >= peers.size()) return status(errc::internal, "aggregation data plane: no rank " + std::to_string(rank));
    if (!inserted[rank]) {
      CAIRN_ASSIGN_OR_RETURN(addrs[rank], ctx->insert_peer(peers[rank]));
      inserted[rank] = true;
    }
    return addrs[rank];
  }

  status send(uint32_t rank, const data_message& m) {
    CAIRN_ASSIGN_OR_RETURN(auto a, peer(rank));
    return ctx->send(a, agents::encode_data_message(m));
  }

  // Receives until `want` (READY from rank `from`, or HELD from leader
  // `from`) of (name, version) is there; drops what belongs to older versions
  // of the name. Gives up when the job is cancelled (its version failed on
  // some rank) or nothing at all arrives for timeout_s.
  result<data_message> await(data_msg want, const std::string& name, int64_t version, uint32_t from,
                             const std::atomic<bool>& cancelled) {
    auto& box = want == data_msg::ready ? ready : held;
    const auto key = std::make_tuple(name, version, from);
    double quiet_since = util::now_s();
    while (true) {
      if (auto it = box.find(key); it != box.end()) {
        data_message m = std::move(it->second);
        box.erase(it);
        return m;
      }
      if (cancelled.load())
        return status(errc::cancelled, "'" + name + "' version " + std::to_string(version) +
                                           ": the flush failed on another rank");
      if (util::now_s() - quiet_since > opts.timeout_s)
        return status(errc::io_error, "'" + name + "' version " + std::to_string(version) + ": no " +
                                          agents::data_msg_name(want) + " from rank " + std::to_string(from) +
                                          " within " + std::to_string(static_cast<int>(opts.timeout_s)) +
                                          " s (rank gone?)");
      auto bytes = ctx->recv(0.1);
      if (!bytes) {
        if (bytes.error().code() == errc::again) continue;
        return bytes.take_status().with_context("aggregation data plane");
      }
      auto m = agents::decode_data_message(*bytes);
      if (!m || (m->type != data_msg::ready && m->type != data_msg::held)) continue;
      quiet_since = util::now_s();
      auto& to = m->type == data_msg::ready ? ready : held;
      // Older versions of this name are over: what still arrives for them is stale.
      if (m->name == name && m->version < version) continue;
      to[std::make_tuple(m->name, m->version, m->rank)] = std::move(*m);
    }
  }
};

result<std::shared_ptr<data_plane>> make_data_plane(const data_plane_options& o) {
  auto d = std::make_shared<data_plane>();
  d->opts = o;
  fabric::fabric_options f;
  f.provider = o.provider;
  f.node = o.bind;
  f.timeout_s = o.timeout_s;
  f.thread_safe = true;
  f.progress_thread = true;  // leaders read this rank's staging slot through this endpoint
  auto ctx = fabric::fabric_context::create(f);
  if (!ctx) return ctx.take_status().with_context("aggregation data plane (aggregate_strategy = leaders)");
  d->ctx = std::move(ctx).value();
  fabric::transfer_options t;
  t.fabric = f;
  t.fabric.thread_safe = false;
  t.fabric.progress_thread = false;
  t.threads = std::max(1, o.lanes);
  CAIRN_ASSIGN_OR_RETURN(d->lanes, fabric::transfer_engine::create(t));
  return d;
}

const std::string& data_plane_name(const data_plane& d) { return d.ctx->name(); }

status set_data_plane_peers(data_plane& d, std::vector<std::string> names) {
  d.peers = std::move(names);
  d.addrs.assign(d.peers.size(), 0);
  d.inserted.assign(d.peers.size(), false);
  return {};
}

namespace {

class leaders_stage final : public aggregated_stage {
 public:
  leaders_stage(storage::storage_env* env, engine::level_paths paths, stage_options o, std::shared_ptr<data_plane> d)
      : env_(env), paths_(std::move(paths)), o_(o), d_(std::move(d)) {}
  const char* name() const override { return "persistent (aggregated, leaders)"; }

 protected:
  status flush(engine::version_job& job) override {
    const auto& h = job.header;
    const plan& p = *job.plan;
    const uint32_t me = h.rank;
    std::byte* image = job.image->data();
    job.extents = image_extents_of(p, me, image);

    // 1. Announce the image to every other leader that gets bytes of it.
    std::set<uint32_t> my_leaders;
    for (const auto& x : pieces_of(p, me))
      if (p.leaders[x.leader] != me) my_leaders.insert(p.leaders[x.leader]);
    fabric::memory_region mr;
    status st;
    if (!my_leaders.empty()) {
      auto r = d_->ctx->register_memory(image, h.file_size, fabric::kRemoteRead);
      if (!r) return r.take_status().with_context("aggregated flush: exposing the image");
      mr = std::move(r).value();
      data_message ready;
      ready.type = data_msg::ready;
      ready.request = d_->next_request++;
      ready.run = h.run;
      ready.name = h.name;
      ready.version = h.version;
      ready.rank = me;
      ready.nranks = h.nranks;
      ready.addr = mr.remote_address();
      ready.key = mr.key();
      ready.length = h.file_size;
      ready.reply_to = d_->ctx->name();
      // Where a leader of this node may read the image without the network:
      // the node-local shard (if the local stage wrote it), and the header
      // checksum that proves the file is this image.
      if (o_.local_level)
        ready.text = format::shard_path(paths_.scratch, h.run, h.name, h.version, me) + "\n" +
                     util::hex64(h.header_checksum);
      for (uint32_t l : my_leaders)
        if (st) st = d_->send(l, ready).with_context("aggregated flush: READY to leader rank " + std::to_string(l));
      if (o_.kill.version == h.version && !o_.kill.leader) ::raise(SIGKILL);  // test hook
    }

    // 2. As a leader: own bytes and every sender's, into the extents it owns.
    auto k = std::find(p.leaders.begin(), p.leaders.end(), me);
    if (st && k != p.leaders.end() && p.used[static_cast<size_t>(k - p.leaders.begin())] > 0)
      st = lead(job, static_cast<uint32_t>(k - p.leaders.begin()));

    // 3. The image must stay put until every leader has read it.
    for (uint32_t l : my_leaders) {
      if (!st) break;
      auto m = d_->await(data_msg::held, h.name, h.version, l, job.cancelled);
      if (!m) st = m.take_status();
      else if (status held = agents::data_message_status(*m); !held)
        // The leader's failure, which the leader reports: a consequence here.
        st = status(errc::cancelled, "leader rank " + std::to_string(l) + " failed: " + held.message());
    }
    return st;
  }

 private:
  // Writes stream bytes [stream, stream+len) of leader k from `data`.
  status write_stream(const plan& p, uint32_t k, uint64_t stream, const std::byte* data, uint64_t len,
                      std::map<uint32_t, std::unique_ptr<storage::writable_file>>& files, const std::string& dir,
                      bool direct) {
    piece x{0, 0, len, k, stream};
    uint64_t at = 0;
    for (const file_run& run : locate(p, x)) {
      auto it = files.find(run.file);
      if (it == files.end()) {
        // file_per_leader: this leader is the file's only writer; shared_striped: keep the others' stripes.
        auto f = env_->create(storage::join(dir, format::data_file_name(run.file)), direct,
                              p.kind == layout::file_per_leader);
        if (!f) return f.take_status().with_context("aggregated persistent level");
        it = files.emplace(run.file, std::move(*f)).first;
      }
      CAIRN_RETURN_IF_ERROR(it->second->write_at(run.offset, data + at, run.length));
      at += run.length;
    }
    return {};
  }

  status lead(engine::version_job& job, uint32_t k) {
    const auto& h = job.header;
    const plan& p = *job.plan;
    const uint32_t me = h.rank;
    const std::string dir = format::version_dir(paths_.persistent, h.run, h.name, h.version);
    CAIRN_RETURN_IF_ERROR(env_->make_dirs(dir));
    // Who sends what to this leader, and whether every write is page aligned.
    std::map<uint32_t, std::vector<piece>> from;
    bool direct = o_.direct_io;
    for (const auto& x : p.pieces)
      if (x.leader == k) {
        if (x.rank != me) from[x.rank].push_back(x);
        direct &= page_aligned(x.src) && page_aligned(x.length) && page_aligned(x.stream);
      }
    std::map<uint32_t, std::unique_ptr<storage::writable_file>> files;
    // One write in flight while the next window is pulled (two windows).
    std::future<status> writing;
    status st;
    auto finish_write = [&] {
      if (writing.valid()) {
        status w = writing.get();
        if (st) st = w;
      }
    };
    auto write_async = [&](uint64_t stream, const std::byte* data, uint64_t len) {
      finish_write();
      if (!st) return;
      writing = std::async(std::launch::async, [this, &p, k, stream, data, len, &files, &dir, direct] {
        return write_stream(p, k, stream, data, len, files, dir, direct);
      });
    };
    // Its own bytes straight from its staging slot, written while the first
    // sender's are pulled.
    for (const auto& x : pieces_of(p, me))
      if (x.leader == k) write_async(x.stream, job.image->data() + x.src, x.length);
    if (!from.empty()) {
      for (auto& w : d_->windows)
        if (st && w.size() < d_->opts.window) {
          auto b = util::aligned_buffer::allocate(d_->opts.window);
          if (!b) st = b.take_status();
          else w = std::move(b).value();
        }
    }
    // Every sender, in the order their READYs arrive; each gets HELD once its
    // bytes are pulled (its image may then change: this leader has them).
    std::set<uint32_t> waiting;
    for (auto& [r, v] : from) waiting.insert(r);
    size_t turn = 0;
    while (!waiting.empty()) {
      uint32_t r = *waiting.begin();
      for (uint32_t c : waiting)
        if (d_->ready.count({h.name, h.version, c})) {
          r = c;
          break;
        }
      auto m = d_->await(data_msg::ready, h.name, h.version, r, job.cancelled);
      if (!m) {
        finish_write();
        return m.take_status();  // cancelled or gone: the senders learn it the same way
      }
      waiting.erase(r);
      if (st) {
        fabric::remote_buffer src{d_->peers[r], m->addr, m->key, m->length};
        // A sender of this node: its node-local shard file, when it is this image.
        std::unique_ptr<storage::readable_file> file =
            p.nodes[r] == p.nodes[me] ? local_copy(*m) : nullptr;
        const uint64_t window = d_->opts.window;
        for (const auto& x : from[r]) {
          for (uint64_t o = 0; st && o < x.length; o += window) {
            const uint64_t n = std::min<uint64_t>(window, x.length - o);
            util::aligned_buffer& w = d_->windows[turn++ % 2];  // not the one being written
            status pulled;
            if (file) {
              pulled = file->read_at(x.src + o, w.data(), n);
            } else {
              fabric::remote_buffer part{src.peer, src.addr + x.src + o, src.key, n};
              fabric::extent e{0, n};
              pulled = d_->lanes->pull(part, w.span().first(n), {&e, 1});
            }
            if (!pulled) st = pulled.with_context("aggregated flush: reading rank " + std::to_string(r) + "'s image");
            if (o_.kill.version == h.version && o_.kill.leader) ::raise(SIGKILL);  // test hook: mid-exchange
            if (st) write_async(x.stream + o, w.data(), n);
          }
        }
      }
      data_message reply;
      reply.type = data_msg::held;
      reply.request = m->request;
      reply.name = h.name;
      reply.version = h.version;
      reply.rank = me;
      if (!st) {
        reply.code = static_cast<int32_t>(st.code());
        reply.text = st.message();
      }
      if (status s = d_->send(r, reply); !s && st) st = s.with_context("aggregated flush: HELD to rank " + std::to_string(r));
    }
    finish_write();
    for (auto& [f, file] : files) {
      if (st) st = file->sync();
      if (st) st = file->close();
    }
    return st;
  }

  // The sender's node-local shard named in its READY, opened, if its header
  // is the image the READY announces; null otherwise (then RMA).
  std::unique_ptr<storage::readable_file> local_copy(const data_message& m) {
    const size_t nl = m.text.find('\n');
    uint64_t checksum = 0;
    if (nl == std::string::npos || !util::parse_hex64(m.text.substr(nl + 1), &checksum)) return nullptr;
    auto f = env_->open_read(m.text.substr(0, nl));
    if (!f || (*f)->size() != m.length) return nullptr;
    auto h = format::read_header(**f, m.text.substr(0, nl));
    if (!h || h->header_checksum != checksum || h->file_size != m.length) return nullptr;
    return std::move(f).value();
  }

  storage::storage_env* env_;
  engine::level_paths paths_;
  stage_options o_;
  std::shared_ptr<data_plane> d_;
};

}  // namespace

std::unique_ptr<engine::stage> make_leaders_stage(storage::storage_env* env, engine::level_paths paths,
                                                  stage_options options, std::shared_ptr<data_plane> plane) {
  return std::make_unique<leaders_stage>(env, std::move(paths), options, std::move(plane));
}

}  // namespace cairn::aggregate
