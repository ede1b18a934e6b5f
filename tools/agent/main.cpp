// cairn-agent: a remote checkpoint agent (DESIGN.md §2 "agents").
//
//   cairn-agent [--name-file FILE] [--stats-file FILE] [--provider P] [--bind ADDR]
//               [--service PORT] [--domain NIC] [--threads N] [--workers W] [--liveness-timeout S]
//               [--memory-budget BYTES] [--keep K] [--persistent STORE]
//               [--no-direct-io] [--compress LEVEL] [--compress-threads N]
//               [--chunk BYTES] [--piece BYTES] [--max-bandwidth B/S]
//               [--timeout S] [--push-timeout S]
//               [--agent-id ID --app-id ID --app NAME --node NODE --controller ADDR]
//               [--key-fd FD]
//
// Opens a libfabric endpoint, writes its name (hex) to the name file and the
// stats file (the manager's launch contract, src/agents/manager.hpp: the
// --agent-id ... --controller arguments are accepted and logged), and serves
// application ranks until SIGTERM or SIGINT: pulls (or accepts pushes of)
// checkpoint images when told a version is ready (every message sealed with
// the application's key, read as hex from descriptor FD, which its manager
// passes on an inherited pipe: never argv or the environment), verifies them, keeps the
// last K versions per rank in memory, writes them in the background into
// STORE in cairn's shard format (zstd-compressed, format 3, unless
// --compress 0), and serves restarts. On SIGTERM it finishes
// the writes it has queued and exits 0 (1 when a background write failed).
// Exit status 2: bad arguments or the endpoint cannot be opened.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "agent_server.hpp"
#include "agents/net.hpp"
#include "fabric/fabric.hpp"
#include "fabric/seal.hpp"
#include "storage/storage_env.hpp"
#include "util/cpu.hpp"
#include "util/hex.hpp"

namespace {

uint64_t parse_bytes(const std::string& s) {
  size_t pos = 0;
  unsigned long long v = std::stoull(s, &pos);
  std::string suffix = s.substr(pos);
  if (suffix == "K" || suffix == "k") v <<= 10;
  else if (suffix == "M" || suffix == "m") v <<= 20;
  else if (suffix == "G" || suffix == "g") v <<= 30;
  else if (!suffix.empty()) throw CLI::ValidationError("size", "unknown suffix '" + suffix + "' (use K, M or G)");
  return v;
}

// The application's key: hex on `fd` (a pipe its manager wrote and closed).
cairn::result<std::string> read_key(int fd) {
  std::string text;
  char buf[256];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return cairn::status(cairn::errc::io_error, std::string("cannot read it: ") + std::strerror(errno));
    if (n == 0 || text.size() > 1024) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  std::string key;
  if (!cairn::util::hex_decode(text, cairn::fabric::kPlaneKeyBytes, &key))
    return cairn::status(cairn::errc::invalid_argument,
                         "expected " + std::to_string(2 * cairn::fabric::kPlaneKeyBytes) + " hex digits, got " +
                             std::to_string(text.size()) + " bytes");
  return key;
}

// Longer than 120 lines for a reason: the agent's command-line table (every
// option with its help) and the start it configures, in one place.
int run_agent(int argc, char** argv) {
  using namespace cairn::agents;
  CLI::App app{"cairn-agent: holds checkpoints of application ranks in memory, pulled or pushed over libfabric",
               "cairn-agent"};
  agent_config cfg;
  std::string name_file, chunk = "0", piece = "4M", bandwidth = "0";
  std::string agent_id, app_id, app_name, node_id, controller;
  bool no_direct = false;
  int key_fd = -1;
  app.add_option("--name-file", name_file, "Write the endpoint name (hex) to this file, atomically");
  app.add_option("--stats-file", cfg.stats_file,
                 "Write counters and the endpoint name (JSON) to this file, atomically, every second");
  app.add_option("--agent-id", agent_id, "Agent id given by the manager (logged)");
  app.add_option("--app-id", app_id, "Application id given by the manager (logged)");
  app.add_option("--app", app_name, "Application name given by the manager (logged)");
  app.add_option("--node", node_id, "Agent node id given by the manager (logged)");
  app.add_option("--controller", controller, "Controller address given by the manager (not used yet)");
  app.add_option("--key-fd", key_fd,
                 "Read the application's key (hex) from this inherited descriptor; every message must then be "
                 "sealed with it (default: none, unsealed messages from anyone)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--provider", cfg.fabric.provider, "libfabric provider, e.g. 'tcp;ofi_rxm', 'verbs;ofi_rxm', 'cxi'")
      ->capture_default_str();
  app.add_option("--bind", cfg.fabric.node, "Local address of the endpoint")->capture_default_str();
  app.add_option("--service", cfg.fabric.service, "Local port (default: any free one)");
  app.add_option("--domain", cfg.fabric.domain, "libfabric domain (NIC), e.g. mlx5_0");
  app.add_option("--threads", cfg.threads, "Lanes of one transfer (threads, each with its own endpoint)")
      ->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--workers", cfg.workers, "Transfers served at once (each with --threads lanes)")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--liveness-timeout", cfg.liveness_timeout_s,
                 "Seconds a transfer may make no progress before its rank counts as gone (its application's "
                 "other transfers are then cancelled; held versions stay)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  std::string budget = "auto";
  app.add_option("--memory-budget", budget,
                 "Bytes of checkpoint images the agent may hold (suffix K, M, G; auto: half the memory available "
                 "at start; 0: no limit)")
      ->capture_default_str();
  app.add_option("--keep", cfg.keep, "Versions kept in memory per (run, checkpoint, rank)")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--persistent", cfg.persistent, "Store written in the background (cairn's format); none: memory only");
  app.add_flag("--no-direct-io", no_direct, "Buffered writes to the store instead of O_DIRECT");
  app.add_option("--compress", cfg.compress_level,
                 "zstd level of the shards written to the store (on by default; 0: uncompressed; "
                 "negative: faster levels). Restart, cairn verify and the readers read either")
      ->capture_default_str()->check(CLI::Range(-131072, 22));
  app.add_option("--compress-threads", cfg.compress_threads,
                 "zstd worker threads per region (0: compress in the writer thread)")
      ->capture_default_str()->check(CLI::Range(0, 256));
  app.add_option("--chunk", chunk, "Largest single RMA operation (0: the provider's limit; suffix K, M, G)")
      ->capture_default_str();
  app.add_option("--piece", piece, "Work unit handed to a transfer thread (suffix K, M, G)")->capture_default_str();
  app.add_option("--max-bandwidth", bandwidth, "Cap on one transfer, bytes per second (suffix K, M, G; 0: none)")
      ->capture_default_str();
  app.add_option("--timeout", cfg.fabric.timeout_s, "Seconds the agent's own endpoint waits for a message to leave")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--push-timeout", cfg.push_timeout_s, "Seconds a rank has to finish a push or a restore by read")
      ->capture_default_str()->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
    cfg.fabric.max_chunk = parse_bytes(chunk);
    cfg.piece_bytes = parse_bytes(piece);
    cfg.max_bytes_per_s = static_cast<double>(parse_bytes(bandwidth));
    cfg.memory_budget = budget == "auto" ? cairn::util::available_memory() / 2 : parse_bytes(budget);
    if (cfg.piece_bytes == 0) throw CLI::ValidationError("--piece", "must be positive");
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cairn-agent: bad size: %s\n", e.what());
    return 2;
  }
  cfg.direct_io = !no_direct;
  if (name_file.empty() && cfg.stats_file.empty()) {
    std::fprintf(stderr, "cairn-agent: give --name-file or --stats-file (where the endpoint name goes)\n");
    return 2;
  }

  if (key_fd >= 0) {
    auto key = read_key(key_fd);
    if (!key) {
      std::fprintf(stderr, "cairn-agent: --key-fd %d: %s\n", key_fd, key.error().message().c_str());
      return 2;
    }
    cfg.key = std::move(key).value();
  }

  const std::atomic<bool>* stop = install_stop_signals();

  auto server = agent_server::create(cfg);
  if (!server) {
    std::fprintf(stderr, "cairn-agent: cannot start: %s\n", server.error().to_string().c_str());
    return 2;
  }
  const auto& pr = (*server)->properties();
  if (!agent_id.empty())
    std::fprintf(stderr, "cairn-agent: agent %s of application %s (%s) on node %s, controller %s\n",
                 agent_id.c_str(), app_id.c_str(), app_name.c_str(), node_id.c_str(), controller.c_str());
  std::fprintf(stderr,
               "cairn-agent: provider %s, domain %s, mr_mode %s, %s progress, %d worker(s) x %d lane(s), liveness "
               "%g s, memory budget %s, keep %d, store %s%s, %s\n",
               pr.provider.c_str(), pr.domain.c_str(), pr.mr_mode_text.c_str(),
               pr.manual_progress ? "manual" : "auto", cfg.workers, cfg.threads, cfg.liveness_timeout_s,
               cfg.memory_budget ? (std::to_string(cfg.memory_budget) + " bytes").c_str() : "none", cfg.keep,
               cfg.persistent.empty() ? "(none)" : cfg.persistent.c_str(),
               cfg.persistent.empty()       ? ""
               : cfg.compress_level == 0    ? " (uncompressed)"
                                            : (" (zstd level " + std::to_string(cfg.compress_level) + ")").c_str(),
               cfg.key.empty() ? "no application key (unsealed messages from any fabric peer are served)"
                               : "messages sealed with the application's key");
  cairn::status st;
  if (!name_file.empty()) {
    st = cairn::storage::storage_env::posix()->write_atomic(name_file, cairn::fabric::to_hex((*server)->name()) + "\n",
                                                            false);
    if (!st) {
      std::fprintf(stderr, "cairn-agent: cannot write the name file: %s\n", st.to_string().c_str());
      return 2;
    }
  }
  std::fprintf(stderr, "cairn-agent: ready, endpoint %s\n", cairn::fabric::to_hex((*server)->name()).c_str());
  st = (*server)->run(*stop);
  if (!st) {
    std::fprintf(stderr, "cairn-agent: %s\n", st.to_string().c_str());
    return 1;
  }
  std::fprintf(stderr, "cairn-agent: stopped\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_agent(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cairn-agent: internal error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "cairn-agent: internal error: unknown exception\n");
  }
  return 3;
}
