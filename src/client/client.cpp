#include "client/client.hpp"

#include <sched.h>

#include <csignal>

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "aggregate/stage.hpp"
#include "client/batch_job.hpp"
#include "client/run_lease.hpp"
#include "daemon/link.hpp"
#ifdef CAIRN_HAVE_FABRIC
#include "aggregate/leaders.hpp"
#include "fabric/mailbox.hpp"
#endif
#include "engine/stages.hpp"
#include "format/container.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "format/commit.hpp"
#include "format/run_info.hpp"
#include "util/contain.hpp"
#include "util/names.hpp"
#include "format/shard_io.hpp"
#include "format/tree.hpp"
#include "redundancy/parity_file.hpp"
#include "util/clock.hpp"
#include "storage/geometry.hpp"
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
  if (!cfg_.fault_inject.empty()) CAIRN_RETURN_IF_ERROR(install_fault());
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
  CAIRN_ASSIGN_OR_RETURN(levels_, make_levels(this));
  bool stages_elsewhere = false, reads_retired = false;
  for (const auto& l : levels_) {
    level_commits_persistent_ |= l->commits_persistent();
    level_writes_data_ |= l->writes_persistent_data();
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
  if (!stages_elsewhere) CAIRN_RETURN_IF_ERROR(build_graph(g));
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
  int home = sched_getcpu();
  CAIRN_ASSIGN_OR_RETURN(std::vector<int> engine_cpus, util::placement_cpus(cfg_.placement, home < 0 ? 0 : home));
  // write_during_capture = auto: the persistent write starts with the
  // capture only where it does not compete with it for the application
  // thread's core (engine threads placed on other CPUs). Sharing the core,
  // its I/O submission runs inside the application's call; measured on 2
  // cores its gain was within the noise (docs/benchmarks.md). Otherwise it
  // starts when the capture ends, beside the checksum pass.
  if (cfg_.write_during_capture == capture_overlap::off) stream_capture_ = false;
  else if (cfg_.write_during_capture == capture_overlap::automatic)
    stream_capture_ = stream_capture_ && !engine_cpus.empty() &&
                      std::find(engine_cpus.begin(), engine_cpus.end(), home) == engine_cpus.end();
  util::thread_setup setup{std::move(engine_cpus), cfg_.engine_priority, cfg_.engine_nice};
  engine_ = std::make_unique<engine::engine>(cfg_.mode, cfg_.io_threads, std::move(setup), std::move(stages));
  return {};
}

status client_impl::build_graph(graph_points& g) {
  engine::stage_graph& stages = *g.graph;
  // Checksum and hash trees first, in one pass (they finish the image); then
  // the levels, each of which only reads the image, run side by side.
  g.image_done = g.local = stages.add(engine::make_checksum_stage(cfg_.hash_trees, cfg_.hash_chunk, cfg_.hash_abs));
  if (level_commits_persistent_) {
    for (const auto& l : levels_) CAIRN_RETURN_IF_ERROR(l->add_stages(g));
  } else {
    if (cfg_.local_enabled) g.local = stages.add(engine::make_local_stage(env_, g.paths, g.recycler), {g.image_done});
    for (const auto& l : levels_) CAIRN_RETURN_IF_ERROR(l->add_stages(g));
    if (!level_writes_data_) {
      // The data part is written as the application captures it, the header
      // once the checksum pass has filled it in.
      const size_t data = stages.add(engine::make_persistent_data_stage(g.flush_env, g.paths, cfg_.direct_io), {});
      stages.add(engine::make_persistent_stage(g.flush_env, g.paths, cfg_.direct_io), {g.image_done, data});
      stream_capture_ = cfg_.mode == engine_mode::thread;  // and write_during_capture allows: below
    }
    // The last rank to make its part durable commits the version, after
    // every level of it ended (the manifest records their times). With
    // mpiio that is after the collective write, which the application
    // thread makes in a cairn call.
    std::vector<size_t> levels(stages.size());
    std::iota(levels.begin(), levels.end(), size_t{0});
    commit_stage_ = true;
    stages.add(engine::make_commit_stage(
                   env_, cfg_.persistent, [this](const engine::version_job& job) { return describe_version(job); },
                   host_),
               std::move(levels));
  }
  if (!cfg_.reference_run.empty()) {
    if (cfg_.reference_run == cfg_.run)
      return {errc::invalid_argument, "reference_run '" + cfg_.reference_run + "' is this run itself; set CAIRN_RUN"};
    analytics::online_reference ref;
    ref.run = cfg_.reference_run;
    ref.store = cfg_.reference_store.empty() ? cfg_.persistent : cfg_.reference_store;
    ref.scratch = cfg_.reference_store.empty() ? cfg_.scratch : "";
    ref.tol = {cfg_.compare_abs, cfg_.compare_rel, cfg_.compare_ulps};
    online_ = std::make_shared<analytics::online_tracker>(env_, std::move(ref), cfg_.persistent,
                                                          cfg_.local_enabled ? cfg_.scratch : "", cfg_.run);
    stages.add(analytics::make_compare_stage(online_), {g.image_done});
  }
  return {};
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

// Test hook, "key=value" pairs separated by commas:
//   level=local|persistent|capture, action=error|kill, kind=write|sync|create|rename|any,
//   errno=N, after=N, version=V, rank=R, file=NAME (a file of version V's directory, e.g. MANIFEST)
// e.g. "level=persistent,action=kill,version=20,rank=1".
status client_impl::install_fault() {
  CAIRN_ASSIGN_OR_RETURN(storage::fault_plan p, storage::parse_fault_plan(cfg_.fault_inject));
  if (p.rank >= 0 && p.rank != rank()) return {};
  if (p.level == "capture") {
    kill_capture_version_ = p.version;
  } else if (p.level == "redundancy" || p.level == "transfer") {
    // The levels' own (redundancy_level::create, aggregate_level::create).
  } else {
    p.spec.prefix = p.level == "local" ? cfg_.scratch : cfg_.persistent;
    fault_env_ = storage::make_fault_env(storage::storage_env::posix(), p.spec);
    env_ = fault_env_.get();
  }
  return {};
}

status client_impl::take_lease() {
  if (rank() != 0) return {};
  auto l = run_lease::acquire(cfg_.persistent, cfg_.run, cfg_.lease_timeout);
  if (l) {
    lease_ = std::move(l).value();
    return {};
  }
  status st = l.take_status();
  if (st.code() == errc::busy) return st;
  if (st.code() == errc::no_space) {
    std::fprintf(stderr, "cairn: warning: run '%s' goes without a lease (%s)\n", cfg_.run.c_str(),
                 st.message().c_str());
    return {};
  }
  return store_unwritable(st);
}

status client_impl::store_unwritable(const status& st) const {
  return st.with_context("the persistent level (CAIRN_PERSISTENT=" + cfg_.persistent +
                         ") cannot be written, so no checkpoint could be saved; give a writable directory");
}

status client_impl::start_run_identity() {
  char host[128] = {0};
  std::snprintf(host, 64, "%s", host_.c_str());
  std::snprintf(host + 64, 64, "%s", node_.c_str());
  std::vector<std::byte> all;
  comm_->gather(std::as_bytes(std::span<const char>(host, sizeof host)), &all);
  if (rank() != 0) return {};
  auto prev = format::read_run_info(env_, cfg_.persistent, cfg_.run);
  if (prev) {
    run_info_ = std::move(prev).value();
  } else if (prev.error().code() != errc::not_found) {
    // A damaged RUN file only loses the identity of earlier executions: say so, start afresh.
    std::fprintf(stderr, "cairn: warning: %s; starting a new run identity\n", prev.error().message().c_str());
  }
  run_info_.run = cfg_.run;
  run_info_.application = cfg_.application;
  if (!cfg_.code_version.empty()) run_info_.code_version = cfg_.code_version;
  std::stringstream ss(cfg_.tags);
  std::string kv;
  while (std::getline(ss, kv, ',')) {
    auto eq = kv.find('=');
    if (eq != std::string::npos) run_info_.tags[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  format::execution e;
  e.started_at = util::wall_s();
  e.nranks = static_cast<uint32_t>(size());
  std::set<std::string> hosts, nodes;
  for (int r = 0; r < size(); ++r) {
    const char* p = reinterpret_cast<const char*>(all.data()) + r * 128;
    hosts.insert(std::string(p, strnlen(p, 63)));
    nodes.insert(std::string(p + 64, strnlen(p + 64, 63)));
  }
  e.hosts.assign(hosts.begin(), hosts.end());
  e.nodes.assign(nodes.begin(), nodes.end());
  e.job = batch::job_id();
  e.executable = program_invocation_short_name ? program_invocation_short_name : "";
  e.code_version = cfg_.code_version;
  e.config = cfg_.values();
  e.attempt = attempt_;
  run_info_.executions.push_back(std::move(e));
  return write_run_identity(true);
}

status client_impl::write_run_identity(bool at_init) {
  if (rank() != 0) return {};
  status st = env_->make_dirs(storage::join(format::runs_dir(cfg_.persistent), cfg_.run));
  if (st) st = env_->write_atomic(format::run_file_path(cfg_.persistent, cfg_.run), format::encode_run_info(run_info_), true);
  if (!st && at_init && st.code() != errc::no_space) {
    // The first write of this execution to the store after the lease: a
    // store that cannot be written (read-only, no permission) would lose
    // every checkpoint.
    return store_unwritable(st);
  }
  if (!st) {
    // The identity is a record, not state: a store that cannot take it (full,
    // read-only) must still restart. Say so and go on.
    std::fprintf(stderr, "cairn: warning: run identity not recorded: %s\n", st.message().c_str());
    return {};
  }
  cairn::lock_guard lk(catalog_mu_);
  if (catalog_) {
    status cs = catalog_->index_run(env_, cfg_.run);
    if (!cs)
      std::fprintf(stderr, "cairn: warning: catalog not updated (%s); run 'cairn reindex %s'\n", cs.to_string().c_str(),
                   cfg_.persistent.c_str());
  }
  return {};
}

status client_impl::set_code_version(const std::string& v) {
  CAIRN_RETURN_IF_ERROR(util::check_text("code version", v));
  if (rank() != 0) return {};
  run_info_.code_version = v;
  if (!run_info_.executions.empty()) run_info_.executions.back().code_version = v;
  return write_run_identity();
}

status client_impl::tag(const std::string& key, const std::string& value) {
  CAIRN_RETURN_IF_ERROR(util::check_name("tag key", key));
  if (key.find_first_of("=,") != std::string::npos)
    return {errc::invalid_argument, "tag key '" + util::escaped(key) + "' must not contain '=' or ','"};
  CAIRN_RETURN_IF_ERROR(util::check_text("tag value", value));
  if (rank() != 0) return {};
  run_info_.tags[key] = value;
  return write_run_identity();
}

#ifdef CAIRN_HAVE_FABRIC
result<std::string> client_impl::plane_key() {
  if (!plane_key_.empty()) return plane_key_;
  std::string key;
  status st;
  if (rank() == 0) {
    auto k = fabric::new_plane_key();
    if (k) key = std::move(k).value();
    else st = k.take_status();
  }
  CAIRN_RETURN_IF_ERROR(agree(st));
  comm_->broadcast(&key, 0);
  plane_key_ = key;
  return key;
}
#endif

status client_impl::agree(status mine) {
  int64_t code = comm_->min(static_cast<int64_t>(mine.code()));
  if (code == 0) return {};
  return agreed_failure(code, mine);
}

status client_impl::agreed_failure(int64_t code, const status& mine) {
  int64_t root = comm_->min(static_cast<int64_t>(mine.code()) == code ? rank() : INT64_MAX);
  std::string msg = mine.message();
  comm_->broadcast(&msg, static_cast<int>(root));
  if (root != rank()) msg = "rank " + std::to_string(root) + ": " + msg;
  return {static_cast<errc>(code), msg};
}

std::string client_impl::exchange_message(bool failing, const std::string& mine) {
  int64_t root = comm_->min(failing ? rank() : INT64_MAX);
  if (root == INT64_MAX) return "unknown failure";
  std::string msg = mine;
  comm_->broadcast(&msg, static_cast<int>(root));
  return "rank " + std::to_string(root) + ": " + msg;
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
  if (auto it = regions_.find(r.name); it != regions_.end() && (it->second.ptr != r.ptr || it->second.count != r.count))
    for (const auto& l : levels_) l->regions_changed();
  regions_[r.name] = std::move(r);
  if (!restart_first_ || restart_asked_) prepare_staging();
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

void client_impl::index_committed(const std::string& name, int64_t version) {
  cairn::lock_guard lk(catalog_mu_);
  if (!catalog_) return;
  status st = catalog_->index_version(env_, cfg_.run, name, version);
  if (!st) std::fprintf(stderr, "cairn: warning: catalog: %s\n", st.message().c_str());
}

std::vector<std::pair<std::string, int64_t>> client_impl::tracked_versions() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& [key, rec] : records_) out.push_back(key);
  return out;
}

uint32_t client_impl::node_count() const {
  return run_info_.executions.empty() ? 1 : static_cast<uint32_t>(run_info_.executions.back().hosts.size());
}

status client_impl::unprotect(const std::string& name) {
  if (regions_.erase(name) == 0) return {errc::not_found, "region '" + name + "' is not protected"};
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

result<int64_t> client_impl::committed_newest(const std::string& name) {
  CAIRN_RETURN_IF_ERROR(util::check_name("checkpoint", name));
  return floor_of(name).version;
}

const client_impl::committed_floor& client_impl::floor_of(const std::string& name) {
  if (auto it = floors_.find(name); it != floors_.end()) return it->second;
  committed_floor f;
  std::string what;
  // The persistent level: the newest version with a MANIFEST, whoever wrote
  // it. Only committed versions count: what a killed execution left at the
  // node-local level alone (of any rank count) was never committed, and a
  // relaunch that restored an older version writes over it.
  if (rank() == 0) {
    auto vs = format::list_versions(env_, cfg_.persistent, cfg_.run, name);
    const auto& damaged = damaged_[name];
    for (auto v = vs.rbegin(); v != vs.rend(); ++v) {
      std::string mp = format::manifest_path(cfg_.persistent, cfg_.run, name, *v);
      if (damaged.count(*v) || !env_->exists(mp)) continue;
      f.version = *v;
      auto m = format::read_manifest(env_, mp);
      what = "version " + std::to_string(*v) + " committed" +
             (m ? " by " + std::to_string(m->nranks) + " rank(s)" : std::string(" (its MANIFEST is unreadable)"));
      break;
    }
  }
  const int64_t newest = -comm_->min(-f.version);
  const int64_t root = comm_->min(f.version == newest ? rank() : INT64_MAX);
  comm_->broadcast(&what, static_cast<int>(root));
  f.version = newest;
  // What the levels that commit themselves hold (agent memory).
  for (const auto& l : levels_) f.version = l->committed_floor(name, f.version, &what);
  if (f.version >= 0) f.what = what + " from an earlier execution";
  return floors_.emplace(name, std::move(f)).first->second;
}

result<format::shard_header> client_impl::plan_header(const std::string& name, int64_t version,
                                                      const std::vector<region>& regs) const {
  format::shard_header h;
  h.run = cfg_.run;
  h.name = name;
  h.version = version;
  h.rank = static_cast<uint32_t>(rank());
  h.nranks = static_cast<uint32_t>(size());
  h.attempt = attempt_;
  for (auto& r : regs) {
    format::region_desc d;
    d.name = r.name;
    d.type = r.type;
    d.flags = r.column_major ? format::kColumnMajor : 0;
    d.dims = r.dims;
    d.count = r.count;
    if (!r.global.empty()) {
      d.flags |= format::kHasLayout;
      d.global = r.global;
      d.start = r.start;
    }
    h.regions.push_back(std::move(d));
  }
  CAIRN_RETURN_IF_ERROR(format::plan_layout(h));
  return h;
}

result<int> client_impl::staging_slots(const std::string& name, uint64_t file_size) const {
  if (cfg_.staging_limit == 0) return 2;
  int slots = static_cast<int>(std::min<uint64_t>(cfg_.staging_limit / file_size, 64));
  if (slots < 1)
    return status(errc::invalid_argument, "staging_limit (" + std::to_string(cfg_.staging_limit) +
                                              " bytes) is smaller than one checkpoint of '" + name + "' (" +
                                              std::to_string(file_size) + " bytes); raise CAIRN_STAGING_LIMIT");
  return slots;
}

bool client_impl::restart_may_come() {
  auto has_versions = [&](const std::string& root) {
    for (const std::string& name : format::list_subdirs(env_, storage::join(format::runs_dir(root), cfg_.run)))
      if (!format::list_versions(env_, root, cfg_.run, name).empty()) return true;
    return false;
  };
  // The shared level is listed once (rank 0), not by every rank.
  const bool mine = !cfg_.agents.empty() || (rank() == 0 && has_versions(cfg_.persistent)) ||
                    has_versions(cfg_.scratch);
  return comm_->min(mine ? -1 : 0) < 0;  // any rank's finding counts for all
}

void client_impl::prepare_staging() {
  if (cfg_.mode != engine_mode::thread || !engine_ || regions_.empty()) return;
  std::vector<region> regs;
  for (auto& [n, r] : regions_) regs.push_back(r);
  // A checkpoint name of up to a page more header than an empty one.
  auto h = plan_header("", 0, regs);
  if (!h) return;
  const uint64_t need = h->file_size;
  auto slots = staging_slots("", need + 4096);
  if (!slots || (need <= pool_.slot_bytes() && pool_.slots() >= *slots)) return;
  {
    // Protects in a row leave one task, which reserves for the newest layout.
    cairn::lock_guard lk(staging_mu_);
    staging_wanted_ = {need, *slots};
    if (std::exchange(staging_queued_, true)) return;
  }
  engine_->submit_task([this]() -> status {
    std::pair<uint64_t, int> w;
    {
      cairn::lock_guard lk(staging_mu_);
      w = staging_wanted_;
      staging_queued_ = false;
    }
    (void)pool_.try_reserve(w.first, w.first + 4096, w.second);  // best effort: the capture reserves what it needs
    return {};
  }, engine::task_priority::low);
}

status client_impl::capture(const std::string& name, int64_t version, const std::vector<region>& regs) {
  if (finalized_) return {errc::invalid_argument, "handle already finalized"};
  CAIRN_RETURN_IF_ERROR(check_name("checkpoint", name));
  if (version < 0) return {errc::invalid_argument, "checkpoint '" + name + "': version must be >= 0"};
  if (auto it = last_version_.find(name); it != last_version_.end() && version <= it->second) {
    return {errc::invalid_argument, "checkpoint '" + name + "': version " + std::to_string(version) +
                                        " is not larger than the previous one (" + std::to_string(it->second) + ")"};
  }

  // Plan the shard image and make sure staging can hold it.
  format::shard_header h;
  status st;
  if (auto planned = plan_header(name, version, regs); planned) h = std::move(planned).value();
  else st = planned.take_status();
  if (st) {
    auto slots = staging_slots(name, h.file_size);
    if (!slots) st = slots.take_status();
    if (st && (h.file_size > pool_.slot_bytes() || pool_.slots() < *slots)) {
      if (pool_.slots() > 0 && h.file_size > pool_.slot_bytes()) engine_->wait_idle();  // slots are replaced
      // Thread mode: this checkpoint needs one slot; the others are made by
      // an engine task, off the application's call (on this VM faulting in
      // a 512 MiB slot costs 0.7-1.4 s).
      const int now = cfg_.mode == engine_mode::thread ? 1 : *slots;
      st = pool_.reserve(h.file_size, now);
      if (st && now < *slots && !more_slots_queued_.exchange(true)) {
        engine_->submit_task([this, size = pool_.slot_bytes(), n = *slots]() -> status {
          (void)pool_.try_reserve(size, size, n);  // best effort: a later capture reserves what it needs
          more_slots_queued_ = false;
          return {};
        }, engine::task_priority::low);
      }
    }
  }
  // st is agreed by the progress round below (one collective, not two).
  // Committed data is never replaced: versions grow across the executions of
  // a run, so an execution that starts over (a relaunch on another rank count,
  // an application that starts fresh on any restart error) cannot overwrite
  // what an earlier one committed.
  const committed_floor& floor = floor_of(name);
  if (version > floor.version && damaged_[name].count(version)) {
    // A committed version that restart found damaged on every level is
    // withdrawn (its MANIFEST first) before any rank replaces its shards.
    status w;
    std::string mp = format::manifest_path(cfg_.persistent, cfg_.run, name, version);
    if (rank() == 0 && env_->exists(mp)) {
      std::fprintf(stderr, "cairn: warning: '%s' version %lld was committed but is damaged on every level; "
                           "replacing it\n", name.c_str(), static_cast<long long>(version));
      w = env_->remove_file(mp);
      if (w) w = env_->sync_dir(storage::dirname_of(mp));
    }
    CAIRN_RETURN_IF_ERROR(agree(w));
    damaged_[name].erase(version);
  }
  if (version <= floor.version) {
    return {errc::exists,
            "checkpoint '" + name + "' version " + std::to_string(version) + ": run '" + cfg_.run + "' already has " +
                floor.what + "; a committed version is never replaced. Restart from it (cairn_restart_test), "
                "continue with versions above " + std::to_string(floor.version) +
                ", use another run (CAIRN_RUN), or remove old versions with 'cairn gc'"};
  }

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
  double t0 = util::now_s();
  std::byte* img = slot->data();
  const auto& regions = job->header.regions;
  // Lent: contiguous regions stay where they are; a level reads them.
  const bool lend = std::any_of(levels_.begin(), levels_.end(), [](const auto& l) { return l->lends(); });
  if (lend) job->lent.assign(regs.size(), nullptr);
  // The copy goes 16 MiB at a time (non-temporal stores: no slower in
  // pieces); with `stream` the persistent write follows it piece by piece
  // and need not wait for the whole image.
  const bool stream = stream_capture_ && !lend && (wanted & CAIRN_LEVEL_PERSISTENT);
  if (stream) engine_->submit(job, true);
  constexpr uint64_t kPiece = 16ull << 20;
  for (size_t i = 0; i < regs.size(); ++i) {
    const auto& d = regions[i];
    if (lend && regs[i].mem_shape.empty() && d.length) {
      job->lent[i] = static_cast<const std::byte*>(regs[i].ptr);
    } else if (!regs[i].mem_shape.empty()) {
      copy_block(img + d.offset, static_cast<std::byte*>(regs[i].ptr), format::type_size(d.type), row_major_dims(regs[i]),
                 regs[i].mem_shape, regs[i].mem_start, true);
    } else {
      for (uint64_t at = 0; at < d.length; at += kPiece) {
        util::stream_copy(img + d.offset + at, static_cast<const std::byte*>(regs[i].ptr) + at,
                          std::min(kPiece, d.length - at));
        if (stream && at + kPiece < d.length) job->capture.publish(d.offset + at + kPiece);
      }
    }
    if (version == kill_capture_version_) ::raise(SIGKILL);  // test hook: crash mid-capture
    // Zero the alignment padding so no stale bytes of earlier layouts leak to disk.
    uint64_t end = format::align_up(d.offset + d.length);
    if (end > d.offset + d.length) std::memset(img + d.offset + d.length, 0, end - d.offset - d.length);
    if (stream) job->capture.publish(end);
  }
  job->capture_s = util::now_s() - t0;
  warnings_at_capture_ = warnings;
  ++stats_.checkpoints;
  stats_.stage_seconds["capture"] += job->capture_s;
  stats_dirty_ = true;
  if (near_deadline()) deadline_checkpointed_ = true;  // agreed: the same on every rank

  // A lent version is captured once the agents hold it (or it was copied).
  job->done = job->lent.empty() ? CAIRN_LEVEL_CAPTURED : 0;
  last_version_[name] = version;

  auto owned = std::make_unique<version_record>();
  version_record* rec = owned.get();
  rec->name = name;
  rec->version = version;
  rec->job = job;
  rec->wanted = wanted;
  pending_.push_back(rec);
  records_[{name, version}] = std::move(owned);
  // Forget old resolved records so a long run does not grow without bound.
  while (records_.size() > 256) {
    auto it = std::find_if(records_.begin(), records_.end(), [](auto& kv) { return kv.second->resolved(); });
    if (it == records_.end()) break;
    records_.erase(it);
  }

  // The daemon gets the version before cairn_checkpoint returns: if the
  // application dies right after, the daemon still has it.
  for (const auto& l : levels_) l->captured(*rec);
  if (stream) engine_->captured(*job);
  else engine_->submit(job);
  for (const auto& l : levels_) l->submitted(*rec);
  if (cfg_.mode == engine_mode::sync) {
    // The baseline: the application waits for every level of this version.
    for (unsigned level : kLevels)
      if (rec->wanted & level) CAIRN_RETURN_IF_ERROR(wait_record(*rec, level));
  }
  if (earlier_failed) {
    // Every rank is here (the flag was agreed): the failure of some rank,
    // once, with the lowest failing rank's message.
    status mine = engine_->has_error() ? engine_->take_error() : status();
    status earlier = agree(mine);
    if (earlier.is_ok()) return {};  // the failing rank's error was taken by an earlier call
    for (auto& [key, r] : records_)
      if (r->global_failed) r->failure_reported = true;
    return {errc::earlier_failed, "checkpoint '" + name + "' version " + std::to_string(version) +
                                      " was taken; an earlier version failed (" +
                                      std::string(errc_name(earlier.code())) + "): " + earlier.message() +
                                      " (cairn_test or cairn_wait on that version returns its error)"};
  }
  return {};
}

status client_impl::progress(bool consume_error, bool* all_have_slot, const status* mine, const plan_record* record,
                             std::vector<plan_record>* records) {
  // Layout (identical on every rank, because it depends only on state that
  // changes through this function's collective results):
  //   [0] latched error code, [1] free-slot flag, [2] first divergent
  //   version, [3] the caller's status code (capture's planning), then per
  //   pending version the open entries: local, shards durable, manifest
  //   committed.
  std::vector<int64_t> v;
  v.push_back(engine_->has_error() ? -1 : 0);
  v.push_back(all_have_slot == nullptr || cfg_.staging_policy == staging_policy::block || pool_.has_free() ? 1 : 0);
  int64_t my_first = INT64_MAX;
  if (online_) {
    my_first = online_->first_version();
    if (online_->claim_retry()) {
      auto st = online_;
      uint32_t me = static_cast<uint32_t>(rank());
      engine_->submit_task([st, me] { return st->retry(me); });
    }
  }
  v.push_back(my_first);
  v.push_back(mine ? static_cast<int64_t>(mine->code()) : 0);
  // Batch jobs: 0 when this rank was warned since its last capture; minus
  // its measured time to durable (us: the minimum is the largest); the time
  // it has left (ms, INT64_MAX unknown).
  v.push_back(batch::warnings_received() > warnings_at_capture_ ? 0 : 1);
  v.push_back(-static_cast<int64_t>(durable_s_->load() * 1e6));
  {
    const double left = time_left();
    v.push_back(std::isfinite(left) ? static_cast<int64_t>(std::max(-1e15, std::min(1e15, left * 1000.0))) : INT64_MAX);
  }
  enum class entry_kind { level, step, durable, manifest };
  struct entry {
    version_record* rec;
    entry_kind kind;
    unsigned level = 0;  // entry_kind::level: LOCAL or PROTECTED
    class level* by = nullptr;  // entry_kind::step: the level whose step it is
  };
  std::vector<entry> entries;
  for (version_record* rec : pending_) {
    auto& job = *rec->job;
    for (unsigned level : {CAIRN_LEVEL_LOCAL, CAIRN_LEVEL_PROTECTED}) {
      if ((rec->wanted & level) && !((rec->global_done | rec->global_failed) & level)) {
        entries.push_back({rec, entry_kind::level, level});
        v.push_back(level_state(*engine_, job, level));
      }
    }
    if ((rec->wanted & CAIRN_LEVEL_PERSISTENT) &&
        !((rec->global_done | rec->global_failed) & CAIRN_LEVEL_PERSISTENT)) {
      for (const auto& l : levels_) {
        // A level's own step (mpiio's collective write): ready on every rank?
        if (auto state = l->step_state(*rec)) {
          entries.push_back({rec, entry_kind::step, 0, l.get()});
          v.push_back(*state);
        }
      }
      if (!rec->shards_durable) {
        entries.push_back({rec, entry_kind::durable});
        unsigned done = 0, failed = 0;
        bool finished = false;
        engine_->levels(job, &done, &failed, &finished);
        // Durable, and with a commit stage every stage ended (it runs last):
        // rank 0's agreed commit then finds the version committed by its
        // last writer (or stands in for it) with every rank's times.
        const bool durable = (done & CAIRN_LEVEL_PERSISTENT) && (finished || !commit_stage_);
        v.push_back(durable ? 1 : (failed & CAIRN_LEVEL_PERSISTENT) ? -1 : 0);
      } else {
        entries.push_back({rec, entry_kind::manifest});
        v.push_back(rank() == 0 ? rec->manifest_state->load() : 1);
      }
    }
  }
  constexpr size_t kFixed = 7;
  if (record) {
    // The same minimum, through an allgather that also carries every rank's
    // plan record: still one collective.
    const size_t row = v.size() * sizeof(int64_t) + sizeof(plan_record);
    std::vector<std::byte> mine(row), all;
    std::memcpy(mine.data(), v.data(), v.size() * sizeof(int64_t));
    std::memcpy(mine.data() + v.size() * sizeof(int64_t), record, sizeof(plan_record));
    comm_->allgather(mine, &all);
    records->resize(static_cast<size_t>(size()));
    for (int r = 0; r < size(); ++r) {
      const std::byte* p = all.data() + static_cast<size_t>(r) * row;
      for (size_t i = 0; i < v.size(); ++i) {
        int64_t x;
        std::memcpy(&x, p + i * sizeof(int64_t), sizeof x);
        v[i] = std::min(v[i], x);
      }
      std::memcpy(&(*records)[static_cast<size_t>(r)], p + v.size() * sizeof(int64_t), sizeof(plan_record));
    }
  } else {
    comm_->allreduce_min(v);
  }
  error_agreed_ = v[0] < 0;
  if (online_) progress_divergence(v[2]);
  agreed_warned_ = v[4] == 0;
  agreed_durable_s_ = static_cast<double>(-v[5]) / 1e6;
  agreed_left_s_ = v[6] == INT64_MAX ? HUGE_VAL : static_cast<double>(v[6]) / 1000.0;

  for (size_t i = 0; i < entries.size(); ++i) {
    version_record& rec = *entries[i].rec;
    int64_t s = v[kFixed + i];
    if (s == 0) continue;
    switch (entries[i].kind) {
      case entry_kind::level:
        if (s > 0) on_level_complete(rec, entries[i].level);
        else agree_level_failure(rec, entries[i].level);
        break;
      case entry_kind::step:
        entries[i].by->step(rec, s);
        break;
      case entry_kind::durable:
        if (s > 0) on_durable(rec);
        else agree_level_failure(rec, CAIRN_LEVEL_PERSISTENT);
        break;
      case entry_kind::manifest:
        if (s > 0) {
          on_level_complete(rec, CAIRN_LEVEL_PERSISTENT);
        } else {
          rec.global_failed |= CAIRN_LEVEL_PERSISTENT;
          count_level(rec, CAIRN_LEVEL_PERSISTENT, true);
          std::string msg = rank() == 0 ? rec.manifest_error->message() : std::string();
          int64_t code = comm_->min(rank() == 0 ? static_cast<int64_t>(rec.manifest_error->code()) : 0);
          comm_->broadcast(&msg, 0);
          rec.level_error[CAIRN_LEVEL_PERSISTENT] =
              status(code < 0 ? static_cast<errc>(code) : errc::io_error, "rank 0: " + msg);
        }
        break;
    }
  }
  std::erase_if(pending_, [](version_record* r) { return r->resolved(); });
  if (stats_dirty_) write_metrics();
  if (all_have_slot) *all_have_slot = v[1] > 0;
  if (v[3] < 0) return agreed_failure(v[3], mine ? *mine : status());

  if (v[0] < 0 && consume_error) {
    // Some rank has a latched background error: every rank returns it.
    status mine = engine_->has_error() ? engine_->take_error() : status();
    return agree(mine);
  }
  return {};
}

void client_impl::agree_level_failure(version_record& rec, unsigned level) {
  rec.global_failed |= level;
  count_level(rec, level, true);
  if (level == CAIRN_LEVEL_PERSISTENT) rec.job->cancelled = true;  // ranks waiting for others stop
  bool mine = level_state(*engine_, *rec.job, level) < 0;
  status e, soft;
  unsigned done, failed;
  bool finished;
  engine_->levels(*rec.job, &done, &failed, &finished, &e, &soft);
  if (e.is_ok()) e = soft;  // a stage that does not latch (agents)
  // The cause, not its consequences: a rank that gave up because another
  // failed (cancelled) reports only when no rank has a cause of its own.
  const bool consequence = mine && e.code() == errc::cancelled;
  int64_t codes[2] = {mine && !consequence ? static_cast<int64_t>(e.code()) : 0,
                      mine ? static_cast<int64_t>(e.code()) : 0};
  comm_->allreduce_min(codes);
  const int64_t code = codes[0] < 0 ? codes[0] : codes[1];
  rec.level_error[level] = status(code < 0 ? static_cast<errc>(code) : errc::io_error,
                                  exchange_message(codes[0] < 0 ? mine && !consequence : mine, e.message()));
}

void client_impl::progress_divergence(int64_t global_first) {
  if (global_first == INT64_MAX || (divergence_ && divergence_->version <= global_first)) return;
  const analytics::online_divergence mine = online_->state().first;
  int64_t root = comm_->min(mine.version == global_first ? rank() : INT64_MAX);
  nlohmann::json j = {{"version", mine.version}, {"rank", mine.rank}, {"name", mine.name}, {"region", mine.region},
                      {"index", mine.index}, {"value", mine.value}, {"reference", mine.reference}, {"kind", mine.kind}};
  std::string text = j.dump();
  comm_->broadcast(&text, static_cast<int>(root));
  auto g = nlohmann::json::parse(text);
  analytics::online_divergence d;
  d.version = g["version"];
  d.rank = g["rank"];
  d.name = g["name"];
  d.region = g["region"];
  d.index = g["index"];
  d.value = g["value"];
  d.reference = g["reference"];
  d.kind = g["kind"];
  divergence_ = d;
  if (rank() == 0) {
    std::fprintf(stderr, "cairn: run '%s' diverged from '%s' at '%s' version %lld, rank %u, region '%s'[%llu]: %s vs %s%s\n",
                 cfg_.run.c_str(), cfg_.reference_run.c_str(), d.name.c_str(), static_cast<long long>(d.version), d.rank,
                 d.region.c_str(), static_cast<unsigned long long>(d.index), d.value.c_str(), d.reference.c_str(),
                 cfg_.on_divergence == divergence_action::stop ? " (stopping: on_divergence = stop)" : "");
  }
}

status client_impl::divergence(cairn_divergence_t* info) {
  if (size() == 1 && !finalized_) CAIRN_RETURN_IF_ERROR(progress(false));
  std::memset(info, 0, sizeof *info);
  info->version = -1;
  if (!online_) return {errc::invalid_argument, "cairn_divergence: no reference_run is configured"};
  const auto state = online_->state();
  info->compared = state.compared;
  info->pending = state.pending;
  if (!divergence_) return {};
  const auto& d = *divergence_;
  info->diverged = 1;
  info->version = d.version;
  info->rank = static_cast<int>(d.rank);
  std::snprintf(info->name, sizeof info->name, "%s", d.name.c_str());
  std::snprintf(info->region, sizeof info->region, "%s", d.region.c_str());
  info->index = d.index;
  std::snprintf(info->value, sizeof info->value, "%s", d.value.c_str());
  std::snprintf(info->reference, sizeof info->reference, "%s", d.reference.c_str());
  info->structural = d.kind == "structural" ? 1 : 0;
  return {};
}

void client_impl::on_durable(version_record& rec) {
  rec.shards_durable = true;
  // Every rank's shard is durable: gather their manifest entries (as the
  // commit stage records them), rank 0 commits.
  const auto& job = *rec.job;
  format::part_record mine;
  mine.entry = engine::shard_entry_of(job, host_);
  mine.aggregated = job.plan != nullptr;
  std::vector<std::string> parts;
  comm_->gather_strings(format::encode_part(mine), &parts);
  rec.manifest_state = std::make_shared<std::atomic<int>>(0);
  rec.manifest_error = std::make_shared<status>();
  if (rank() != 0) return;

  format::manifest m = describe_version(job);
  for (int r = 0; r < size(); ++r) {
    auto p = format::decode_part(parts[static_cast<size_t>(r)], "rank " + std::to_string(r) + "'s manifest entry");
    if (!p) {  // cannot happen short of memory corruption: the commit fails, said so
      *rec.manifest_error = p.error();
      rec.manifest_state->store(-1);
      return;
    }
    m.shards.push_back(std::move(p->entry));
  }
  // The time only when it is known now: the manifest is never rewritten.
  if (m.redundancy && (rec.global_done & CAIRN_LEVEL_PROTECTED)) m.redundancy->protected_at = rec.protected_at;
  auto state = rec.manifest_state;
  auto err = rec.manifest_error;
  double local_at = rec.local_done_at;
  // Usually the last rank's commit stage has committed the version already;
  // this commit stands in where it could not (write_commit leaves a MANIFEST
  // with exactly these shards as it is).
  engine_->submit_task([this, m = std::move(m), state, err, local_at]() mutable -> status {
    m.committed_at = util::wall_s();
    status st = util::contained("committing the manifest", [&] {
      auto at = format::write_commit(env_, cfg_.persistent, m);
      if (at) m.committed_at = *at;  // the last writer's, when it committed first
      return at.take_status();
    });
    if (!st) {
      *err = st;
      state->store(-1);
      return st.with_context("committing the manifest");
    }
    state->store(1);
    double first = m.committed_at;
    for (const auto& sh : m.shards) first = std::min(first, sh.captured_at);
    durable_s_->store(m.committed_at - first);
    // The catalog follows the commit when nothing more urgent is ready (the
    // manifest is the truth; `cairn reindex` rebuilds the catalog from it).
    engine_->submit_task(
        [this, run = m.run, name = m.name, version = m.version, local_at]() -> status {
          cairn::lock_guard lk(catalog_mu_);
          if (!catalog_) return {};
          status cs = catalog_->index_version(env_, run, name, version);
          // The persistent event comes from the manifest; the local one only exists here.
          if (cs && local_at > 0) cs = catalog_->record_level(run, name, version, CAIRN_LEVEL_LOCAL, local_at, 0);
          // Retention may have removed the version (keep_persistent) before
          // this task ran: nothing to index, nothing to say.
          if (!cs && cs.code() == errc::not_found &&
              !env_->exists(format::manifest_path(cfg_.persistent, run, name, version)))
            return {};
          if (!cs)
            std::fprintf(stderr, "cairn: warning: catalog not updated (%s); run 'cairn reindex %s'\n",
                         cs.to_string().c_str(), cfg_.persistent.c_str());
          return {};
        },
        engine::task_priority::low);
    return {};
  });
}

format::manifest client_impl::describe_version(const engine::version_job& job) const {
  format::manifest m;
  m.run = cfg_.run;
  m.name = job.header.name;
  m.version = job.header.version;
  m.nranks = static_cast<uint32_t>(size());
  m.executable = program_invocation_short_name ? program_invocation_short_name : "";
  if (!util::valid_utf8(m.executable)) m.executable = util::escaped(m.executable);
  m.mode = cfg_.mode == engine_mode::sync ? "sync" : "thread";
  // The scheme this version was encoded with, whether or not its sets are
  // complete yet (the levels are agreed independently).
  for (const auto& l : levels_) l->describe(job, &m);
  return m;
}

void client_impl::on_level_complete(version_record& rec, unsigned level) {
  rec.global_done |= level;
  count_level(rec, level, false);
  for (const auto& l : levels_) l->on_level_complete(rec, level);
  if (level == CAIRN_LEVEL_PROTECTED) {
    // A level may keep node-local versions until a newer one is protected.
    schedule_retention(rec.name, CAIRN_LEVEL_LOCAL);
    return;
  }
  if (level == CAIRN_LEVEL_LOCAL) {
    rec.local_done_at = util::wall_s();
    // The persistent level finished first and its commit's catalog update
    // went without the local time (on_durable): record it now.
    if (rec.shards_durable) record_runtime_level(rec, CAIRN_LEVEL_LOCAL, rec.local_done_at, 0);
  }
  auto& list = complete_[{rec.name, level}];
  list.push_back(rec.version);
  std::sort(list.begin(), list.end());
  schedule_retention(rec.name, level);
}

void client_impl::record_runtime_level(const version_record& rec, unsigned level, double at, double took) {
  if (rank() != 0) return;
  engine_->submit_task(
      [this, run = cfg_.run, name = rec.name, version = rec.version, level, at, took]() -> status {
        cairn::lock_guard lk(catalog_mu_);
        if (!catalog_) return {};
        if (status cs = catalog_->record_level(run, name, version, level, at, took); !cs)
          std::fprintf(stderr, "cairn: warning: catalog not updated (%s)\n", cs.to_string().c_str());
        return {};
      },
      engine::task_priority::low);
}

void client_impl::schedule_retention(const std::string& name, unsigned level) {
  int keep = level == CAIRN_LEVEL_LOCAL ? cfg_.keep_local : cfg_.keep_persistent;
  auto& list = complete_[{name, level}];
  if (keep <= 0 || list.size() <= static_cast<size_t>(keep)) return;
  // Versions older than the keep-th newest version complete on every rank go.
  int64_t threshold = list[list.size() - static_cast<size_t>(keep)];
  list.erase(list.begin(), list.end() - keep);
  if (level == CAIRN_LEVEL_LOCAL)
    for (const auto& l : levels_) threshold = std::min(threshold, l->keep_local_from(name));
  if (level != CAIRN_LEVEL_LOCAL && rank() != 0) return;  // rank 0 retires the persistent level
  // One queued task per name and level, run before stage work that comes
  // later (retention keeps pace with back-to-back checkpoints instead of
  // waiting for an idle moment), with the newest threshold; one at a time.
  {
    cairn::lock_guard lk(retention_->mu);
    auto [it, fresh] = retention_->pending.emplace(std::make_pair(name, level), threshold);
    if (!fresh) {
      it->second = std::max(it->second, threshold);
      return;
    }
  }
  engine_->submit_task([this, name, level]() -> status {
    cairn::lock_guard run_lk(retention_->run_mu);
    int64_t below;
    {
      cairn::lock_guard lk(retention_->mu);
      auto it = retention_->pending.find({name, level});
      below = it->second;
      retention_->pending.erase(it);
    }
    return level == CAIRN_LEVEL_LOCAL ? remove_local_below(name, below) : remove_persistent_below(name, below);
  });
}

void client_impl::adopt_local_versions(const std::string& name, int64_t restored) {
  if (!cfg_.local_enabled || cfg_.keep_local <= 0) return;
  const uint32_t me = static_cast<uint32_t>(rank());
  auto& list = complete_[{name, CAIRN_LEVEL_LOCAL}];
  for (int64_t v : format::list_versions(env_, cfg_.scratch, cfg_.run, name)) {
    if (v > restored) break;
    if (std::find(list.begin(), list.end(), v) == list.end() &&
        env_->exists(format::shard_path(cfg_.scratch, cfg_.run, name, v, me)))
      list.push_back(v);
  }
  std::sort(list.begin(), list.end());
  schedule_retention(name, CAIRN_LEVEL_LOCAL);
}

status client_impl::remove_local_below(const std::string& name, int64_t threshold) {
  const uint32_t me = static_cast<uint32_t>(rank());
  for (int64_t v : format::list_versions(env_, cfg_.scratch, cfg_.run, name)) {
    if (v >= threshold) break;
    std::string dir = format::version_dir(cfg_.scratch, cfg_.run, name, v);
    const std::string shard = storage::join(dir, format::shard_file_name(me));
    CAIRN_RETURN_IF_ERROR(recycler_ ? recycler_->retire(shard) : env_->remove_file(shard));
    CAIRN_RETURN_IF_ERROR(env_->remove_file(storage::join(dir, format::tree_file_name(me))));
    CAIRN_RETURN_IF_ERROR(env_->remove_file(storage::join(dir, redundancy::parity_file_name(me))));
    (void)env_->remove_dir(dir);  // fails while other ranks' shards remain
  }
  return {};
}

status client_impl::remove_persistent_below(const std::string& name, int64_t threshold) {
  const std::string& root = cfg_.persistent;
  for (int64_t v : format::list_versions(env_, root, cfg_.run, name)) {
    if (v >= threshold) break;
    // The commit withdrawn first, so no reader ever sees a manifest without its shards.
    CAIRN_RETURN_IF_ERROR(format::remove_version(env_, format::version_dir(root, cfg_.run, name, v)));
    cairn::lock_guard lk(catalog_mu_);
    if (catalog_) (void)catalog_->remove_version(cfg_.run, name, v);
  }
  return {};
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
  status first;
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

void client_impl::drop_local_versions() {
  if (!cfg_.local_enabled || cfg_.keep_local_after_finalize) return;
  const uint32_t me = static_cast<uint32_t>(rank());
  const std::string run_dir = storage::join(format::runs_dir(cfg_.scratch), cfg_.run);
  const std::vector<std::string> names = format::list_subdirs(env_, run_dir);
  // Only when the node-local level holds no version the persistent level
  // lacks: every checkpoint's newest node-local version of every rank is
  // committed (older ones are older than a committed one).
  int ok = 1;
  for (const auto& name : names) {
    auto versions = format::list_versions(env_, cfg_.scratch, cfg_.run, name);
    for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
      if (!env_->exists(format::shard_path(cfg_.scratch, cfg_.run, name, *v, me))) continue;
      if (!env_->exists(format::manifest_path(cfg_.persistent, cfg_.run, name, *v))) ok = 0;
      break;
    }
  }
  if (comm_->min(ok) == 0) return;
  // This rank's files of every version (shard, hash tree, parity: each
  // named <kind>.<rank:06>), and its recycled files.
  const std::string mine = format::shard_file_name(me).substr(format::shard_file_name(me).find('.'));
  for (const auto& name : names)
    for (int64_t v : format::list_versions(env_, cfg_.scratch, cfg_.run, name)) {
      const std::string dir = format::version_dir(cfg_.scratch, cfg_.run, name, v);
      auto files = env_->list(dir);
      if (!files) continue;
      for (const auto& f : *files)
        if (f.size() > mine.size() && f.compare(f.size() - mine.size(), mine.size(), mine) == 0)
          (void)env_->remove_file(storage::join(dir, f));
    }
  if (recycler_) (void)recycler_->clear();
  (void)comm_->min(0);  // every rank removed its files: the directories can go
  for (const auto& name : names) {
    for (int64_t v : format::list_versions(env_, cfg_.scratch, cfg_.run, name))
      (void)env_->remove_dir(format::version_dir(cfg_.scratch, cfg_.run, name, v));
    (void)env_->remove_dir(format::checkpoint_dir(cfg_.scratch, cfg_.run, name));
  }
  (void)env_->remove_dir(run_dir);
  const std::string bin = storage::join(cfg_.scratch, "recycle");
  (void)env_->remove_dir(storage::join(bin, cfg_.run));
  (void)env_->remove_dir(bin);
}

void client_impl::count_level(version_record& rec, unsigned level, bool failed) {
  const char* name = level == CAIRN_LEVEL_LOCAL ? "local" : level == CAIRN_LEVEL_PERSISTENT ? "persistent" : nullptr;
  if (name == nullptr) return;
  stats_dirty_ = true;
  auto& c = stats_.levels[name];
  if (failed) {
    ++c.errors;
    return;
  }
  // The stages of this rank finished before the level was agreed complete.
  const auto& job = *rec.job;
  ++c.versions;
  c.bytes += job.header.file_size;
  stats_.stage_seconds[name] += level == CAIRN_LEVEL_LOCAL ? job.local_s : job.persistent_s;
  if (!rec.counted_checksum) {
    rec.counted_checksum = true;
    stats_.stage_seconds["checksum"] += job.checksum_s;
  }
}

void client_impl::write_metrics() {
  stats_dirty_ = false;
  if (cfg_.metrics_dir.empty()) return;
  stats_.run = cfg_.run;
  stats_.rank = static_cast<uint32_t>(rank());
  stats_.time_to_durable_s = agreed_durable_s_;
  stats_.warning_signals = batch::warnings_received();
  stats_.staging_bytes = pool_.slot_bytes() * static_cast<uint64_t>(pool_.slots());
  // One file per rank (run and rank in the name: the node exporter reads
  // every *.prom of the directory), replaced atomically; not synced, since a
  // metric is an observation, not state.
  std::string path = storage::join(cfg_.metrics_dir, "cairn_" + cfg_.run + "_" + std::to_string(rank()) + ".prom");
  bool submit = false;
  {
    cairn::lock_guard lk(textfile_->mu);
    textfile_->latest = stats_;
    submit = !textfile_->queued && !metrics_inline_;
    textfile_->queued = textfile_->queued || submit;
  }
  if (metrics_inline_) {
    textfile_->flush(env_, cfg_.metrics_dir, path, rank());
  } else if (submit) {
    // Never a failing status: a metric that cannot be written must not fail
    // a checkpoint (the engine would latch it); flush reports it once.
    engine_->submit_task([tf = textfile_, env = env_, dir = cfg_.metrics_dir, path = std::move(path), r = rank()] {
      tf->flush(env, dir, path, r);
      return status();
    });
  }
}

void client_impl::metrics_textfile::flush(storage::storage_env* env, const std::string& dir, const std::string& path,
                                          int rank) {
  cairn::lock_guard wl(write_mu);
  std::optional<metrics::rank_metrics> m;
  {
    cairn::lock_guard lk(mu);
    m.swap(latest);
    queued = false;
  }
  if (!m) return;  // a later flush wrote it already
  status st = dir_made ? status() : env->make_dirs(dir);
  dir_made = st.is_ok();
  if (st) st = env->write_atomic(path, metrics::to_openmetrics({*m}), false);
  if (!st && !warned) {
    warned = true;
    std::fprintf(stderr, "cairn: rank %d: warning: metrics not written (%s); checkpoints go on\n", rank,
                 st.message().c_str());
  }
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
