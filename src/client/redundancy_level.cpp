// Node-loss redundancy as a level: see redundancy_level.hpp.
#include "client/redundancy_level.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>

#include "client/restart_checks.hpp"
#include "client/version_record.hpp"
#include "format/layout.hpp"
#include "redundancy/codec.hpp"
#include "redundancy/parity_file.hpp"
#include "util/clock.hpp"
#include "util/hash.hpp"
#include "util/hex.hpp"
#ifdef CAIRN_HAVE_FABRIC
#include "fabric/transfer.hpp"
#include "redundancy/coding.hpp"
#include "redundancy/stage.hpp"
#endif

namespace cairn {

result<std::unique_ptr<redundancy_level>> redundancy_level::create(level_host* host) {
  const config& cfg = host->cfg();
  if (cfg.redundancy == "none") return std::unique_ptr<redundancy_level>();
#ifndef CAIRN_HAVE_FABRIC
  return status(errc::not_supported, "redundancy = " + cfg.redundancy + " needs the libfabric data plane, which "
                                     "this build of cairn lacks (rebuild with libfabric, or set redundancy = none)");
#else
  CAIRN_ASSIGN_OR_RETURN(auto kind, redundancy::parse_scheme(cfg.redundancy));
  if (!cfg.local_enabled)
    return status(errc::invalid_argument, "redundancy = " + cfg.redundancy + " protects the node-local level, which "
                                          "is off: set local_enabled = true or redundancy = none");
  std::unique_ptr<redundancy_level> l(new redundancy_level(host, kind));
  if (!cfg.fault_inject.empty()) {
    // A rank killed in the middle of encoding a version (after `after` windows).
    CAIRN_ASSIGN_OR_RETURN(storage::fault_plan p, storage::parse_fault_plan(cfg.fault_inject));
    if (p.level == "redundancy" && (p.rank < 0 || p.rank == host->rank())) {
      if (p.role == "rebuild") {
        l->kill_rebuild_version_ = p.version;
      } else {
        l->kill_version_ = p.version;
        l->kill_after_ = p.spec.after;
      }
    }
  }
  return l;
#endif
}

unsigned redundancy_level::wants(uint64_t count) const {
  if (off_) return 0;
  return count % static_cast<uint64_t>(cfg_.redundancy_interval) == 0 ? CAIRN_LEVEL_PROTECTED : 0u;
}

void redundancy_level::describe(const engine::version_job& job, format::manifest* m) const {
  if (job.wanted & CAIRN_LEVEL_PROTECTED) m->redundancy = record_;
}

void redundancy_level::on_level_complete(version_record& rec, unsigned level) {
  if (level != CAIRN_LEVEL_PROTECTED) return;
  // The protected version lives beside the node-local shards, which
  // retention may now remove below it.
  rec.protected_at = util::wall_s();
  host_->record_runtime_level(rec, CAIRN_LEVEL_PROTECTED, rec.protected_at,
                              std::max(0.0, rec.protected_at - rec.job->captured_at));
  auto [it, fresh] = newest_protected_.emplace(rec.name, rec.version);
  if (!fresh) it->second = std::max(it->second, rec.version);
}

// Never below the newest protected version: a node lost while a newer one
// is encoded still has a version to rebuild.
int64_t redundancy_level::keep_local_from(const std::string& name) const {
  auto it = newest_protected_.find(name);
  return it == newest_protected_.end() ? INT64_MIN : it->second;
}

// Every version some rank holds at the node-local level (a lost rank may get it rebuilt).
void redundancy_level::candidates(const std::string& name, std::set<int64_t>* out) {
  std::string mine;
  for (int64_t v : format::list_versions(host_->env(), cfg_.scratch, cfg_.run, name)) mine += std::to_string(v) + " ";
  for (const auto& line : comm::allgather_lines(host_->comm(), mine)) {
    std::istringstream in(line);
    for (int64_t v; in >> v;) out->insert(v);
  }
}

#ifndef CAIRN_HAVE_FABRIC

status redundancy_level::add_stages(graph_points&) { return {errc::not_supported, "no redundancy in this build"}; }
result<nlohmann::json> redundancy_level::for_daemon(const std::vector<std::string>&) {
  return status(errc::not_supported, "no redundancy in this build");
}
status redundancy_level::rebuild(const std::string&, int64_t, const format::shard_image* mine, format::shard_image*) {
  return mine ? status() : status(errc::not_supported, "no redundancy in this build");
}

#else

status redundancy_level::add_stages(graph_points& g) {
  redundancy::set_info mine;
  CAIRN_RETURN_IF_ERROR(form_set(&mine));
  if (off_) return {};
  // Encodes from the image but follows the local level: a protected
  // version's shards are on their nodes (rebuild reads them).
  g.graph->add(redundancy::make_stage(host_->env(), g.paths, std::move(mine), plane_, {kill_version_, kill_after_}),
               {g.local});
  return {};
}

result<nlohmann::json> redundancy_level::for_daemon(const std::vector<std::string>& peers) {
  redundancy::set_info set;
  CAIRN_RETURN_IF_ERROR(form_set(&set));
  if (off_) return nlohmann::json(nullptr);  // the daemons encode nothing
  CAIRN_ASSIGN_OR_RETURN(std::string key, host_->plane_key());  // the one form_set agreed on
  const auto& rec = record_;  // what a protected version's MANIFEST records: the daemon commits it
  return nlohmann::json{{"scheme", cfg_.redundancy}, {"k", set.geo.k},         {"m", set.geo.m},
                        {"members", set.members},    {"nodes", set.nodes},     {"position", set.position},
                        {"peers", peers},            {"key", util::hex_encode(key)},
                        {"record", {{"scheme", rec.scheme}, {"description", rec.description}, {"k", rec.k},
                                    {"m", rec.m}, {"sets", rec.sets}}}};
}

status redundancy_level::form_set(redundancy::set_info* out) {
  const redundancy::scheme kind = kind_;
  redundancy::plane_options o;
  o.provider = cfg_.agents_provider;
  o.bind = cfg_.agents_bind == "auto" ? "" : cfg_.agents_bind;
  o.what = "redundancy data plane";
  auto p = redundancy::plane::create(o);
  status st = host_->agree(p ? status() : p.error());
  if (!st && !cfg_.redundancy_required) {
    if (host_->rank() == 0)
      std::fprintf(stderr, "cairn: redundancy = %s is off for this job (redundancy_required = false): %s\n",
                   cfg_.redundancy.c_str(), st.message().c_str());
    off_ = true;
    return {};
  }
  CAIRN_RETURN_IF_ERROR(st);
  plane_ = std::move(p).value();
  // Every rank's node and plane address, in rank order.
  auto lines = comm::allgather_lines(host_->comm(), host_->node() + "\t" + fabric::to_hex(plane_->address()));
  std::vector<std::string> nodes, names;
  for (const auto& l : lines) {
    const size_t tab = l.rfind('\t');
    nodes.push_back(l.substr(0, tab));
    auto n = fabric::from_hex(l.substr(tab + 1));
    if (!n) return n.take_status();
    names.push_back(std::move(n).value());
  }
  if (nodes.size() != static_cast<size_t>(host_->size())) return {errc::internal, "redundancy: endpoint exchange"};
  // The same sets (or the same error) on every rank.
  CAIRN_ASSIGN_OR_RETURN(auto sets, redundancy::form_sets(nodes, kind, cfg_.redundancy_set, cfg_.rs_parity));
  redundancy::set_info mine;
  const uint32_t me = static_cast<uint32_t>(host_->rank());
  for (const auto& s : sets) {
    auto it = std::find(s.begin(), s.end(), me);
    if (it == s.end()) continue;
    mine.members = s;
    mine.position = static_cast<uint32_t>(it - s.begin());
    for (uint32_t r : s) mine.nodes.push_back(nodes[r]);
  }
  mine.geo.kind = kind;
  mine.geo.k = static_cast<uint32_t>(mine.members.size());
  mine.geo.m = kind == redundancy::scheme::rs ? static_cast<uint32_t>(cfg_.rs_parity) : 1;
  // Sets are balanced, so their sizes differ by one at most: the record
  // names the largest and lists every set.
  redundancy::geometry widest = mine.geo;
  size_t smallest = mine.members.size();
  for (const auto& s : sets) {
    widest.k = std::max(widest.k, static_cast<uint32_t>(s.size()));
    smallest = std::min(smallest, s.size());
  }
  std::string description = widest.describe();
  if (smallest < widest.k)
    description += " (sets of " + std::to_string(smallest) + ".." + std::to_string(widest.k) + " ranks)";
  record_.scheme = redundancy::scheme_name(kind);
  record_.description = description;
  record_.k = widest.k;
  record_.m = mine.geo.m;
  record_.sets = sets;
  CAIRN_ASSIGN_OR_RETURN(std::string key, host_->plane_key());
  CAIRN_RETURN_IF_ERROR(plane_->join(me, names, std::move(key)));
  *out = std::move(mine);
  return {};
}

std::optional<redundancy_level::set_record> redundancy_level::set_of(const std::vector<nlohmann::json>& all,
                                                                    uint32_t me) {
  using nlohmann::json;
  const json* desc = nullptr;
  for (const auto& e : all)
    if (e.is_object() && e.contains("pset"))
      for (const auto& r : e["pset"])
        if (r.get<uint32_t>() == me) desc = &e;
  if (!desc) return std::nullopt;
  set_record rec;
  rec.desc = desc;
  rec.g.kind = *redundancy::parse_scheme((*desc)["scheme"].get<std::string>());
  rec.g.k = static_cast<uint32_t>((*desc)["pset"].size());
  rec.g.m = (*desc)["m"].get<uint32_t>();
  for (size_t i = 0; i < rec.g.k; ++i) {
    rec.ranks.push_back((*desc)["pset"][i].get<uint32_t>());
    rec.sizes.push_back((*desc)["sizes"][i].get<uint64_t>());
    rec.nodes.push_back((*desc)["nodes"][i].get<std::string>());
    uint64_t h = 0;
    util::parse_hex64((*desc)["hcs"][i].get<std::string>(), &h);
    rec.hcs.push_back(h);
    const json& e = all[rec.ranks[i]];
    uint64_t hc = 0;
    rec.intact.push_back(e.is_object() && e["shard"].get<bool>() &&
                         util::parse_hex64(e.value("hc", std::string()), &hc) && hc == h);
  }
  rec.pos = static_cast<uint32_t>(std::find(rec.ranks.begin(), rec.ranks.end(), me) - rec.ranks.begin());
  return rec;
}

// One loop over the stripes that hold a chunk of this rank, planning the
// windows pulled and decoded after it: split further, its parts would share a
// dozen arguments (the reason it is longer than 120 lines).
status redundancy_level::decode_lost(const std::vector<nlohmann::json>& all, const set_record& rec,
                                     const std::string& name, int64_t version, format::shard_image* rebuilt,
                                     std::string* lost_out) {
  using nlohmann::json;
  const uint32_t me = static_cast<uint32_t>(host_->rank());
  auto& plane = *plane_;
  const std::string what = "'" + name + "' version " + std::to_string(version);
  util::aligned_buffer& image = rebuilt->image;
  std::string& lost_text = *lost_out;
  status st;
  const json* desc = rec.desc;
  const redundancy::geometry& g = rec.g;
  const std::vector<uint32_t>& set = rec.ranks;
  const std::vector<uint64_t>& sizes = rec.sizes;
  const std::vector<uint64_t>& hcs = rec.hcs;
  const uint32_t pos = rec.pos;
  for (uint32_t p = 0; p < g.k; ++p)
    if (!rec.intact[p])
      lost_text += std::string(lost_text.empty() ? "" : ", ") + "node '" + rec.nodes[p] + "' (rank " +
                   std::to_string(set[p]) + ")";
  redundancy::codec codec(g);
  const uint32_t d = g.d();
  const uint64_t mine_cb = g.chunk_bytes(sizes[pos]);
  // The size its set recorded, checked before it is allocated.
  st = image_fits_memory(sizes[pos], "rebuilt shard of " + what);
  if (st) {
    auto img = util::aligned_buffer::allocate(sizes[pos]);
    if (!img) st = img.error();
    else image = std::move(img).value();
  }
  // The plan: per stripe that holds a chunk of this rank, the d blocks it
  // decodes from and its tables; per window of it, the d reads and where
  // the decoded bytes go.
  const uint64_t window = redundancy::kWindow;
  std::vector<std::vector<unsigned char>> tables;
  struct step {
    size_t tables = 0;
    uint64_t dst = 0, end = 0;  // the part of this rank's image the window fills
  };
  std::vector<step> steps;
  std::vector<redundancy::window_reads> windows;  // per step
  for (uint32_t s = 0; st && s < g.k; ++s) {
    const int j = g.chunk_of(pos, s);
    if (j < 0) continue;
    const auto contrib = g.contributors(s);
    const auto holders = g.holders(s);
    struct source { uint32_t row, rank; uint64_t addr, key, length; };
    std::vector<source> avail;
    uint32_t lost_t = 0;
    uint64_t len = 0;
    for (uint32_t t = 0; t < contrib.size(); ++t) {
      const uint32_t c = contrib[t];
      const uint64_t cb = g.chunk_bytes(sizes[c]);
      len = std::max(len, cb);
      if (c == pos) { lost_t = t; continue; }
      if (!rec.intact[c]) continue;
      const uint64_t from = static_cast<uint64_t>(g.chunk_of(c, s)) * cb;
      const uint64_t n = sizes[c] > from ? std::min(cb, sizes[c] - from) : 0;
      const json& e = all[set[c]];
      avail.push_back({t, set[c], e["saddr"].get<uint64_t>() + from, e["skey"].get<uint64_t>(), n});
    }
    std::string bad_parity;
    for (uint32_t r = 0; r < holders.size(); ++r) {
      const json& e = all[set[holders[r]]];
      if (!e.is_object() || !e.contains("pset") || e["pset"] != (*desc)["pset"] || e["hcs"] != (*desc)["hcs"])
        continue;
      for (const auto& b : e["blocks"])
        if (b[0].get<uint32_t>() == s && b[1].get<uint32_t>() == r) {
          if (b[4].get<bool>())
            avail.push_back({d + r, set[holders[r]], e["paddr"].get<uint64_t>() + b[2].get<uint64_t>(),
                             e["pkey"].get<uint64_t>(), b[3].get<uint64_t>()});
          else
            bad_parity += std::string(bad_parity.empty() ? "" : ", ") + "rank " + std::to_string(set[holders[r]]);
        }
    }
    if (avail.size() < d) {
      st = status(errc::unusable,
                  "lost " + lost_text + "; " + g.describe() + " tolerates " + std::to_string(g.tolerance()) +
                      " lost node(s) per set, and stripe " + std::to_string(s) + " has " +
                      std::to_string(avail.size()) + " of the " + std::to_string(d) + " blocks it needs" +
                      (bad_parity.empty() ? "" : " (corrupt parity on " + bad_parity + ")"));
      break;
    }
    avail.resize(d);
    std::vector<uint32_t> rows;
    for (const auto& a : avail) rows.push_back(a.row);
    auto t = codec.decoder(rows, lost_t);
    if (!t) { st = t.error(); break; }
    tables.push_back(std::move(t).value());
    const uint64_t chunk_at = static_cast<uint64_t>(j) * mine_cb;
    for (uint64_t at = 0; at < len; at += window) {
      redundancy::window_reads w;
      w.n = std::min(window, len - at);
      for (const auto& a : avail)
        w.reads.push_back({a.rank, a.addr + at, a.key, nullptr, a.length > at ? std::min(w.n, a.length - at) : 0});
      // Only the bytes of this rank's image (its last chunk is padded).
      const uint64_t dst = chunk_at + at;
      steps.push_back({tables.size() - 1, dst, std::min(sizes[pos], std::min(chunk_at + mine_cb, dst + w.n))});
      windows.push_back(std::move(w));
    }
  }
  // Straight into the image, unless a window runs past its end.
  util::aligned_buffer out;
  redundancy::window_buffers bufs;
  if (st)
    st = redundancy::pull_windows(plane, windows, d, &bufs, [&](size_t k, const unsigned char* const* src) -> status {
      const step& w = steps[k];
      const uint64_t n = windows[k].n;
      if (w.end >= w.dst + n) {
        codec.decode(tables[w.tables], src, reinterpret_cast<unsigned char*>(image.data() + w.dst), n);
        return {};
      }
      if (out.size() < n) {
        auto b = util::aligned_buffer::allocate(window);
        if (!b) return b.take_status();
        out = std::move(b).value();
      }
      codec.decode(tables[w.tables], src, reinterpret_cast<unsigned char*>(out.data()), n);
      if (w.end > w.dst) std::memcpy(image.data() + w.dst, out.data(), w.end - w.dst);
      return {};
    }).with_context("rebuild: reading the survivors' blocks");
  if (st) {
    auto h = fabric::verify_shard_image(image.span().first(sizes[pos]), "rebuilt shard of " + what);
    if (!h) st = h.error();
    else if (h->header_checksum != hcs[pos] || h->rank != me || h->name != name || h->version != version)
      st = status(errc::corruption, "rebuilt shard of " + what + " is not the image its set protected");
    else rebuilt->header = std::move(h).value();
  }
  return st;
}

status redundancy_level::rebuild(const std::string& name, int64_t version, const format::shard_image* mine,
                                 format::shard_image* rebuilt) {
  const bool have = mine != nullptr;
  if (off_) return have ? status() : status(errc::not_found, "redundancy is off for this job");
  storage::storage_env* env = host_->env();
  using nlohmann::json;
  const uint32_t me = static_cast<uint32_t>(host_->rank());
  auto& plane = *plane_;
  const std::string what = "'" + name + "' version " + std::to_string(version);

  // 1. What this rank can serve: its verified shard, its parity blocks.
  json info = {{"rank", me}, {"shard", false}};
  fabric::memory_region shard_mr, parity_mr;
  // The parity file mapped (node-local tmpfs: no copy), or read into `parity`
  // where it cannot be; exposed until every lost rank has pulled.
  std::unique_ptr<storage::readable_file> pfile;
  util::aligned_buffer parity;
  std::span<const std::byte> pbytes;
  if (have) {
    auto b = mine->bytes();
    auto r = plane.context().register_memory(const_cast<std::byte*>(b.data()), b.size(), fabric::kRemoteRead);
    if (r) {
      shard_mr = std::move(r).value();
      info["shard"] = true;
      info["saddr"] = shard_mr.remote_address();
      info["skey"] = shard_mr.key();
      info["hc"] = util::hex64(mine->header.header_checksum);
    } else {
      std::fprintf(stderr, "cairn: rank %u: cannot expose %s for a rebuild: %s\n", me, what.c_str(),
                   r.error().message().c_str());
    }
  }
  const std::string dir = format::version_dir(cfg_.scratch, cfg_.run, name, version);
  const std::string ppath = storage::join(dir, redundancy::parity_file_name(me));
  if (env->exists(ppath)) {
    status st;
    auto f = env->open_read(ppath);
    if (!f) st = f.error();
    else pfile = std::move(f).value();
    if (st) pbytes = pfile->map();
    if (st && pbytes.empty() && pfile->size() > 0) {
      auto b = util::aligned_buffer::allocate(pfile->size());
      if (!b) st = b.error();
      else parity = std::move(b).value();
      if (st) st = pfile->read_at(0, parity.data(), pfile->size());
      if (st) pbytes = parity.span().first(pfile->size());
    }
    std::optional<redundancy::parity_header> ph;
    if (st) {
      auto h = redundancy::decode_parity_header(pbytes, ppath);
      if (!h) st = h.error();
      else if (h->run != cfg_.run || h->name != name || h->version != version || h->set[h->position].rank != me)
        st = status(errc::corruption, ppath + ": names another version or rank");
      else if (h->nranks != static_cast<uint32_t>(host_->size()))
        st = status(errc::invalid_argument, ppath + ": written by a job of " + std::to_string(h->nranks) +
                                                " ranks; this job has " + std::to_string(host_->size()));
      else ph = std::move(h).value();
    }
    if (st) {
      auto r = plane.context().register_memory(const_cast<std::byte*>(pbytes.data()), pbytes.size(),
                                               fabric::kRemoteRead);
      if (!r) st = r.error();
      else parity_mr = std::move(r).value();
    }
    if (!st) {
      std::fprintf(stderr, "cairn: rank %u: parity file of %s unusable: %s\n", me, what.c_str(), st.message().c_str());
    } else {
      json set = json::array(), hcs = json::array(), sizes = json::array(), nodes = json::array(),
           blocks = json::array();
      for (const auto& m : ph->set) {
        set.push_back(m.rank);
        hcs.push_back(util::hex64(m.header_checksum));
        sizes.push_back(m.size);
        nodes.push_back(m.node);
      }
      for (const auto& b : ph->blocks) {
        const bool ok = b.offset <= pbytes.size() && b.length <= pbytes.size() - b.offset &&
                        util::xxh3(pbytes.data() + b.offset, b.length) == b.checksum;
        if (!ok)
          std::fprintf(stderr, "cairn: rank %u: parity block of stripe %u in %s is corrupt (checksum mismatch); "
                               "not used\n", me, b.stripe, ppath.c_str());
        blocks.push_back({b.stripe, b.row, b.offset, b.length, ok});
      }
      info["pset"] = set;
      info["hcs"] = hcs;
      info["sizes"] = sizes;
      info["nodes"] = nodes;
      info["blocks"] = blocks;
      info["scheme"] = redundancy::scheme_name(ph->geo.kind);
      info["m"] = ph->geo.m;
      info["paddr"] = parity_mr.remote_address();
      info["pkey"] = parity_mr.key();
    }
  }

  // 2. Everybody's, on every rank (application thread: MPI is allowed here).
  std::vector<json> all;
  for (const auto& l : comm::allgather_lines(host_->comm(), info.dump())) all.push_back(json::parse(l, nullptr, false));
  if (kill_rebuild_version_ == version) ::raise(SIGKILL);  // test hook: mid-rebuild

  // 3. A lost rank decodes its own chunks from the survivors' blocks into
  // memory, the image its restart copies from (the client writes it to the
  // node-local level afterwards, in the background), then encodes the parity
  // its node lost from the survivors' shards.
  status st;
  std::string lost_text;
  std::optional<set_record> rec;
  auto ph = std::make_shared<redundancy::parity_header>();
  auto blocks = std::make_shared<std::vector<util::aligned_buffer>>();
  status parity_st;
  if (!have) {
    rec = set_of(all, me);
    if (!rec)
      st = status(errc::not_found, "no surviving parity file of " + what + " covers rank " + std::to_string(me) +
                                       " (not protected: see redundancy_interval, or its whole set was lost)");
    else st = decode_lost(all, *rec, name, version, rebuilt, &lost_text);
  }
  // Where a lost rank's parity needs another lost member's data (rs, two
  // lost in one set), the rebuilt images are exposed too: a second exchange,
  // which every rank knows from `all` to make.
  std::vector<json> again;
  fabric::memory_region rebuilt_mr;
  if (parity_needs_rebuilt(all)) {
    json mine_now = {{"rebuilt", false}};
    if (!have && st) {
      auto r = plane.context().register_memory(rebuilt->image.data(), rebuilt->image.size(), fabric::kRemoteRead);
      if (r) {
        rebuilt_mr = std::move(r).value();
        mine_now = {{"rebuilt", true}, {"raddr", rebuilt_mr.remote_address()}, {"rkey", rebuilt_mr.key()}};
      }
    }
    for (const auto& l : comm::allgather_lines(host_->comm(), mine_now.dump()))
      again.push_back(json::parse(l, nullptr, false));
  }
  if (!have && st) parity_st = encode_lost_parity(all, again, *rec, name, version, ph.get(), blocks.get());
  // Survivors (and rebuilt ranks) keep their buffers exposed until every lost rank has pulled.
  host_->comm().barrier();
  shard_mr = fabric::memory_region();
  parity_mr = fabric::memory_region();
  rebuilt_mr = fabric::memory_region();
  if (have) return {};
  if (!st) {
    std::fprintf(stderr, "cairn: rank %u: cannot rebuild the node-local shard of %s from redundancy (%s); trying "
                         "the persistent level\n", me, what.c_str(), st.message().c_str());
    return st;
  }
  std::fprintf(stderr, "cairn: rank %u: rebuilt the node-local shard of %s from redundancy %s (lost: %s)\n", me,
               what.c_str(), rec->g.describe().c_str(), lost_text.c_str());
  if (!parity_st) {
    std::fprintf(stderr, "cairn: rank %u: its parity of %s is not restored (%s); the next protected version "
                         "protects its set again\n", me, what.c_str(), parity_st.message().c_str());
    return {};
  }
  // Written by an engine task, while the application goes on.
  host_->engine().submit_task([env, me, ph, blocks, what,
                               dir = format::version_dir(cfg_.scratch, cfg_.run, name, version)]() -> status {
    status w = redundancy::write_parity_file(env, dir, me, ph.get(), *blocks);
    if (!w)
      std::fprintf(stderr, "cairn: rank %u: its parity of %s, encoded again, could not be stored (%s); the next "
                           "protected version protects its set again\n", me, what.c_str(), w.message().c_str());
    return {};
  }, engine::task_priority::low);
  return {};
}

bool redundancy_level::parity_needs_rebuilt(const std::vector<nlohmann::json>& all) {
  for (uint32_t r = 0; r < all.size(); ++r) {
    if (all[r].is_object() && all[r].value("shard", false)) continue;
    auto rec = set_of(all, r);
    if (!rec) continue;
    for (uint32_t s : rec->g.held_stripes(rec->pos))
      for (uint32_t c : rec->g.contributors(s))
        if (!rec->intact[c]) return true;
  }
  return false;
}

status redundancy_level::encode_lost_parity(const std::vector<nlohmann::json>& all,
                                            const std::vector<nlohmann::json>& again, const set_record& rec,
                                            const std::string& name, int64_t version,
                                            redundancy::parity_header* ph,
                                            std::vector<util::aligned_buffer>* parity) {
  // From the images of the stripes' contributors: a survivor's shard, or a
  // lost member's image rebuilt now (the second exchange, `again`).
  std::vector<redundancy::exposed_image> img(rec.g.k);
  for (uint32_t s : rec.g.held_stripes(rec.pos))
    for (uint32_t c : rec.g.contributors(s)) {
      const uint32_t r = rec.ranks[c];
      if (rec.intact[c]) {
        img[c] = {r, all[r]["saddr"].get<uint64_t>(), all[r]["skey"].get<uint64_t>(), rec.sizes[c]};
      } else if (r < again.size() && again[r].is_object() && again[r].value("rebuilt", false)) {
        img[c] = {r, again[r]["raddr"].get<uint64_t>(), again[r]["rkey"].get<uint64_t>(), rec.sizes[c]};
      } else {
        return status(errc::unusable, "the shard of rank " + std::to_string(r) + ", which it encodes, is lost and "
                                      "was not rebuilt");
      }
    }
  ph->run = cfg_.run;
  ph->name = name;
  ph->version = version;
  ph->nranks = static_cast<uint32_t>(host_->size());
  ph->geo = rec.g;
  ph->position = rec.pos;
  for (uint32_t p = 0; p < rec.g.k; ++p)
    ph->set.push_back({rec.ranks[p], p == rec.pos ? host_->node() : rec.nodes[p], rec.sizes[p], rec.hcs[p]});
  CAIRN_RETURN_IF_ERROR(redundancy::encode_held(*plane_, rec.g, rec.pos, img, &ph->blocks, parity)
                            .with_context("rebuild: encoding its parity"));
  ph->written_at = util::wall_s();
  return {};
}

#endif

}  // namespace cairn
