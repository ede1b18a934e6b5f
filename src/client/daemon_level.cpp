// engine_host = daemon as a level: see daemon_level.hpp.
#include "client/daemon_level.hpp"

#include <dlfcn.h>
#include <spawn.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "client/version_record.hpp"
#include "client/redundancy_level.hpp"
#include "engine/stages.hpp"
#include "daemon/link.hpp"
#include "util/clock.hpp"
#include "util/hash.hpp"
#include "util/hex.hpp"

extern char** environ;

namespace cairn {
namespace {

// Where cairnd is: configured, else beside libcairn (installed: <prefix>/lib
// and <prefix>/bin; build tree: src/ and tools/cairnd/), else on PATH.
std::string daemon_program(const config& cfg) {
  if (!cfg.daemon_program.empty()) return cfg.daemon_program;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&daemon_program), &info) && info.dli_fname) {
    std::string dir = storage::dirname_of(info.dli_fname);
    for (const char* rel : {"/../bin/cairnd", "/../tools/cairnd/cairnd"}) {
      std::string p = dir + rel;
      if (access(p.c_str(), X_OK) == 0) return p;
    }
  }
  return "cairnd";
}

// Starts cairnd in a session of its own (a signal to the application's
// process group, or the launcher's cleanup of it, does not reach the daemon),
// with stdin and stdout on /dev/null and stderr shared with the rank. The
// execution's token reaches it through a pipe on its descriptor 3 (never its
// arguments or environment, which other users can read in /proc).
result<pid_t> spawn_daemon(const std::string& program, const std::string& socket, int ranks, double drain_s,
                           const std::string& token) {
  int tp[2];
  if (pipe2(tp, O_CLOEXEC) != 0) return status::from_errno(errno, "the node daemon's token pipe");
  const bool written = write(tp[1], token.data(), token.size()) == static_cast<ssize_t>(token.size());
  close(tp[1]);
  if (!written) {
    close(tp[0]);
    return status(errc::io_error, "writing the node daemon's token");
  }
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, tp[0], 3);  // dup2 clears close-on-exec
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
  std::string ranks_s = std::to_string(ranks);
  std::string drain = std::to_string(drain_s);
  std::vector<char*> argv = {const_cast<char*>(program.c_str()),
                             const_cast<char*>("--socket"),
                             const_cast<char*>(socket.c_str()),
                             const_cast<char*>("--ranks"),
                             ranks_s.data(),
                             const_cast<char*>("--drain-s"),
                             drain.data(),
                             const_cast<char*>("--token-fd"),
                             const_cast<char*>("3"),
                             nullptr};
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, program.c_str(), &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(tp[0]);
  if (rc != 0)
    return status::from_errno(rc, "starting the node daemon '" + program +
                                      "' (engine_host = daemon; set daemon_program to where cairnd is installed)");
  return pid;
}

}  // namespace

result<std::unique_ptr<daemon_level>> daemon_level::create(level_host* host, redundancy_level* redundancy) {
  const config& cfg = host->cfg();
  if (cfg.engine_host != engine_host::daemon) return std::unique_ptr<daemon_level>();
  std::string why;
  if (cfg.mode == engine_mode::sync) why = "mode = sync runs the stages in the application (use mode = thread)";
  else if (!cfg.agents.empty()) why = "checkpoint agents are not run by the daemon yet (use engine_host = thread)";
  else if (cfg.persistent_layout == persistent_layout::aggregated)
    why = "persistent_layout = aggregated is not run by the daemon yet (use file_per_process)";
  else if (!cfg.reference_run.empty()) why = "the online comparison is not run by the daemon yet";
  if (!why.empty()) return status(errc::invalid_argument, "configuration key 'engine_host = daemon': " + why);
  return std::unique_ptr<daemon_level>(new daemon_level(host, redundancy));
}

daemon_level::~daemon_level() { close(); }

status daemon_level::start(graph_points& g) {
  comm::communicator& comm = host_->comm();
  const int rank = host_->rank();
  const std::string& node = host_->node();
  // This rank's node: the lowest rank on it starts the daemon for all of them.
  const uint64_t mine = util::xxh3(node.data(), node.size());
  std::vector<std::byte> all;
  comm.allgather(std::as_bytes(std::span<const uint64_t>(&mine, 1)), &all);
  int leader = -1, local_ranks = 0;
  for (int r = 0; r < host_->size(); ++r) {
    uint64_t h;
    std::memcpy(&h, all.data() + static_cast<size_t>(r) * sizeof h, sizeof h);
    if (h != mine) continue;
    if (leader < 0) leader = r;
    ++local_ranks;
  }
  const std::string socket = daemon::socket_name(host_->attempt(), cfg_.run, node);
  status st;
  std::string token;  // the node's leader draws it; its ranks learn it from the leader
  if (rank == leader) {
    token.resize(daemon::kTokenBytes);
    if (getrandom(token.data(), token.size(), 0) != static_cast<ssize_t>(token.size()))
      st = status::from_errno(errno, "drawing the node daemon's token");
  }
  if (rank == leader && st) {
    auto pid = spawn_daemon(daemon_program(cfg_), socket, local_ranks, cfg_.daemon_drain_s, token);
    if (pid) pid_ = *pid;
    else st = pid.take_status();
  }
  const auto tokens = comm::allgather_lines(comm, util::hex_encode(token));
  CAIRN_RETURN_IF_ERROR(host_->agree(st));
  nlohmann::json hello = {{"rank", rank},
                          {"nranks", host_->size()},
                          {"token", tokens[static_cast<size_t>(leader)]},
                          {"pid", static_cast<int>(getpid())},
                          {"executable", program_invocation_short_name ? program_invocation_short_name : ""},
                          {"config", cfg_.values()}};
  auto l = daemon::link::connect(socket, hello.dump(), 30, rank);
  if (l) link_ = std::move(l).value();
  else st = l.take_status().with_context("engine_host = daemon");
  CAIRN_RETURN_IF_ERROR(host_->agree(st));
  // Redundancy: this rank's own plane and set (the rebuild at restart uses
  // them), then the daemons' endpoints, over which the daemons encode.
  nlohmann::json start = {{"redundancy", nullptr}};
  if (redundancy_) {
    const auto peers = comm::allgather_lines(comm, util::hex_encode(link_->plane_address()));
    CAIRN_ASSIGN_OR_RETURN(start["redundancy"], redundancy_->for_daemon(peers));
  }
  CAIRN_RETURN_IF_ERROR(host_->agree(link_->start(start.dump())));
  engine::staging_pool& pool = host_->staging();
  pool.set_shared(true);
  pool.set_on_drop([l = std::weak_ptr<daemon::link>(link_)](uint64_t id) {
    if (auto p = l.lock()) p->release_slot(id);
  });
  size_t image = g.graph->add(daemon::make_image_proxy(
      link_, engine::make_checksum_stage(cfg_.hash_trees, cfg_.hash_chunk, cfg_.hash_abs)));
  size_t local = image;
  if (cfg_.local_enabled)
    local = g.graph->add(daemon::make_level_proxy(link_, engine::make_local_stage(host_->env(), g.paths)), {image});
  if (redundancy_)
    g.graph->add(daemon::make_level_proxy(
                    link_, daemon::make_unreachable_stage(
                                 "redundancy", CAIRN_LEVEL_PROTECTED,
                                 "the node daemon is gone, and the other members of this rank's redundancy set encode "
                                 "in theirs: this version is not protected (its node-local and persistent copies are "
                                 "not affected)")),
                {local});
  g.graph->add(daemon::make_level_proxy(link_, engine::make_persistent_stage(g.flush_env, g.paths, cfg_.direct_io)), {image});
  return {};
}

// The daemon gets the version before cairn_checkpoint returns: if the
// application dies right after, the daemon still has it.
void daemon_level::captured(version_record& rec) { link_->submit(*rec.job); }

void daemon_level::on_level_complete(version_record& rec, unsigned level) {
  if (level == CAIRN_LEVEL_PERSISTENT) link_->committed(rec.name, rec.version);
}

void daemon_level::abandon() {
  if (link_) link_->abandon();
}

status daemon_level::finish(bool) {
  close();
  return {};
}

// Says goodbye; the node's first rank reaps the daemon it started.
void daemon_level::close() {
  if (!link_) return;
  link_->bye();
  if (pid_ <= 0) return;
  // The daemon ends once every rank of the node said goodbye and its work is
  // done; reap it (it is this rank's child), but never hang the application.
  const double deadline = util::now_s() + 10;
  while (util::now_s() < deadline) {
    if (waitpid(pid_, nullptr, WNOHANG) != 0) {
      pid_ = 0;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace cairn
