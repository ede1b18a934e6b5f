// The aggregated persistent level as a level: see aggregate_level.hpp.
#include "client/aggregate_level.hpp"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <sstream>

#include "client/version_record.hpp"
#include "format/container.hpp"
#include "format/layout.hpp"
#include "storage/geometry.hpp"
#ifdef CAIRN_HAVE_FABRIC
#include "aggregate/leaders.hpp"
#endif

namespace cairn {

result<std::unique_ptr<aggregate_level>> aggregate_level::create(level_host* host) {
  const config& cfg = host->cfg();
  if (cfg.persistent_layout != persistent_layout::aggregated) return std::unique_ptr<aggregate_level>();
#ifndef CAIRN_HAVE_FABRIC
  if (cfg.aggregate_strategy == aggregate_strategy::leaders)
    return status(errc::not_supported, "aggregate_strategy = leaders needs the libfabric data plane, which this "
                                       "build of cairn lacks (rebuild with libfabric, or use aligned or posix_shared)");
#endif
  std::unique_ptr<aggregate_level> l(new aggregate_level(host));
  if (!cfg.fault_inject.empty()) {
    // leaders: a sender killed once it announced its image, or a leader
    // killed in the middle of reading a sender's.
    CAIRN_ASSIGN_OR_RETURN(storage::fault_plan p, storage::parse_fault_plan(cfg.fault_inject));
    if (p.level == "transfer" && (p.rank < 0 || p.rank == host->rank())) l->kill_ = {p.version, p.role == "leader"};
  }
  return l;
}

status aggregate_level::add_stages(graph_points& g) {
  switch (strategy_) {
    case aggregate_strategy::leaders: {
#ifdef CAIRN_HAVE_FABRIC
      aggregate::data_plane_options o;
      o.provider = cfg_.agents_provider;
      o.bind = cfg_.agents_bind == "auto" ? "" : cfg_.agents_bind;
      CAIRN_ASSIGN_OR_RETURN(plane_, aggregate::make_data_plane(o));
      // The leaders read their senders' node-local files: after the local level.
      g.graph->add(aggregate::make_leaders_stage(g.flush_env, g.paths,
                                                 {strategy_, cfg_.direct_io, kill_, cfg_.local_enabled}, plane_),
                   {g.local});
#endif
      return {};
    }
    case aggregate_strategy::mpiio:
      // Ready once the image is: the write itself is the application thread's (step).
      g.graph->add(aggregate::make_collective_write_stage(host_->env(), g.paths), {g.image_done});
      return {};
    default: {
      aggregate::stage_options o;
      o.strategy = strategy_;
      o.direct_io = cfg_.direct_io;
      g.graph->add(aggregate::make_self_write_stage(g.flush_env, g.paths, o), {g.image_done});
      return {};
    }
  }
}

status aggregate_level::start(graph_points&) {
  comm::communicator& comm = host_->comm();
  const int rank = host_->rank();
  // Collective (one broadcast): every rank plans with rank 0's geometry.
  std::string text;
  if (rank == 0) {
    auto g = storage::detect_geometry(cfg_.persistent);
    if (!g) std::fprintf(stderr, "cairn: warning: stripe geometry of %s unknown (%s); using 1 MiB stripes\n",
                         cfg_.persistent.c_str(), g.error().to_string().c_str());
    uint64_t unit = cfg_.stripe_size ? cfg_.stripe_size : g ? g->stripe_unit : 0;
    if (unit == 0 || unit % storage::kDirectAlign != 0) unit = unit < storage::kDirectAlign && unit ? storage::kDirectAlign : 1 << 20;
    const uint32_t count = cfg_.stripe_count ? cfg_.stripe_count : g ? std::max<uint32_t>(1, g->stripe_count) : 1;
    text = std::to_string(unit) + " " + std::to_string(count) + " " + (g ? g->fs : std::string("unknown"));
    // An override on CephFS becomes the layout of this run's directory, so
    // that every data file gets it before its first write.
    if (g && g->fs == "cephfs" && (cfg_.stripe_size || cfg_.stripe_count)) {
      const std::string dir = storage::join(format::runs_dir(cfg_.persistent), cfg_.run);
      const uint64_t object = std::max<uint64_t>(g->object_size, unit) / unit * unit;
      status st = host_->env()->make_dirs(dir);
      if (st)
        st = storage::set_dir_layout(dir, cfg_.stripe_size ? unit : 0, cfg_.stripe_count ? count : 0,
                                     cfg_.stripe_size ? object : 0);
      if (!st) text = "error " + st.with_context("setting the layout of " + dir + " (stripe_size " +
                                                std::to_string(unit) + ", stripe_count " + std::to_string(count) +
                                                "): fix stripe_size/stripe_count or remove them to use the "
                                                "directory's layout").to_string();
    }
  }
  comm.broadcast(&text, 0);
  if (text.rfind("error ", 0) == 0) return {errc::invalid_argument, text.substr(6)};
  std::istringstream in(text);
  in >> stripe_ >> stripe_count_ >> fs_name_;
  // auto (0): leaders one per node up to the storage targets, decided per
  // version from the nodes the records name; the baselines one shared file.
  files_ = cfg_.aggregate_files ? cfg_.aggregate_files
                                          : cfg_.aggregate_strategy == aggregate_strategy::leaders ? 0 : 1;
  if (cfg_.aggregate_strategy == aggregate_strategy::mpiio && files_ != 1)
    return {errc::invalid_argument, "aggregate_strategy = mpiio writes one shared file with one collective call "
                                    "per version: set aggregate_files = 1 (or use leaders for M files)"};
#ifdef CAIRN_HAVE_FABRIC
  if (plane_) {
    // Every rank's data-plane address, in rank order.
    constexpr size_t kRow = 256;
    const std::string& name = aggregate::data_plane_address(*plane_);
    if (name.size() >= kRow) return {errc::internal, "data-plane address too long"};
    std::vector<std::byte> row(kRow), all;
    row[0] = static_cast<std::byte>(name.size());
    std::memcpy(row.data() + 1, name.data(), name.size());
    comm.allgather(row, &all);
    std::vector<std::string> names;
    for (int r = 0; r < host_->size(); ++r) {
      const std::byte* p = all.data() + static_cast<size_t>(r) * kRow;
      names.emplace_back(reinterpret_cast<const char*>(p + 1), static_cast<size_t>(p[0]));
    }
    CAIRN_ASSIGN_OR_RETURN(std::string key, host_->plane_key());
    CAIRN_RETURN_IF_ERROR(aggregate::join_data_plane(*plane_, static_cast<uint32_t>(rank), std::move(names),
                                                     std::move(key)));
  }
#endif
  if (files_ > static_cast<uint32_t>(host_->size()))
    return {errc::invalid_argument, "aggregate_files = " + std::to_string(files_) + " is more than the " +
                                        std::to_string(host_->size()) + " ranks of this job: set it to at most " +
                                        std::to_string(host_->size()) + " (or auto)"};
  return {};
}

result<std::shared_ptr<const aggregate::plan>> aggregate_level::plan(const std::vector<plan_record>& records) {
  // Nodes as dense indices, in the order of their hashes: the same on every rank.
  std::vector<uint64_t> nodes;
  for (const auto& r : records) nodes.push_back(r.node);
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  std::vector<aggregate::rank_input> in(records.size());
  for (size_t r = 0; r < records.size(); ++r) {
    in[r].bytes = records[r].bytes;
    in[r].node = static_cast<uint32_t>(std::lower_bound(nodes.begin(), nodes.end(), records[r].node) - nodes.begin());
    in[r].load = records[r].load;
  }
  const uint32_t files = files_ ? files_
                                           : std::max<uint32_t>(1, std::min<uint32_t>(static_cast<uint32_t>(nodes.size()),
                                                                                     stripe_count_));
  // Every strategy below assigns it (a default-constructed result is an error).
  result<aggregate::plan> p = status(errc::internal, "aggregate strategy not planned");
  switch (cfg_.aggregate_strategy) {
    case aggregate_strategy::posix_shared:
    case aggregate_strategy::mpiio: p = aggregate::make_self_plan(in, files, 0); break;
    case aggregate_strategy::aligned: p = aggregate::make_self_plan(in, files, stripe_); break;
    default: {
      aggregate::plan_options o;
      o.leaders = files;
      o.stripe = stripe_;
      // Lustre: one shared file, leader k owning stripes k, k+M, ... (its OST's
      // objects); elsewhere a file per leader (CephFS keeps a single writing
      // client's write-back cache: docs/benchmarks.md, "CephFS rig").
      o.kind = fs_name_ == "lustre" ? aggregate::layout::shared_striped : aggregate::layout::file_per_leader;
      p = aggregate::make_plan(in, o);
    }
  }
  if (!p) return p.take_status().with_context("planning the aggregated flush");
  return std::shared_ptr<const aggregate::plan>(std::make_shared<aggregate::plan>(std::move(p).value()));
}

void aggregate_level::describe(const engine::version_job& job, format::manifest* m) const {
  if (!job.plan) return;
  const aggregate::plan& p = *job.plan;
  m->aggregated = true;
  format::container_info& c = m->container;
  switch (cfg_.aggregate_strategy) {
    case aggregate_strategy::posix_shared: c.strategy = "posix_shared"; break;
    case aggregate_strategy::aligned: c.strategy = "aligned"; break;
    case aggregate_strategy::mpiio: c.strategy = "mpiio"; break;
    case aggregate_strategy::leaders: c.strategy = "leaders"; break;
  }
  c.stripe = p.stripe;
  c.stripe_count = stripe_count_;
  c.leaders = p.leaders;
  c.bytes_between_nodes = p.bytes_between_nodes;
  c.bytes_within_nodes = p.bytes_within_nodes;
  c.padding = p.padding;
  c.files.resize(p.file_bytes.size());
  for (uint32_t f = 0; f < c.files.size(); ++f) {
    c.files[f].name = format::data_file_name(f);
    c.files[f].size = p.file_bytes[f];
  }
  for (uint32_t k = 0; k < p.owned.size(); ++k)
    if (p.used[k]) c.files[p.owned[k].file].writers.push_back(p.leaders[k]);
}

bool aggregate_level::awaits_collective(const version_record& rec) const {
  return rec.job->plan && strategy_ == aggregate_strategy::mpiio && !rec.step_done;
}

bool aggregate_level::awaits_step() const {
  for (const version_record* r : host_->pending())
    if (awaits_collective(*r) && r->job->collective.load() == 1) return true;
  return false;
}

status aggregate_level::before_capture(bool drain) {
  if (strategy_ != aggregate_strategy::mpiio) return {};
  engine::staging_pool& pool = host_->staging();
  // A slot is held by a version until its collective write, which only this
  // thread makes: waiting for a slot in acquire() (or for the engine to go
  // idle before slots grow: `drain`) would wait for ever. Drive the writes
  // until every rank has a free slot and, when draining, none waits (the
  // loop's condition is agreed, so every rank makes the same collective calls).
  auto done = [&] {
    if (drain)
      for (version_record* r : host_->pending())
        if (awaits_collective(*r)) return false;
    return pool.slots() == 0 || pool.has_free();
  };
  while (host_->comm().min(done() ? 1 : 0) == 0) {
    for (version_record* r : host_->pending())
      if (awaits_collective(*r)) {
        wait_local(*r, CAIRN_LEVEL_PERSISTENT);
        break;
      }
    CAIRN_RETURN_IF_ERROR(host_->progress_round());
  }
  return {};
}

std::optional<int64_t> aggregate_level::step_state(version_record& rec) {
  if (!awaits_collective(rec)) return std::nullopt;
  // 1 once this rank's image waits for the collective write.
  const int64_t state = level_state(host_->engine(), *rec.job, CAIRN_LEVEL_PERSISTENT);
  return state < 0 ? -1 : rec.job->collective.load() == 1 ? 1 : 0;
}

bool aggregate_level::wait_local(version_record& rec, unsigned level) {
  if (level != CAIRN_LEVEL_PERSISTENT || !awaits_collective(rec)) return false;
  // The stage waits for this thread's collective write; wait only until
  // this rank is ready for it (or failed).
  while (rec.job->collective.load() == 0 && level_state(host_->engine(), *rec.job, CAIRN_LEVEL_PERSISTENT) == 0) {
    struct timespec ts {0, 200000};
    nanosleep(&ts, nullptr);
  }
  return true;
}

void aggregate_level::step(version_record& rec, int64_t state) {
  rec.step_done = true;
  if (state < 0) {
    rec.job->cancelled = true;  // some rank cannot write: nobody does
    return;
  }
  // paper 004, 2.2: every rank's image at its prefix-sum offset of the
  // version's shared file, in one collective MPI-IO call made here, on the
  // application thread, inside whichever cairn call found every rank ready.
  engine::version_job& job = *rec.job;
  const auto& h = job.header;
  const std::string path = storage::join(format::version_dir(cfg_.persistent, h.run, h.name, h.version),
                                         format::data_file_name(0));
  const uint64_t offset = job.extents.empty() ? 0 : job.extents.front().offset;
  status st = host_->comm().write_at_all(path, offset, {job.image->data(), job.extents.empty() ? 0 : h.file_size});
  if (!st) {
    job.collective_error = st.with_context("aggregated persistent level (mpiio)");
    job.collective.store(-1);
  } else {
    job.collective.store(2);
  }
}

}  // namespace cairn
