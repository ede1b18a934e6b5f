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
//       for bit against the image `checkpoint` would have built.
//
// Exit status: 0 done (held / restored and equal); 3 not held or not
// restored (the agent's error or a timeout, on stderr); 4 restored but
// different; 2 bad arguments or no endpoint.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "agents/transfer.hpp"
#include "cairn.h"
#include "engine/staging.hpp"
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
};

result<test::shard_image> build_image(const args& a, int64_t version) {
  return test::make_shard_image(a.run, a.name, version, a.rank, a.nranks,
                                {{"data", CAIRN_UINT8, a.bytes, {}, false}, {"step", CAIRN_INT64, 1, {}, false}});
}

int fail(int code, const std::string& what) {
  std::fprintf(stderr, "cairn_agent_test_client: %s\n", what.c_str());
  return code;
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
    c->add_option("--mode", a.mode)->check(CLI::IsMember({"pull", "push"}));
    c->add_option("--threads", a.threads);
    c->add_option("--timeout", a.timeout);
  };
  CLI::App* ckpt = app.add_subcommand("checkpoint");
  CLI::App* rest = app.add_subcommand("restore");
  common(ckpt);
  common(rest);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  auto hex = storage::storage_env::posix()->read_all(a.agent_file);
  if (!hex) return fail(2, hex.error().to_string());
  auto agent_name = from_hex(*hex);
  if (!agent_name) return fail(2, agent_name.error().to_string());
  client_options co;
  co.fabric.provider = a.provider;
  co.fabric.node = a.node;
  co.fabric.timeout_s = a.timeout;
  co.threads = a.threads;
  co.reply_timeout_s = a.timeout;
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

  // restore: a buffer large enough for the image of any version.
  auto probe = build_image(a, 0);
  if (!probe) return fail(2, probe.error().to_string());
  auto buf = engine::aligned_buffer::allocate(probe->bytes.size());
  if (!buf) return fail(2, buf.error().to_string());
  std::memset(buf->data(), 0x5a, buf->size());
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
