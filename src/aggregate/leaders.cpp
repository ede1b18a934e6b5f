#include "aggregate/leaders.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <future>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "fabric/fabric.hpp"
#include "fabric/mailbox.hpp"
#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/shard.hpp"
#include "util/hash.hpp"
#include "util/aligned_buffer.hpp"
#include "util/clock.hpp"

namespace cairn::aggregate {

using fabric::data_message;
using fabric::data_msg;

// The mailbox (fabric/mailbox.hpp) and a leader's bounce buffers (pull one,
// write the other), reused.
class data_plane {
 public:
  std::shared_ptr<fabric::mailbox> box;
  util::aligned_buffer windows[2];
};

result<std::shared_ptr<data_plane>> make_data_plane(const data_plane_options& o) {
  auto d = std::make_shared<data_plane>();
  fabric::mailbox_options m;
  m.provider = o.provider;
  m.bind = o.bind;
  m.lanes = o.lanes;
  m.timeout_s = o.timeout_s;
  m.what = "aggregation data plane (aggregate_strategy = leaders)";
  CAIRN_ASSIGN_OR_RETURN(d->box, fabric::mailbox::create(m));
  return d;
}

const std::string& data_plane_address(const data_plane& d) { return d.box->address(); }

status join_data_plane(data_plane& d, uint32_t self, const std::vector<std::string>& addresses, std::string key) {
  return d.box->join(self, addresses, std::move(key));
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
      auto r = d_->box->context().register_memory(image, h.file_size, fabric::kRemoteRead);
      if (!r) return r.take_status().with_context("aggregated flush: exposing the image");
      mr = std::move(r).value();
      data_message ready;
      ready.type = data_msg::ready;
      ready.run = h.run;
      ready.name = h.name;
      ready.version = h.version;
      ready.rank = me;
      ready.nranks = h.nranks;
      ready.addr = mr.remote_address();
      ready.key = mr.key();
      ready.length = h.file_size;
      // Where a leader of this node may read the image without the network:
      // the node-local directory (if the local stage wrote the shard), and
      // the header checksum that proves the file is this image.
      if (o_.local_level)
        ready.text = paths_.scratch + "\n" + util::hex64(h.header_checksum);
      for (uint32_t l : my_leaders)
        if (st) st = d_->box->send(l, ready).with_context("aggregated flush: READY to leader rank " + std::to_string(l));
      if (o_.kill.version == h.version && !o_.kill.leader) ::raise(SIGKILL);  // test hook
    }

    // 2. As a leader: own bytes and every sender's, into the extents it owns.
    auto k = std::find(p.leaders.begin(), p.leaders.end(), me);
    if (st && k != p.leaders.end() && p.used[static_cast<size_t>(k - p.leaders.begin())] > 0)
      st = lead(job, static_cast<uint32_t>(k - p.leaders.begin()));

    // 3. The image must stay put until every leader has read it.
    for (uint32_t l : my_leaders) {
      if (!st) break;
      auto m = d_->box->await(data_msg::held, h.name, h.version, l, job.cancelled);
      if (!m) st = m.take_status();
      else if (status held = fabric::data_message_status(*m); !held)
        // The leader's failure, which the leader reports: a consequence here.
        st = status(errc::cancelled, "leader rank " + std::to_string(l) + " failed: " + held.message());
    }
    return st;
  }

 private:
  // After a failed pull: whether the version was agreed failed. A sender
  // withdraws its image only then (another rank's error, which that rank
  // reports), and this rank learns it in the same progress round, moments
  // later; a pull that fails for that reason is a consequence, not a new
  // failure. Waits up to 2 s for the agreement (a sender that died instead
  // costs the wait).
  static bool withdrawn(const engine::version_job& job) {
    const double until = util::now_s() + 2.0;
    while (!job.cancelled.load() && util::now_s() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return job.cancelled.load();
  }

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
        if (st && w.size() < kWindow) {
          auto b = util::aligned_buffer::allocate(kWindow);
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
        if (d_->box->arrived(data_msg::ready, h.name, h.version, c)) {
          r = c;
          break;
        }
      auto m = d_->box->await(data_msg::ready, h.name, h.version, r, job.cancelled);
      if (!m) {
        finish_write();
        return m.take_status();  // cancelled or gone: the senders learn it the same way
      }
      waiting.erase(r);
      if (st) {
        // A sender of this node: its node-local shard file, when it is this image.
        std::unique_ptr<storage::readable_file> file =
            p.nodes[r] == p.nodes[me] ? local_copy(h, r, *m) : nullptr;
        const uint64_t window = kWindow;
        for (const auto& x : from[r]) {
          for (uint64_t o = 0; st && o < x.length; o += window) {
            const uint64_t n = std::min<uint64_t>(window, x.length - o);
            util::aligned_buffer& w = d_->windows[turn++ % 2];  // not the one being written
            status pulled;
            if (file) {
              pulled = file->read_at(x.src + o, w.data(), n);
            } else {
              pulled = x.src + o + n > m->length ? status(errc::corruption, "a piece beyond the image it announced")
                                                 : d_->box->pull(r, m->addr + x.src + o, m->key, w.data(), n);
            }
            if (!pulled)
              st = withdrawn(job) ? status(errc::cancelled, "aggregated flush: rank " + std::to_string(r) +
                                                                "'s image was withdrawn: the version failed elsewhere")
                                  : pulled.with_context("aggregated flush: reading rank " + std::to_string(r) + "'s image");
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
      if (status s = d_->box->send(r, reply); !s && st) st = s.with_context("aggregated flush: HELD to rank " + std::to_string(r));
    }
    finish_write();
    for (auto& [f, file] : files) {
      if (st) st = file->sync();
      if (st) st = file->close();
    }
    return st;
  }

  // Sender r's node-local shard of this version, opened, if its header is the
  // image its READY announces; null otherwise (then RMA). The READY gives the
  // sender's node-local directory (ranks of a node may have their own); the
  // path in it is the layout's for this version and rank, computed here.
  std::unique_ptr<storage::readable_file> local_copy(const format::shard_header& mine, uint32_t r,
                                                     const data_message& m) {
    const size_t nl = m.text.find('\n');
    uint64_t checksum = 0;
    if (nl == std::string::npos || nl == 0 || !util::parse_hex64(m.text.substr(nl + 1), &checksum)) return nullptr;
    const std::string path = format::shard_path(m.text.substr(0, nl), mine.run, mine.name, mine.version, r);
    auto f = env_->open_read(path);
    if (!f || (*f)->size() != m.length) return nullptr;
    auto h = format::read_header(**f, path);
    if (!h || h->header_checksum != checksum || h->file_size != m.length || h->rank != r) return nullptr;
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
