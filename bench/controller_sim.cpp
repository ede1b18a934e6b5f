// controller_sim: the agents controller's decisions (src/agents/controller_state,
// the code `cairn controller` runs) at a scale this machine cannot deploy:
// --nodes agent nodes and applications totalling --ranks ranks, with churn
// (nodes joining, leaving gracefully and dying; applications arriving,
// reporting progress, resizing and finishing), driven in-process without
// sockets. Every invariant is checked after every --check-every events: no
// node holds more agents than its capacity, no agent sits on a node that left
// or died, every application has at most one agent per rank and at most its
// target, and an application short of its target is so only while no node
// with room exists. At the end the journal is replayed into a fresh state
// (what a controller restart does) and the result must equal the live state.
// Reports decisions per second, peak memory, journal size and recovery time.
//
// usage: controller_sim [--nodes 10000] [--ranks 100000] [--events 200000] [--capacity 16]
//                       [--strategy bandwidth|memory|activity|power] [--check-every N] [--seed S] [--json]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agents/controller_state.hpp"

using namespace cairn;
using namespace cairn::agents;
using nlohmann::json;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "controller_sim: %s\nusage: controller_sim [--nodes N] [--ranks R] [--events E] "
                       "[--capacity C] [--strategy S] [--check-every N] [--seed S] [--json]\n", why.c_str());
  std::exit(2);
}

// Every invariant of the state; "" when all hold.
std::string check(controller_state& s) {
  // The placement index (what the decisions read) equals a fresh ranking.
  if (std::string why = s.index_mismatch(); !why.empty()) return why;
  std::map<std::string, uint32_t> per_node;
  std::map<uint64_t, uint32_t> per_app;
  for (const auto& [id, g] : s.agents()) {
    auto n = s.nodes().find(g.node);
    if (n == s.nodes().end()) return "agent " + std::to_string(id) + " on node " + g.node + ", which is gone";
    if (!s.apps().count(g.app)) return "agent " + std::to_string(id) + " of a finished application";
    ++per_node[g.node];
    ++per_app[g.app];
  }
  bool room = false;  // some usable node has room
  for (const auto& [id, n] : s.nodes()) {
    if (per_node[id] > n.capacity)
      return "node " + id + " holds " + std::to_string(per_node[id]) + " agents, capacity " +
             std::to_string(n.capacity);
    if (n.reported && !n.leaving && per_node[id] < n.capacity) room = true;
  }
  for (const auto& [id, a] : s.apps()) {
    const uint32_t k = per_app[id];
    if (a.hints.ranks && k > a.hints.ranks) return "application " + a.name + " has more agents than ranks";
    if (k > a.target) return "application " + a.name + " has more agents than its target";
    // Short of agents with a node free: the controller must have placed one
    // at least (an application without any agent gets one unconditionally).
    if (k == 0 && room) return "application " + a.name + " has no agent although a node has room";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t nodes = 10000, ranks = 100000, events = 200000, capacity = 16, check_every = 1000, seed = 1;
  std::string strat = "bandwidth";
  bool as_json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    if (a == "--nodes") nodes = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--ranks") ranks = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--events") events = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--capacity") capacity = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--check-every") check_every = std::max<uint64_t>(1, std::strtoull(next().c_str(), nullptr, 10));
    else if (a == "--seed") seed = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--strategy") strat = next();
    else if (a == "--json") as_json = true;
    else usage("unknown option " + a);
  }
  auto st_opt = parse_strategy(strat);
  if (!st_opt) usage("unknown strategy " + strat);
  if (nodes == 0 || ranks == 0) usage("--nodes and --ranks must be positive");

  controller_policy policy;
  policy.strat = *st_opt;
  policy.default_capacity = static_cast<uint32_t>(capacity);
  policy.heartbeat_timeout_s = 5;
  std::vector<json> journal;
  uint64_t journal_bytes = 0;
  controller_state s(policy, [&](const json& rec) {
    journal_bytes += rec.dump().size() + 1;  // one line per record (docs/format/journal.md)
    journal.push_back(rec);
    return status();
  });

  std::mt19937_64 rng(seed);
  auto metrics = [&](double load) {
    node_metrics m;
    m.mem_total = 256ull << 30;
    m.mem_free = static_cast<uint64_t>((1.0 - load) * static_cast<double>(m.mem_total));
    m.bw_in_use = load * 10e9;
    m.activity = load * 5;
    m.power_w = 200 + 300 * load;
    m.cpu_util = load;
    return m;
  };
  double clock = 0;
  uint64_t next_node = 0, next_app = 0, decisions = 0, failed = 0;
  std::vector<std::string> live_nodes;
  // (id, ranks), picked at random in O(1): a walk of a map to a random
  // element would cost the harness more than a decision costs the controller.
  std::vector<std::pair<uint64_t, uint32_t>> live_apps;
  uint64_t live_ranks = 0;
  auto add_node = [&]() {
    std::string id = "n" + std::to_string(next_node++);
    status st = s.node_register(id, "10.0." + std::to_string(next_node / 250) + "." + std::to_string(next_node % 250) +
                                        ":7421",
                                static_cast<uint32_t>(capacity), metrics(static_cast<double>(rng() % 100) / 100), {},
                                clock);
    ++decisions;
    if (st) live_nodes.push_back(id);
    else ++failed;
  };
  auto add_app = [&](uint32_t r) {
    app_hints h;
    h.ranks = r;
    h.nodes = std::max<uint32_t>(1, r / 32);
    h.checkpoint_bytes = static_cast<uint64_t>(r) * (256ull << 20);
    h.interval_s = 60 + static_cast<double>(rng() % 600);
    h.checkpoints = 10 + rng() % 1000;
    auto id = s.app_register("app" + std::to_string(next_app++), h, std::nullopt, std::nullopt, std::nullopt);
    ++decisions;
    if (!id) {
      ++failed;
      return;
    }
    live_apps.emplace_back(*id, r);
    live_ranks += r;
  };

  // The initial system: every node, then applications up to --ranks ranks.
  const double t0 = now_s();
  for (uint64_t i = 0; i < nodes; ++i) add_node();
  while (live_ranks < ranks) add_app(static_cast<uint32_t>(std::min<uint64_t>(ranks - live_ranks, 8 + rng() % 120)));
  const double setup_s = now_s() - t0;
  std::string broken = check(s);

  // Churn.
  uint64_t kinds[7] = {0};
  double kind_s[7] = {0};  // seconds per event kind (what each costs the controller and the harness)
  const double t1 = now_s();
  double check_s = 0, heartbeat_round_s = 0, death_s = 0;
  uint64_t heartbeat_rounds = 0;
  for (uint64_t e = 0; e < events && broken.empty(); ++e) {
    clock += 0.01;
    const uint64_t k = rng() % 100;
    const double e0 = now_s();
    uint64_t before[7];
    std::copy(std::begin(kinds), std::end(kinds), before);
    if (k < 40 && !live_apps.empty()) {  // progress report (the most common message)
      auto it = live_apps.begin() + static_cast<long>(rng() % live_apps.size());
      const auto& a = s.apps().at(it->first);
      status st = s.app_progress(it->first, a.checkpoints_done + 1, 0.5 + static_cast<double>(rng() % 100) / 50,
                                 (rng() % 10 == 0) ? 2.5 : 0);
      ++kinds[0];
      if (!st) ++failed;
    } else if (k < 60 && !live_nodes.empty()) {  // heartbeat with fresh metrics
      const std::string& id = live_nodes[rng() % live_nodes.size()];
      status st = s.node_heartbeat(id, metrics(static_cast<double>(rng() % 100) / 100), {}, clock);
      ++kinds[1];
      if (!st) ++failed;
    } else if (k < 70) {  // an application finishes, another arrives
      if (!live_apps.empty()) {
        auto it = live_apps.begin() + static_cast<long>(rng() % live_apps.size());
        if (!s.app_unregister(it->first)) ++failed;
        live_ranks -= it->second;
        *it = live_apps.back();
        live_apps.pop_back();
      }
      add_app(static_cast<uint32_t>(8 + rng() % 120));
      ++kinds[2];
    } else if (k < 78 && !live_apps.empty()) {  // a resize request (the break-even rule decides)
      auto it = live_apps.begin() + static_cast<long>(rng() % live_apps.size());
      auto d = s.app_resize(it->first, 1 + static_cast<uint32_t>(rng() % std::min<uint32_t>(it->second, 16)), false);
      ++kinds[3];
      if (!d) ++failed;
    } else if (k < 82 && live_nodes.size() > 1) {  // a node leaves gracefully, a new one joins
      size_t i = rng() % live_nodes.size();
      auto moved = s.node_leave(live_nodes[i]);
      if (!moved) ++failed;
      live_nodes.erase(live_nodes.begin() + static_cast<long>(i));
      add_node();
      ++kinds[4];
    } else if (k < 85 && rng() % 8 == 0 && live_nodes.size() > 1) {  // a node dies: silent past the timeout
      size_t i = rng() % live_nodes.size();
      const std::string dead = live_nodes[i];
      live_nodes.erase(live_nodes.begin() + static_cast<long>(i));
      // Everyone else keeps beating (a round of heartbeats, timed apart: the
      // steady load of the nodes); only the dead node falls silent.
      const double later = clock + policy.heartbeat_timeout_s + 1;
      const double h0 = now_s();
      for (const auto& id : live_nodes) (void)s.node_heartbeat(id, metrics(0.5), {}, later);
      const double round = now_s() - h0;
      kind_s[5] -= round;
      heartbeat_round_s += round;
      check_s += round;  // not part of the churn's decisions
      ++heartbeat_rounds;
      clock = later;
      const double x0 = now_s();
      auto lost = s.expire(clock);
      death_s += now_s() - x0;
      if (lost.size() != 1 || lost[0] != dead) {
        broken = "expire lost " + std::to_string(lost.size()) + " nodes, expected exactly " + dead;
        break;
      }
      add_node();
      ++kinds[5];
    } else if (!live_apps.empty()) {  // a migration asked by an administrator
      if (!s.agents().empty()) {
        // The first agent at or after a random id (ids are dense enough).
        auto it = s.agents().lower_bound(1 + rng() % s.agents().rbegin()->first);
        (void)s.agent_migrate(it->first, "");  // may be refused: no other node with room
      }
      ++kinds[6];
    }
    ++decisions;
    for (int i = 0; i < 7; ++i) {
      if (kinds[i] != before[i]) kind_s[i] += now_s() - e0;
    }
    if ((e + 1) % check_every == 0) {
      const double c0 = now_s();
      broken = check(s);
      check_s += now_s() - c0;
    }
  }
  const double churn_s = now_s() - t1 - check_s;
  if (broken.empty()) broken = check(s);

  // Recovery: a fresh controller replays the journal and must equal the live one.
  const double r0 = now_s();
  controller_state replayed(policy, [](const json&) { return status(); });
  std::string recovery = "ok";
  for (const auto& rec : journal) {
    status st = replayed.apply(rec);
    if (!st) {
      recovery = "replay failed: " + st.to_string();
      break;
    }
  }
  replayed.recovered(clock);
  const double recovery_s = now_s() - r0;
  if (recovery == "ok" && json(replayed.snapshot()) != json(s.snapshot())) recovery = "replayed state differs";
  // What compaction would keep: the snapshot's records.
  uint64_t snapshot_bytes = 0;
  for (const auto& rec : s.snapshot()) snapshot_bytes += rec.dump().size() + 1;

  const uint64_t churn_events = kinds[0] + kinds[1] + kinds[2] + kinds[3] + kinds[4] + kinds[5] + kinds[6];
  const bool ok = broken.empty() && recovery == "ok";
  if (as_json) {
    json j = {{"nodes", nodes}, {"ranks", ranks}, {"capacity", capacity}, {"strategy", strat},
              {"applications", s.apps().size()}, {"agents", s.agents().size()}, {"setup_s", setup_s},
              {"churn_events", churn_events}, {"churn_s", churn_s},
              {"decisions_per_s", static_cast<double>(churn_events) / std::max(churn_s, 1e-9)},
              {"events", {{"progress", kinds[0]}, {"heartbeat", kinds[1]}, {"app_replaced", kinds[2]},
                          {"resize", kinds[3]}, {"node_left", kinds[4]}, {"node_died", kinds[5]},
                          {"migrate", kinds[6]}}},
              {"us_per_event", {{"progress", kind_s[0] / std::max<double>(1, kinds[0]) * 1e6},
                                {"heartbeat", kind_s[1] / std::max<double>(1, kinds[1]) * 1e6},
                                {"app_replaced", kind_s[2] / std::max<double>(1, kinds[2]) * 1e6},
                                {"resize", kind_s[3] / std::max<double>(1, kinds[3]) * 1e6},
                                {"node_left", kind_s[4] / std::max<double>(1, kinds[4]) * 1e6},
                                {"node_died", kind_s[5] / std::max<double>(1, kinds[5]) * 1e6},
                                {"migrate", kind_s[6] / std::max<double>(1, kinds[6]) * 1e6}}},
              {"refused", failed}, {"peak_rss_mib", peak_rss_mib()},
              {"heartbeat_round_s", heartbeat_rounds ? heartbeat_round_s / static_cast<double>(heartbeat_rounds) : 0},
              {"node_death_s", kinds[5] ? death_s / static_cast<double>(kinds[5]) : 0}, {"journal_records", journal.size()},
              {"journal_bytes", journal_bytes}, {"snapshot_bytes", snapshot_bytes}, {"recovery_s", recovery_s},
              {"invariants", broken.empty() ? "ok" : broken}, {"recovery", recovery}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("controller simulation: %llu nodes (capacity %llu), %llu ranks in %zu applications, %zu agents, "
                "strategy %s\n",
                (unsigned long long)nodes, (unsigned long long)capacity, (unsigned long long)live_ranks,
                s.apps().size(), s.agents().size(), strat.c_str());
    std::printf("  setup (every node and application registered)  %8.2f s\n", setup_s);
    std::printf("  churn: %llu events in %.2f s = %.0f decisions/s (progress %llu, heartbeats %llu, apps replaced "
                "%llu, resizes %llu, nodes left %llu, died %llu, migrations %llu; %llu refused)\n",
                (unsigned long long)churn_events, churn_s, static_cast<double>(churn_events) / std::max(churn_s, 1e-9),
                (unsigned long long)kinds[0], (unsigned long long)kinds[1], (unsigned long long)kinds[2],
                (unsigned long long)kinds[3], (unsigned long long)kinds[4], (unsigned long long)kinds[5],
                (unsigned long long)kinds[6], (unsigned long long)failed);
    if (heartbeat_rounds)
      std::printf("  a round of heartbeats from every node           %8.3f s (%.0f heartbeats/s); a death found and "
                  "its agents moved in %.4f s\n",
                  heartbeat_round_s / static_cast<double>(heartbeat_rounds),
                  static_cast<double>(live_nodes.size()) * static_cast<double>(heartbeat_rounds) /
                      std::max(heartbeat_round_s, 1e-9),
                  kinds[5] ? death_s / static_cast<double>(kinds[5]) : 0.0);
    std::printf("  invariants (checked every %llu events)          %s\n", (unsigned long long)check_every,
                broken.empty() ? "ok" : broken.c_str());
    std::printf("  peak memory                                     %8.0f MiB\n", peak_rss_mib());
    std::printf("  journal                                         %8zu records, %.1f MiB (a compacted snapshot: "
                "%.1f MiB)\n",
                journal.size(), static_cast<double>(journal_bytes) / 1048576.0,
                static_cast<double>(snapshot_bytes) / 1048576.0);
    std::printf("  recovery (replay the journal into a new state)  %8.2f s: %s\n", recovery_s, recovery.c_str());
  }
  return ok ? 0 : 1;
}
