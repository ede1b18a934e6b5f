// Node-loss redundancy without MPI or a network: sets across nodes, the
// rotated stripes, the ISA-L codec (every loss pattern it must survive is
// decoded back bit for bit) and the parity file header.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "redundancy/codec.hpp"
#include "redundancy/parity_file.hpp"
#include "redundancy/sets.hpp"

using namespace cairn::redundancy;

TEST(RedundancySets, RoundRobinOverNodes) {
  // Two nodes of two ranks: sets {0,2} and {1,3}, never two ranks of a node.
  auto s = form_sets({"a", "a", "b", "b"}, scheme::partner, 8, 2);
  ASSERT_TRUE(s.is_ok()) << s.error().to_string();
  EXPECT_EQ(*s, (std::vector<std::vector<uint32_t>>{{0, 2}, {1, 3}}));
  // Eight nodes of two ranks, sets of 4: every set spans 4 nodes.
  std::vector<std::string> nodes;
  for (int r = 0; r < 16; ++r) nodes.push_back("n" + std::to_string(r / 2));
  auto t = form_sets(nodes, scheme::rs, 4, 2);
  ASSERT_TRUE(t.is_ok());
  ASSERT_EQ(t->size(), 4u);
  for (const auto& set : *t) {
    std::set<std::string> distinct;
    for (uint32_t r : set) distinct.insert(nodes[r]);
    EXPECT_EQ(distinct.size(), set.size());
  }
}

TEST(RedundancySets, CannotFormIsAClearError) {
  auto one = form_sets({"a", "a"}, scheme::xor_parity, 8, 2);
  ASSERT_FALSE(one.is_ok());
  EXPECT_NE(one.error().message().find("on 1 node(s)"), std::string::npos) << one.error().message();
  auto rs = form_sets({"a", "b"}, scheme::rs, 8, 2);
  ASSERT_FALSE(rs.is_ok());
  EXPECT_NE(rs.error().message().find("at least 3"), std::string::npos);
  // Uneven nodes: a set would hold two ranks of node a.
  auto uneven = form_sets({"a", "a", "a", "b"}, scheme::xor_parity, 2, 2);
  ASSERT_FALSE(uneven.is_ok());
  EXPECT_NE(uneven.error().message().find("share a set on node 'a'"), std::string::npos) << uneven.error().message();
}

TEST(RedundancyGeometry, EveryChunkInExactlyOneStripe) {
  for (auto kind : {scheme::partner, scheme::xor_parity, scheme::rs}) {
    geometry g{kind, 6, kind == scheme::rs ? 2u : 1u};
    for (uint32_t p = 0; p < g.k; ++p) {
      std::vector<int> seen(g.d(), 0);
      for (uint32_t s = 0; s < g.k; ++s) {
        int j = g.chunk_of(p, s);
        auto h = g.holders(s);
        if (j >= 0) {
          ++seen[j];
          EXPECT_EQ(std::count(h.begin(), h.end(), p), 0) << "a holder contributes to its own stripe";
        }
      }
      for (int n : seen) EXPECT_EQ(n, 1);
      EXPECT_EQ(g.held_stripes(p).size(), g.m);
    }
  }
}

// Encodes a set of k random images and, for every pattern of `lost`
// positions, decodes each lost member's chunks from the survivors.
static void round_trip(scheme kind, uint32_t k, uint32_t m, uint32_t lost) {
  geometry g{kind, k, m};
  codec c(g);
  const uint32_t d = g.d();
  std::mt19937_64 rng(k * 131 + m);
  std::vector<std::vector<unsigned char>> img(k);
  for (auto& v : img) {
    v.resize(4096 * 3 + rng() % 20000);
    for (auto& b : v) b = static_cast<unsigned char>(rng());
  }
  auto chunk = [&](uint32_t p, int j, uint64_t len) {
    std::vector<unsigned char> out(len, 0);
    const uint64_t cb = g.chunk_bytes(img[p].size()), from = j * cb;
    if (from < img[p].size()) std::memcpy(out.data(), img[p].data() + from, std::min(cb, img[p].size() - from));
    return out;
  };
  auto stripe_len = [&](uint32_t s) {
    uint64_t len = 0;
    for (uint32_t p : g.contributors(s)) len = std::max(len, g.chunk_bytes(img[p].size()));
    return len;
  };
  // parity[s][r]
  std::vector<std::vector<std::vector<unsigned char>>> parity(k);
  for (uint32_t s = 0; s < k; ++s) {
    const uint64_t len = stripe_len(s);
    std::vector<std::vector<unsigned char>> data;
    std::vector<const unsigned char*> ptrs;
    for (uint32_t p : g.contributors(s)) data.push_back(chunk(p, g.chunk_of(p, s), len));
    for (auto& v : data) ptrs.push_back(v.data());
    for (uint32_t r = 0; r < m; ++r) {
      parity[s].emplace_back(len);
      c.encode(r, ptrs.data(), parity[s][r].data(), len);
    }
  }
  for (uint32_t mask = 0; mask < (1u << k); ++mask) {
    if (static_cast<uint32_t>(__builtin_popcount(mask)) != lost) continue;
    for (uint32_t p = 0; p < k; ++p) {
      if (!(mask >> p & 1)) continue;
      for (uint32_t s = 0; s < k; ++s) {
        const int j = g.chunk_of(p, s);
        if (j < 0) continue;
        const uint64_t len = stripe_len(s);
        auto contrib = g.contributors(s);
        auto holders = g.holders(s);
        std::vector<uint32_t> rows;
        std::vector<std::vector<unsigned char>> blocks;
        uint32_t lost_t = 0;
        for (uint32_t t = 0; t < contrib.size(); ++t) {
          if (contrib[t] == p) lost_t = t;
          else if (!(mask >> contrib[t] & 1) && rows.size() < d) {
            rows.push_back(t);
            blocks.push_back(chunk(contrib[t], g.chunk_of(contrib[t], s), len));
          }
        }
        for (uint32_t r = 0; r < m && rows.size() < d; ++r)
          if (!(mask >> holders[r] & 1)) {
            rows.push_back(d + r);
            blocks.push_back(parity[s][r]);
          }
        ASSERT_EQ(rows.size(), d) << g.describe() << " mask " << mask << " stripe " << s;
        auto tables = c.decoder(rows, lost_t);
        ASSERT_TRUE(tables.is_ok());
        std::vector<const unsigned char*> ptrs;
        for (auto& b : blocks) ptrs.push_back(b.data());
        std::vector<unsigned char> out(len);
        c.decode(*tables, ptrs.data(), out.data(), len);
        EXPECT_EQ(out, chunk(p, j, len)) << g.describe() << " lost mask " << mask << " position " << p;
      }
    }
  }
}

TEST(RedundancyCodec, PartnerSurvivesOneLoss) { round_trip(scheme::partner, 4, 1, 1); }
TEST(RedundancyCodec, XorSurvivesOneLoss) { round_trip(scheme::xor_parity, 5, 1, 1); }
TEST(RedundancyCodec, RsSurvivesTwoLosses) { round_trip(scheme::rs, 6, 2, 2); }
TEST(RedundancyCodec, RsSurvivesThreeLosses) { round_trip(scheme::rs, 8, 3, 3); }

TEST(RedundancyParityFile, HeaderRoundTripAndDamage) {
  parity_header h;
  h.run = "r";
  h.name = "ckpt";
  h.version = 6;
  h.nranks = 8;
  h.geo = {scheme::rs, 4, 2};
  h.position = 1;
  for (uint32_t p = 0; p < 4; ++p) h.set.push_back({p * 2, "node" + std::to_string(p), 70000 + p, 0x1234 + p});
  h.blocks = {{1, 1, 0, 24576, 0xabc}, {2, 0, 0, 24576, 0xdef}};
  std::string head = encode_parity_header(&h);
  ASSERT_EQ(head.size() % 4096, 0u);
  EXPECT_EQ(h.blocks[0].offset, head.size());
  EXPECT_EQ(h.blocks[1].offset, head.size() + 24576);
  auto bytes = std::as_bytes(std::span(head.data(), head.size()));
  auto d = decode_parity_header(bytes, "x");
  ASSERT_TRUE(d.is_ok()) << d.error().to_string();
  EXPECT_EQ(d->set[3].node, "node3");
  EXPECT_EQ(d->set[2].header_checksum, 0x1236u);
  EXPECT_EQ(d->blocks[1].checksum, 0xdefu);
  head[40] ^= 1;
  auto bad = decode_parity_header(std::as_bytes(std::span(head.data(), head.size())), "x");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.error().message().find("header checksum mismatch"), std::string::npos);
  // Re-sealed headers with members that are not distinct ranks of the job:
  // a rebuild would index past the job's ranks.
  for (uint32_t forged : {8u, 2u}) {
    parity_header f = h;
    f.set[3].rank = forged;  // out of range, or a duplicate of member 1
    std::string text = encode_parity_header(&f);
    auto r = decode_parity_header(std::as_bytes(std::span(text.data(), text.size())), "x");
    ASSERT_FALSE(r.is_ok()) << forged;
    EXPECT_NE(r.error().message().find("is not a distinct rank"), std::string::npos) << r.error().message();
  }
}
