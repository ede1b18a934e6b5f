// Control plane of the remote checkpoint agents (src/agents, docs/format/control.md):
// framing and authentication, placement, the break-even rule, the controller's
// state and journal, metrics parsing, and the services over loopback.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "agents/auth.hpp"
#include "agents/controller.hpp"
#include "agents/controller_state.hpp"
#include "agents/journal.hpp"
#include "agents/manager.hpp"
#include "agents/metrics.hpp"
#include "agents/metrics_http.hpp"
#include "agents/net.hpp"
#include "agents/placement.hpp"
#include "agents/protocol.hpp"
#include "agents/wire.hpp"
#include "storage/storage_env.hpp"
#include "util/clock.hpp"
#include "util/hex.hpp"

// Hints are written with designated initializers that leave the rest at its
// default (C++20); gcc 12 warns about each omitted member all the same.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif

namespace cairn::agents {
namespace {

using nlohmann::json;

const std::string kSecret = "0123456789abcdef0123456789abcdef";
const std::string kServiceSecret = "fedcba9876543210fedcba9876543210";

class agents_env : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(crypto_init());
    char tmpl[] = "/tmp/cairn-agents-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { ASSERT_TRUE(storage::storage_env::posix()->remove_tree(dir_)); }
  std::string dir_;
};

// ---- framing ----------------------------------------------------------------

std::string frame(ctl_type t, uint64_t seq, const std::string& payload, const std::string& key = kSecret) {
  return encode_frame(key, t, seq, payload);
}

decoded_frame decode(const std::string& bytes, uint32_t limit = kDefaultMaxPayload) {
  return decode_frame(bytes, kSecret, limit);
}

// Recomputes the tag after the header or payload was altered, so that the
// check under test is the one that fires (not the tag).
std::string retag(std::string f) {
  f.resize(f.size() - kTagSize);
  return f + hmac(kSecret, f);
}

TEST(agents_wire, round_trip) {
  std::string payload = R"({"node":"n1","x":[1,2,3]})";
  std::string f = frame(ctl_type::heartbeat, 42, payload);
  ASSERT_EQ(f.size(), kHeaderSize + payload.size() + kTagSize);
  EXPECT_EQ(f.substr(0, 4), "CRNC");
  const std::string buf = f + "trailing";  // d.payload points into it
  decoded_frame d = decode(buf);
  ASSERT_EQ(d.what, decoded_frame::kind::frame) << d.detail;
  EXPECT_EQ(d.header.type, static_cast<uint16_t>(ctl_type::heartbeat));
  EXPECT_EQ(d.header.seq, 42u);
  EXPECT_EQ(d.header.version, kProtocolVersion);
  EXPECT_EQ(std::string(d.payload), payload);
  EXPECT_EQ(d.consumed, f.size());
  auto j = util::parse_json_object(d.payload);
  ASSERT_TRUE(j);
  EXPECT_EQ((*j)["node"], "n1");
}

TEST(agents_wire, every_prefix_of_a_frame_needs_more) {
  std::string f = frame(ctl_type::status, 1, "{}");
  for (size_t n = 0; n < f.size(); ++n) {
    decoded_frame d = decode(f.substr(0, n));
    EXPECT_EQ(d.what, decoded_frame::kind::need_more) << "prefix " << n;
  }
}

TEST(agents_wire, garbage_is_bad_magic_from_the_first_byte) {
  for (std::string g : {std::string("G"), std::string("GET / HTTP/1.1\r\n\r\n"), std::string(100, '\0')}) {
    decoded_frame d = decode(g);
    ASSERT_EQ(d.what, decoded_frame::kind::error);
    EXPECT_EQ(d.error, frame_error::bad_magic);
  }
}

TEST(agents_wire, bad_version_type_flags_are_refused_by_the_header) {
  std::string f = frame(ctl_type::status, 1, "{}");
  std::string v = f;
  v[4] = static_cast<char>(kProtocolVersion + 1);  // a version this build does not speak
  EXPECT_EQ(decode(retag(v)).error, frame_error::bad_version);
  std::string t = f;
  t[6] = static_cast<char>(0xe7);  // type 999
  t[7] = 0x03;
  EXPECT_EQ(decode(retag(t)).error, frame_error::bad_type);
  std::string fl = f;
  fl[20] = 1;
  EXPECT_EQ(decode(retag(fl)).error, frame_error::bad_flags);
  // Header alone is enough to refuse them.
  EXPECT_EQ(decode(v.substr(0, kHeaderSize)).error, frame_error::bad_version);
}

TEST(agents_wire, oversized_is_refused_before_the_payload_arrives) {
  std::string h = encode_header(ctl_type::status, 1, kDefaultMaxPayload + 1);
  decoded_frame d = decode(h);
  ASSERT_EQ(d.what, decoded_frame::kind::error);
  EXPECT_EQ(d.error, frame_error::oversized);
  // At the limit exactly, the header is fine and the decoder waits for the payload.
  EXPECT_EQ(decode(encode_header(ctl_type::status, 1, kDefaultMaxPayload)).what, decoded_frame::kind::need_more);
  // A smaller configured limit applies.
  EXPECT_EQ(decode(frame(ctl_type::status, 1, std::string(100, ' ')), 99).error, frame_error::oversized);
  // A length of 2^32-1 does not overflow anything.
  EXPECT_EQ(decode(encode_header(ctl_type::status, 1, 0xffffffffu)).error, frame_error::oversized);
}

TEST(agents_wire, altered_or_foreign_frames_fail_the_tag) {
  std::string f = frame(ctl_type::heartbeat, 7, R"({"a":1})");
  for (size_t i : {size_t{8}, size_t{kHeaderSize + 2}, f.size() - 1}) {  // sequence, payload, tag
    std::string x = f;
    x[i] ^= 0x01;
    decoded_frame d = decode(x);
    ASSERT_EQ(d.what, decoded_frame::kind::error) << i;
    EXPECT_EQ(d.error, frame_error::bad_tag) << i;
  }
  EXPECT_EQ(decode(frame(ctl_type::heartbeat, 7, "{}", "another secret of 32 bytes......")).error, frame_error::bad_tag);
  // A frame with no tag at all is unauthenticated: it never completes a frame.
  std::string untagged = f.substr(0, f.size() - kTagSize);
  EXPECT_EQ(decode(untagged).what, decoded_frame::kind::need_more);
  EXPECT_EQ(decode(untagged + std::string(kTagSize, '\0')).error, frame_error::bad_tag);
}

TEST(agents_wire, hmac_is_hmac_sha512_truncated) {
  // RFC 4231 test case 2 (HMAC-SHA-512), first 32 bytes: libsodium's
  // crypto_auth_hmacsha512256, which is what other implementations must compute.
  EXPECT_EQ(util::hex_encode(hmac("Jefe", "what do ya want for nothing?")),
            "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea250554");
}

namespace {

// Both ends' keys as a handshake would leave them (tag keys from a secret,
// cipher keys from a key exchange).
struct session_pair {
  session client, server;
};
session_pair handshake_keys() {
  const box_keypair c = new_box_keypair(), s = new_box_keypair();
  const session_keys tag = derive_session_keys("a deployment secret", std::string(kNonceSize, 'c'),
                                               std::string(kNonceSize, 's'));
  auto cc = client_cipher_keys(c, s.public_key);
  auto sc = server_cipher_keys(s, c.public_key);
  EXPECT_TRUE(cc && sc);
  EXPECT_EQ(cc->c2s, sc->c2s);
  EXPECT_EQ(cc->s2c, sc->s2c);
  EXPECT_NE(cc->c2s, cc->s2c);
  return {session(tag, *cc, true), session(tag, *sc, false)};
}

}  // namespace

TEST(agents_wire, session_rejects_replayed_and_skipped_frames) {
  auto [tx, rx] = handshake_keys();
  std::string f1 = tx.seal(ctl_type::status, "{}");
  std::string f2 = tx.seal(ctl_type::status, "{}");
  std::string f3 = tx.seal(ctl_type::status, "{}");
  std::string plain;
  ASSERT_EQ(rx.open(f1, kDefaultMaxPayload, &plain).what, decoded_frame::kind::frame);
  EXPECT_EQ(plain, "{}");
  decoded_frame again = rx.open(f1, kDefaultMaxPayload, &plain);
  EXPECT_EQ(again.error, frame_error::replayed);
  EXPECT_EQ(rx.open(f3, kDefaultMaxPayload, &plain).error, frame_error::bad_sequence);
  ASSERT_EQ(rx.open(f2, kDefaultMaxPayload, &plain).what, decoded_frame::kind::frame);
  ASSERT_EQ(rx.open(f3, kDefaultMaxPayload, &plain).what, decoded_frame::kind::frame);
  // A frame sealed for the other direction (reflection) fails the tag.
  EXPECT_EQ(rx.open(rx.seal(ctl_type::status, "{}"), kDefaultMaxPayload, &plain).error, frame_error::bad_tag);
}

TEST(agents_wire, payloads_after_the_handshake_are_unreadable_without_the_exchanged_keys) {
  auto [client, server] = handshake_keys();
  const std::string body = R"({"app":7,"proof":"0123456789abcdef","name":"a-secret-name"})";
  const std::string f = client.seal(ctl_type::app_progress, body);
  // On the wire: neither the body nor any field name is readable.
  EXPECT_EQ(f.find("a-secret-name"), std::string::npos);
  EXPECT_EQ(f.find("proof"), std::string::npos);
  // Someone with the secret and both nonces (the tag keys) but another key
  // exchange gets an authentic frame and garbage.
  session eve_server = handshake_keys().server;
  std::string plain;
  ASSERT_EQ(eve_server.open(f, kDefaultMaxPayload, &plain).what, decoded_frame::kind::frame);
  EXPECT_NE(plain, body);
  EXPECT_FALSE(util::parse_json_object(plain));
  ASSERT_EQ(server.open(f, kDefaultMaxPayload, &plain).what, decoded_frame::kind::frame);
  EXPECT_EQ(plain, body);
  // A key exchange key of the wrong size or a low-order point is refused.
  const box_keypair c = new_box_keypair();
  EXPECT_FALSE(client_cipher_keys(c, "short"));
  EXPECT_FALSE(server_cipher_keys(c, std::string(kBoxPublicKeySize, '\0')));
}

TEST(agents_wire, payloads_must_be_shallow_json_objects) {
  EXPECT_TRUE(util::parse_json_object("{}"));
  EXPECT_TRUE(util::parse_json_object(R"({"s":"[[[[[[[[[[[[[[[[[[[[[[[[[["})"));  // brackets inside strings do not count
  for (std::string bad : {std::string("[1,2]"), std::string("\"x\""), std::string("{"), std::string("not json"),
                          std::string(""), std::string("{\"a\":\"\xff\xfe\"}"), std::string(100, '[') + std::string(100, ']'),
                          "{\"a\":" + std::string(17, '[') + std::string(17, ']') + "}"}) {
    auto r = util::parse_json_object(bad);
    EXPECT_FALSE(r) << bad.substr(0, 40);
    if (!r) {
      EXPECT_EQ(r.error().code(), errc::invalid_argument);
    }
  }
}

TEST(agents_wire, fields_check_types_and_ranges) {
  json j = {{"s", "x"}, {"n", -1}, {"u", 5}, {"f", 1.5}, {"b", true}, {"o", json::object()}};
  {
    fields f(j, "m");
    uint64_t u = 0;
    EXPECT_FALSE(f.u64("n", &u));  // negative
    EXPECT_NE(f.error().message().find("'n'"), std::string::npos);
  }
  {
    fields f(j, "m");
    std::string s;
    EXPECT_FALSE(f.str("u", &s));
  }
  {
    fields f(j, "m");
    uint32_t u = 0;
    EXPECT_FALSE(f.u32("u", &u, true, 4));
  }
  {
    fields f(j, "m");
    std::string s;
    EXPECT_FALSE(f.str("missing", &s));
    EXPECT_NE(f.error().message().find("missing field 'missing'"), std::string::npos);
  }
  {
    fields f(j, "m");
    std::string s;
    uint64_t u = 0;
    double d = 0;
    bool b = false;
    EXPECT_TRUE(f.str("s", &s) && f.u64("u", &u) && f.num("f", &d) && f.boolean("b", &b) && f.object("o"));
    EXPECT_TRUE(f.ok());
    EXPECT_EQ(u, 5u);
  }
  EXPECT_FALSE(parse_metrics(json{{"mem_total", 1}}));
  EXPECT_FALSE(parse_hints(json{{"ranks", "four"}}));
  EXPECT_FALSE(valid_name("a b"));
  EXPECT_FALSE(valid_name(""));
  EXPECT_FALSE(valid_name(std::string(129, 'a')));
  EXPECT_TRUE(valid_name("node-1.example:7@x"));
}

// ---- connections over a socket pair -------------------------------------------

struct pair_fixture {
  pair_fixture(const std::string& client_secret = kSecret) {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    client_fd = sv[0];
    server = std::make_unique<connection>(unique_fd(sv[1]), connection::side::server, kSecret, net_limits{}, "test",
                                          0.0, &nonces);
    if (!client_secret.empty()) {
      client = std::make_unique<connection>(unique_fd(sv[0]), connection::side::client, client_secret, net_limits{},
                                            "test", 0.0);
    }
  }
  // Moves bytes both ways until nothing moves; returns messages each side got.
  bool pump(std::vector<ctl_message>* at_server, std::vector<ctl_message>* at_client) {
    for (int i = 0; i < 10; ++i) {
      if (client && !client->on_writable(0)) return false;
      if (!server->on_readable(0, at_server)) return false;
      if (!server->on_writable(0)) return false;
      if (client && !client->on_readable(0, at_client)) return false;
    }
    return true;
  }
  nonce_cache nonces;
  int client_fd = -1;
  std::unique_ptr<connection> server;
  std::unique_ptr<connection> client;
};

TEST(agents_connection, handshake_then_messages_both_ways) {
  pair_fixture p;
  p.client->start_client("admin", "tester");
  p.client->send(ctl_type::status, json::object());
  std::vector<ctl_message> s, c;
  ASSERT_TRUE(p.pump(&s, &c)) << p.server->close_reason();
  ASSERT_TRUE(p.server->established());
  ASSERT_TRUE(p.client->established());
  EXPECT_EQ(p.server->role(), "admin");
  EXPECT_EQ(p.server->peer_id(), "tester");
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].type, ctl_type::status);
  p.server->send(ctl_type::reply, json{{"ok", true}});
  ASSERT_TRUE(p.pump(&s, &c));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].body["ok"], true);
}

TEST(agents_connection, wrong_secret_is_rejected_as_bad_tag) {
  pair_fixture p("not the deployment secret at all");
  p.client->start_client("admin", "");
  std::vector<ctl_message> s, c;
  EXPECT_FALSE(p.pump(&s, &c));
  EXPECT_TRUE(p.server->rejected());
  EXPECT_EQ(p.server->close_reason().rfind("bad_tag", 0), 0u) << p.server->close_reason();
  EXPECT_TRUE(s.empty());
}

TEST(agents_connection, first_message_must_be_a_hello) {
  pair_fixture p("");
  std::string f = frame(ctl_type::status, 0, "{}");  // authentic, but no handshake
  ASSERT_EQ(::write(p.client_fd, f.data(), f.size()), static_cast<ssize_t>(f.size()));
  std::vector<ctl_message> s;
  EXPECT_FALSE(p.server->on_readable(0, &s));
  EXPECT_EQ(p.server->close_reason().rfind("unexpected", 0), 0u) << p.server->close_reason();
  ::close(p.client_fd);
}

TEST(agents_connection, replayed_hello_is_rejected) {
  std::string nonce(kNonceSize, 'n');
  std::string hello = frame(ctl_type::hello, 0,
                            util::dump_json(json{{"role", "admin"},
                                                 {"id", ""},
                                                 {"nonce", util::hex_encode(nonce)},
                                                 {"kx", util::hex_encode(new_box_keypair().public_key)}}));
  nonce_cache shared;
  for (int round = 0; round < 2; ++round) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    connection server(unique_fd(sv[1]), connection::side::server, kSecret, net_limits{}, "test", 0.0, &shared);
    ASSERT_EQ(::write(sv[0], hello.data(), hello.size()), static_cast<ssize_t>(hello.size()));
    std::vector<ctl_message> s;
    bool alive = server.on_readable(0, &s);
    if (round == 0) {
      EXPECT_TRUE(alive);
      EXPECT_TRUE(server.established());
    } else {
      EXPECT_FALSE(alive);
      EXPECT_EQ(server.close_reason().rfind("replayed", 0), 0u) << server.close_reason();
    }
    ::close(sv[0]);
  }
}

TEST(agents_connection, truncated_frame_at_close_is_reported) {
  pair_fixture p("");
  std::string f = frame(ctl_type::hello, 0, "{\"role\":\"admin\"}");
  ASSERT_EQ(::write(p.client_fd, f.data(), 10), 10);
  ::close(p.client_fd);
  std::vector<ctl_message> s;
  EXPECT_FALSE(p.server->on_readable(0, &s));
  EXPECT_EQ(p.server->close_reason().rfind("truncated", 0), 0u) << p.server->close_reason();
}

TEST(agents_connection, slow_peers_and_silent_handshakes_time_out) {
  net_limits lim;
  lim.handshake_timeout_s = 100;  // so that the frame timeout fires first
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
  connection slow(unique_fd(sv[1]), connection::side::server, kSecret, lim, "test", 0.0);
  std::string f = frame(ctl_type::hello, 0, "{\"role\":\"admin\"}");
  ASSERT_EQ(::write(sv[0], f.data(), 5), 5);
  std::vector<ctl_message> s;
  ASSERT_TRUE(slow.on_readable(1.0, &s));
  EXPECT_TRUE(slow.check_timeouts(1.0 + lim.frame_timeout_s - 1));
  EXPECT_FALSE(slow.check_timeouts(1.0 + lim.frame_timeout_s + 1));
  EXPECT_NE(slow.close_reason().find("slow peer"), std::string::npos) << slow.close_reason();
  ::close(sv[0]);
  lim = net_limits{};
  pair_fixture q("");
  EXPECT_TRUE(q.server->check_timeouts(lim.handshake_timeout_s - 0.5));
  EXPECT_FALSE(q.server->check_timeouts(lim.handshake_timeout_s + 0.5));
  EXPECT_NE(q.server->close_reason().find("handshake"), std::string::npos);
  ::close(q.client_fd);
}

TEST(agents_connection, invalid_json_in_an_authentic_frame_gets_an_error_reply) {
  pair_fixture p;
  p.client->start_client("admin", "");
  std::vector<ctl_message> s, c;
  ASSERT_TRUE(p.pump(&s, &c));
  // Craft an authentic frame with a non-object payload by sealing it ourselves
  // would need the session key; instead send through the client with a valid
  // body and check the server's error path via an invalid body type.
  p.client->send(ctl_type::status, json::array({1, 2}));  // a JSON array, not an object
  ASSERT_TRUE(p.pump(&s, &c));
  EXPECT_TRUE(s.empty());
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].type, ctl_type::error);
  EXPECT_EQ(c[0].body["code"], "invalid_argument");
  EXPECT_TRUE(p.server->established());  // the stream is intact: the connection stays
}

// ---- placement -----------------------------------------------------------------

std::vector<node_view> four_nodes() {
  // id, free slots, mem_free, bw in use, activity, power
  return {{"n1", 4, 8ull << 30, 300e6, 0.5, 250},
          {"n2", 4, 32ull << 30, 100e6, 2.0, 180},
          {"n3", 4, 16ull << 30, 200e6, 0.1, 300},
          {"n4", 4, 4ull << 30, 100e6, 1.0, 120}};
}

std::vector<std::string> ids(const std::vector<node_view>& v, const std::vector<size_t>& order) {
  std::vector<std::string> out;
  for (size_t i : order) out.push_back(v[i].id);
  return out;
}

using strs = std::vector<std::string>;

TEST(agents_placement, strategies_rank_by_their_metric) {
  auto v = four_nodes();
  // Least bandwidth in use; n2 and n4 tie at 100 MB/s and have equal free slots: by id.
  EXPECT_EQ(ids(v, rank_nodes(v, strategy::bandwidth, 0)), (strs{"n2", "n4", "n3", "n1"}));
  EXPECT_EQ(ids(v, rank_nodes(v, strategy::memory, 0)), (strs{"n2", "n3", "n1", "n4"}));
  EXPECT_EQ(ids(v, rank_nodes(v, strategy::activity, 0)), (strs{"n3", "n1", "n4", "n2"}));
  EXPECT_EQ(ids(v, rank_nodes(v, strategy::power, 0)), (strs{"n4", "n2", "n1", "n3"}));
  // Ties: more free slots first.
  v[3].free_slots = 1;
  EXPECT_EQ(ids(v, rank_nodes(v, strategy::bandwidth, 0)), (strs{"n2", "n4", "n3", "n1"}));
  v[1].free_slots = 1;
  v[3].free_slots = 2;
  EXPECT_EQ(ids(v, rank_nodes(v, strategy::bandwidth, 0)), (strs{"n4", "n2", "n3", "n1"}));
}

TEST(agents_placement, nodes_without_room_are_not_chosen) {
  auto v = four_nodes();
  v[1].free_slots = 0;  // n2 full
  EXPECT_EQ(ids(v, rank_nodes(v, strategy::memory, 0)), (strs{"n3", "n1", "n4"}));
  // An agent needs 6 GiB: n4 (4 GiB free) cannot take one.
  v[1].free_slots = 4;
  EXPECT_EQ(ids(v, rank_nodes(v, strategy::bandwidth, 6ull << 30)), (strs{"n2", "n3", "n1"}));
  EXPECT_EQ(node_room(v[0], 3ull << 30), 2u);  // 8 GiB / 3 GiB
  EXPECT_EQ(node_room(v[1], 0), 4u);
}

TEST(agents_placement, distributions_give_exact_assignments) {
  auto v = four_nodes();
  std::vector<size_t> order = {0, 1, 2, 3};
  EXPECT_EQ(distribute(v, order, 7, distribution::round_robin, 0, 0),
            (strs{"n1", "n2", "n3", "n4", "n1", "n2", "n3"}));
  EXPECT_EQ(distribute(v, order, 7, distribution::block, 2, 0),
            (strs{"n1", "n1", "n2", "n2", "n3", "n3", "n4"}));
  EXPECT_EQ(distribute(v, order, 11, distribution::block, 3, 0),
            (strs{"n1", "n1", "n1", "n2", "n2", "n2", "n3", "n3", "n3", "n4", "n4"}));
  EXPECT_EQ(distribute(v, order, 7, distribution::fill, 0, 0),
            (strs{"n1", "n1", "n1", "n1", "n2", "n2", "n2"}));
  // Block wraps around when every node had its block: 4 nodes x block 1 of room... 
  v[0].free_slots = 1;
  v[1].free_slots = 3;
  v[2].free_slots = 0;
  v[3].free_slots = 2;
  EXPECT_EQ(distribute(v, order, 5, distribution::block, 2, 0), (strs{"n1", "n2", "n2", "n4", "n4"}));
  EXPECT_EQ(distribute(v, order, 9, distribution::round_robin, 0, 0),
            (strs{"n1", "n2", "n4", "n2", "n4", "n2"}));  // only 6 fit
  EXPECT_EQ(distribute(v, order, 4, distribution::fill, 0, 0), (strs{"n1", "n2", "n2", "n2"}));
  // Memory limits the room: 9 GiB per agent leaves only n2 (32 GiB -> 3 agents by its slots).
  auto w = four_nodes();
  EXPECT_EQ(place_agents(w, 5, strategy::memory, distribution::fill, 0, 9ull << 30),
            (strs{"n2", "n2", "n2", "n3"}));
  EXPECT_TRUE(distribute(w, order, 0, distribution::fill, 0, 0).empty());
}

TEST(agents_placement, place_agents_combines_strategy_and_distribution) {
  auto v = four_nodes();
  EXPECT_EQ(place_agents(v, 3, strategy::power, distribution::round_robin, 0, 0), (strs{"n4", "n2", "n1"}));
  EXPECT_EQ(place_agents(v, 3, strategy::power, distribution::fill, 0, 0), (strs{"n4", "n4", "n4"}));
  EXPECT_EQ(place_agents(v, 5, strategy::activity, distribution::block, 2, 0), (strs{"n3", "n3", "n1", "n1", "n4"}));
}

TEST(agents_placement, the_index_places_exactly_as_a_full_ranking) {
  // Random views, updated, erased and put back; every placement the index
  // makes must equal place_agents over all the views (ties included: the
  // metrics take few values, slots and memory are often short).
  std::mt19937_64 rng(7);
  node_index index;
  std::map<std::string, node_view> truth;
  auto random_view = [&](const std::string& id) {
    node_view v;
    v.id = id;
    v.free_slots = static_cast<uint32_t>(rng() % 4);
    v.mem_free = (rng() % 8) << 30;
    v.bw_in_use = static_cast<double>(rng() % 5) * 1e8;
    v.activity = rng() % 13 == 0 ? std::nan("") : static_cast<double>(rng() % 3);
    v.power_w = static_cast<double>(100 + rng() % 4 * 50);
    return v;
  };
  const distribution dists[] = {distribution::block, distribution::round_robin, distribution::fill};
  for (int round = 0; round < 3000; ++round) {
    const std::string id = "n" + std::to_string(rng() % 60);
    if (rng() % 5 == 0) {
      index.erase(id);
      truth.erase(id);
    } else {
      node_view v = random_view(id);
      index.put(v);
      truth[id] = v;
    }
    ASSERT_EQ(index.size(), truth.size());
    const auto s = static_cast<strategy>(rng() % 4);
    const distribution d = dists[rng() % 3];
    const uint32_t count = static_cast<uint32_t>(rng() % 12), block = static_cast<uint32_t>(rng() % 4);
    const uint64_t per = rng() % 3 == 0 ? 0 : (rng() % 4) << 30;
    const std::string exclude = rng() % 3 == 0 ? "n" + std::to_string(rng() % 60) : "";
    std::vector<node_view> all;
    for (const auto& [k, v] : truth)
      if (k != exclude) all.push_back(v);
    ASSERT_EQ(index.place(count, s, d, block, per, exclude), place_agents(all, count, s, d, block, per))
        << "round " << round << ", strategy " << strategy_name(s) << ", " << distribution_name(d);
  }
}

TEST(agents_placement, initial_agent_count_from_hints) {
  count_policy p;  // 1 agent per node, max 16, 1 GB/s per agent, 10% of the interval
  EXPECT_EQ(initial_agent_count(app_hints{}, p), 1u);
  EXPECT_EQ(initial_agent_count(app_hints{.ranks = 96, .nodes = 2}, p), 2u);
  // 40 GB every 100 s: 40e9 / (1e9 * 0.1 * 100) = 4 agents; 3 nodes ask for 3.
  EXPECT_EQ(initial_agent_count(app_hints{.ranks = 96, .nodes = 3, .checkpoint_bytes = 40'000'000'000ull, .interval_s = 100}, p), 4u);
  // 40.1 GB rounds up to 5.
  EXPECT_EQ(initial_agent_count(app_hints{.nodes = 1, .checkpoint_bytes = 40'100'000'000ull, .interval_s = 100}, p), 5u);
  // Never more agents than ranks, nor than max_agents.
  EXPECT_EQ(initial_agent_count(app_hints{.ranks = 2, .nodes = 12}, p), 2u);
  EXPECT_EQ(initial_agent_count(app_hints{.nodes = 100}, p), 16u);
  p.nodes_per_agent = 4;
  EXPECT_EQ(initial_agent_count(app_hints{.nodes = 12}, p), 3u);
  EXPECT_EQ(initial_agent_count(app_hints{.nodes = 13}, p), 4u);
}

// ---- break-even rule (iCheck equations 1 and 2) --------------------------------

TEST(agents_break_even, hand_computed_cases) {
  // t_probe 2.5, t_old 0.5, t_new 0.25:
  //   ncops = (2.5 + 0.25) / 0.5 - 1 = 4.5;  n = 4.5 * 0.5 / 0.25 + 1 = 10.
  ASSERT_TRUE(break_even_checkpoints(2.5, 0.5, 0.25));
  EXPECT_DOUBLE_EQ(*break_even_checkpoints(2.5, 0.5, 0.25), 10.0);
  EXPECT_TRUE(change_pays_off(2.5, 0.5, 0.25, 10));
  EXPECT_TRUE(change_pays_off(2.5, 0.5, 0.25, 11));
  EXPECT_FALSE(change_pays_off(2.5, 0.5, 0.25, 9));
  // t_probe 1, t_old 2, t_new 1: ncops = 2/2 - 1 = 0; n = 0 + 1 = 1.
  EXPECT_DOUBLE_EQ(*break_even_checkpoints(1, 2, 1), 1.0);
  EXPECT_TRUE(change_pays_off(1, 2, 1, 1));
  EXPECT_FALSE(change_pays_off(1, 2, 1, 0));
  // The paper's heat simulation: 0.7 s per checkpoint with 2 agents, about
  // 2.5 s for the change, twice as fast after: n = (2.5 + 0.35 - 0.7)/0.35 + 1.
  EXPECT_NEAR(*break_even_checkpoints(2.5, 0.7, 0.35), (2.5 + 0.35 - 0.7) / 0.35 + 1, 1e-12);
  EXPECT_FALSE(change_pays_off(2.5, 0.7, 0.35, 7));
  EXPECT_TRUE(change_pays_off(2.5, 0.7, 0.35, 8));
  // Non-integer n: 3 checkpoints are not enough for n = 3.5.
  // t_probe 1.25, t_old 1, t_new 0.5: ncops = 1.75 - 1 = 0.75; n = 0.75 * 2 + 1 = 2.5.
  EXPECT_DOUBLE_EQ(*break_even_checkpoints(1.25, 1, 0.5), 2.5);
  EXPECT_FALSE(change_pays_off(1.25, 1, 0.5, 2));
  EXPECT_TRUE(change_pays_off(1.25, 1, 0.5, 3));
}

TEST(agents_break_even, closed_form_and_edges) {
  // (1) and (2) reduce to n = (t_probe + 2 t_new - t_old) / t_new.
  for (double tp : {0.0, 0.3, 2.5, 40.0}) {
    for (double to : {0.25, 1.0, 3.0}) {
      for (double tn : {0.125, 0.5, 2.0}) {
        EXPECT_NEAR(*break_even_checkpoints(tp, to, tn), (tp + 2 * tn - to) / tn, 1e-9);
      }
    }
  }
  // A free change that makes transfers faster pays off at once (n <= 0).
  EXPECT_DOUBLE_EQ(*break_even_checkpoints(0, 1, 0.5), 0.0);
  EXPECT_TRUE(change_pays_off(0, 1, 0.5, 0));
  // No speed-up, no pay-off, however many checkpoints remain.
  EXPECT_FALSE(change_pays_off(0, 1, 1, UINT64_MAX));
  EXPECT_FALSE(change_pays_off(1, 1, 2, UINT64_MAX));
  // Outside the domain.
  EXPECT_FALSE(break_even_checkpoints(1, 0, 1));
  EXPECT_FALSE(break_even_checkpoints(1, 1, 0));
  EXPECT_FALSE(break_even_checkpoints(-1, 1, 0.5));
  EXPECT_FALSE(break_even_checkpoints(NAN, 1, 0.5));
  EXPECT_FALSE(break_even_checkpoints(1, INFINITY, 0.5));
  EXPECT_FALSE(change_pays_off(1, 0, 0.5, 100));
  EXPECT_FALSE(change_pays_off(NAN, 1, 0.5, 100));
}

// ---- controller state ------------------------------------------------------------

node_metrics metrics(uint64_t mem_free, double bw, double activity = 0, double power = 100) {
  node_metrics m;
  m.mem_total = 64ull << 30;
  m.mem_free = mem_free;
  m.bw_in_use = bw;
  m.activity = activity;
  m.power_w = power;
  return m;
}

struct state_fixture {
  explicit state_fixture(controller_policy p = {})
      : state(p, [this](const json& r) {
          if (fail_journal) return status(errc::no_space, "journal full");
          records.push_back(r);
          return status();
        }) {}
  // Every test's state ends with its placement index equal to a fresh ranking.
  ~state_fixture() { EXPECT_EQ(state.index_mismatch(), ""); }
  std::vector<json> records;
  bool fail_journal = false;
  controller_state state;
};

std::vector<std::string> nodes_of(const controller_state& s, uint64_t app) {
  std::vector<std::string> out;
  for (const auto& [id, g] : s.agents()) {
    if (g.app == app) out.push_back(g.node);
  }
  return out;
}

TEST(agents_controller_state, registration_places_by_strategy_and_distribution) {
  controller_policy p;
  p.strat = strategy::memory;
  p.dist = distribution::round_robin;
  state_fixture f(p);
  ASSERT_TRUE(f.state.node_register("a", "h:1", 2, metrics(8ull << 30, 0), {}, 0));
  ASSERT_TRUE(f.state.node_register("b", "h:2", 2, metrics(32ull << 30, 0), {}, 0));
  ASSERT_TRUE(f.state.node_register("c", "h:3", 2, metrics(16ull << 30, 0), {}, 0));
  auto app = f.state.app_register("heat", app_hints{.ranks = 8, .nodes = 3}, std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(app);
  EXPECT_EQ(nodes_of(f.state, *app), (strs{"b", "c", "a"}));
  // fill, bandwidth, overridden per application.
  auto app2 = f.state.app_register("lulesh", app_hints{.nodes = 2}, strategy::power, distribution::fill, std::nullopt);
  ASSERT_TRUE(app2);
  // Equal power and one free slot each: by id; fill puts one on a (its room), then b.
  EXPECT_EQ(nodes_of(f.state, *app2), (strs{"a", "b"}));
  EXPECT_EQ(f.state.apps().at(*app2).target, 2u);
}

TEST(agents_controller_state, reservations_count_against_free_memory_until_held) {
  state_fixture f;  // bandwidth strategy
  ASSERT_TRUE(f.state.node_register("a", "h:1", 8, metrics(10ull << 30, 0), {}, 0));
  ASSERT_TRUE(f.state.node_register("b", "h:2", 8, metrics(10ull << 30, 1000), {}, 0));
  // 16 GiB over 2 agents: 8 GiB each; 'a' (less bandwidth) fits one, then 'b'.
  auto app = f.state.app_register("big", app_hints{.nodes = 2, .checkpoint_bytes = 16ull << 30}, std::nullopt,
                                  distribution::fill, std::nullopt);
  ASSERT_TRUE(app);
  EXPECT_EQ(nodes_of(f.state, *app), (strs{"a", "b"}));
  auto v = f.state.views();
  EXPECT_EQ(v[0].mem_free, 2ull << 30);
  // Once the agent holds its data, the node's own report counts it instead.
  agent_report r;
  r.agent = f.state.agents().begin()->first;
  r.app = *app;
  r.state = "running";
  r.memory_held = 8ull << 30;
  ASSERT_TRUE(f.state.node_heartbeat("a", metrics(2ull << 30, 0), {r}, 1));
  EXPECT_EQ(f.state.views()[0].mem_free, 2ull << 30);
  EXPECT_EQ(f.state.agents().begin()->second.state, "running");
}

TEST(agents_controller_state, journal_replay_reproduces_the_registry) {
  state_fixture f;
  ASSERT_TRUE(f.state.node_register("a", "h:1", 2, metrics(1 << 30, 0), {}, 0));
  ASSERT_TRUE(f.state.node_register("b", "h:2", 3, metrics(1 << 30, 5), {}, 0));
  auto x = f.state.app_register("x", app_hints{.ranks = 4, .nodes = 3, .checkpoint_bytes = 3000, .interval_s = 10},
                                std::nullopt, distribution::block, 2);
  auto y = f.state.app_register("y", app_hints{.nodes = 1}, strategy::power, std::nullopt, std::nullopt);
  ASSERT_TRUE(x && y);
  ASSERT_TRUE(f.state.app_unregister(*y));
  ASSERT_TRUE(f.state.node_register("c", "h:3", 2, metrics(1 << 30, 0), {}, 0));
  auto moved = f.state.agent_migrate(f.state.agents().begin()->first, "c");
  ASSERT_TRUE(moved) << moved.error().to_string();
  auto replay = [&](const std::vector<json>& recs) {
    auto s = std::make_unique<controller_state>(controller_policy{}, [](const json&) { return status(); });
    for (const auto& r : recs) EXPECT_TRUE(s->apply(r)) << r.dump();
    return s;
  };
  auto r1 = replay(f.records);
  auto r2 = replay(f.state.snapshot());
  for (const controller_state* r : {r1.get(), r2.get()}) {
    EXPECT_EQ(json(r->snapshot()), json(f.state.snapshot()));
    ASSERT_EQ(r->agents().size(), f.state.agents().size());
    for (const auto& [id, g] : f.state.agents()) {
      EXPECT_EQ(r->agents().at(id).node, g.node);
      EXPECT_EQ(r->agents().at(id).app, g.app);
      EXPECT_EQ(r->agents().at(id).reserve, g.reserve);
    }
    EXPECT_EQ(r->nodes().at("b").capacity, 3u);
    EXPECT_EQ(r->apps().at(*x).dist, distribution::block);
    EXPECT_EQ(r->apps().at(*x).hints.checkpoint_bytes, 3000u);
    EXPECT_FALSE(r->apps().count(*y));
  }
  // Ids are never reused after a replay.
  auto z = r2->app_register("z", {}, std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(z);
  EXPECT_GT(*z, *y);
  // Records that do not fit the state are refused.
  EXPECT_FALSE(r2->apply(json{{"op", "agent_add"}, {"agent", 999}, {"app", 12345}, {"node", "a"}}));
  EXPECT_FALSE(r2->apply(json{{"op", "nonsense"}}));
  EXPECT_FALSE(r2->apply(json{{"op", "node_add"}, {"node", "bad name"}, {"address", "x"}, {"capacity", 1}}));
}

TEST(agents_controller_state, a_silent_node_is_lost_and_its_agents_reassigned) {
  controller_policy p;
  p.heartbeat_timeout_s = 5;
  state_fixture f(p);
  ASSERT_TRUE(f.state.node_register("a", "h:1", 4, metrics(1 << 30, 0), {}, 0));
  ASSERT_TRUE(f.state.node_register("b", "h:2", 4, metrics(1 << 30, 10), {}, 0));
  ASSERT_TRUE(f.state.node_register("c", "h:3", 4, metrics(1 << 30, 20), {}, 0));
  auto app = f.state.app_register("x", app_hints{.nodes = 3}, std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(app);
  EXPECT_EQ(nodes_of(f.state, *app), (strs{"a", "b", "c"}));
  (void)f.state.take_dirty_nodes();
  ASSERT_TRUE(f.state.node_heartbeat("a", metrics(1 << 30, 0), {}, 4));
  ASSERT_TRUE(f.state.node_heartbeat("c", metrics(1 << 30, 20), {}, 4));
  EXPECT_TRUE(f.state.expire(5).empty());
  EXPECT_EQ(f.state.expire(5.5), (strs{"b"}));
  EXPECT_FALSE(f.state.nodes().count("b"));
  // b's agent went to the best remaining node by bandwidth: a.
  EXPECT_EQ(nodes_of(f.state, *app), (strs{"a", "a", "c"}));
  auto dirty = f.state.take_dirty_nodes();
  EXPECT_TRUE(dirty.count("a") && dirty.count("b"));
  EXPECT_EQ(f.records.back()["op"], "node_remove");
  EXPECT_EQ(f.records.back()["reason"], "lost");
  // Both others lost: nowhere to go, the agents are dropped, the target stays.
  EXPECT_EQ(f.state.expire(100).size(), 2u);
  EXPECT_TRUE(nodes_of(f.state, *app).empty());
  EXPECT_EQ(f.state.apps().at(*app).target, 3u);
  // A node joins: the application gets its agents back (it had none: no rule).
  ASSERT_TRUE(f.state.node_register("d", "h:4", 2, metrics(1 << 30, 0), {}, 101));
  EXPECT_EQ(nodes_of(f.state, *app), (strs{"d", "d"}));
}

TEST(agents_controller_state, graceful_leave_moves_agents_first) {
  state_fixture f;
  ASSERT_TRUE(f.state.node_register("a", "h:1", 2, metrics(1 << 30, 0), {}, 0));
  ASSERT_TRUE(f.state.node_register("b", "h:2", 2, metrics(1 << 30, 10), {}, 0));
  auto app = f.state.app_register("x", app_hints{.nodes = 2}, std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(app);
  auto moved = f.state.node_leave("a");
  ASSERT_TRUE(moved);
  EXPECT_EQ(*moved, 1u);
  EXPECT_EQ(nodes_of(f.state, *app), (strs{"b", "b"}));
  EXPECT_EQ(f.records.back()["reason"], "left");
  EXPECT_EQ(f.state.node_leave("a").error().code(), errc::not_found);
}

TEST(agents_controller_state, agents_are_capped_by_ranks_and_sizes_come_with_progress) {
  controller_policy p;
  state_fixture f(p);
  ASSERT_TRUE(f.state.node_register("a", "h:1", 8, metrics(64ull << 30, 0), {}, 0));
  auto app = f.state.app_register("x", app_hints{.ranks = 2, .nodes = 1}, std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(app);
  // Each rank talks to one agent: a third one would serve nobody.
  auto d = f.state.app_resize(*app, 3, true);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code(), errc::invalid_argument);
  EXPECT_TRUE(f.state.app_resize(*app, 2, true));
  // The application learns its checkpoint size after init and reports it.
  EXPECT_EQ(f.state.apps().at(*app).hints.checkpoint_bytes, 0u);
  ASSERT_TRUE(f.state.app_progress(*app, 1, 0.5, 0, 128ull << 20));
  EXPECT_EQ(f.state.apps().at(*app).hints.checkpoint_bytes, 128ull << 20);
  ASSERT_TRUE(f.state.app_progress(*app, 2, 0.5, 0));  // 0: unchanged
  EXPECT_EQ(f.state.apps().at(*app).hints.checkpoint_bytes, 128ull << 20);
}

TEST(agents_controller_state, expansion_follows_the_break_even_rule) {
  controller_policy p;
  p.count.agent_bandwidth = 1e9;
  p.probe_cost_s = 2.5;
  state_fixture f(p);
  ASSERT_TRUE(f.state.node_register("a", "h:1", 8, metrics(64ull << 30, 0), {}, 0));
  // 1 GB checkpoints, 20 of them: with 1 agent t_old = 1 s; with 2, t_new = 0.5 s:
  // ncops = (2.5 + 0.5) / 1 - 1 = 2; n = 2 * 1 / 0.5 + 1 = 5.
  auto app = f.state.app_register("x", app_hints{.nodes = 1, .checkpoint_bytes = 1'000'000'000, .checkpoints = 20},
                                  std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(app);
  ASSERT_TRUE(f.state.app_progress(*app, 16, 0, 0));  // 4 left < 5
  auto d = f.state.app_resize(*app, 2, false);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->applied);
  EXPECT_DOUBLE_EQ(*d->break_even, 5.0);
  EXPECT_EQ(*d->remaining, 4u);
  EXPECT_EQ(nodes_of(f.state, *app).size(), 1u);
  EXPECT_EQ(f.state.apps().at(*app).target, 1u);
  ASSERT_TRUE(f.state.app_progress(*app, 15, 0, 0));  // 5 left
  d = f.state.app_resize(*app, 2, false);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->applied) << d->reason;
  EXPECT_EQ(nodes_of(f.state, *app).size(), 2u);
  // A measured transfer time replaces the model: 4 s with 2 agents -> 2 s with 4,
  // t_probe measured 1 s: ncops = (1 + 2) / 4 - 1 = -0.25; n = -0.25 * 4 / 2 + 1 = 0.5.
  ASSERT_TRUE(f.state.app_progress(*app, 19, 4.0, 1.0));
  d = f.state.app_resize(*app, 4, false);
  ASSERT_TRUE(d);
  EXPECT_DOUBLE_EQ(d->t_old, 4.0);
  EXPECT_DOUBLE_EQ(d->t_new, 2.0);
  EXPECT_DOUBLE_EQ(*d->break_even, 0.5);
  EXPECT_TRUE(d->applied);
  // Forced expansion ignores the rule; reduction always applies, newest agents first.
  ASSERT_TRUE(f.state.app_progress(*app, 20, 0, 0));  // nothing left
  d = f.state.app_resize(*app, 5, false);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->applied);
  d = f.state.app_resize(*app, 5, true);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->applied);
  EXPECT_EQ(nodes_of(f.state, *app).size(), 5u);
  uint64_t first = 0;
  for (const auto& [id, g] : f.state.agents()) {
    if (first == 0) first = id;
  }
  d = f.state.app_resize(*app, 1, false);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->applied);
  ASSERT_EQ(f.state.agents().size(), 1u);
  EXPECT_EQ(f.state.agents().begin()->first, first);
  EXPECT_EQ(f.state.app_resize(*app, 0, true).error().code(), errc::invalid_argument);
  EXPECT_EQ(f.state.app_resize(999, 2, true).error().code(), errc::not_found);
}

TEST(agents_controller_state, migration_and_journal_failures) {
  state_fixture f;
  ASSERT_TRUE(f.state.node_register("a", "h:1", 1, metrics(1 << 30, 0), {}, 0));
  ASSERT_TRUE(f.state.node_register("b", "h:2", 1, metrics(1 << 30, 10), {}, 0));
  auto app = f.state.app_register("x", {}, std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(app);
  uint64_t agent = f.state.agents().begin()->first;
  EXPECT_EQ(f.state.agents().at(agent).node, "a");
  EXPECT_EQ(f.state.agent_migrate(agent, "a").error().code(), errc::invalid_argument);
  EXPECT_EQ(f.state.agent_migrate(agent, "zz").error().code(), errc::not_found);
  auto to = f.state.agent_migrate(agent, "");
  ASSERT_TRUE(to);
  EXPECT_EQ(*to, "b");
  EXPECT_EQ(f.state.agents().at(agent).state, "assigned");
  // b is full now for a second application: a gets it; then nothing has room.
  auto app2 = f.state.app_register("y", {}, std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(app2);
  EXPECT_EQ(nodes_of(f.state, *app2), (strs{"a"}));
  EXPECT_EQ(f.state.agent_migrate(agent, "a").error().code(), errc::again);
  // A journal that refuses the record leaves the state as it was.
  f.fail_journal = true;
  auto snap = json(f.state.snapshot());
  EXPECT_EQ(f.state.app_register("z", {}, std::nullopt, std::nullopt, std::nullopt).error().code(), errc::no_space);
  EXPECT_EQ(json(f.state.snapshot()), snap);
}

TEST(agents_controller_state, a_manager_that_lost_its_agents_frees_what_they_held) {
  state_fixture f;
  ASSERT_TRUE(f.state.node_register("a", "h:1", 4, metrics(16ull << 30, 0), {}, 0));
  auto app = f.state.app_register("x", app_hints{.nodes = 1, .checkpoint_bytes = 8ull << 30}, std::nullopt,
                                  std::nullopt, std::nullopt);
  ASSERT_TRUE(app);
  uint64_t agent = f.state.agents().begin()->first;
  agent_report r;
  r.agent = agent;
  r.app = *app;
  r.state = "running";
  r.pid = 42;
  r.memory_held = 8ull << 30;
  r.endpoint = "tcp://a:1";
  ASSERT_TRUE(f.state.node_heartbeat("a", metrics(8ull << 30, 0), {r}, 1));
  EXPECT_EQ(f.state.views()[0].mem_free, 8ull << 30);
  uint64_t gen = f.state.apps().at(*app).generation;
  // The manager restarts: it runs nothing and its node has all its memory
  // free again; the agent will take its 8 GiB when relaunched.
  ASSERT_TRUE(f.state.node_register("a", "h:1", 4, metrics(16ull << 30, 0), {}, 2));
  const auto& g = f.state.agents().at(agent);
  EXPECT_EQ(g.state, "assigned");
  EXPECT_EQ(g.memory_held, 0u);
  EXPECT_EQ(g.pid, 0);
  EXPECT_EQ(g.endpoint, "");
  EXPECT_GT(f.state.apps().at(*app).generation, gen);  // its address is gone: probes see the change
  EXPECT_EQ(f.state.views()[0].mem_free, 8ull << 30);
}

TEST(agents_controller_state, a_reported_checkpoint_size_is_journaled_once) {
  state_fixture f;
  ASSERT_TRUE(f.state.node_register("a", "h:1", 4, metrics(64ull << 30, 0), {}, 0));
  auto app = f.state.app_register("x", app_hints{.ranks = 4, .nodes = 1}, std::nullopt, std::nullopt, std::nullopt);
  ASSERT_TRUE(app);
  size_t before = f.records.size();
  ASSERT_TRUE(f.state.app_progress(*app, 1, 0.5, 0, 3ull << 30));
  ASSERT_EQ(f.records.size(), before + 1);
  EXPECT_EQ(f.records.back()["op"], "app_hints");
  ASSERT_TRUE(f.state.app_progress(*app, 2, 0.5, 0, 3ull << 30));  // same size: nothing to record
  ASSERT_TRUE(f.state.app_progress(*app, 3, 0.5, 0));
  EXPECT_EQ(f.records.size(), before + 1);
  // A restarted controller reserves for the size the application reported.
  controller_state replayed(controller_policy{}, [](const json&) { return status(); });
  for (const auto& rec : f.records) ASSERT_TRUE(replayed.apply(rec)) << rec.dump();
  EXPECT_EQ(replayed.apps().at(*app).hints.checkpoint_bytes, 3ull << 30);
  EXPECT_EQ(replayed.apps().at(*app).hints.ranks, 4u);
  EXPECT_EQ(json(replayed.snapshot()), json(f.state.snapshot()));
  EXPECT_FALSE(replayed.apply(json{{"op", "app_hints"}, {"app", 999}, {"hints", json::object()}}));
  // A journal that refuses the record: the size is not taken.
  f.fail_journal = true;
  EXPECT_EQ(f.state.app_progress(*app, 4, 0.5, 0, 5ull << 30).code(), errc::no_space);
  EXPECT_EQ(f.state.apps().at(*app).hints.checkpoint_bytes, 3ull << 30);
}

TEST(agents_controller_state, an_evacuated_agent_needs_room_for_the_reservation_it_carries) {
  state_fixture f;  // bandwidth strategy
  ASSERT_TRUE(f.state.node_register("a", "h:1", 4, metrics(10ull << 30, 0), {}, 0));
  ASSERT_TRUE(f.state.node_register("b", "h:2", 4, metrics(10ull << 30, 50), {}, 0));
  // One agent for 8 GiB: on a (least bandwidth), reserving 8 GiB.
  auto app = f.state.app_register("x", app_hints{.nodes = 1, .checkpoint_bytes = 8ull << 30}, std::nullopt,
                                  std::nullopt, std::nullopt);
  ASSERT_TRUE(app);
  uint64_t first = f.state.agents().begin()->first;
  ASSERT_EQ(f.state.agents().at(first).reserve, 8ull << 30);
  // Two agents: the new one reserves 4 GiB; a has 2 GiB left, so b takes it.
  auto d = f.state.app_resize(*app, 2, true);
  ASSERT_TRUE(d);
  EXPECT_EQ(nodes_of(f.state, *app), (strs{"a", "b"}));
  // a leaves: its agent still reserves 8 GiB, b has 6 GiB left: it cannot go
  // there (a share now is 4 GiB, but the agent is moved, not re-placed). It
  // is dropped; the shortfall is filled at the share's size when room comes.
  auto moved = f.state.node_leave("a");
  ASSERT_TRUE(moved);
  EXPECT_EQ(*moved, 0u);
  EXPECT_FALSE(f.state.agents().count(first));
  EXPECT_EQ(nodes_of(f.state, *app), (strs{"b"}));
  ASSERT_TRUE(f.state.fill_shortfalls());
  EXPECT_EQ(nodes_of(f.state, *app), (strs{"b", "b"}));
  EXPECT_EQ(f.state.agents().rbegin()->second.reserve, 4ull << 30);
}

TEST(agents_controller_state, unknown_heartbeat_and_bad_names) {
  state_fixture f;
  EXPECT_EQ(f.state.node_heartbeat("ghost", {}, {}, 0).code(), errc::not_found);
  EXPECT_EQ(f.state.node_register("bad id", "h:1", 1, {}, {}, 0).code(), errc::invalid_argument);
  EXPECT_EQ(f.state.app_register("", {}, std::nullopt, std::nullopt, std::nullopt).error().code(),
            errc::invalid_argument);
}

// ---- journal file --------------------------------------------------------------

TEST_F(agents_env, journal_file_replays_and_tolerates_only_a_torn_tail) {
  storage::storage_env* env = storage::storage_env::posix();
  const std::string path = dir_ + "/journal";
  std::vector<json> applied;
  auto apply = [&](const json& r) {
    applied.push_back(r);
    return status();
  };
  std::vector<json> snap;
  auto snapshot = [&]() { return snap; };
  journal_replay st;
  {
    auto j = journal::open(env, path, apply, snapshot, &st);
    ASSERT_TRUE(j) << j.error().to_string();
    EXPECT_TRUE(st.created);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*j)->append(json{{"op", "ids"}, {"i", i}}));
  }
  applied.clear();
  snap = {json{{"op", "x"}}};  // what the state looks like after the replay
  {
    auto j = journal::open(env, path, apply, snapshot, &st);
    ASSERT_TRUE(j);
    EXPECT_EQ(st.records, 3u);
    ASSERT_EQ(applied.size(), 3u);
    EXPECT_EQ(applied[2]["i"], 2);
    ASSERT_TRUE((*j)->append(json{{"op", "y"}}));
  }
  // Compacted: the snapshot record, then the new append.
  applied.clear();
  auto image = env->read_all(path);
  ASSERT_TRUE(image);
  ASSERT_TRUE(replay_journal(*image, apply, &st));
  ASSERT_EQ(applied.size(), 2u);
  EXPECT_EQ(applied[0]["op"], "x");
  EXPECT_EQ(applied[1]["op"], "y");
  // A torn last record (crash during an append) is dropped...
  std::string torn = *image + encode_journal_record(json{{"op", "z"}}).substr(0, 15);
  applied.clear();
  journal_replay st2;
  ASSERT_TRUE(replay_journal(torn, apply, &st2));
  EXPECT_EQ(st2.records, 2u);
  EXPECT_EQ(st2.torn_bytes, 15u);
  // ... and so is a complete last record with a bad checksum;
  std::string last_bad = *image + encode_journal_record(json{{"op", "z"}});
  last_bad.back() ^= 1;
  journal_replay st3;
  ASSERT_TRUE(replay_journal(last_bad, apply, &st3));
  EXPECT_GT(st3.torn_bytes, 0u);
  // but damage followed by more records is corruption, as is a bad header.
  std::string mid = *image;
  mid[kJournalHeaderSize + kJournalRecordHeader + 2] ^= 1;
  journal_replay st4;
  EXPECT_EQ(replay_journal(mid, apply, &st4).code(), errc::corruption);
  EXPECT_EQ(replay_journal("not a journal at all", apply, &st4).code(), errc::corruption);
  std::string huge = image->substr(0, kJournalHeaderSize) + std::string("\xff\xff\xff\x7f", 4) + std::string(8, 0);
  EXPECT_EQ(replay_journal(huge, apply, &st4).code(), errc::corruption);
  // A record the state refuses stops the open with corruption.
  auto refuse = [](const json&) { return status(errc::invalid_argument, "no"); };
  EXPECT_EQ(journal::open(env, path, refuse, snapshot, &st).error().code(), errc::corruption);
}

// ---- metrics ----------------------------------------------------------------------

TEST(agents_metrics, parsers) {
  auto m = parse_meminfo("MemTotal:       16384 kB\nMemFree:         1000 kB\nMemAvailable:    8192 kB\n");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->total, 16384u * 1024);
  EXPECT_EQ(m->available, 8192u * 1024);
  auto old = parse_meminfo("MemTotal: 100 kB\nMemFree: 10 kB\nBuffers: 5 kB\nCached: 20 kB\n");
  ASSERT_TRUE(old);
  EXPECT_EQ(old->available, 35u * 1024);
  EXPECT_FALSE(parse_meminfo("garbage"));
  const char* netdev =
      "Inter-|   Receive                                                |  Transmit\n"
      " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
      "    lo:  5000      10    0    0    0     0          0         0     5000      10    0    0    0     0       0          0\n"
      "  eth0:  1000      10    0    0    0     0          0         0      200      10    0    0    0     0       0          0\n"
      "  ib0:     30       1    0    0    0     0          0         0        4       1    0    0    0     0       0          0\n";
  EXPECT_EQ(*parse_net_dev(netdev, false), 1234u);
  EXPECT_EQ(*parse_net_dev(netdev, true), 11234u);
  EXPECT_FALSE(parse_net_dev("  eth0: 1 2 3\n", false));
  auto c = parse_proc_stat("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->total, 1000u);
  EXPECT_EQ(c->busy, 150u);
  EXPECT_FALSE(parse_proc_stat("intr 1 2 3\n"));
}

TEST_F(agents_env, sampler_uses_rapl_when_readable_and_flags_estimates) {
  storage::storage_env* env = storage::storage_env::posix();
  const std::string proc = dir_ + "/proc", sys = dir_ + "/sys";
  ASSERT_TRUE(env->make_dirs(proc + "/net"));
  ASSERT_TRUE(env->write_atomic(proc + "/meminfo", "MemTotal: 1000 kB\nMemAvailable: 600 kB\n", false));
  ASSERT_TRUE(env->write_atomic(proc + "/stat", "cpu 0 0 0 100 0 0 0 0\n", false));
  ASSERT_TRUE(env->write_atomic(proc + "/net/dev", "x\ny\n eth0: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n", false));
  // No powercap directory: power is estimated from the CPU utilisation.
  const double t0 = util::now_s();
  metrics_sampler est(proc, sys, 100);
  ASSERT_TRUE(env->write_atomic(proc + "/stat", "cpu 50 0 0 150 0 0 0 0\n", false));  // 50 of 100 busy
  ASSERT_TRUE(env->write_atomic(proc + "/net/dev", "x\ny\n eth0: 500 0 0 0 0 0 0 0 500 0 0 0 0 0 0 0\n", false));
  node_metrics m = est.sample(t0 + 1.0, agent_counters{});
  EXPECT_EQ(m.mem_total, 1000u * 1024);
  EXPECT_EQ(m.mem_free, 600u * 1024);
  EXPECT_DOUBLE_EQ(m.cpu_util, 0.5);
  EXPECT_NEAR(m.bw_in_use, 1000, 10);
  EXPECT_EQ(m.bw_source.rfind("/proc/net/dev", 0), 0u);
  EXPECT_TRUE(m.power_estimated);
  EXPECT_DOUBLE_EQ(m.power_w, 100 * (0.3 + 0.7 * 0.5));
  EXPECT_NE(m.power_source.find("estimated"), std::string::npos);
  // Agent counters replace /proc/net/dev once agents report.
  node_metrics m2 = est.sample(t0 + 2.0, agent_counters{true, 4000, 2});
  EXPECT_EQ(m2.bw_source, "agents");
  node_metrics m3 = est.sample(t0 + 4.0, agent_counters{true, 8000, 6});
  EXPECT_NEAR(m3.bw_in_use, 2000, 1);
  EXPECT_NEAR(m3.activity, 2, 0.01);
  // Readable RAPL package domains (subdomains ignored): measured watts.
  const std::string pc = sys + "/class/powercap";
  for (const char* d : {"intel-rapl:0", "intel-rapl:1", "intel-rapl:0:0"}) {
    ASSERT_TRUE(env->make_dirs(pc + "/" + d));
    ASSERT_TRUE(env->write_atomic(pc + "/" + d + "/energy_uj", "1000000\n", false));
    ASSERT_TRUE(env->write_atomic(pc + "/" + d + "/max_energy_range_uj", "262143328850\n", false));
  }
  const double t1 = util::now_s();
  metrics_sampler rapl(proc, sys, 100);
  ASSERT_TRUE(env->write_atomic(pc + "/intel-rapl:0/energy_uj", "51000000\n", false));     // +50 J
  ASSERT_TRUE(env->write_atomic(pc + "/intel-rapl:1/energy_uj", "31000000\n", false));     // +30 J
  ASSERT_TRUE(env->write_atomic(pc + "/intel-rapl:0:0/energy_uj", "999000000\n", false));  // ignored
  node_metrics r = rapl.sample(t1 + 2.0, agent_counters{});
  EXPECT_FALSE(r.power_estimated);
  EXPECT_NEAR(r.power_w, 40.0, 0.5);  // 80 J over 2 s
  EXPECT_EQ(r.power_source.rfind("rapl", 0), 0u);
  // Unreadable counters fall back to the estimate.
  ASSERT_TRUE(env->write_atomic(pc + "/intel-rapl:1/energy_uj", "denied", false));
  EXPECT_TRUE(rapl.sample(t1 + 3.0, agent_counters{}).power_estimated);
}

// ---- the controller service over loopback -----------------------------------------

TEST_F(agents_env, controller_serves_and_survives_bad_input) {
  controller_options o;
  o.listen = {"127.0.0.1", 0};
  o.secret = kSecret;
  o.service_secret = kServiceSecret;
  o.journal_path = dir_ + "/journal";
  auto c = controller_service::open(o);
  ASSERT_TRUE(c) << c.error().to_string();
  auto addr = parse_address((*c)->address());
  ASSERT_TRUE(addr);
  std::atomic<bool> stop{false};
  std::thread t([&] { (void)(*c)->run(&stop); });

  auto st = control_call(*addr, kSecret, "admin", ctl_type::status, json::object(), 5000);
  ASSERT_TRUE(st) << st.error().to_string();
  EXPECT_TRUE((*st)["nodes"].empty());
  EXPECT_EQ((*st)["policy"]["strategy"], "bandwidth");
  // Wrong secret: refused, reported as a closed connection.
  auto bad = control_call(*addr, "a wrong secret of sufficient len", "admin", ctl_type::status, json::object(), 5000);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), errc::io_error);
  // Garbage and an oversized header on raw sockets.
  for (std::string junk : {std::string("GET / HTTP/1.0\r\n\r\n"), encode_header(ctl_type::status, 0, 1u << 30)}) {
    auto fd = connect_tcp(*addr, 2000);
    ASSERT_TRUE(fd);
    ASSERT_EQ(::send(fd->get(), junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
    char b;
    struct pollfd pfd {fd->get(), POLLIN, 0};
    ASSERT_EQ(::poll(&pfd, 1, 5000), 1) << "no answer within 5 s";
    ssize_t n = ::recv(fd->get(), &b, 1, 0);  // (the socket is non-blocking)
    // Closed: an orderly end, or a reset when our unread bytes were discarded.
    EXPECT_TRUE(n == 0 || (n < 0 && errno == ECONNRESET)) << "recv returned " << n << " errno " << errno;
  }
  // A request with a field of the wrong type gets invalid_argument; the service goes on.
  auto reg = control_call(*addr, kSecret, "client", ctl_type::app_register, json{{"name", 5}}, 5000);
  ASSERT_FALSE(reg);
  EXPECT_EQ(reg.error().code(), errc::invalid_argument);
  // The application's key comes sealed to the key pair the client drew.
  const box_keypair kp = new_box_keypair();
  const json heat = {{"name", "heat"}, {"hints", {{"nodes", 2}}}, {"box_public", util::hex_encode(kp.public_key)}};
  reg = control_call(*addr, kSecret, "client", ctl_type::app_register, heat, 5000);
  ASSERT_TRUE(reg) << reg.error().to_string();
  EXPECT_EQ((*reg)["target"], 2);
  EXPECT_TRUE((*reg)["agents"].empty());  // no node yet
  std::string box, key;
  ASSERT_TRUE(util::hex_decode((*reg)["key_box"].get<std::string>(), kAppKeySize + 48, &box));
  auto opened = open_sealed(kp, box);
  ASSERT_TRUE(opened) << opened.error().to_string();
  key = *opened;
  EXPECT_FALSE(open_sealed(new_box_keypair(), box));  // nobody else opens it
  // Coming back under that name needs the proof of the key.
  auto again = control_call(*addr, kSecret, "client", ctl_type::app_register, heat, 5000);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), errc::busy);
  json wrong = heat;
  wrong["proof"] = util::hex_encode(app_key_proof(new_app_key(), "heat", kp.public_key));
  EXPECT_EQ(control_call(*addr, kSecret, "client", ctl_type::app_register, wrong, 5000).error().code(), errc::busy);
  const box_keypair kp2 = new_box_keypair();
  json proven = heat;
  proven["box_public"] = util::hex_encode(kp2.public_key);
  proven["proof"] = util::hex_encode(app_key_proof(key, "heat", kp2.public_key));
  again = control_call(*addr, kSecret, "client", ctl_type::app_register, proven, 5000);
  ASSERT_TRUE(again) << again.error().to_string();
  EXPECT_TRUE((*again)["returning"].get<bool>());
  ASSERT_TRUE(util::hex_decode((*again)["key_box"].get<std::string>(), kAppKeySize + 48, &box));
  EXPECT_EQ(open_sealed(kp2, box).value(), key);
  // Its later requests: only with its proof (or from the service).
  const uint64_t heat_id = (*again)["app"].get<uint64_t>();
  json progress = {{"app", heat_id}, {"checkpoints_done", 1}};
  auto forged = control_call(*addr, kSecret, "client", ctl_type::app_progress, progress, 5000);
  ASSERT_FALSE(forged);
  EXPECT_EQ(forged.error().code(), errc::invalid_argument);
  EXPECT_FALSE(control_call(*addr, kSecret, "client", ctl_type::app_unregister, json{{"app", heat_id}}, 5000));
  EXPECT_FALSE(control_call(*addr, kSecret, "admin", ctl_type::agent_migrate, json{{"agent", 1}}, 5000));
  // The proof is bound to its connection and request: one seen on the wire
  // (the control plane does not encrypt) is of no use in another connection.
  std::string seen;
  auto prove = [&](json& b, std::string_view binding) {
    seen = util::hex_encode(app_request_proof(key, heat_id, binding, "app_progress"));
    b["proof"] = seen;
  };
  auto mine = control_call_bound(*addr, kSecret, "client", ctl_type::app_progress, progress, prove, 5000);
  EXPECT_TRUE(mine) << mine.error().to_string();
  json replayed = progress;
  replayed["proof"] = seen;
  auto again_seen = control_call(*addr, kSecret, "client", ctl_type::app_progress, replayed, 5000);
  ASSERT_FALSE(again_seen);
  EXPECT_EQ(again_seen.error().code(), errc::invalid_argument);
  json other = {{"app", heat_id}};
  auto wrong_request = control_call_bound(
      *addr, kSecret, "client", ctl_type::app_unregister, other,
      [&](json& b, std::string_view binding) {
        b["proof"] = util::hex_encode(app_request_proof(key, heat_id, binding, "app_progress"));
      },
      5000);
  EXPECT_FALSE(wrong_request);  // a progress proof does not unregister
  auto by_service = control_call(*addr, kServiceSecret, "admin", ctl_type::app_progress, progress, 5000);
  EXPECT_TRUE(by_service) << by_service.error().to_string();
  auto nodereg = control_call(*addr, kSecret, "client", ctl_type::node_register, json::object(), 5000);
  EXPECT_EQ(nodereg.error().code(), errc::invalid_argument);  // only managers register nodes
  // ... and a manager is who holds the service secret: an application (which
  // holds the deployment secret) cannot pose as one.
  EXPECT_FALSE(control_call(*addr, kSecret, "manager", ctl_type::status, json::object(), 5000));
  auto service = control_call(*addr, kServiceSecret, "manager", ctl_type::status, json::object(), 5000);
  EXPECT_TRUE(service) << service.error().to_string();
  EXPECT_FALSE(control_call(*addr, "not the secret of anyone here", "admin", ctl_type::status, json::object(), 5000));
  stop = true;
  t.join();

  // Restarted on the same journal: the application is still there.
  c->reset();
  auto c2 = controller_service::open(o);
  ASSERT_TRUE(c2) << c2.error().to_string();
  ASSERT_EQ((*c2)->state().apps().size(), 1u);
  EXPECT_EQ((*c2)->state().apps().begin()->second.name, "heat");
  EXPECT_EQ((*c2)->state().apps().begin()->second.target, 2u);
  EXPECT_EQ((*c2)->state().apps().begin()->second.key, key);  // journaled
  struct stat js {};
  ASSERT_EQ(::stat(o.journal_path.c_str(), &js), 0);
  EXPECT_EQ(js.st_mode & 0777, 0600u) << "the journal holds the applications' keys";
}

// ---- the /metrics endpoints (metrics_http.hpp, docs/design/metrics.md "Agents")

TEST(agents_openmetrics, builder_names_escapes_and_ends_with_eof) {
  openmetrics_builder b;
  b.family("cairn_x", "counter", "Help with a \\ and\na newline.");
  b.sample({{"node", "a\"b\\c\nd"}, {"mode", "pull"}}, uint64_t{3});
  b.family("cairn_y_seconds", "gauge", "A gauge.", "seconds");
  b.sample({}, 0.25);
  b.sample({{"k", "v"}}, std::nan(""));
  EXPECT_EQ(b.finish(),
            "# TYPE cairn_x counter\n"
            "# HELP cairn_x Help with a \\\\ and\\na newline.\n"
            "cairn_x_total{node=\"a\\\"b\\\\c\\nd\",mode=\"pull\"} 3\n"
            "# TYPE cairn_y_seconds gauge\n"
            "# UNIT cairn_y_seconds seconds\n"
            "# HELP cairn_y_seconds A gauge.\n"
            "cairn_y_seconds 0.25\n"
            "cairn_y_seconds{k=\"v\"} NaN\n"
            "# EOF\n");
}

TEST(agents_openmetrics, http_responses) {
  int renders = 0;
  auto render = [&] {
    ++renders;
    return std::string("# EOF\n");
  };
  std::string ok = http_response("GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n", render);
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"),
            std::string::npos);
  EXPECT_NE(ok.find("\r\nContent-Length: 6\r\n"), std::string::npos);
  EXPECT_NE(ok.find("\r\nConnection: close\r\n"), std::string::npos);
  EXPECT_EQ(ok.substr(ok.size() - 10), "\r\n\r\n# EOF\n");
  // A query string, HTTP/1.0 and the absolute form name the same resource.
  EXPECT_EQ(http_response("GET /metrics?x=1 HTTP/1.0\r\n", render).rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(http_response("GET http://h:1/metrics HTTP/1.1\r\n", render).rfind("HTTP/1.1 200", 0), 0u);
  std::string head = http_response("HEAD /metrics HTTP/1.1\r\n", render);
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n");  // no body, its length announced
  EXPECT_NE(head.find("Content-Length: 6\r\n"), std::string::npos);
  EXPECT_EQ(renders, 4);
  EXPECT_EQ(http_response("GET / HTTP/1.1\r\n", render).rfind("HTTP/1.1 404", 0), 0u);
  std::string post = http_response("POST /metrics HTTP/1.1\r\n", render);
  EXPECT_EQ(post.rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_NE(post.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos);
  for (const char* bad : {"", "GET\r\n", "GET /metrics\r\n", "GET  /metrics HTTP/1.1\r\n", "GET /metrics SPDY/3\r\n",
                          "GET /metrics HTTP/1.1 x\r\n"}) {
    EXPECT_EQ(http_response(bad, render).rfind("HTTP/1.1 400", 0), 0u) << bad;
  }
  EXPECT_EQ(renders, 4);  // rendered only for a 200
}

TEST(agents_openmetrics, agent_stats_file) {
  auto st = parse_agent_stats(
      R"({"bytes_in": 10, "bytes_out": 4, "checkpoints": 2, "memory_held": 8, "memory_budget": 100, "cancelled": 1,
          "endpoint": "ab", "pulls": 2, "pull_bytes": 10, "pull_seconds": 0.5, "pull_failures": 3, "pushes": 0,
          "push_bytes": 0, "push_seconds": 0, "push_failures": 1, "workers": 4})");
  ASSERT_TRUE(st) << st.error().to_string();
  EXPECT_EQ(st->pulls.held, 2u);
  EXPECT_EQ(st->pulls.bytes, 10u);
  EXPECT_EQ(st->pulls.failures, 3u);
  EXPECT_DOUBLE_EQ(st->pulls.seconds, 0.5);
  EXPECT_EQ(st->pushes.failures, 1u);
  EXPECT_EQ(st->memory_budget, 100u);
  EXPECT_EQ(st->endpoint, "ab");
  // An older agent's file (no transfer counters) reads as zeros.
  auto old = parse_agent_stats(R"({"bytes_in": 1, "memory_held": 2})");
  ASSERT_TRUE(old);
  EXPECT_EQ(old->pulls.held, 0u);
  EXPECT_FALSE(parse_agent_stats(R"({"pulls": "two"})"));
  EXPECT_FALSE(parse_agent_stats(R"({"pull_seconds": -1})"));
  EXPECT_FALSE(parse_agent_stats("not json"));
}

TEST(agents_openmetrics, controller_counts_its_decisions_not_replayed_records) {
  controller_policy p;
  p.heartbeat_timeout_s = 5;
  state_fixture f(p);
  ASSERT_TRUE(f.state.node_register("a", "h:1", 4, metrics(1 << 30, 0), {}, 0));
  ASSERT_TRUE(f.state.node_register("b", "h:2", 4, metrics(1 << 30, 10), {}, 0));
  auto app = f.state.app_register("x", app_hints{.ranks = 8, .nodes = 2, .checkpoints = 5}, std::nullopt,
                                  std::nullopt, std::nullopt);
  ASSERT_TRUE(app);
  EXPECT_EQ(f.state.decisions().agents_placed, 2u);
  // Forced growth and a reduction: applied; then growth the break-even rule refuses.
  ASSERT_TRUE(f.state.app_resize(*app, 3, true));
  ASSERT_TRUE(f.state.app_resize(*app, 2, false));
  EXPECT_EQ(f.state.decisions().resize_applied, 2u);
  EXPECT_EQ(f.state.decisions().agents_placed, 3u);
  EXPECT_EQ(f.state.decisions().agents_removed, 1u);
  ASSERT_TRUE(f.state.app_progress(*app, 1, 10.0, 100.0));
  auto refused = f.state.app_resize(*app, 3, false);  // t_probe 100 s, 4 checkpoints left: no
  ASSERT_TRUE(refused);
  EXPECT_FALSE(refused->applied);
  EXPECT_EQ(f.state.decisions().resize_refused, 1u);
  // b goes silent: its agent moves to a.
  ASSERT_TRUE(f.state.node_heartbeat("a", metrics(1 << 30, 0), {}, 4));
  EXPECT_EQ(f.state.expire(5.5), (strs{"b"}));
  EXPECT_EQ(f.state.decisions().nodes_lost, 1u);
  EXPECT_EQ(f.state.decisions().agents_moved, 1u);
  ASSERT_TRUE(f.state.node_leave("a"));
  EXPECT_EQ(f.state.decisions().nodes_left, 1u);
  EXPECT_EQ(f.state.decisions().agents_removed, 3u);  // nowhere to go

  std::string text = controller_openmetrics(f.state);
  EXPECT_NE(text.find("\ncairn_controller_agent_placements_total{action=\"placed\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\ncairn_controller_agent_placements_total{action=\"moved\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("\ncairn_controller_agent_placements_total{action=\"removed\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("\ncairn_controller_nodes_removed_total{reason=\"lost\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("\ncairn_controller_resize_requests_total{outcome=\"refused\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("\ncairn_controller_app_target_agents{app=\"x\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("\ncairn_controller_app_agents{app=\"x\"} 0\n"), std::string::npos);
  EXPECT_EQ(text.substr(text.size() - 6), "# EOF\n");

  // A controller that replays the journal made none of those decisions.
  controller_state r(controller_policy{}, [](const json&) { return status(); });
  for (const auto& rec : f.records) ASSERT_TRUE(r.apply(rec)) << rec.dump();
  EXPECT_EQ(r.decisions().agents_placed, 0u);
  EXPECT_EQ(r.decisions().nodes_lost, 0u);
}

// A request on a raw blocking socket; the whole answer once the server closed.
std::string http_get(const net_address& a, const std::string& request) {
  auto fd = connect_tcp(a, 2000);
  if (!fd) return "connect: " + fd.error().to_string();
  ::fcntl(fd->get(), F_SETFL, ::fcntl(fd->get(), F_GETFL) & ~O_NONBLOCK);
  struct timeval tv {10, 0};
  ::setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd->get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  for (size_t off = 0; off < request.size();) {
    ssize_t n = ::send(fd->get(), request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return "send: " + std::string(std::strerror(errno));
    off += static_cast<size_t>(n);
  }
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd->get(), buf, sizeof buf, 0);
    if (n == 0) return out;
    if (n < 0) return out + "(recv: " + std::strerror(errno) + ")";
    out.append(buf, static_cast<size_t>(n));
  }
}

TEST_F(agents_env, controller_and_manager_serve_metrics_on_their_loop) {
  controller_options o;
  o.listen = {"127.0.0.1", 0};
  o.secret = kSecret;
  o.journal_path = dir_ + "/journal";
  o.metrics_listen = net_address{"127.0.0.1", 0};
  auto c = controller_service::open(o);
  ASSERT_TRUE(c) << c.error().to_string();
  auto maddr = parse_address((*c)->metrics_address());
  ASSERT_TRUE(maddr) << (*c)->metrics_address();
  manager_options mo;
  mo.controller = *parse_address((*c)->address());
  mo.secret = kSecret;
  mo.node_id = "n1";
  mo.capacity = 3;
  mo.run_dir = dir_ + "/run";
  mo.metrics_listen = net_address{"127.0.0.1", 0};
  auto m = manager_service::open(mo);
  ASSERT_TRUE(m) << m.error().to_string();
  auto mgr_addr = parse_address((*m)->metrics_address());
  ASSERT_TRUE(mgr_addr);
  std::atomic<bool> stop{false};
  std::thread t([&] {
    while (!stop) {
      (*c)->run_once(10);
      (*m)->run_once(10);
    }
  });
  const double until = util::now_s() + 10;
  std::string text;
  while (util::now_s() < until) {
    text = http_get(*maddr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    if (text.find("cairn_controller_nodes{state=\"up\"} 1\n") != std::string::npos) break;
    ::usleep(50000);
  }
  EXPECT_EQ(text.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << text;
  EXPECT_NE(text.find("cairn_controller_node_capacity_agents{node=\"n1\"} 3\n"), std::string::npos) << text;
  std::string mt = http_get(*mgr_addr, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_NE(mt.find("\r\n\r\n# TYPE cairn_manager_connected gauge\n"), std::string::npos) << mt;
  EXPECT_NE(mt.find("cairn_manager_capacity_agents{node=\"n1\"} 3\n"), std::string::npos) << mt;
  // A request split over several sends, one too large, and one in pieces
  // after a silent connection: each answered, the service goes on.
  EXPECT_EQ(http_get(*maddr, "GET /nothing HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  std::string big = http_get(*maddr, "GET /metrics HTTP/1.1\r\nX: " + std::string(9000, 'a') + "\r\n\r\n");
  EXPECT_EQ(big.rfind("HTTP/1.1 400", 0), 0u) << big;
  auto idle = connect_tcp(*maddr, 2000);  // silent: must not block the others
  ASSERT_TRUE(idle);
  EXPECT_EQ(http_get(*maddr, "GET /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  // The control plane still answers.
  auto st = control_call(*parse_address((*c)->address()), kSecret, "admin", ctl_type::status, json::object(), 5000);
  ASSERT_TRUE(st) << st.error().to_string();
  EXPECT_EQ((*st)["nodes"].size(), 1u);
  stop = true;
  t.join();
  // A metrics address that cannot be bound fails the open with what is wrong.
  controller_options o2 = o;
  o2.journal_path = dir_ + "/journal2";
  o2.metrics_listen = *maddr;  // in use by the first controller
  auto c2 = controller_service::open(o2);
  ASSERT_FALSE(c2);
  EXPECT_NE(c2.error().message().find("metrics endpoint"), std::string::npos) << c2.error().to_string();
}

}  // namespace
}  // namespace cairn::agents
