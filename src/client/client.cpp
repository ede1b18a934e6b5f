#include "client/client.hpp"

#include <sched.h>

#include <csignal>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "aggregate/stage.hpp"
#include "client/batch_job.hpp"
#include "client/pipeline.hpp"
#include "client/run_lease.hpp"
#include "engine/stages.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/commit.hpp"
#include "format/run_info.hpp"
#include "redundancy/sets.hpp"
#include "util/names.hpp"
#include "util/clock.hpp"
#include "storage/geometry.hpp"
#include "util/aligned_buffer.hpp"
#include "util/copy.hpp"
#include "util/cpu.hpp"
#include "util/hash.hpp"
#include "util/mutex.hpp"

namespace cairn {
namespace {

constexpr unsigned kLevels[] = {CAIRN_LEVEL_LOCAL, CAIRN_LEVEL_PERSISTENT};

const char* level_name(unsigned level) {
  switch (level) {
    case CAIRN_LEVEL_CAPTURED: return "captured";
    case CAIRN_LEVEL_LOCAL: return "local";
    case CAIRN_LEVEL_PROTECTED: return "protected";
    case CAIRN_LEVEL_PERSISTENT: return "persistent";
  }
  return "unknown";
}

}  // namespace

int64_t level_state(engine::engine& eng, const engine::version_job& job, unsigned level) {
  unsigned done = 0, failed = 0;
  bool finished = false;
  eng.levels(job, &done, &failed, &finished);
  if (done & level) return 1;
  if (failed & level) return -1;
  return 0;
}

std::vector<uint64_t> row_major_dims(const region& r) {
  std::vector<uint64_t> d = r.dims;
  if (r.column_major) std::reverse(d.begin(), d.end());
  return d;
}

status check_name(const std::string& what, const std::string& name) {
  CAIRN_RETURN_IF_ERROR(util::check_name(what, name));
  // A checkpoint is a directory beside the run's own files (runs/<run>/RUN
  // and its temporaries: docs/format/store.md).
  if (what == "checkpoint" && name.rfind(format::kRunFileName, 0) == 0)
    return {errc::invalid_argument, "checkpoint name '" + name + "' starts with '" + format::kRunFileName +
                                        "', which the store keeps for the run's identity file: choose another name"};
  return {};
}

client_impl::client_impl(std::unique_ptr<comm::communicator> comm, config cfg)
    : comm_(std::move(comm)), cfg_(std::move(cfg)), env_(storage::storage_env::posix()) {}

client_impl::~client_impl() {
  pool_.stop_ahead();
  for (auto& [key, rec] : records_) rec->job->cancelled = true;
  for (const auto& l : levels_) l->abandon();
  if (engine_) engine_->shutdown(false);
  for (const auto& l : levels_) l->close();
  if (warning_handler_) batch::release_warning_handler();
  if (lease_) lease_->release();
}

result<std::unique_ptr<client_impl>> client_impl::create(std::unique_ptr<comm::communicator> comm,
                                                         const std::string& config_path) {
  std::string path = config_path;
  if (path.empty()) {
    if (const char* p = std::getenv("CAIRN_CONFIG")) path = p;
  }
  auto cfg = config::load(path);
  // Agree on success so that no rank is left waiting in a collective.
  status st = cfg ? status() : cfg.error();
  int64_t ok = comm->min(st.is_ok() ? 1 : 0);
  if (!ok) {
    if (st.is_ok()) st = status(errc::invalid_argument, "another rank failed to read its configuration");
    return st;
  }
  std::unique_ptr<client_impl> c(new client_impl(std::move(comm), std::move(cfg).value()));
  if (!c->cfg_.run_set) {
    // The default run (docs/design/run-identity.md) is rank 0's, said once.
    c->comm_->broadcast(&c->cfg_.run, 0);
    if (c->rank() == 0)
      std::fprintf(stderr, "cairn: run '%s' (the default for this program, directory%s; set CAIRN_RUN to choose one)\n",
                   c->cfg_.run.c_str(), c->cfg_.run_scope_job && std::getenv("SLURM_JOB_ID") ? " and job" : "");
  }
  st = c->start();
  st = c->agree(st);
  if (!st) return st;
  return c;
}

void client_impl::settle_redundancy() {
  if (cfg_.redundancy == "none" || cfg_.redundancy_required) return;
  std::string why;
#ifndef CAIRN_HAVE_FABRIC
  why = "this build of cairn has no libfabric data plane";
#endif
  if (why.empty() && !cfg_.local_enabled) why = "it protects the node-local level, which is off";
  if (why.empty() && !cfg_.agents.empty()) why = "checkpoint agents hold level L2";
  if (why.empty()) {
    // The same answer on every rank: every rank's node, in rank order.
    auto nodes = comm::allgather_lines(*comm_, node_);
    auto kind = redundancy::parse_scheme(cfg_.redundancy);
    if (!kind) {
      why = kind.error().message();
    } else {
      auto sets = redundancy::form_sets(nodes, *kind, cfg_.redundancy_set, cfg_.rs_parity);
      if (!sets) why = sets.error().message();
    }
  }
  if (why.empty()) return;
  if (rank() == 0)
    std::fprintf(stderr, "cairn: redundancy = %s is off for this job (redundancy_required = false): %s\n",
                 cfg_.redundancy.c_str(), why.c_str());
  cfg_.redundancy = "none";
}

status client_impl::start() {
  host_ = comm_->host();
  // The node (failure domain, leader spread): configured, else the batch
  // system's node name, else the host; ranks_per_node emulates nodes.
  node_ = batch::node_identity(cfg_.node_id, host_);
  if (cfg_.ranks_per_node > 0) node_ += "#" + std::to_string(rank() / cfg_.ranks_per_node);
  {
    CAIRN_ASSIGN_OR_RETURN(auto signals, batch::parse_signals(cfg_.warning_signals, batch::in_batch_job()));
    CAIRN_ASSIGN_OR_RETURN(job_end_, batch::job_end_time(cfg_.deadline, util::wall_s()));
    CAIRN_RETURN_IF_ERROR(batch::install_warning_handler(signals));
    warning_handler_ = true;
    warnings_at_capture_ = batch::warnings_received();
  }
  if (!cfg_.fault_inject.empty()) {  // a test hook (storage::parse_fault_plan)
    CAIRN_ASSIGN_OR_RETURN(storage::fault_plan plan, storage::parse_fault_plan(cfg_.fault_inject));
    if (plan.level == "capture" && (plan.rank < 0 || plan.rank == rank())) kill_capture_version_ = plan.version;
    fault_env_ = storage::make_planned_fault_env(storage::storage_env::posix(), std::move(plan), rank(), cfg_.scratch,
                                                 cfg_.persistent);
    if (fault_env_) env_ = fault_env_.get();
  }
  CAIRN_RETURN_IF_ERROR(env_->make_dirs(cfg_.persistent).with_context("persistent level (CAIRN_PERSISTENT)"));
  if (cfg_.local_enabled)
    CAIRN_RETURN_IF_ERROR(env_->make_dirs(cfg_.scratch).with_context("local level (CAIRN_SCRATCH)"));
  // One writer per run, before anything of the run is read or written.
  CAIRN_RETURN_IF_ERROR(agree(take_lease()));
  if (rank() == 0) {
    cairn::lock_guard lk(catalog_mu_);  // no engine thread yet: taken for the analysis, never contended
    auto cat = history::catalog::open(cfg_.persistent);
    if (!cat) {
      std::fprintf(stderr, "cairn: warning: catalog unavailable (%s); checkpoints are still written, "
                           "run 'cairn reindex' later\n", cat.error().to_string().c_str());
    } else {
      catalog_ = std::move(cat).value();
      // The time to durable of the run's newest committed version, from an
      // earlier execution: cairn_should_checkpoint's estimate until this
      // execution measures its own.
      auto vs = catalog_->list_versions(cfg_.run);
      if (vs && !vs->empty()) {
        const auto newest = std::max_element(vs->begin(), vs->end(),
                                             [](const auto& a, const auto& b) { return a.committed_at < b.committed_at; });
        auto shards = catalog_->list_shards(cfg_.run, newest->name, newest->version);
        if (shards && !shards->empty()) {
          double first = shards->front().captured_at;
          for (const auto& sh : *shards) first = std::min(first, sh.captured_at);
          if (first > 0 && newest->committed_at > first) durable_s_->store(newest->committed_at - first);
        }
      }
    }
  }
  CAIRN_RETURN_IF_ERROR(resolve_layout());
  settle_redundancy();
  CAIRN_ASSIGN_OR_RETURN(levels_, make_levels(this));
  bool stages_elsewhere = false, reads_retired = false;
  for (const auto& l : levels_) {
    level_commits_persistent_ |= l->commits_persistent();
    stages_elsewhere |= l->runs_stages();
    reads_retired |= l->reads_retired_local();
  }
  // Not where a stage may still read a node-local file when its version
  // retires (the leaders' aggregation: removing it keeps an open file
  // intact; overwriting it in place would not), nor where a level runs the
  // stages (the daemon writes the node-local level, the client's retention
  // removes from it).
  if (cfg_.local_enabled && !stages_elsewhere && !reads_retired) {
    recycler_ = std::make_shared<engine::local_recycler>(env_, cfg_.scratch, cfg_.run, static_cast<uint32_t>(rank()));
    CAIRN_RETURN_IF_ERROR(recycler_->clear().with_context("local level (emptying the recycled files' bin)"));
  }
  restart_first_ = restart_may_come();
  // The stages that write the persistent level write through the cap.
  storage::storage_env* flush_env = env_;
  if (cfg_.io_rate_limit > 0) {
    rate_env_ = storage::make_rate_limited_env(env_, cfg_.io_rate_limit);
    flush_env = rate_env_.get();
  }
  engine::stage_graph stages;
  graph_points g{&stages, 0, 0, {cfg_.run, cfg_.scratch, cfg_.persistent}, flush_env, recycler_};
  const int home = sched_getcpu();
  CAIRN_ASSIGN_OR_RETURN(std::vector<int> engine_cpus, util::placement_cpus(cfg_.placement, home < 0 ? 0 : home));
  // write_during_capture: the checksum pass and the persistent data write
  // start with the application thread's copy, each 16 MiB piece read once it
  // is copied. `auto`: only where the engine threads are placed on other
  // CPUs than the application thread; on its core they would run inside the
  // application's call. With engine threads free to run on the other core
  // of two, the node-local copy came 0.85x as late but the blocked time was
  // 1.2x (the pass reads memory beside the copy), so that is not the default
  // (docs/benchmarks/core.md, "The checksum pass behind the copy").
  g.follow_capture = cfg_.mode == engine_mode::thread &&
                     (cfg_.write_during_capture == capture_overlap::on ||
                      (cfg_.write_during_capture == capture_overlap::automatic && !engine_cpus.empty() &&
                       std::find(engine_cpus.begin(), engine_cpus.end(), home) == engine_cpus.end()));
  // An idle engine thread shares large copies (copy_image) where it can run
  // beside the application thread.
  copy_helper_ = cfg_.mode == engine_mode::thread && util::runs_elsewhere(engine_cpus, home);
  if (!stages_elsewhere) {
    CAIRN_ASSIGN_OR_RETURN(pipeline_shape shape,
                           build_pipeline(cfg_, env_, levels_, g,
                                          [this](const engine::version_job& job) { return describe_version(job); }, host_));
    commit_stage_ = shape.commit_stage;
    follow_capture_ = g.follow_capture;
    online_ = std::move(shape.online);
  }
  // The attempt tag of this execution's shards: rank 0 draws it, and the
  // run's identity records it.
  std::string tag;
  if (rank() == 0) tag = std::to_string(std::random_device{}() | 1u);
  comm_->broadcast(&tag, 0);
  attempt_ = static_cast<uint32_t>(std::stoul(tag));
  CAIRN_RETURN_IF_ERROR(agree(start_run_identity()));  // rank 0 writes: every rank learns how it went
  // The attempts of every execution of the run in this store: a node-local
  // shard of another (a run of the same name in another store, sharing the
  // node-local directory) is never restored. Empty: some execution predates
  // the record, so no shard can be told apart.
  std::string known;
  if (rank() == 0) {
    for (const auto& e : run_info_.executions) {
      if (e.attempt == 0) {
        known.clear();
        break;
      }
      known += std::to_string(e.attempt) + ",";
    }
  }
  comm_->broadcast(&known, 0);
  store_attempts_.clear();
  for (size_t at = 0, comma; (comma = known.find(',', at)) != std::string::npos; at = comma + 1)
    store_attempts_.insert(static_cast<uint32_t>(std::stoul(known.substr(at, comma - at))));
  for (const auto& l : levels_) CAIRN_RETURN_IF_ERROR(l->start(g));
  util::thread_setup setup{std::move(engine_cpus), cfg_.engine_priority, cfg_.engine_nice};
  engine_ = std::make_unique<engine::engine>(cfg_.mode, cfg_.io_threads, std::move(setup), std::move(stages));
  // Whether staging slots ask for huge pages, learnt off the application's
  // thread before the first slot is made (util/aligned_buffer.hpp).
  if (cfg_.mode == engine_mode::thread) engine_->submit_task([] {
      util::learn_page_cost();
      return status{};
    });
  start_cow();
  return {};
}

void client_impl::start_cow() {
  // Copy-on-write needs the engine's threads (sync mode waits for every
  // level anyway) and a version that may complete after cairn_checkpoint
  // returns (not the daemon's, which holds it at return).
  if (cfg_.capture == capture_method::copy) return;
  const char* why = nullptr;
  if (cfg_.mode != engine_mode::thread) why = "mode = sync waits for every level inside cairn_checkpoint";
  for (const auto& l : levels_)
    if (l->takes_capture()) why = "engine_host = daemon holds the whole version when cairn_checkpoint returns";
  std::string reason;
  if (!why) {
    auto c = engine::cow_capture::make();
    if (c) cow_ = std::move(*c);
    else reason = c.error().message();
    why = reason.empty() ? nullptr : reason.c_str();
  }
  if (why && cfg_.capture == capture_method::cow && rank() == 0)
    std::fprintf(stderr, "cairn: notice: capture = cow does not apply here (%s): checkpoints copy\n", why);
}

status client_impl::resolve_layout() {
  // Collective, on every rank whatever its configuration (a broadcast and an
  // agreement): `auto` follows the file system rank 0 sees, and ranks that
  // would lay the persistent level out differently (a launcher that set the
  // environment for some ranks only) get an error instead of a deadlock.
  std::string fs;
  if (rank() == 0) {
    auto g = storage::detect_geometry(cfg_.persistent);
    fs = g ? g->fs : "unknown";
  }
  comm_->broadcast(&fs, 0);
  cfg_.persistent_layout = cfg_.resolved_layout(fs);
  const bool aggregated = cfg_.persistent_layout == persistent_layout::aggregated;
  int64_t mine[2] = {aggregated ? 1 : 0, aggregated ? static_cast<int64_t>(cfg_.aggregate_strategy) : -1};
  int64_t lo[2] = {mine[0], mine[1]}, hi[2] = {-mine[0], -mine[1]};
  comm_->allreduce_min(lo);
  comm_->allreduce_min(hi);
  if (lo[0] != -hi[0] || lo[1] != -hi[1])
    return agree({errc::invalid_argument,
                  "ranks disagree on the persistent level's layout (persistent_layout, aggregate_strategy): "
                  "this rank has " + std::string(aggregated ? "aggregated" : "file_per_process") +
                      "; give every rank the same configuration (CAIRN_* variables reach every rank?)"});
  return {};
}

void copy_block(std::byte* contiguous, std::byte* memory, size_t elem, const std::vector<uint64_t>& dims,
                const std::vector<uint64_t>& mem_shape, const std::vector<uint64_t>& mem_start, bool to_contiguous) {
  const size_t nd = dims.size();
  // Row length in bytes (innermost dimension) and strides of the memory buffer.
  const size_t row = dims[nd - 1] * elem;
  std::vector<uint64_t> stride(nd, elem);
  for (size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * mem_shape[d];
  uint64_t rows = 1;
  for (size_t d = 0; d + 1 < nd; ++d) rows *= dims[d];
  std::vector<uint64_t> idx(nd, 0);
  for (uint64_t r = 0; r < rows; ++r) {
    uint64_t off = 0;
    for (size_t d = 0; d < nd; ++d) off += (mem_start[d] + idx[d]) * stride[d];
    if (to_contiguous) std::memcpy(contiguous + r * row, memory + off, row);
    else std::memcpy(memory + off, contiguous + r * row, row);
    for (size_t d = nd - 1; d-- > 0;) {  // odometer over the outer dimensions
      if (++idx[d] < dims[d]) break;
      idx[d] = 0;
    }
  }
}

status client_impl::protect(region r) {
  CAIRN_RETURN_IF_ERROR(check_name("region", r.name));
  if (r.ptr == nullptr && r.count > 0) return {errc::invalid_argument, "region '" + r.name + "': null pointer"};
  if (format::type_size(r.type) == 0)
    return {errc::invalid_argument, "region '" + r.name + "': unknown type " + std::to_string(r.type)};
  if (r.name.rfind("file:", 0) == 0)
    return {errc::invalid_argument, "region '" + r.name + "': names starting with 'file:' are reserved for file mode"};
  // Its bytes, with room for the shard's header and alignment: a count whose
  // size does not fit in 63 bits is refused here, not by the next checkpoint.
  if (r.count > (uint64_t{1} << 62) / format::type_size(r.type))
    return {errc::invalid_argument, "region '" + r.name + "': " + std::to_string(r.count) +
                                        " elements are more bytes than a checkpoint can hold (2^62)"};
  if (!r.dims.empty()) {
    if (r.dims.size() > format::kMaxDims) return {errc::invalid_argument, "region '" + r.name + "': more than 8 dimensions"};
    uint64_t n = 1;
    bool overflow = false;
    for (auto d : r.dims) overflow = overflow || __builtin_mul_overflow(n, d, &n);
    if (overflow)
      return {errc::invalid_argument, "region '" + r.name + "': the shape's element count overflows 64 bits"};
    if (n != r.count)
      return {errc::invalid_argument, "region '" + r.name + "': shape product " + std::to_string(n) +
                                          " differs from the count " + std::to_string(r.count)};
  }
  // A block (start, count) must lie inside its enclosing shape, in every dimension.
  auto check_block = [&](const std::vector<uint64_t>& start, const std::vector<uint64_t>& shape,
                         const char* what) -> status {
    if (shape.size() != r.dims.size() || start.size() != r.dims.size())
      return {errc::invalid_argument, "region '" + r.name + "': " + what + " and its start need the rank of count"};
    for (size_t d = 0; d < r.dims.size(); ++d)
      if (start[d] > shape[d] || r.dims[d] > shape[d] - start[d])
        return {errc::invalid_argument, "region '" + r.name + "': start + count exceeds the " + what +
                                            " in dimension " + std::to_string(d)};
    return {};
  };
  if (!r.global.empty()) CAIRN_RETURN_IF_ERROR(check_block(r.start, r.global, "global shape"));
  if (!r.mem_shape.empty()) {
    CAIRN_RETURN_IF_ERROR(check_block(r.mem_start, r.mem_shape, "memory shape"));
    if (r.column_major) {  // copy_block works row-major: reverse Fortran order once here
      std::reverse(r.mem_shape.begin(), r.mem_shape.end());
      std::reverse(r.mem_start.begin(), r.mem_start.end());
    }
  }
  if (auto it = regions_.find(r.name); it != regions_.end()) {
    if (it->second.ptr != r.ptr || it->second.count != r.count) {
      drain_capture();  // the region's old memory may be freed once this returns
      for (const auto& l : levels_) l->regions_changed();
    }
    count_for_staging(it->second, false);
  }
  count_for_staging(r, true);
  regions_[r.name] = std::move(r);
  // The slots are made once the protects have settled (kProtectSettle), for
  // the layout they leave. A run with versions may restart: its slots wait
  // kRestartGrace after the last protect for the application to ask (a
  // restart wants the memory first), then are made anyway, so that an
  // execution that never asks does not make them in its first checkpoint.
  pool_.defer_until(std::chrono::steady_clock::now() +
                    (restart_first_ && !restart_asked_ ? std::chrono::milliseconds(kRestartGrace) : kProtectSettle));
  prepare_staging();
  return {};
}

result<int> client_impl::probe() {
  if (finalized_) return status(errc::invalid_argument, "cairn_probe: handle already finalized");
  int change = CAIRN_AGENTS_UNCHANGED;
  for (const auto& l : levels_) {
    CAIRN_ASSIGN_OR_RETURN(int c, l->probe());
    if (c != CAIRN_AGENTS_UNCHANGED) change = c;
  }
  return change;
}

status client_impl::unprotect(const std::string& name) {
  drain_capture();  // the application may free the memory once this returns
  auto it = regions_.find(name);
  if (it == regions_.end()) return {errc::not_found, "region '" + name + "' is not protected"};
  count_for_staging(it->second, false);
  regions_.erase(it);
  for (const auto& l : levels_) l->regions_changed();
  return {};
}

version_record* client_impl::find(const std::string& name, int64_t version) {
  auto it = records_.find({name, version});
  return it == records_.end() ? nullptr : it->second.get();
}

status client_impl::checkpoint(const std::string& name, int64_t version) {
  if (files_) return {errc::invalid_argument, "cairn_checkpoint called inside a file-mode begin/end sequence"};
  std::vector<region> regs;
  for (auto& [n, r] : regions_) regs.push_back(r);
  if (regs.empty())
    return {errc::invalid_argument, "checkpoint '" + name + "': no region is protected (call cairn_protect first)"};
  return capture(name, version, regs);
}

status client_impl::capture(const std::string& name, int64_t version, const std::vector<region>& regs,
                            bool may_cow) {
  if (finalized_) return {errc::invalid_argument, "handle already finalized"};
  CAIRN_RETURN_IF_ERROR(check_name("checkpoint", name));
  if (version < 0) return {errc::invalid_argument, "checkpoint '" + name + "': version must be >= 0"};
  if (auto it = last_version_.find(name); it != last_version_.end() && version <= it->second) {
    return {errc::invalid_argument, "checkpoint '" + name + "': version " + std::to_string(version) +
                                        " is not larger than the previous one (" + std::to_string(it->second) + ")"};
  }

  // Plan the shard image and make sure staging can hold it: st is agreed
  // by the progress round below (one collective, not two).
  format::shard_header h;
  // Lent: contiguous regions stay where they are; a level reads them.
  const bool lend = std::any_of(levels_.begin(), levels_.end(), [](const auto& l) { return l->lends(); });
  bool cow = false;
  status st = reserve_staging(name, version, regs, lend, may_cow, &h, &cow);
  CAIRN_RETURN_IF_ERROR(check_committed_floor(name, version));

  // Whether this version goes to the persistent level (the same on every rank).
  const bool to_persistent = !level_commits_persistent_ && ((count_[name] + 1) % cfg_.persistent_interval == 0 || !cfg_.local_enabled);
  // A level that plans the persistent write (aggregation): every rank's
  // size, node and load ride on the collective below.
  level* planner = nullptr;
  for (const auto& l : levels_)
    if (to_persistent && l->plans()) planner = l.get();
  plan_record my_record;
  std::vector<plan_record> records;
  if (planner) {
    my_record.bytes = st ? h.file_size : 0;
    my_record.node = util::xxh3(node_.data(), node_.size());
    my_record.load = util::node_load();
  }
  for (const auto& l : levels_) CAIRN_RETURN_IF_ERROR(l->before_capture(st && h.file_size > pool_.slot_bytes()));
  bool all_have_slot = true;
  const uint64_t warnings = batch::warnings_received();  // a checkpoint from here on answers them
  // An earlier version's failure latched on some rank does not stop this
  // capture: it is reported once this version is taken (below).
  CAIRN_RETURN_IF_ERROR(progress(false, &all_have_slot, &st, planner ? &my_record : nullptr, &records));
  const bool earlier_failed = error_agreed_;
  if (divergence_ && cfg_.on_divergence == divergence_action::stop) {
    return {errc::diverged, "run '" + cfg_.run + "' diverged from '" + cfg_.reference_run + "' at '" +
                                divergence_->name + "' version " + std::to_string(divergence_->version) + ", rank " +
                                std::to_string(divergence_->rank) + ", region '" + divergence_->region +
                                "' (on_divergence = stop): end the run"};
  }
  if (!all_have_slot) {
    return {errc::again, "checkpoint '" + name + "' version " + std::to_string(version) +
                             ": staging memory is full on some rank (staging_policy = eagain); retry later or raise "
                             "staging_limit"};
  }

  std::shared_ptr<const aggregate::plan> plan;
  if (planner) {
    // The same pure function of the same records on every rank: the same plan
    // (or the same error) everywhere, with no further agreement.
    CAIRN_ASSIGN_OR_RETURN(plan, planner->plan(records));
  }

  engine::aligned_buffer* slot = pool_.acquire(true);
  auto job = std::make_shared<engine::version_job>();
  ++count_[name];
  unsigned wanted = CAIRN_LEVEL_CAPTURED;
  if (cfg_.local_enabled) wanted |= CAIRN_LEVEL_LOCAL;
  for (const auto& l : levels_) wanted |= l->wants(count_[name]);
  if (to_persistent) wanted |= CAIRN_LEVEL_PERSISTENT;
  job->header = std::move(h);
  job->image = slot;
  job->pool = &pool_;
  job->wanted = wanted;
  job->plan = std::move(plan);
  job->captured_at = util::wall_s();
  if (lend) job->lent.assign(regs.size(), nullptr);
  // The copy goes 16 MiB at a time (non-temporal stores: no slower in
  // pieces); with `stream` the checksum pass and the persistent write follow
  // it piece by piece and need not wait for the whole image.
  const bool stream = !cow && !lend && follow_capture_;
  job->capture_streams = stream;
  // A lent version is captured once the agents hold it (or it was copied);
  // a copy-on-write one once the background copy ends (engine::captured).
  job->done = job->lent.empty() && !cow ? CAIRN_LEVEL_CAPTURED : 0;
  if (stream || cow) engine_->submit(job, true);
  if (cow) {
    capture_cow(job, regs);
    ++cow_captures_;
  } else {
    copy_image(*job, regs, lend, stream);
  }
  warnings_at_capture_ = warnings;
  ++stats_.checkpoints;
  stats_dirty_ = true;
  if (near_deadline()) deadline_checkpointed_ = true;  // agreed: the same on every rank
  last_version_[name] = version;

  version_record* rec = track(name, version, job);

  // A level that must hold the version before cairn_checkpoint returns (the
  // daemon: the application may die right after) gets it before the engine.
  for (const auto& l : levels_) l->captured(*rec);
  if (stream) engine_->captured(*job);
  else if (!cow) engine_->submit(job);
  for (const auto& l : levels_) l->submitted(*rec);
  if (cfg_.mode == engine_mode::sync) {
    // The baseline: the application waits for every level of this version.
    for (unsigned level : kLevels)
      if (rec->wanted & level) CAIRN_RETURN_IF_ERROR(wait_record(*rec, level));
  }
  if (earlier_failed) return report_earlier_failure(name, version);
  return {};
}

bool client_impl::use_cow(uint64_t bytes, bool lend, bool may_cow, bool slot_ready) const {
  if (!cow_ || lend || !may_cow) return false;
  if (cfg_.capture == capture_method::cow) return true;
  // copy_or_cow: a copy into a slot made inside the call would also fault
  // its fresh memory in (about 1 s per GiB); the background copy does that.
  if (cfg_.capture == capture_method::copy_or_cow && slot_ready) return false;
  return bytes >= kCowMinBytes;
}

void client_impl::capture_cow(const std::shared_ptr<engine::version_job>& job, const std::vector<region>& regs) {
  std::byte* img = job->image->data();
  const auto& regions = job->header.regions;
  std::vector<engine::cow_region> protect;
  std::vector<size_t> which;  // index in regs of protect[k]
  std::vector<std::pair<uint64_t, uint64_t>> padding;  // offset, length
  for (size_t i = 0; i < regs.size(); ++i) {
    const auto& d = regions[i];
    if (regs[i].mem_shape.empty() && d.length) {
      protect.push_back({static_cast<const std::byte*>(regs[i].ptr), d.length, img + d.offset});
      which.push_back(i);
    }
    const uint64_t end = format::align_up(d.offset + d.length);
    if (end > d.offset + d.length) padding.emplace_back(d.offset + d.length, end - d.offset - d.length);
  }
  // The background copy ends the capture; the job (and the engine, which
  // outlives cow_) stay until it has. It also zeroes the alignment padding,
  // so no stale bytes of earlier layouts leak to disk: here, in a slot not
  // faulted in yet, every region's last page would fault a huge page in on
  // the application's call (90-180 ms of a 312 MiB first save).
  std::vector<int> refused = cow_->begin(protect, [this, job, padding = std::move(padding)](
                                                      status st, const engine::cow_report& r) {
    std::byte* image = job->image->data();
    for (const auto& [at, length] : padding) std::memset(image + at, 0, length);
    job->capture_s = r.copy_s;
    cow_faults_ += r.faults;
    engine_->captured(*job, std::move(st));
  });
  if (job->header.version == kill_capture_version_) ::raise(SIGKILL);  // test hook: crash mid-copy
  std::vector<bool> copy_here(regs.size(), true);
  for (size_t k = 0; k < which.size(); ++k) {
    copy_here[which[k]] = refused[k] != 0;
    // capture = cow says once per reason which region it copies (auto: silently).
    if (refused[k] && cfg_.capture == capture_method::cow && cow_refused_.insert(refused[k]).second)
      std::fprintf(stderr,
                   "cairn: rank %d: notice: capture = cow: region '%s' is copied, not write-protected (%s%s)\n",
                   rank(), regs[which[k]].name.c_str(), std::strerror(refused[k]),
                   refused[k] == EINVAL ? ": shared, file-backed or hugetlbfs memory" : "");
  }
  for (size_t i = 0; i < regs.size(); ++i)
    if (copy_here[i]) copy_region(img, regions[i], regs[i]);
  cow_->caller_done();
}

void client_impl::copy_region(std::byte* img, const format::region_desc& d, const region& r) {
  if (!r.mem_shape.empty()) {
    copy_block(img + d.offset, static_cast<std::byte*>(r.ptr), format::type_size(d.type), row_major_dims(r), r.mem_shape,
               r.mem_start, true);
  } else if (d.length) {
    util::stream_copy(img + d.offset, r.ptr, d.length);
  }
}

namespace {

// Pieces of a copy taken by two threads (the application's and an idle
// engine thread), each claiming the next piece until none is left. The
// application thread returns once every piece is copied; a helper that
// starts late finds none left and copies nothing. Each piece's time goes to
// util::fresh_pages_written: in a slot not faulted in yet, huge pages found
// slow are given up for the rest of it (copies into memory already faulted
// in are far below its threshold).
struct shared_copy {
  struct piece {
    std::byte* to;
    const std::byte* from;
    uint64_t bytes;
  };
  std::vector<piece> pieces;
  std::byte* slot_end = nullptr;
  std::atomic<size_t> next{0};
  std::atomic<size_t> left{0};  // pieces not copied yet
  cairn::mutex mu;
  cairn::condition_variable all_copied;

  void run() {
    for (size_t i; (i = next.fetch_add(1)) < pieces.size();) {
      const double t0 = util::now_s();
      util::stream_copy(pieces[i].to, pieces[i].from, pieces[i].bytes);
      util::fresh_pages_written(pieces[i].to, pieces[i].bytes, util::now_s() - t0, slot_end);
      if (left.fetch_sub(1) == 1) {
        cairn::lock_guard lk(mu);
        all_copied.notify_all();
      }
    }
  }
  void wait() {
    cairn::unique_lock lk(mu);
    all_copied.wait(lk, [&] { return left.load() == 0; });
  }
};

}  // namespace

void client_impl::copy_image(engine::version_job& job, const std::vector<region>& regs, bool lend, bool stream) {
  double t0 = util::now_s();
  std::byte* img = job.image->data();
  const auto& regions = job.header.regions;
  constexpr uint64_t kPiece = 16ull << 20;
  // Shared with an engine thread: on fresh slot memory the page faults take
  // most of a copy's time, and two threads take them in half of it (312 MiB
  // of 4 KiB pages: 69 against 135 ms here); into memory already faulted in,
  // 0.9x (11.5 against 13 ms).
  std::shared_ptr<shared_copy> shared;
  if (shares_copy(job.header.file_size, lend)) {  // never with `stream` (follow_capture_)
    shared = std::make_shared<shared_copy>();
    shared->slot_end = img + job.image->size();
  }
  for (size_t i = 0; i < regs.size(); ++i) {
    const auto& d = regions[i];
    if (lend && regs[i].mem_shape.empty() && d.length) {
      job.lent[i] = static_cast<const std::byte*>(regs[i].ptr);
    } else if (!regs[i].mem_shape.empty()) {
      copy_region(img, d, regs[i]);
    } else if (shared) {
      constexpr uint64_t kSharedPiece = 4ull << 20;  // copied after the loop
      for (uint64_t at = 0; at < d.length; at += kSharedPiece)
        shared->pieces.push_back({img + d.offset + at, static_cast<const std::byte*>(regs[i].ptr) + at,
                                  std::min(kSharedPiece, d.length - at)});
    } else {
      for (uint64_t at = 0; at < d.length; at += kPiece) {
        util::stream_copy(img + d.offset + at, static_cast<const std::byte*>(regs[i].ptr) + at,
                          std::min(kPiece, d.length - at));
        if (stream && at + kPiece < d.length) job.capture.publish(d.offset + at + kPiece);
      }
    }
    if (job.header.version == kill_capture_version_) ::raise(SIGKILL);  // test hook: crash mid-capture
    // Zero the alignment padding so no stale bytes of earlier layouts leak to disk.
    uint64_t end = format::align_up(d.offset + d.length);
    if (end > d.offset + d.length) std::memset(img + d.offset + d.length, 0, end - d.offset - d.length);
    if (stream) job.capture.publish(end);
  }
  if (shared && !shared->pieces.empty()) {
    shared->left = shared->pieces.size();
    engine_->submit_task([shared] {
      shared->run();
      return status{};
    });
    shared->run();
    shared->wait();
  }
  job.capture_s = util::now_s() - t0;
}

version_record* client_impl::track(const std::string& name, int64_t version, std::shared_ptr<engine::version_job> job) {
  auto owned = std::make_unique<version_record>();
  version_record* rec = owned.get();
  rec->name = name;
  rec->version = version;
  rec->job = job;
  rec->wanted = job->wanted;
  pending_.push_back(rec);
  records_[{name, version}] = std::move(owned);
  // Forget old resolved records so a long run does not grow without bound.
  while (records_.size() > 256) {
    auto it = std::find_if(records_.begin(), records_.end(), [](auto& kv) { return kv.second->resolved(); });
    if (it == records_.end()) break;
    records_.erase(it);
  }
  return rec;
}

result<unsigned> client_impl::test(const std::string& name, int64_t version) {
  // Alone, progress is local and cheap: let a polling application see commits.
  if (size() == 1 && !finalized_) CAIRN_RETURN_IF_ERROR(progress(false));
  version_record* rec = find(name, version);
  if (!rec) {
    return status(errc::not_found, "checkpoint '" + name + "' version " + std::to_string(version) +
                                       " was not taken by this handle");
  }
  unsigned done = 0, failed = 0;
  bool fin = false;
  status e;
  engine_->levels(*rec->job, &done, &failed, &fin, &e);
  unsigned levels = (done & (CAIRN_LEVEL_CAPTURED | CAIRN_LEVEL_LOCAL)) | (rec->global_done & CAIRN_LEVEL_PERSISTENT) |
                    (rec->global_done & CAIRN_LEVEL_PROTECTED);
  for (const auto& l : levels_) levels |= l->reached(*rec);
  if (!e.is_ok()) return e;
  // A version the agents did not take is not an error (the rank wrote it
  // itself): the missing PROTECTED bit says so; cairn_wait reports why.
  for (auto& [lvl, err] : rec->level_error)
    if (lvl != CAIRN_LEVEL_PROTECTED) return err;
  return levels;
}

void client_impl::wait_local(version_record& rec, unsigned level) {
  for (const auto& l : levels_)
    if (l->wait_local(rec, level)) return;  // a step of its own (mpiio): until this rank is ready for it
  if (!rec.shards_durable || level != CAIRN_LEVEL_PERSISTENT) {
    engine_->wait_levels(*rec.job, level);
    return;
  }
  if (rank() != 0) return;
  // Rank 0 waits for its manifest commit task, unless a later version waits
  // for a level's step (mpiio's collective write): the engine runs the task
  // after that version's stage, which waits for this thread.
  const auto awaits_step = [&] {
    return std::any_of(levels_.begin(), levels_.end(), [](const auto& l) { return l->awaits_step(); });
  };
  while (rec.manifest_state->load() == 0 && !awaits_step()) {
    struct timespec ts {0, 200000};
    nanosleep(&ts, nullptr);
  }
}

status client_impl::wait_record(version_record& rec, unsigned level) {
  for (;;) {
    if (rec.global_done & level) return {};
    if (rec.global_failed & level) return rec.level_error[level];
    wait_local(rec, level);
    CAIRN_RETURN_IF_ERROR(progress(false));
  }
}

status client_impl::wait(const std::string& name, int64_t version, unsigned level) {
  if (level != CAIRN_LEVEL_CAPTURED && level != CAIRN_LEVEL_LOCAL && level != CAIRN_LEVEL_PROTECTED &&
      level != CAIRN_LEVEL_PERSISTENT)
    return {errc::invalid_argument,
            "cairn_wait: level must be one of CAIRN_LEVEL_CAPTURED, _LOCAL, _PROTECTED, _PERSISTENT"};
  version_record* rec = find(name, version);
  if (!rec) {
    return {errc::not_found, "checkpoint '" + name + "' version " + std::to_string(version) +
                                 " was not taken by this handle (or is too old to be tracked)"};
  }
  if (level == CAIRN_LEVEL_CAPTURED) {
    // Immediate unless the regions are lent (agents_lend): then until the
    // agents hold them or they were copied, on every rank.
    engine_->wait_levels(*rec->job, CAIRN_LEVEL_CAPTURED);
    unsigned done = 0, failed = 0;
    bool fin = false;
    status e;
    engine_->levels(*rec->job, &done, &failed, &fin, &e);
    status mine = (done & CAIRN_LEVEL_CAPTURED) ? status() : !e.is_ok() ? e : status(errc::cancelled, "not captured");
    return agree(mine);
  }
  for (const auto& l : levels_)
    if (auto own = l->wait(*rec, level)) return *own;
  if (!(rec->wanted & level)) {
    return {errc::not_found, std::string("checkpoint '") + name + "' version " + std::to_string(version) +
                                 " is not scheduled for the " + level_name(level) +
                                 " level (see persistent_interval, local_enabled and agents)"};
  }
  return wait_record(*rec, level);
}

status client_impl::finalize(bool wait_for_pending) {
  if (finalized_) return {};
  drain_capture();
  status first;
  pool_.stop_ahead();  // a slot made ahead (or waiting for a restart) would not be used
  metrics_inline_ = true;  // the engine stops below: the textfile is written here from now on
  if (wait_for_pending) {
    while (!pending_.empty()) {
      version_record* rec = pending_.front();
      for (unsigned level : kLevels) {
        if (!(rec->wanted & level)) continue;
        status st = wait_record(*rec, level);
        if (!st && first.is_ok() && !rec->failure_reported) first = st;
      }
      std::erase(pending_, rec);
    }
    engine_->shutdown(true);
    status st = progress(true);
    if (!st && first.is_ok()) first = st;
  } else {
    for (version_record* rec : pending_) rec->job->cancelled = true;  // stages waiting for other ranks stop
    for (const auto& l : levels_) l->abandon();
    engine_->shutdown(false);
  }
  for (const auto& l : levels_) {
    status st = l->finish(wait_for_pending);
    if (!st && first.is_ok()) first = st;
  }
  if (wait_for_pending && first.is_ok()) drop_local_versions();
  if (rank() == 0 && !run_info_.executions.empty()) {
    run_info_.executions.back().ended_at = util::wall_s();
    status st = write_run_identity();
    if (!st && first.is_ok()) first = st;
  }
  (void)env_->remove_dir(files_dir());  // file mode: this execution's (empty) directory
  if (lease_) lease_->release();
  finalized_ = true;
  write_metrics();
  if (warning_handler_) {
    batch::release_warning_handler();
    warning_handler_ = false;
  }
  return first;
}

double client_impl::time_left() const {
  if (!job_end_) return HUGE_VAL;
  return *job_end_ - util::wall_s();
}

bool client_impl::near_deadline() const {
  return std::isfinite(agreed_left_s_) &&
         agreed_left_s_ <= cfg_.deadline_factor * agreed_durable_s_ + cfg_.deadline_margin;
}

result<bool> client_impl::should_checkpoint() {
  if (finalized_) return status(errc::invalid_argument, "handle already finalized");
  // The answer comes from one progress round (which also moves pending
  // versions on), so every rank answers the same even when the signal
  // reached the ranks at different moments.
  CAIRN_RETURN_IF_ERROR(progress(false));
  return agreed_warned_ || (near_deadline() && !deadline_checkpointed_);
}

}  // namespace cairn
