// cairn agents ACTION: requests to the agents controller (docs/format/control.md).
#include <cmath>
#include <cstdio>

#include "agents/auth.hpp"
#include "agents/net.hpp"
#include "commands.hpp"
#include "output.hpp"
#include "store_scan.hpp"
#include "util/config.hpp"
#include "util/hex.hpp"

namespace cairn::cli {
namespace {

using nlohmann::json;

std::string rate(double bytes_per_s) {
  if (bytes_per_s <= 0) return "0 B/s";
  return format_bytes(static_cast<uint64_t>(std::llround(bytes_per_s))) + "/s";
}

template <typename T>
T get_or(const json& j, const char* key, T dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  try {
    return it->get<T>();
  } catch (const std::exception&) {
    return dflt;
  }
}

void print_status(const json& j) {
  const json& p = j.value("policy", json::object());
  const json& c = j.value("controller", json::object());
  std::printf("controller %s  journal %s\n", get_or<std::string>(c, "address", "?").c_str(),
              get_or<std::string>(c, "journal", "?").c_str());
  std::printf("strategy %s  distribution %s (block %u)  default capacity %u  heartbeat %.3gs, lost after %.3gs\n\n",
              get_or<std::string>(p, "strategy", "?").c_str(), get_or<std::string>(p, "distribution", "?").c_str(),
              get_or<unsigned>(p, "block_size", 0), get_or<unsigned>(p, "default_capacity", 0),
              get_or<double>(p, "heartbeat_interval_s", 0), get_or<double>(p, "heartbeat_timeout_s", 0));
  table nodes({"NODE", "STATE", "ADDRESS", "AGENTS", "MEM FREE", "HELD", "RESERVED", "BW IN USE", "CKPT/S", "POWER"},
              {false, false, false, true, true, true, true, true, true, true});
  for (const auto& n : j.value("nodes", json::array())) {
    const json& m = n.value("metrics", json());
    std::string power = "-", mem = "-", bw = "-", act = "-";
    if (m.is_object()) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.0f W%s", get_or<double>(m, "power_w", 0),
                    get_or<bool>(m, "power_estimated", true) ? " (est.)" : "");
      power = buf;
      mem = format_bytes(get_or<uint64_t>(m, "mem_free", 0));
      bw = rate(get_or<double>(m, "bw_in_use", 0));
      std::snprintf(buf, sizeof buf, "%.3g", get_or<double>(m, "activity", 0));
      act = buf;
    }
    nodes.add({get_or<std::string>(n, "node", "?"), get_or<std::string>(n, "state", "?"),
               get_or<std::string>(n, "address", "?"),
               std::to_string(get_or<uint64_t>(n, "agents", 0)) + "/" + std::to_string(get_or<uint64_t>(n, "capacity", 0)),
               mem, format_bytes(get_or<uint64_t>(n, "memory_held", 0)),
               format_bytes(get_or<uint64_t>(n, "memory_reserved", 0)), bw, act, power});
  }
  if (nodes.empty()) std::printf("no agent nodes\n");
  else nodes.print(stdout);
  std::printf("\n");
  table apps({"APP", "NAME", "AGENTS", "NODES", "HELD", "RESERVED", "STRATEGY", "LAST DECISION"},
             {true, false, true, false, true, true, false, false});
  for (const auto& a : j.value("applications", json::array())) {
    std::string where;
    size_t count = 0;
    for (const auto& g : a.value("agents", json::array())) {
      if (!where.empty()) where += ",";
      where += get_or<std::string>(g, "node", "?");
      ++count;
    }
    apps.add({std::to_string(get_or<uint64_t>(a, "app", 0)), get_or<std::string>(a, "name", "?"),
              std::to_string(count) + "/" + std::to_string(get_or<uint64_t>(a, "target", 0)), where.empty() ? "-" : where,
              format_bytes(get_or<uint64_t>(a, "memory_held", 0)), format_bytes(get_or<uint64_t>(a, "memory_reserved", 0)),
              get_or<std::string>(a, "strategy", "?") + "/" + get_or<std::string>(a, "distribution", "?"),
              get_or<std::string>(a, "last_decision", "")});
  }
  if (apps.empty()) std::printf("no applications\n");
  else apps.print(stdout);
}

void print_agents(const json& j) {
  std::printf("application %llu (%s): %zu of %llu agents\n",
              static_cast<unsigned long long>(get_or<uint64_t>(j, "app", 0)), get_or<std::string>(j, "name", "?").c_str(),
              j.value("agents", json::array()).size(), static_cast<unsigned long long>(get_or<uint64_t>(j, "target", 0)));
  for (const auto& g : j.value("agents", json::array())) {
    std::printf("  agent %llu on %s (%s)\n", static_cast<unsigned long long>(get_or<uint64_t>(g, "agent", 0)),
                get_or<std::string>(g, "node", "?").c_str(), get_or<std::string>(g, "state", "?").c_str());
  }
}

}  // namespace

int cmd_agents(const agents_cli_options& o) {
  // An administrator's changes to applications are the service's: with its
  // secret the handshake is the service's (docs/design/security.md "Agents").
  auto service = agents::load_service_secret(o.service_secret_file, nullptr);
  if (!service) {
    print_error(service.error());
    return kExitUsage;
  }
  auto secret = !service->empty() ? std::move(service) : agents::load_deployment_secret(o.secret_file, nullptr);
  if (!secret) {
    print_error(secret.error());
    return kExitUsage;
  }
  auto addr = agents::parse_address(o.controller);
  if (!addr) {
    print_error(addr.error());
    return kExitUsage;
  }
  if (status st = agents::crypto_init(); !st) {
    print_error(st);
    return kExitFailure;
  }
  agents::ctl_type type = agents::ctl_type::status;
  const agents::box_keypair box = agents::new_box_keypair();
  json body = json::object();
  if (o.action == "register") {
    auto bytes = parse_size(o.checkpoint_bytes);
    if (!bytes) {
      print_error(bytes.error());
      return kExitUsage;
    }
    type = agents::ctl_type::app_register;
    body = {{"name", o.name},
            {"hints", {{"ranks", o.ranks}, {"nodes", o.nodes}, {"checkpoint_bytes", *bytes},
                       {"interval_s", o.interval}, {"checkpoints", o.checkpoints}, {"store", o.store}}}};
    if (!o.strategy.empty()) body["strategy"] = o.strategy;
    if (!o.distribution.empty()) body["distribution"] = o.distribution;
    if (o.block_size > 0) body["block_size"] = o.block_size;
    // The application's key is kept where its job finds it (the run
    // directory of --store, or --key-file): the job must prove it holds it
    // to take this registration over. Without either it is thrown away.
    body["box_public"] = util::hex_encode(box.public_key);
  } else if (o.action == "unregister") {
    type = agents::ctl_type::app_unregister;
    body = {{"app", o.app}};
  } else if (o.action == "resize") {
    type = agents::ctl_type::app_resize;
    body = {{"app", o.app}, {"agents", o.agents}, {"force", o.force}};
  } else if (o.action == "migrate") {
    type = agents::ctl_type::agent_migrate;
    body = {{"agent", o.agent}};
    if (!o.to.empty()) body["node"] = o.to;
  }
  auto r = agents::control_call(*addr, *secret, "admin", type, body, static_cast<int>(o.timeout * 1000));
  if (!r) {
    print_error(r.error());
    return exit_code_for(r.error());
  }
  if (o.action == "register") {
    const std::string key_file =
        !o.key_file.empty() ? o.key_file : o.store.empty() ? "" : agents::app_key_file(o.store, o.name);
    std::string sealed;
    const std::string hex = r->value("key_box", "");
    auto key = util::hex_decode(hex, hex.size() / 2, &sealed)
                   ? agents::open_sealed(box, sealed)
                   : result<std::string>(status(errc::corruption, "the controller's reply has no key box"));
    status st = key ? (key_file.empty() ? status{} : agents::save_app_key(key_file, *key)) : key.take_status();
    if (!st) {
      print_error(st.with_context("the application's key"));
      return kExitFailure;
    }
    if (!o.json)
      std::printf("%s\n", key_file.empty()
                              ? "its key was not kept (no --store or --key-file): no job can take this "
                                "registration over"
                              : ("its key is in " + key_file + ": a job of run " + o.name +
                                 " that keeps its run there takes this registration over")
                                    .c_str());
    r->erase("key_box");
  }
  // A resize the break-even rule refused is a failure for scripts (exit 1).
  const bool refused = o.action == "resize" && r->contains("decision") && !(*r)["decision"].value("applied", false);
  if (o.json) {
    print_json(*r);
    return refused ? kExitFailure : kExitOk;
  }
  if (o.action == "status") {
    print_status(*r);
  } else if (o.action == "register" || o.action == "resize") {
    if (r->contains("decision")) {
      const json& d = (*r)["decision"];
      std::printf("%s: %s\n", get_or<bool>(d, "applied", false) ? "applied" : "refused",
                  get_or<std::string>(d, "reason", "").c_str());
    }
    print_agents(*r);
  } else if (o.action == "unregister") {
    std::printf("application %llu unregistered\n", static_cast<unsigned long long>(o.app));
  } else if (o.action == "migrate") {
    std::printf("agent %llu moved from %s to %s\n", static_cast<unsigned long long>(o.agent),
                get_or<std::string>(*r, "from", "?").c_str(), get_or<std::string>(*r, "node", "?").c_str());
  }
  return refused ? kExitFailure : kExitOk;
}

}  // namespace cairn::cli
