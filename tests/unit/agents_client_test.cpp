// The client side of the agents that needs no network: agent views and their
// changes (cairn_probe's answer), the rank -> agent mapping, the HOLDING codec,
// and the commit by the last writer (format::commit_if_complete) with attempts.
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "cairn.h"
#include "client/agents_link.hpp"
#include "format/commit.hpp"
#include "format/layout.hpp"
#include "format/manifest.hpp"
#include "storage/storage_env.hpp"
#include "test_store.hpp"

#ifdef CAIRN_HAVE_FABRIC
#include "agents/data_protocol.hpp"
#endif

namespace cairn {
namespace {

agents_view view(std::vector<std::pair<uint64_t, std::string>> agents, uint64_t generation = 1) {
  agents_view v;
  v.app = 7;
  v.generation = generation;
  for (auto& [id, ep] : agents) v.agents.push_back({id, "node-" + std::to_string(id), ep});
  return v;
}

TEST(AgentsView, ChangesAreClassified) {
  auto one = view({{1, "aa"}});
  EXPECT_EQ(classify_change(one, one), CAIRN_AGENTS_UNCHANGED);
  EXPECT_EQ(classify_change(one, view({{1, "aa"}, {2, "bb"}})), CAIRN_AGENTS_EXPANDED);
  EXPECT_EQ(classify_change(view({{1, "aa"}, {2, "bb"}}), one), CAIRN_AGENTS_REDUCED);
  EXPECT_EQ(classify_change(one, view({{3, "cc"}})), CAIRN_AGENTS_MIGRATED);
  // The same agent restarted by its manager answers at a new address.
  EXPECT_EQ(classify_change(one, view({{1, "dd"}})), CAIRN_AGENTS_MIGRATED);
  EXPECT_EQ(classify_change(agents_view{}, agents_view{}), CAIRN_AGENTS_UNCHANGED);
}

TEST(AgentsView, EncodeDecodeRoundTripsAndReadiness) {
  auto v = view({{1, "aa"}, {2, ""}}, 42);
  v.target = 3;
  auto back = agents_view::decode(v.encode());
  ASSERT_TRUE(back) << back.error().to_string();
  EXPECT_EQ(back->app, 7u);
  EXPECT_EQ(back->generation, 42u);
  EXPECT_EQ(back->target, 3u);
  ASSERT_EQ(back->agents.size(), 2u);
  EXPECT_EQ(back->agents[1].id, 2u);
  EXPECT_EQ(back->agents[0].endpoint, "aa");
  EXPECT_FALSE(back->ready());
  EXPECT_TRUE(view({{1, "aa"}}).ready());
  EXPECT_FALSE(agents_view::decode("{\"app\": 1}"));
  EXPECT_FALSE(agents_view::decode("not json"));
}

TEST(AgentsView, RanksAreSplitInContiguousBlocks) {
  // 4 ranks, 2 agents: 0,1 -> 0; 2,3 -> 1. Every agent serves someone.
  EXPECT_EQ(agent_for_rank(0, 4, 2), 0u);
  EXPECT_EQ(agent_for_rank(1, 4, 2), 0u);
  EXPECT_EQ(agent_for_rank(2, 4, 2), 1u);
  EXPECT_EQ(agent_for_rank(3, 4, 2), 1u);
  for (int n : {1, 2, 3, 5, 7, 16}) {
    for (size_t k = 1; k <= static_cast<size_t>(n); ++k) {
      std::set<size_t> used;
      size_t prev = 0;
      for (int r = 0; r < n; ++r) {
        size_t a = agent_for_rank(r, n, k);
        ASSERT_LT(a, k);
        ASSERT_GE(a, prev);  // contiguous
        prev = a;
        used.insert(a);
      }
      EXPECT_EQ(used.size(), k) << n << " ranks, " << k << " agents";
    }
  }
}

TEST(AgentsView, AutoBindAddressIsTheRouteToTheController) {
  EXPECT_EQ(route_source_address("127.0.0.1:7420"), "127.0.0.1");
  EXPECT_EQ(route_source_address("not an address"), "127.0.0.1");
}

#ifdef CAIRN_HAVE_FABRIC
TEST(AgentsHolding, CodecRoundTripsAndRejectsGarbage) {
  std::vector<agents::held_info> v = {{4, 8192, 17}, {6, 4096, 4294967295u}};
  auto back = agents::decode_held(agents::encode_held(v));
  ASSERT_TRUE(back);
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].attempt, 4294967295u);
  EXPECT_EQ((*back)[0].length, 8192u);
  EXPECT_TRUE(agents::decode_held("")->empty());
  for (const char* bad : {"4", "4:1", "4:1:2x", "-1:1:1", "4:1:4294967296", "4:1:1,,"})
    EXPECT_FALSE(agents::decode_held(bad)) << bad;
}

// A sealed message taken twice, or long after it was sent, is a replay.
TEST(AgentsFreshness, ReplaysAndStaleMessagesAreRefused) {
  constexpr int64_t s = 1000000000;  // ns
  const int64_t t0 = 1800000000 * s;
  agents::replay_guard g(300);
  auto msg = [](uint64_t session, uint64_t request, agents::data_msg type, int64_t sent) {
    agents::data_message m;
    m.session = session;
    m.request = request;
    m.type = type;
    m.sent_ns = sent;
    return m;
  };
  using agents::data_msg;
  EXPECT_TRUE(g.admit(msg(7, 1, data_msg::ready, t0), t0));
  EXPECT_FALSE(g.admit(msg(7, 1, data_msg::ready, t0), t0 + s)) << "the same message again";
  EXPECT_TRUE(g.admit(msg(7, 1, data_msg::push_done, t0 + s), t0 + s)) << "the next step of one request";
  EXPECT_TRUE(g.admit(msg(7, 2, data_msg::release, t0 + 2 * s), t0 + 2 * s));
  EXPECT_FALSE(g.admit(msg(7, 1, data_msg::release, t0 + 3 * s), t0 + 3 * s)) << "an older request";
  EXPECT_FALSE(g.admit(msg(7, 2, data_msg::release, t0 + 2 * s), t0 + 4 * s)) << "a recorded RELEASE";
  // Another session (another client, or the same rank relaunched) starts anew.
  EXPECT_TRUE(g.admit(msg(8, 1, data_msg::release, t0 + 4 * s), t0 + 4 * s));
  // Outside the window either way, whatever the session.
  status old = g.admit(msg(9, 1, data_msg::query, t0), t0 + 301 * s);
  EXPECT_FALSE(old);
  EXPECT_NE(old.message().find("freshness window"), std::string::npos) << old.to_string();
  EXPECT_FALSE(g.admit(msg(9, 1, data_msg::query, t0 + 400 * s), t0 + 5 * s)) << "from the future";
  EXPECT_FALSE(g.admit(msg(0, 1, data_msg::query, t0 + 5 * s), t0 + 5 * s)) << "no session";
  // Silent sessions are forgotten after a window; their messages are stale by then.
  EXPECT_EQ(g.sessions(), 2u);
  EXPECT_TRUE(g.admit(msg(10, 1, data_msg::query, t0 + 700 * s), t0 + 700 * s));
  EXPECT_EQ(g.sessions(), 1u);
  EXPECT_FALSE(g.admit(msg(7, 2, data_msg::release, t0 + 2 * s), t0 + 700 * s));
}
#endif

// ---- commit by the last writer ----

class CommitTest : public ::testing::Test {
 protected:
  void write_shard(uint32_t rank, uint32_t attempt, int64_t version = 3, uint32_t nranks = 3) {
    auto img = test::make_shard_image("run", "ck", version, rank, nranks, {{"x", CAIRN_FLOAT64, 100, {}}});
    ASSERT_TRUE(img);
    img->header.attempt = attempt;
    format::encode_header(img->header, img->bytes);
    ASSERT_TRUE(test::write_file(format::shard_path(dir.path(), "run", "ck", version, rank), img->bytes.data(),
                                 img->bytes.size()));
    last = img->header;
  }
  result<bool> commit() { return format::commit_if_complete(env, dir.path(), last, "test", "agent"); }
  std::string manifest() { return format::manifest_path(dir.path(), "run", "ck", 3); }

  test::temp_dir dir;
  storage::storage_env* env = storage::storage_env::posix();
  format::shard_header last;
};

TEST_F(CommitTest, OnlyTheWriterOfTheLastShardCommits) {
  write_shard(0, 9);
  EXPECT_FALSE(*commit());
  write_shard(2, 9);
  EXPECT_FALSE(*commit());
  EXPECT_FALSE(env->exists(manifest()));
  write_shard(1, 9);
  EXPECT_TRUE(*commit());
  auto m = format::read_manifest(env, manifest());
  ASSERT_TRUE(m) << m.error().to_string();
  EXPECT_EQ(m->nranks, 3u);
  EXPECT_EQ(m->mode, "agent");
  ASSERT_EQ(m->shards.size(), 3u);
  for (uint32_t r = 0; r < 3; ++r) {
    auto h = format::read_header(env, format::shard_path(dir.path(), "run", "ck", 3, r));
    ASSERT_TRUE(h);
    EXPECT_EQ(m->shards[r].header_checksum, h->header_checksum);
    EXPECT_EQ(m->shards[r].size, h->file_size);
  }
  // A second writer finding the same set: committed already, nothing rewritten.
  auto before = env->read_all(manifest());
  EXPECT_TRUE(*commit());
  EXPECT_EQ(*env->read_all(manifest()), *before);
}

TEST_F(CommitTest, ShardsOfAnotherAttemptNeverMix) {
  write_shard(0, 1);  // left by a failed execution
  write_shard(1, 1);
  write_shard(2, 2);  // the restarted execution's first shard
  EXPECT_FALSE(*commit());
  EXPECT_FALSE(env->exists(manifest()));
  write_shard(0, 2);
  write_shard(1, 2);
  EXPECT_TRUE(*commit());
  EXPECT_TRUE(env->exists(manifest()));
}

TEST_F(CommitTest, AStaleManifestIsReplacedByTheCompleteNewSet) {
  for (uint32_t r = 0; r < 3; ++r) write_shard(r, 1);
  ASSERT_TRUE(*commit());
  auto old = format::read_manifest(env, manifest());
  for (uint32_t r = 0; r < 3; ++r) write_shard(r, 2);
  ASSERT_TRUE(*commit());
  auto now = format::read_manifest(env, manifest());
  ASSERT_TRUE(old && now);
  // The shard bytes are equal but their headers (attempt) differ.
  EXPECT_NE(old->shards[0].header_checksum, now->shards[0].header_checksum);
}

TEST_F(CommitTest, DamagedOrMisnamedShardsDoNotCommit) {
  write_shard(0, 5);
  write_shard(1, 5);
  std::string p2 = format::shard_path(dir.path(), "run", "ck", 3, 2);
  ASSERT_TRUE(test::write_file(p2, "garbage", 7));
  EXPECT_FALSE(*commit());
  // A shard of another rank count in rank 2's place.
  auto img = test::make_shard_image("run", "ck", 3, 2, 4, {{"x", CAIRN_FLOAT64, 100, {}}});
  img->header.attempt = 5;
  format::encode_header(img->header, img->bytes);
  ASSERT_TRUE(test::write_file(p2, img->bytes.data(), img->bytes.size()));
  EXPECT_FALSE(*commit());
  EXPECT_FALSE(env->exists(manifest()));
}

TEST_F(CommitTest, ConcurrentCommittersLeaveOneValidManifest) {
  for (uint32_t r = 0; r < 3; ++r) write_shard(r, 8);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&] {
      for (int k = 0; k < 20; ++k) {
        (void)env->remove_file(manifest());
        auto c = commit();
        if (c && *c) ++ok;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 160);
  (void)commit();
  EXPECT_TRUE(format::read_manifest(env, manifest()));
  auto names = env->list(format::version_dir(dir.path(), "run", "ck", 3));
  ASSERT_TRUE(names);
  for (const auto& n : *names) EXPECT_EQ(n.find(".tmp"), std::string::npos) << n;
}

}  // namespace
}  // namespace cairn
