// cairn_plane_stranger: a process without a job's key that floods the job's
// data-plane endpoints with forged messages (tests/integration/test_data_planes.py).
//
//   cairn_plane_stranger SECONDS NAME VERSIONS RANKS ADDRESS:PORT...
//   cairn_plane_stranger --agent RUN SECONDS ENDPOINT...
//
// Prints "stranger: round 1 sent" once every endpoint got the first round.
// For SECONDS (or until SIGTERM), to every endpoint ADDRESS:PORT (IPv4; with tcp;ofi_rxm the
// endpoint name is the sockaddr_in), sends for checkpoint NAME, versions 1..VERSIONS
// and ranks 0..RANKS-1: a READY that points at a buffer that is not there
// and at a file outside any store, and a HELD that reports a failure; half
// of them carry a random 16-byte tag (a wrong key), half none. Accepted, they
// would fail the job's versions or make a leader read the wrong bytes.
// With --agent, the endpoints are agents' (hex names, as `cairn agents status`
// shows them; tests/integration/test_agents.py), and the messages are what
// would drop or read an application's versions there: RELEASE of RUN, QUERY
// and RESTORE of its checkpoint "ckpt".
// Prints how many it sent; exit 0, or 2 on bad arguments or no endpoint.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>

#include <atomic>
#include <csignal>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fabric/fabric.hpp"
#include "fabric/message.hpp"

using namespace cairn;

namespace {

std::atomic<bool> stop{false};

// Half of the messages carry a random 16-byte tag (a wrong key), half none.
std::string forge(const fabric::data_message& m, uint64_t n) {
  std::string bytes = fabric::encode_data_message(m);
  if (n % 2) {
    std::string tag(16, '\0');
    randombytes_buf(tag.data(), tag.size());
    bytes += tag;
  }
  return bytes;
}

int agent_mode(int argc, char** argv) {
  const std::string run = argv[2];
  const double seconds = std::atof(argv[3]);
  fabric::fabric_options o;
  o.timeout_s = 0.5;
  auto ctx = fabric::fabric_context::create(o);
  if (!ctx) {
    std::fprintf(stderr, "stranger: %s\n", ctx.error().to_string().c_str());
    return 2;
  }
  std::vector<fabric::fabric_addr> agents;
  for (int i = 4; i < argc; ++i) {
    auto name = fabric::from_hex(argv[i]);
    auto a = name ? (*ctx)->insert_peer(*name) : cairn::result<fabric::fabric_addr>(name.take_status());
    if (!a) {
      std::fprintf(stderr, "stranger: agent %s: %s\n", argv[i], a.error().to_string().c_str());
      return 2;
    }
    agents.push_back(*a);
  }
  uint64_t sent = 0, failed = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (int round = 1; std::chrono::steady_clock::now() < end && !stop; ++round) {
    for (auto a : agents)
      for (auto type : {fabric::data_msg::release, fabric::data_msg::query, fabric::data_msg::restore}) {
        fabric::data_message m;
        m.type = type;
        m.mode = fabric::transfer_mode::pull;
        m.request = sent + failed + 1;
        m.run = run;
        m.name = type == fabric::data_msg::release ? "" : "ckpt";
        m.version = -1;
        m.reply_to = (*ctx)->name();
        if ((*ctx)->send(a, forge(m, sent + failed))) ++sent;
        else ++failed;
      }
    if (round == 1) {
      std::printf("stranger: round 1 sent\n");
      std::fflush(stdout);
    }
    while (auto r = (*ctx)->recv(0.01)) {
      // An answer would mean the agent took a forged message.
      auto m = fabric::decode_data_message(*r);
      std::printf("stranger: answered: %s\n", m ? fabric::data_msg_name(m->type) : "undecodable");
    }
  }
  std::printf("stranger: sent %llu forged messages to %zu agents (%llu failed)\n",
              static_cast<unsigned long long>(sent), agents.size(), static_cast<unsigned long long>(failed));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 5 && std::string(argv[1]) == "--agent") {
    if (sodium_init() < 0) return 2;
    std::signal(SIGTERM, [](int) { stop = true; });
    return agent_mode(argc, argv);
  }
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s SECONDS NAME VERSIONS RANKS ADDRESS:PORT...\n", argv[0]);
    return 2;
  }
  const double seconds = std::atof(argv[1]);
  const std::string name = argv[2];
  const int versions = std::atoi(argv[3]), ranks = std::atoi(argv[4]);
  if (sodium_init() < 0) return 2;
  std::signal(SIGTERM, [](int) { stop = true; });
  // One context per endpoint: a port that is not a fabric endpoint (or one
  // that drops the connection) fails its context for good, not the others'.
  struct target {
    std::unique_ptr<fabric::fabric_context> ctx;
    fabric::fabric_addr addr = 0;
  };
  std::vector<target> peers;
  fabric::fabric_options o;
  o.timeout_s = 0.5;  // an endpoint that does not take the message is dropped, not waited for
  for (int i = 5; i < argc; ++i) {
    auto ctx = fabric::fabric_context::create(o);
    if (!ctx) {
      std::fprintf(stderr, "stranger: %s\n", ctx.error().to_string().c_str());
      return 2;
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    const std::string at = argv[i];
    const size_t colon = at.rfind(':');
    if (colon == std::string::npos || inet_pton(AF_INET, at.substr(0, colon).c_str(), &a.sin_addr) != 1) {
      std::fprintf(stderr, "stranger: %s is not ADDRESS:PORT\n", argv[i]);
      return 2;
    }
    a.sin_port = htons(static_cast<uint16_t>(std::atoi(at.c_str() + colon + 1)));
    auto p = (*ctx)->insert_peer(std::string(reinterpret_cast<const char*>(&a), sizeof a));
    if (p) peers.push_back({std::move(ctx).value(), *p});
  }
  uint64_t sent = 0, failed = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (int round = 1; std::chrono::steady_clock::now() < end && !stop; ++round) {
    for (target& t : peers)
      for (int v = 1; v <= versions; ++v)
        for (int r = 0; r < ranks; ++r)
          for (auto type : {fabric::data_msg::ready, fabric::data_msg::held}) {
            fabric::data_message m;
            m.type = type;
            m.request = sent;
            m.run = "redundancy";
            m.name = name;
            m.version = v;
            m.rank = static_cast<uint32_t>(r);
            m.nranks = static_cast<uint32_t>(ranks);
            m.addr = 4096;
            m.key = 0x5eed;
            m.length = 1 << 20;
            if (type == fabric::data_msg::ready) {
              m.text = "/etc\n0123456789abcdef";
            } else {
              m.code = -5;
              m.text = "forged by a stranger";
            }
            const std::string bytes = forge(m, sent);
            if (!t.ctx || stop) continue;
            if (t.ctx->send(t.addr, bytes)) {
              ++sent;
            } else {
              ++failed;
              t.ctx.reset();
            }
          }
    if (round == 1) {
      std::printf("stranger: round 1 sent\n");  // the test waits for this line
      std::fflush(stdout);
    }
  }
  std::printf("stranger: sent %llu forged messages to %zu endpoints (%llu failed)\n",
              static_cast<unsigned long long>(sent), peers.size(), static_cast<unsigned long long>(failed));
  return 0;
}
