// What cairn-agent holds (agent_server_impl.hpp): the memory budget and the
// spare buffers reused by the next pulls, the last `keep` verified versions
// of every (run, name, rank), the lookup a RESTORE makes (memory first, then
// committed versions in the store), and the background writer that puts held
// versions into the store in cairn's shard format and commits each version
// once its last shard is there. take_buffer, memory_held, fits_budget and
// hold run under state_mu (serving thread or a worker); find runs on a worker
// and takes state_mu itself; the writer runs on its own thread, and its first
// error is latched (writer_error) for run() to return.
#include <memory>
#include <string>
#include <vector>

#include "agent_server_impl.hpp"
#include "engine/stages.hpp"
#include "format/commit.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/shard_io.hpp"
#include "util/clock.hpp"

namespace cairn::agents {

// A buffer of at least `length` bytes: a spare one if any fits (the smallest
// that does), else new memory.
result<engine::aligned_buffer> agent_server::impl::take_buffer(uint64_t length) CAIRN_REQUIRES(state_mu) {
  size_t best = spare.size();
  for (size_t i = 0; i < spare.size(); ++i)
    if (spare[i].size() >= length && (best == spare.size() || spare[i].size() < spare[best].size())) best = i;
  if (best == spare.size()) return engine::aligned_buffer::allocate(length);
  engine::aligned_buffer b = std::move(spare[best]);
  spare.erase(spare.begin() + static_cast<std::ptrdiff_t>(best));
  return b;
}

// Bytes of memory the agent has: held images, pending pushes and lent
// restores, pulls in flight or queued, spare buffers.
uint64_t agent_server::impl::memory_held() const CAIRN_REQUIRES(state_mu) {
  uint64_t b = in_flight_bytes + reserved_bytes;
  for (const auto& [key, list] : held)
    for (const auto& v : list) b += v->image.size();
  for (const auto& [key, p] : pendings) b += p.buffer.size();
  for (const auto& x : spare) b += x.size();
  return b;
}

// Whether `length` more bytes fit the memory budget (spare buffers are
// given back first).
status agent_server::impl::fits_budget(uint64_t length) CAIRN_REQUIRES(state_mu) {
  if (cfg.memory_budget == 0) return {};
  while (memory_held() + length > cfg.memory_budget && !spare.empty()) spare.pop_back();
  const uint64_t now = memory_held();
  if (now + length <= cfg.memory_budget) return {};
  return status(errc::no_space, "agent memory budget of " + std::to_string(cfg.memory_budget) + " bytes exhausted (" +
                                    std::to_string(now) + " held, " + std::to_string(length) +
                                    " asked): raise --memory-budget, lower --keep, or add agents");
}

// Keeps a verified version: newest `keep` per stream stay in memory, and the
// writer gets it for the store.
void agent_server::impl::hold(std::shared_ptr<held_version> v) CAIRN_REQUIRES(state_mu) {
  auto& list = held[{v->header.run, v->header.name, v->header.rank}];
  // A version sent again replaces the older copy.
  for (auto it = list.begin(); it != list.end(); ++it)
    if ((*it)->header.version == v->header.version) {
      list.erase(it);
      break;
    }
  auto pos = list.begin();
  while (pos != list.end() && (*pos)->header.version < v->header.version) ++pos;
  list.insert(pos, v);
  while (static_cast<int>(list.size()) > cfg.keep) {
    // An evicted version the writer is done with gives its memory to the
    // next pull: fresh pages cost the kernel a zeroing pass each time.
    std::shared_ptr<held_version> old = std::move(list.front());
    list.pop_front();
    if (old.use_count() == 1 && spare.size() < kSpareBuffers) spare.push_back(std::move(old->image));
  }
  if (!cfg.persistent.empty()) {
    {
      cairn::lock_guard lk(mu);
      to_write.push_back(std::move(v));
    }
    cv.notify_all();
  }
}

// The held version a RESTORE asks for: memory first, then the store (read
// without the lock: it may take a while).
result<std::shared_ptr<held_version>> agent_server::impl::find(const data_message& m) {
  {
    cairn::lock_guard lk(state_mu);
    auto it = held.find({m.run, m.name, m.rank});
    if (it != held.end() && !it->second.empty()) {
      if (m.version < 0) return it->second.back();
      for (auto& v : it->second)
        if (v->header.version == m.version) return v;
    }
  }
  if (cfg.persistent.empty())
    return status(errc::not_found, describe(m) + " is not held by this agent");
  // From the store: committed versions only (a MANIFEST), newest first.
  std::vector<int64_t> versions = format::list_versions(env, cfg.persistent, m.run, m.name);
  for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
    if (m.version >= 0 && *v != m.version) continue;
    if (!env->exists(format::manifest_path(cfg.persistent, m.run, m.name, *v))) continue;
    const std::string path = format::shard_path(cfg.persistent, m.run, m.name, *v, m.rank);
    if (!env->exists(path)) continue;
    // Compressed or not, the image comes back as it was pulled (verified).
    auto s = format::read_shard_image(env, path);
    if (!s) {
      if (s.error().code() == errc::no_space) return s.take_status();
      agent_log("skipping %s: %s", path.c_str(), s.error().to_string().c_str());
      continue;
    }
    auto out = std::make_shared<held_version>();
    out->header = std::move(s->header);
    out->image = std::move(s->image);
    return out;
  }
  return status(errc::not_found, describe(m) + " is neither held nor committed in " + cfg.persistent);
}

// ---- background writer ----

// Writes v's image to path: compressed (format 3) unless compression is
// off, or the image cannot be compressed (then as is, with a note).
status agent_server::impl::write_shard(held_version& v, const std::string& path) {
  const auto& h = v.header;
  if (cfg.compress_level != 0) {
    format::compress_options co;
    co.level = cfg.compress_level;
    co.threads = cfg.compress_threads;
    auto c = format::compress_shard(h, v.bytes(), co);
    if (c) {
      stored_bytes += c->header.stored_size;
      image_bytes += h.file_size;
      return engine::write_shard_file(env, path, c->bytes.data(), c->header.stored_size, cfg.direct_io, true);
    }
    agent_log("%s is written uncompressed: %s", describe(h).c_str(), c.error().to_string().c_str());
  }
  stored_bytes += h.file_size;
  image_bytes += h.file_size;
  return engine::write_shard_file(env, path, v.image.data(), h.file_size, cfg.direct_io, true);
}

status agent_server::impl::persist(held_version& v) {
  const auto& h = v.header;
  const double t0 = util::now_s();
  const std::string path = format::shard_path(cfg.persistent, h.run, h.name, h.version, h.rank);
  CAIRN_RETURN_IF_ERROR(write_shard(v, path));
  // The last shard of a version to arrive (from whichever agent or rank
  // wrote it) commits the version.
  auto committed = format::commit_if_complete(env, cfg.persistent, h, "cairn-agent", "agent");
  if (!committed) return committed.take_status().with_context("commit of " + describe(h));
  if (*committed)
    agent_log("committed %s/%s v%lld to %s (%.3f s)", h.run.c_str(), h.name.c_str(),
              static_cast<long long>(h.version), cfg.persistent.c_str(), util::now_s() - t0);
  return {};
}

void agent_server::impl::writer_loop() {
  cairn::unique_lock lk(mu);
  while (true) {
    cv.wait(lk, [&]() CAIRN_REQUIRES(mu) { return writer_stop || !to_write.empty(); });
    if (to_write.empty()) {  // stop requested and nothing left
      if (image_bytes > 0)
        agent_log("wrote %llu bytes of shard files for %llu bytes of images (%s, ratio %.2f)",
                  static_cast<unsigned long long>(stored_bytes), static_cast<unsigned long long>(image_bytes),
                  cfg.compress_level != 0 ? ("zstd level " + std::to_string(cfg.compress_level)).c_str()
                                          : "uncompressed",
                  stored_bytes ? static_cast<double>(image_bytes) / static_cast<double>(stored_bytes) : 0.0);
      return;
    }
    auto v = std::move(to_write.front());
    to_write.pop_front();
    lk.unlock();
    status st = persist(*v);
    if (!st) agent_log("writing %s to %s failed: %s", describe(v->header).c_str(), cfg.persistent.c_str(),
                 st.to_string().c_str());
    v.reset();
    lk.lock();
    if (!st && writer_error.is_ok()) writer_error = st;
  }
}

}  // namespace cairn::agents
