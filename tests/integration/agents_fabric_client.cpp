// cairn_agent_test_client: a stand-in application rank for agents_fabric_test.sh.
//
//   checkpoint --agent NAMEFILE --run R --name N --version V [--rank r --nranks n]
//              --bytes B [--mode pull|push] [--threads T] [--timeout S]
//       builds the deterministic shard image of (R, N, V, r) with a region
//       "data" of B bytes (tests/support/test_store), exposes it in a
//       page-aligned buffer, notifies the agent and waits until it holds it.
//   restore    --agent NAMEFILE --run R --name N [--version V] [--rank r --nranks n]
//              --bytes B [--mode push|pull]
//       asks the agent for version V (default: the newest) and checks it bit
//       for bit against the image `checkpoint` would have built. --mode lend:
//       the agent lends it (open_restore) and the image is read in three
//       uneven ranges (read_restored, as restart_verify = while reads
//       regions); a read past its end must be refused.
//   replay     --agent NAMEFILE --key-file F --run R --name N --version V --bytes B
//       as someone who recorded the fabric's traffic: checkpoints V (sealed
//       under the application's key in F, hex), sends a sealed RELEASE of R
//       whose bytes it keeps (the agent drops V), checkpoints V+1, sends the
//       kept bytes again and expects no answer; V+1 must still be held.
//   restart    --store DIR --run R --name N [--version V] --bytes B
//       an ordinary restart (cairn_init, cairn_protect, cairn_restart) of
//       rank 0 of 1 from the store an agent wrote, compared with the regions
//       `checkpoint` would have sent.
// --data smooth (checkpoint, restore, restart) fills "data" with the bytes
// of a float64 temperature field, which compresses; the default (random)
// does not.
//
// Exit status: 0 done (held / restored and equal); 3 not held or not
// restored (the agent's error or a timeout, on stderr); 4 restored but
// different; 2 bad arguments or no endpoint.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "agents/data_protocol.hpp"
#include "cairn.h"
#include "util/hash.hpp"
#include "util/hex.hpp"
#include "engine/staging.hpp"
#include "fabric/fabric.hpp"
#include "storage/storage_env.hpp"
#include "test_store.hpp"

namespace {

using namespace cairn;
using namespace cairn::agents;

struct args {
  std::string agent_file;
  std::string provider = "tcp;ofi_rxm";
  std::string node = "127.0.0.1";
  std::string run = "app";
  std::string name = "state";
  int64_t version = -1;
  uint32_t rank = 0;
  uint32_t nranks = 1;
  uint64_t bytes = 1 << 20;
  std::string mode = "pull";
  int threads = 2;
  double timeout = 30;
  std::string data = "random";
  std::string store;
  std::string key_file;
};

result<test::shard_image> build_image(const args& a, int64_t version) {
  auto img = test::make_shard_image(a.run, a.name, version, a.rank, a.nranks,
                                    {{"data", CAIRN_UINT8, a.bytes, {}, false}, {"step", CAIRN_INT64, 1, {}, false}});
  if (!img || a.data != "smooth") return img;
  // A plate 512 wide heated from its top edge, as heat2d's early steps: the
  // heat has reached the first 100 + version rows, the rest is still 0.
  format::region_desc& r = img->header.regions[0];
  std::vector<double> field(r.length / sizeof(double) + 1, 0.0);
  const size_t front = 512 * static_cast<size_t>(100 + version);
  for (size_t i = 0; i < field.size() && i < front; ++i)
    field[i] = std::exp(-static_cast<double>(i / 512) / 30.0) * std::sin(static_cast<double>(i % 512) * 0.0061);
  std::memcpy(img->bytes.data() + r.offset, field.data(), r.length);
  r.checksum = util::xxh3(img->bytes.data() + r.offset, r.length);
  format::encode_header(img->header, img->bytes);
  return img;
}

int fail(int code, const std::string& what) {
  std::fprintf(stderr, "cairn_agent_test_client: %s\n", what.c_str());
  return code;
}

// Restarts rank 0 of 1 from a.store with the C API and compares the regions.
int restart_from_store(const args& a) {
  setenv("CAIRN_RUN", a.run.c_str(), 1);
  setenv("CAIRN_PERSISTENT", a.store.c_str(), 1);
  setenv("CAIRN_LOCAL_ENABLED", "false", 1);
  setenv("CAIRN_MODE", "sync", 1);
  cairn_t* c = nullptr;
  if (cairn_init(nullptr, &c) != 0) return fail(2, std::string("cairn_init: ") + cairn_last_error());
  std::vector<uint8_t> data(a.bytes, 0x5a);
  int64_t step = -1;
  int64_t v = a.version;
  int rc = cairn_protect(c, "data", data.data(), data.size(), CAIRN_UINT8);
  if (rc == 0) rc = cairn_protect(c, "step", &step, 1, CAIRN_INT64);
  if (rc == 0 && v < 0) rc = cairn_restart_test(c, a.name.c_str(), &v);
  if (rc == 0) rc = cairn_restart(c, a.name.c_str(), v);
  std::string error = rc == 0 ? "" : cairn_last_error();
  cairn_finalize(&c, 0);
  if (rc != 0) return fail(3, "restart from " + a.store + ": " + error);
  auto expect = build_image(a, v);
  if (!expect) return fail(2, expect.error().to_string());
  const auto& d = expect->header.regions[0];
  const auto& s = expect->header.regions[1];
  if (std::memcmp(data.data(), expect->bytes.data() + d.offset, d.length) != 0 ||
      std::memcmp(&step, expect->bytes.data() + s.offset, s.length) != 0)
    return fail(4, "restarted v" + std::to_string(v) + " differs from the image that was checkpointed");
  std::printf("restarted %s/%s v%lld from the store (%llu bytes, equal)\n", a.run.c_str(), a.name.c_str(),
              static_cast<long long>(v), static_cast<unsigned long long>(a.bytes));
  return 0;
}

int run(int argc, char** argv) {
  CLI::App app{"stand-in application rank for the agent tests"};
  app.require_subcommand(1, 1);
  args a;
  auto common = [&](CLI::App* c) {
    c->add_option("--agent", a.agent_file, "the agent's name file")->required();
    c->add_option("--provider", a.provider);
    c->add_option("--bind", a.node, "local address of the rank's endpoint");
    c->add_option("--run", a.run);
    c->add_option("--name", a.name);
    c->add_option("--version", a.version);
    c->add_option("--rank", a.rank);
    c->add_option("--nranks", a.nranks);
    c->add_option("--bytes", a.bytes);
    c->add_option("--mode", a.mode)->check(CLI::IsMember({"pull", "push", "lend"}));
    c->add_option("--threads", a.threads);
    c->add_option("--timeout", a.timeout);
    c->add_option("--data", a.data)->check(CLI::IsMember({"random", "smooth"}));
  };
  CLI::App* ckpt = app.add_subcommand("checkpoint");
  CLI::App* rest = app.add_subcommand("restore");
  CLI::App* restart = app.add_subcommand("restart");
  CLI::App* query = app.add_subcommand("query");
  CLI::App* replay = app.add_subcommand("replay");
  common(ckpt);
  common(rest);
  common(query);
  common(replay);
  for (CLI::App* c : {ckpt, rest, query, replay})
    c->add_option("--key-file", a.key_file, "the application's key (hex): messages are sealed");
  restart->add_option("--store", a.store, "the store the agent wrote")->required();
  restart->add_option("--run", a.run);
  restart->add_option("--name", a.name);
  restart->add_option("--version", a.version);
  restart->add_option("--bytes", a.bytes);
  restart->add_option("--data", a.data)->check(CLI::IsMember({"random", "smooth"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (restart->parsed()) return restart_from_store(a);

  auto hex = storage::storage_env::posix()->read_all(a.agent_file);
  if (!hex) return fail(2, hex.error().to_string());
  auto agent_name = fabric::from_hex(*hex);
  if (!agent_name) return fail(2, agent_name.error().to_string());
  client_options co;
  co.fabric.provider = a.provider;
  co.fabric.node = a.node;
  co.fabric.timeout_s = a.timeout;
  co.threads = a.threads;
  co.reply_timeout_s = a.timeout;
  if (!a.key_file.empty()) {
    auto text = storage::storage_env::posix()->read_all(a.key_file);
    if (!text) return fail(2, text.error().to_string());
    std::string_view t = *text;
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.remove_suffix(1);
    if (!util::hex_decode(t, fabric::kPlaneKeyBytes, &co.key)) return fail(2, "bad key in " + a.key_file);
  }
  auto client = agent_client::create(co, *agent_name);
  if (!client) return fail(2, client.error().to_string());
  const transfer_mode mode = a.mode == "push" ? transfer_mode::push : transfer_mode::pull;

  if (ckpt->parsed()) {
    if (a.version < 0) return fail(2, "checkpoint needs --version");
    auto img = build_image(a, a.version);
    if (!img) return fail(2, img.error().to_string());
    // The staging slot: page-aligned, pre-faulted, laid out as the shard file.
    auto slot = engine::aligned_buffer::allocate(img->bytes.size());
    if (!slot) return fail(2, slot.error().to_string());
    std::memcpy(slot->data(), img->bytes.data(), img->bytes.size());
    auto t0 = std::chrono::steady_clock::now();
    status st = (*client)->checkpoint(slot->span().first(img->bytes.size()), img->header, mode);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st) return fail(3, st.to_string());
    std::printf("held %s/%s v%lld rank %u (%s, %.1f MB/s)\n", a.run.c_str(), a.name.c_str(),
                static_cast<long long>(a.version), a.rank, a.mode.c_str(), img->bytes.size() / 1e6 / secs);
    return 0;
  }

  if (replay->parsed()) {
    if (a.version < 0 || co.key.empty()) return fail(2, "replay needs --version and --key-file");
    auto held_one = [&](int64_t v) -> status {
      auto img = build_image(a, v);
      if (!img) return img.error();
      auto slot = engine::aligned_buffer::allocate(img->bytes.size());
      if (!slot) return slot.error();
      std::memcpy(slot->data(), img->bytes.data(), img->bytes.size());
      return (*client)->checkpoint(slot->span().first(img->bytes.size()), img->header, mode);
    };
    if (status st = held_one(a.version); !st) return fail(3, st.to_string());
    // A RELEASE as the application's library sends it, from an endpoint of its own.
    fabric::fabric_options fo = co.fabric;
    fo.progress_thread = true;
    auto ctx = fabric::fabric_context::create(fo);
    if (!ctx) return fail(2, ctx.error().to_string());
    auto peer = (*ctx)->insert_peer(*agent_name);
    if (!peer) return fail(2, peer.error().to_string());
    data_message rel;
    rel.type = data_msg::release;
    rel.request = 1;
    rel.session = 0x5eed5eed5eedULL;
    rel.sent_ns = agents::wall_ns();
    rel.run = a.run;
    rel.reply_to = (*ctx)->name();
    const std::string recorded = fabric::seal(co.key, kToAgent, encode_data_message(rel));
    auto answer = [&](double seconds) -> std::optional<data_message> {
      const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
      while (std::chrono::steady_clock::now() < end) {
        auto bytes = (*ctx)->recv(0.2);
        if (!bytes) continue;
        auto in = fabric::unseal(co.key, kFromAgent, *bytes);
        if (!in) continue;
        auto m = decode_data_message(*in);
        if (m && m->type == data_msg::released) return *m;
      }
      return std::nullopt;
    };
    if (status st = (*ctx)->send(*peer, recorded); !st) return fail(3, st.to_string());
    auto first = answer(a.timeout);
    if (!first) return fail(3, "no RELEASED for the original RELEASE");
    std::printf("released %lld version(s)\n", static_cast<long long>(first->version));
    if (status st = held_one(a.version + 1); !st) return fail(3, st.to_string());
    if (status st = (*ctx)->send(*peer, recorded); !st) return fail(3, st.to_string());
    if (auto again = answer(3)) return fail(4, "the agent answered the replayed RELEASE");
    auto list = (*client)->held(a.run, a.name, a.rank);
    if (!list) return fail(3, list.error().to_string());
    for (const auto& h : *list) std::printf("held %lld\n", static_cast<long long>(h.version));
    if (list->size() != 1 || list->front().version != a.version + 1)
      return fail(4, "the replayed RELEASE changed what the agent holds");
    std::printf("replay refused\n");
    return 0;
  }

  if (query->parsed()) {
    // QUERY: the versions held, one line "held V" each, and how long the answer took.
    auto t0 = std::chrono::steady_clock::now();
    auto list = (*client)->held(a.run, a.name, a.rank);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!list) return fail(3, list.error().to_string());
    for (const auto& h : *list) std::printf("held %lld\n", static_cast<long long>(h.version));
    std::printf("answered in %.3f s\n", secs);
    return 0;
  }

  // restore: a buffer large enough for the image of any version.
  auto probe = build_image(a, 0);
  if (!probe) return fail(2, probe.error().to_string());
  auto buf = engine::aligned_buffer::allocate(probe->bytes.size());
  if (!buf) return fail(2, buf.error().to_string());
  std::memset(buf->data(), 0x5a, buf->size());
  if (a.mode == "lend") {
    auto lease = (*client)->open_restore(a.run, a.name, a.rank, a.version);
    if (!lease) return fail(3, lease.error().to_string());
    const uint64_t n = lease->length;
    if (n > buf->size()) return fail(4, "the lent image is larger than any image checkpointed");
    status st;
    const uint64_t cuts[] = {0, n / 3 + 17, n - n / 5, n};
    for (int i = 0; st && i < 3; ++i)
      st = (*client)->read_restored(*lease, cuts[i], buf->span().subspan(cuts[i], cuts[i + 1] - cuts[i]));
    status past = (*client)->read_restored(*lease, n - 8, buf->span().subspan(0, 16));
    (*client)->close_restore(*lease, st);
    if (!st) return fail(3, st.to_string());
    if (past.code() != errc::invalid_argument) return fail(4, "a read past the lent image was not refused");
    auto expect = build_image(a, lease->version);
    if (!expect) return fail(2, expect.error().to_string());
    if (n != expect->bytes.size() || std::memcmp(buf->data(), expect->bytes.data(), n) != 0)
      return fail(4, "lent v" + std::to_string(lease->version) + " differs from the image that was checkpointed");
    std::printf("restored %s/%s v%lld rank %u (lend, %llu bytes in 3 ranges, equal)\n", a.run.c_str(),
                a.name.c_str(), static_cast<long long>(lease->version), a.rank, static_cast<unsigned long long>(n));
    return 0;
  }
  auto got = (*client)->restore(a.run, a.name, a.rank, a.version, buf->span(), mode);
  if (!got) return fail(3, got.error().to_string());
  auto expect = build_image(a, got->version);
  if (!expect) return fail(2, expect.error().to_string());
  if (got->length != expect->bytes.size() || std::memcmp(buf->data(), expect->bytes.data(), got->length) != 0)
    return fail(4, "restored v" + std::to_string(got->version) + " differs from the image that was checkpointed");
  std::printf("restored %s/%s v%lld rank %u (%s, %llu bytes, equal)\n", a.run.c_str(), a.name.c_str(),
              static_cast<long long>(got->version), a.rank, a.mode.c_str(),
              static_cast<unsigned long long>(got->length));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    return fail(2, std::string("internal error: ") + e.what());
  }
}
