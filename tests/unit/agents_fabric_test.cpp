// The inter-rank data plane (src/fabric: fabric, transfer) on loopback, and
// the codecs of the agents' protocol over it (src/agents/data_protocol): two
// endpoints in one process, RMA reads and writes of 1 B .. 64 MiB, errors
// that must come back as values (wrong key, peer gone), messages, and shard
// images pulled and pushed by several lanes.
//
// The provider is CAIRN_TEST_FABRIC_PROVIDER (default "tcp;ofi_rxm"); every
// test skips itself when fi_getinfo finds no usable provider.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include "agents/data_protocol.hpp"
#include "cairn.h"
#include "engine/staging.hpp"
#include "fabric/fabric.hpp"
#include "fabric/mailbox.hpp"
#include "fabric/seal.hpp"
#include "fabric/transfer.hpp"
#include "test_store.hpp"

namespace cairn::fabric {
namespace {

fabric_options test_options() {
  fabric_options o;
  if (const char* p = std::getenv("CAIRN_TEST_FABRIC_PROVIDER")) o.provider = p;
  o.node = "127.0.0.1";
  o.timeout_s = 20;
  return o;
}

// Skips the test (with the reason) when the provider cannot be opened here.
#define SKIP_WITHOUT_FABRIC()                                                                    \
  do {                                                                                           \
    status probe_ = probe_provider(test_options());                                              \
    if (!probe_.is_ok())                                                                         \
      GTEST_SKIP() << "no usable libfabric provider, fabric tests skipped: " << probe_.to_string(); \
  } while (0)

// Providers that check keys (tcp, sockets, verbs, cxi, efa) fail the read;
// shm does not check them (it reads the peer's memory directly).
bool checks_keys() { return test_options().provider.rfind("shm", 0) != 0; }

void fill(std::byte* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    p[i] = static_cast<std::byte>(seed >> 56);
  }
}

engine::aligned_buffer buffer(size_t n) {
  auto b = engine::aligned_buffer::allocate(n);
  EXPECT_TRUE(b.is_ok()) << b.error().to_string();
  return std::move(b).value();
}

class FabricTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_FABRIC();
    fabric_options t = test_options();
    t.progress_thread = true;  // the passive side
    auto a = fabric_context::create(t);
    ASSERT_TRUE(a.is_ok()) << a.error().to_string();
    target_ = std::move(a).value();
    fabric_options i = test_options();
    i.max_chunk = 1 << 20;  // so that large transfers are split and pipelined
    auto b = fabric_context::create(i);
    ASSERT_TRUE(b.is_ok()) << b.error().to_string();
    initiator_ = std::move(b).value();
    auto peer = initiator_->insert_peer(target_->name());
    ASSERT_TRUE(peer.is_ok()) << peer.error().to_string();
    peer_ = *peer;
  }

  std::unique_ptr<fabric_context> target_;
  std::unique_ptr<fabric_context> initiator_;
  fabric_addr peer_ = 0;
};

// libfabric is loaded on first use and its providers install signal handlers
// (libpsm2, libinfinipath): the application's stay as they were.
TEST(FabricSignals, OpeningAContextKeepsTheApplicationsHandlers) {
  static volatile sig_atomic_t got = 0;
  struct sigaction mine {}, old_term {}, old_int {};
  mine.sa_handler = [](int) { got = 1; };
  ASSERT_EQ(::sigaction(SIGTERM, &mine, &old_term), 0);
  ASSERT_EQ(::sigaction(SIGINT, &mine, &old_int), 0);
  // The first test of the file: libfabric is loaded here, after the handlers.
  auto ctx = fabric_context::create(test_options());
  if (!ctx.is_ok()) {
    (void)::sigaction(SIGTERM, &old_term, nullptr);
    (void)::sigaction(SIGINT, &old_int, nullptr);
    GTEST_SKIP() << "no usable libfabric provider: " << ctx.error().to_string();
  }
  struct sigaction now {};
  for (int s : {SIGTERM, SIGINT}) {
    ASSERT_EQ(::sigaction(s, nullptr, &now), 0);
    EXPECT_EQ(now.sa_handler, mine.sa_handler) << "signal " << s << " handler replaced";
  }
  ::raise(SIGTERM);
  EXPECT_EQ(got, 1);
  (void)::sigaction(SIGTERM, &old_term, nullptr);
  (void)::sigaction(SIGINT, &old_int, nullptr);
}

TEST_F(FabricTest, PropertiesAndName) {
  const fabric_properties& p = initiator_->properties();
  EXPECT_FALSE(p.provider.empty());
  EXPECT_GT(p.max_msg_size, 0u);
  EXPECT_EQ(p.chunk_bytes, std::min<uint64_t>(p.max_msg_size, 1 << 20));
  EXPECT_GE(p.max_outstanding, 1);
  EXPECT_FALSE(target_->name().empty());
  EXPECT_NE(target_->name(), initiator_->name());
  // Inserting the same name twice gives the same address.
  auto again = initiator_->insert_peer(target_->name());
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(*again, peer_);
}

TEST_F(FabricTest, ReadAndWriteOfManySizes) {
  // 1 B .. 64 MiB, including sizes that are not multiples of the 1 MiB chunk.
  const std::vector<size_t> sizes = {1,       7,           4095,     4096,          4097,
                                     65537,   1 << 20,     (1 << 20) + 1, (3 << 20) + 5, 17 << 20,
                                     64 << 20};
  const size_t cap = 64 << 20;
  auto remote = buffer(cap + 8192);
  auto local = buffer(cap + 8192);
  auto rmr = target_->register_memory(remote.data(), remote.size(), kRemoteRead | kRemoteWrite);
  ASSERT_TRUE(rmr.is_ok()) << rmr.error().to_string();
  auto lmr = initiator_->register_memory(local.data(), local.size(), kLocal);
  ASSERT_TRUE(lmr.is_ok()) << lmr.error().to_string();
  uint64_t seed = 1;
  for (size_t n : sizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    const size_t roff = n % 4096 == 0 ? 4096 : 3;  // unaligned remote offsets too
    // Read: remote pattern -> local.
    fill(remote.data() + roff, n, ++seed);
    std::memset(local.data(), 0, n + 1);
    status st = initiator_->read(peer_, local.data(), &*lmr, n, rmr->remote_address() + roff, rmr->key());
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(std::memcmp(local.data(), remote.data() + roff, n), 0);
    EXPECT_EQ(local.data()[n], std::byte{0}) << "read past the end";
    // Write: local pattern -> remote.
    fill(local.data(), n, ++seed);
    std::memset(remote.data() + roff, 0, n + 1);
    st = initiator_->write(peer_, local.data(), &*lmr, n, rmr->remote_address() + roff, rmr->key());
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(std::memcmp(local.data(), remote.data() + roff, n), 0) << "written data not visible at completion";
    EXPECT_EQ(remote.data()[roff + n], std::byte{0}) << "wrote past the end";
  }
}

TEST_F(FabricTest, ScatteredOperationsInOneCall) {
  const size_t n = 8 << 20;
  auto remote = buffer(n);
  auto local = buffer(n);
  fill(remote.data(), n, 42);
  auto rmr = target_->register_memory(remote.data(), n, kRemoteRead);
  ASSERT_TRUE(rmr.is_ok());
  auto lmr = initiator_->register_memory(local.data(), n, kLocal);
  ASSERT_TRUE(lmr.is_ok());
  std::vector<rma_op> ops;
  for (size_t off = 0; off < n; off += 3 << 18)  // 768 KiB strides, 500 KiB each
    ops.push_back({local.data() + off, std::min<size_t>(500 << 10, n - off), rmr->remote_address() + off, rmr->key(),
                   &*lmr});
  status st = initiator_->read(peer_, ops);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  for (const auto& op : ops)
    ASSERT_EQ(std::memcmp(op.local, remote.data() + (op.local - local.data()), op.len), 0);
}

TEST_F(FabricTest, WrongKeyIsAnErrorNotACrash) {
  if (!checks_keys()) GTEST_SKIP() << "provider " << test_options().provider << " does not check keys";
  const size_t n = 1 << 16;
  auto remote = buffer(n);
  auto local = buffer(n);
  fill(remote.data(), n, 7);
  auto rmr = target_->register_memory(remote.data(), n, kRemoteRead);
  ASSERT_TRUE(rmr.is_ok());
  auto lmr = initiator_->register_memory(local.data(), n, kLocal);
  ASSERT_TRUE(lmr.is_ok());
  status st = initiator_->read(peer_, local.data(), &*lmr, n, rmr->remote_address(), rmr->key() + 12345);
  ASSERT_FALSE(st.is_ok());
  EXPECT_TRUE(st.code() == errc::io_error || st.code() == errc::invalid_argument) << st.to_string();
  EXPECT_NE(st.message().find("fi_read completed with an error"), std::string::npos) << st.to_string();
  // An error completion does not fail the context (only a timeout does).
  EXPECT_TRUE(initiator_->health().is_ok()) << initiator_->health().to_string();
  // The target serves other initiators as before.
  auto other = fabric_context::create(test_options());
  ASSERT_TRUE(other.is_ok());
  auto p = (*other)->insert_peer(target_->name());
  ASSERT_TRUE(p.is_ok());
  auto omr = (*other)->register_memory(local.data(), n, kLocal);
  ASSERT_TRUE(omr.is_ok());
  std::memset(local.data(), 0, n);
  st = (*other)->read(*p, local.data(), &*omr, n, rmr->remote_address(), rmr->key());
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(std::memcmp(local.data(), remote.data(), n), 0);
  // Reading past the end of the region is an error too.
  st = (*other)->read(*p, local.data(), &*omr, n, rmr->remote_address() + n / 2, rmr->key());
  EXPECT_FALSE(st.is_ok());
}

TEST_F(FabricTest, RevokedRegionIsAnError) {
  const size_t n = 4096;
  auto remote = buffer(n);
  auto local = buffer(n);
  uint64_t addr = 0, key = 0;
  {
    auto rmr = target_->register_memory(remote.data(), n, kRemoteWrite);
    ASSERT_TRUE(rmr.is_ok());
    addr = rmr->remote_address();
    key = rmr->key();
  }  // closed: the key is gone
  auto lmr = initiator_->register_memory(local.data(), n, kLocal);
  ASSERT_TRUE(lmr.is_ok());
  status st = initiator_->write(peer_, local.data(), &*lmr, n, addr, key);
  EXPECT_FALSE(st.is_ok());
}

TEST_F(FabricTest, InvalidArguments) {
  EXPECT_EQ(initiator_->register_memory(nullptr, 10, kLocal).error().code(), errc::invalid_argument);
  std::byte b[16];
  EXPECT_EQ(initiator_->register_memory(b, sizeof b, 0).error().code(), errc::invalid_argument);
  EXPECT_EQ(initiator_->insert_peer("").error().code(), errc::invalid_argument);
  std::string big(initiator_->max_message_bytes() + 1, 'x');
  EXPECT_EQ(initiator_->send(peer_, big).code(), errc::invalid_argument);
  // A zero-length operation is a no-op.
  EXPECT_TRUE(initiator_->read(peer_, b, nullptr, 0, 0, 0).is_ok());
}

TEST_F(FabricTest, Messages) {
  auto back = target_->insert_peer(initiator_->name());
  ASSERT_TRUE(back.is_ok());
  for (int i = 0; i < 40; ++i) {  // more than the receive buffers posted
    std::string text = "hello " + std::to_string(i);
    ASSERT_TRUE(initiator_->send(peer_, text).is_ok());
    auto got = target_->recv(10);
    ASSERT_TRUE(got.is_ok()) << got.error().to_string();
    EXPECT_EQ(*got, text);
    ASSERT_TRUE(target_->send(*back, "re: " + text).is_ok());
    auto reply = initiator_->recv(10);
    ASSERT_TRUE(reply.is_ok()) << reply.error().to_string();
    EXPECT_EQ(*reply, "re: " + text);
  }
  std::string full(initiator_->max_message_bytes(), 'z');
  ASSERT_TRUE(initiator_->send(peer_, full).is_ok());
  auto got = target_->recv(10);
  ASSERT_TRUE(got.is_ok());
  EXPECT_EQ(*got, full);
  auto none = initiator_->recv(0.2);
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.error().code(), errc::again);
}

TEST(FabricSeal, OnlyTheKeyAndContextItWasSealedForOpenIt) {
  auto key = fabric::new_plane_key(), other = fabric::new_plane_key();
  ASSERT_TRUE(key && other);
  const std::string sealed = fabric::seal(*key, 7, "READY v2");
  ASSERT_EQ(sealed.size(), 8 + fabric::kPlaneTagBytes);
  EXPECT_EQ(fabric::unseal(*key, 7, sealed).value_or("?"), "READY v2");
  EXPECT_FALSE(fabric::unseal(*other, 7, sealed));  // another job's or application's key
  EXPECT_FALSE(fabric::unseal(*key, 8, sealed));    // meant for another receiver
  EXPECT_FALSE(fabric::unseal(*key, 7, "READY v2"));  // unsealed
  EXPECT_FALSE(fabric::unseal(*key, 7, ""));
  std::string flipped = sealed;
  flipped[0] ^= 1;
  EXPECT_FALSE(fabric::unseal(*key, 7, flipped));
  EXPECT_FALSE(fabric::unseal("", 7, sealed));  // no key opens nothing
}

// A job's own sealed traffic recorded and sent again (same key, same bytes:
// the seal has no nonce, so rebuilding the message is recording it) is
// dropped, as is a message of a session the rank did not join with (a plane
// made again); a fresh message from the rank is still taken.
TEST(FabricMailbox, ARecordingOfTheJobsOwnTrafficIsDropped) {
  SKIP_WITHOUT_FABRIC();
  mailbox_options o;
  o.provider = test_options().provider;
  o.bind = "127.0.0.1";
  o.lanes = 1;
  o.timeout_s = 1;  // await gives up after a second without a fresh message
  auto a = mailbox::create(o), b = mailbox::create(o);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto key = new_plane_key();
  ASSERT_TRUE(key.is_ok());
  const std::vector<std::string> job{(*a)->address(), (*b)->address()};
  ASSERT_TRUE((*a)->join(0, job, *key).is_ok());
  ASSERT_TRUE((*b)->join(1, job, *key).is_ok());
  data_message m;
  m.type = data_msg::ready;
  m.name = "state";
  m.version = 3;
  m.rank = 0;
  m.addr = 4096;
  ASSERT_TRUE((*a)->send(1, m).is_ok());
  std::atomic<bool> cancelled{false};
  auto got = (*b)->await(data_msg::ready, "state", 3, 0, cancelled);
  ASSERT_TRUE(got.is_ok()) << got.error().to_string();
  EXPECT_EQ(got->addr, 4096u);

  // The recording: what rank 0 sent, sealed for rank 1, from a stranger's endpoint.
  auto stranger = fabric_context::create(test_options());
  ASSERT_TRUE(stranger.is_ok());
  auto to_b = (*stranger)->insert_peer((*b)->address().substr(sizeof(uint64_t)));
  ASSERT_TRUE(to_b.is_ok());
  uint64_t session = 0;
  std::memcpy(&session, (*a)->address().data(), sizeof session);
  data_message recorded = m;
  recorded.session = session;
  recorded.request = 1;
  ASSERT_TRUE((*stranger)->send(*to_b, seal(*key, 1, encode_data_message(recorded))).is_ok());
  data_message other_session = recorded;
  other_session.session = session + 1;
  other_session.request = 7;
  ASSERT_TRUE((*stranger)->send(*to_b, seal(*key, 1, encode_data_message(other_session))).is_ok());
  auto replayed = (*b)->await(data_msg::ready, "state", 3, 0, cancelled);
  EXPECT_FALSE(replayed.is_ok());
  EXPECT_EQ((*b)->replayed(), 2u);
  EXPECT_EQ((*b)->refused(), 0u);  // both were sealed under the job's key

  m.addr = 8192;
  ASSERT_TRUE((*a)->send(1, m).is_ok());
  got = (*b)->await(data_msg::ready, "state", 3, 0, cancelled);
  ASSERT_TRUE(got.is_ok()) << got.error().to_string();
  EXPECT_EQ(got->addr, 8192u);
}

TEST(FabricPeerGone, ReadFromAClosedPeerFailsWithinTheTimeout) {
  SKIP_WITHOUT_FABRIC();
  // libfabric 1.17's shm dereferences the vanished peer's shared memory.
  if (!checks_keys()) GTEST_SKIP() << "shm crashes when a peer's endpoint is gone";
  fabric_options t = test_options();
  t.progress_thread = true;
  auto target = fabric_context::create(t);
  ASSERT_TRUE(target.is_ok());
  fabric_options i = test_options();
  i.timeout_s = 2;
  auto initiator = fabric_context::create(i);
  ASSERT_TRUE(initiator.is_ok());
  auto peer = (*initiator)->insert_peer((*target)->name());
  ASSERT_TRUE(peer.is_ok());
  const size_t n = 1 << 20;
  auto remote = buffer(n);
  auto local = buffer(n);
  auto rmr = (*target)->register_memory(remote.data(), n, kRemoteRead);
  ASSERT_TRUE(rmr.is_ok());
  auto lmr = (*initiator)->register_memory(local.data(), n, kLocal);
  ASSERT_TRUE(lmr.is_ok());
  const uint64_t addr = rmr->remote_address(), key = rmr->key();
  ASSERT_TRUE((*initiator)->read(*peer, local.data(), &*lmr, n, addr, key).is_ok());
  *rmr = memory_region();
  target->reset();  // the peer is gone
  auto t0 = std::chrono::steady_clock::now();
  status st = (*initiator)->read(*peer, local.data(), &*lmr, n, addr, key);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), errc::io_error) << st.to_string();
  EXPECT_LT(took, i.timeout_s + 5) << st.to_string();
  // A message to it fails too rather than hang.
  EXPECT_FALSE((*initiator)->send(*peer, "anyone?").is_ok());
}

TEST(FabricPeerGone, UnresponsivePeerTimesOutAndFailsTheContext) {
  SKIP_WITHOUT_FABRIC();
  // A target that never drives progress: with manual-progress providers
  // (tcp) nothing moves, like a peer that hangs.
  fabric_options t = test_options();
  t.progress_thread = false;
  auto target = fabric_context::create(t);
  ASSERT_TRUE(target.is_ok());
  if (!(*target)->properties().manual_progress) GTEST_SKIP() << "provider progresses by itself";
  fabric_options i = test_options();
  i.timeout_s = 1;
  auto initiator = fabric_context::create(i);
  ASSERT_TRUE(initiator.is_ok());
  auto peer = (*initiator)->insert_peer((*target)->name());
  ASSERT_TRUE(peer.is_ok());
  const size_t n = 1 << 20;
  auto remote = buffer(n);
  auto local = buffer(n);
  auto rmr = (*target)->register_memory(remote.data(), n, kRemoteRead);
  ASSERT_TRUE(rmr.is_ok());
  auto lmr = (*initiator)->register_memory(local.data(), n, kLocal);
  ASSERT_TRUE(lmr.is_ok());
  auto t0 = std::chrono::steady_clock::now();
  status st = (*initiator)->read(*peer, local.data(), &*lmr, n, rmr->remote_address(), rmr->key());
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), errc::io_error);
  EXPECT_NE(st.message().find("no completion for"), std::string::npos) << st.to_string();
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 10);
  // The context is failed for good; later calls say so at once.
  EXPECT_FALSE((*initiator)->health().is_ok());
  EXPECT_EQ((*initiator)->send(*peer, "x").message(), st.message());
  initiator->reset();  // closes the endpoint: the read can no longer land in `local`
}

// shm's regions of killed processes go when the next process opens its first
// shm endpoint; a live process's, and names that are not cairn's, stay.
TEST(FabricNames, DeadProcessesShmRegionsAreRemoved) {
  char tmpl[] = "/tmp/cairn-shm-regions-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const pid_t zombie = ::fork();  // killed, not reaped yet: its regions are as dead
  ASSERT_GE(zombie, 0);
  if (zombie == 0) ::_exit(0);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(zombie), &info, WEXITED | WNOWAIT), 0);
  const std::string mine = shm_node_name();
  const std::string prefix = mine.substr(0, mine.rfind('.') + 1);
  EXPECT_EQ(mine, prefix + std::to_string(::getpid()));
  const std::vector<std::string> gone = {prefix + std::to_string(dead) + ":0:0", prefix + std::to_string(dead) + ":0:7",
                                         prefix + std::to_string(zombie) + ":0:0"};
  const std::vector<std::string> kept = {mine + ":0:0", std::to_string(dead) + ":0:0", prefix + "12x:0:0",
                                         prefix + std::to_string(dead), "cairn.999999.1." + std::to_string(dead) + ":0:0"};
  for (const auto& n : gone) std::ofstream(dir + "/" + n) << "region";
  for (const auto& n : kept) std::ofstream(dir + "/" + n) << "region";
  EXPECT_EQ(remove_dead_shm_regions(dir), gone.size());
  for (const auto& n : gone) EXPECT_FALSE(std::filesystem::exists(dir + "/" + n)) << n;
  for (const auto& n : kept) EXPECT_TRUE(std::filesystem::exists(dir + "/" + n)) << n;
  std::filesystem::remove_all(dir);
  ASSERT_EQ(::waitpid(zombie, nullptr, 0), zombie);
}

TEST(FabricNames, HexRoundTrip) {
  std::string raw("\x00\x01\xfe\xff abc", 8);
  EXPECT_EQ(to_hex(raw), "0001feff20616263");
  auto back = from_hex(to_hex(raw) + "\n");
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(*back, raw);
  EXPECT_FALSE(from_hex("abc").is_ok());
  EXPECT_FALSE(from_hex("zz").is_ok());
  EXPECT_FALSE(from_hex("").is_ok());
}

TEST(FabricProvider, UnknownProviderIsNotSupported) {
  fabric_options o = test_options();
  o.provider = "no-such-provider";
  status st = probe_provider(o);
  EXPECT_EQ(st.code(), errc::not_supported) << st.to_string();
  EXPECT_NE(st.message().find("no-such-provider"), std::string::npos);
  auto ctx = fabric_context::create(o);
  EXPECT_FALSE(ctx.is_ok());
}

// ---- transfer -----------------------------------------------------------------

TEST(AgentMessages, EncodeDecodeRoundTrip) {
  agents::data_message m;
  m.type = agents::data_msg::push_target;
  m.mode = agents::transfer_mode::push;
  m.request = 77;
  m.version = -1;
  m.rank = 3;
  m.nranks = 8;
  m.addr = 0x7f0000001000;
  m.key = 0xdeadbeef;
  m.length = 1ull << 33;
  m.code = static_cast<int32_t>(errc::corruption);
  m.reply_to = std::string("\x01\x00\x02", 3);
  m.run = "run";
  m.name = "ckpt";
  m.text = "why";
  std::string bytes = agents::encode_data_message(m);
  EXPECT_LE(bytes.size(), 4096u);
  auto d = agents::decode_data_message(bytes);
  ASSERT_TRUE(d.is_ok()) << d.error().to_string();
  EXPECT_EQ(d->type, m.type);
  EXPECT_EQ(d->mode, m.mode);
  EXPECT_EQ(d->request, m.request);
  EXPECT_EQ(d->version, m.version);
  EXPECT_EQ(d->rank, m.rank);
  EXPECT_EQ(d->nranks, m.nranks);
  EXPECT_EQ(d->addr, m.addr);
  EXPECT_EQ(d->key, m.key);
  EXPECT_EQ(d->length, m.length);
  EXPECT_EQ(d->reply_to, m.reply_to);
  EXPECT_EQ(d->run, m.run);
  EXPECT_EQ(d->name, m.name);
  EXPECT_EQ(d->text, m.text);
  EXPECT_EQ(agents::data_message_status(*d).code(), errc::corruption);
  EXPECT_EQ(agents::decode_data_message(bytes.substr(0, bytes.size() - 1)).error().code(), errc::corruption);
  EXPECT_EQ(agents::decode_data_message("nonsense").error().code(), errc::corruption);
  std::string other = bytes;
  other[4] = 9;  // wire version
  EXPECT_EQ(agents::decode_data_message(other).error().code(), errc::not_supported);
}

test::shard_image make_image(int64_t version, uint64_t big_elems) {
  std::vector<test::region_spec> regions = {{"grid", CAIRN_FLOAT64, big_elems, {}, false},
                                            {"step", CAIRN_INT64, 1, {}, false},
                                            {"odd", CAIRN_UINT8, 12345, {}, false}};
  auto img = test::make_shard_image("run", "state", version, 2, 4, regions);
  EXPECT_TRUE(img.is_ok()) << img.error().to_string();
  return std::move(img).value();
}

TEST(AgentImages, ExtentsCoverHeaderAndRegionsOnly) {
  auto img = make_image(1, 1000);
  auto ext = image_extents(img.header);
  ASSERT_FALSE(ext.empty());
  EXPECT_EQ(ext[0].offset, 0u);
  uint64_t covered = 0;
  for (const auto& e : ext) covered += e.length;
  uint64_t expect = img.header.data_offset;
  for (const auto& r : img.header.regions) expect += r.length;
  EXPECT_EQ(covered, expect);
  EXPECT_LT(covered, img.header.file_size);  // padding is skipped
  EXPECT_TRUE(verify_shard_image(img.bytes, "test").is_ok());
}

class TransferTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_FABRIC();
    fabric_options t = test_options();
    t.progress_thread = true;
    auto a = fabric_context::create(t);
    ASSERT_TRUE(a.is_ok()) << a.error().to_string();
    app_ = std::move(a).value();
    transfer_options o;
    o.fabric = test_options();
    o.fabric.max_chunk = 1 << 20;
    o.threads = GetParam();
    o.piece_bytes = 1 << 20;
    auto e = transfer_engine::create(o);
    ASSERT_TRUE(e.is_ok()) << e.error().to_string();
    lanes_ = std::move(e).value();
  }

  std::unique_ptr<fabric_context> app_;
  std::unique_ptr<transfer_engine> lanes_;
};

TEST_P(TransferTest, PullVerifiesAndPushPlacesAnImage) {
  ASSERT_EQ(lanes_->threads(), GetParam());
  auto img = make_image(5, (6 << 20) / 8 + 3);  // ~6 MiB, not a multiple of anything
  // The application's staging slot: page-aligned, registered for the agent.
  auto slot = buffer(img.bytes.size());
  std::memcpy(slot.data(), img.bytes.data(), img.bytes.size());
  auto mr = app_->register_memory(slot.data(), img.bytes.size(), kRemoteRead | kRemoteWrite);
  ASSERT_TRUE(mr.is_ok());
  remote_buffer rb{app_->name(), mr->remote_address(), mr->key(), img.bytes.size()};

  auto held = buffer(img.bytes.size());
  std::memset(held.data(), 0xa5, held.size());  // padding must come back zeroed
  auto h = pull_image(*lanes_, rb, held.span(), &img.header);
  ASSERT_TRUE(h.is_ok()) << h.error().to_string();
  EXPECT_EQ(h->version, 5);
  EXPECT_EQ(std::memcmp(held.data(), img.bytes.data(), img.bytes.size()), 0);

  // A header that names another version is refused.
  format::shard_header other = img.header;
  other.version = 6;
  auto wrong = pull_image(*lanes_, rb, held.span(), &other);
  EXPECT_EQ(wrong.error().code(), errc::corruption);

  // Push back into a zeroed slot: every extent lands where it belongs.
  std::memset(slot.data(), 0, img.bytes.size());
  auto ext = image_extents(img.header);
  status st = lanes_->push(rb, held.span().first(img.bytes.size()), ext);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_TRUE(verify_shard_image(std::span<const std::byte>(slot.data(), img.bytes.size()), "slot").is_ok());
  EXPECT_EQ(std::memcmp(slot.data(), img.bytes.data(), img.bytes.size()), 0);
}

TEST_P(TransferTest, LentRegionsArePulledFromTheApplicationsMemory) {
  auto img = make_image(7, (3 << 20) / 8 + 5);
  // The slot has the header block only: its region bytes are garbage (a
  // reused slot), the real ones live in the application's own buffers.
  auto slot = buffer(img.bytes.size());
  std::memset(slot.data(), 0x5a, img.bytes.size());
  std::memcpy(slot.data(), img.bytes.data(), img.header.regions[0].offset);
  auto mr = app_->register_memory(slot.data(), img.bytes.size(), kRemoteRead);
  ASSERT_TRUE(mr.is_ok());
  std::vector<util::aligned_buffer> own;
  std::vector<memory_region> mrs;
  std::vector<lent_region> lent;
  for (uint32_t i : {0u, 2u}) {  // region 1 stays in the slot
    const auto& d = img.header.regions[i];
    own.push_back(buffer(d.length));
    std::memcpy(own.back().data(), img.bytes.data() + d.offset, d.length);
    auto m = app_->register_memory(own.back().data(), d.length, kRemoteRead);
    ASSERT_TRUE(m.is_ok());
    lent.push_back({i, m->remote_address(), m->key()});
    mrs.push_back(std::move(m).value());
  }
  const auto& step = img.header.regions[1];
  std::memcpy(slot.data() + step.offset, img.bytes.data() + step.offset, step.length);
  remote_buffer rb{app_->name(), mr->remote_address(), mr->key(), img.bytes.size()};
  auto held = buffer(img.bytes.size());
  auto h = pull_image(*lanes_, rb, held.span(), &img.header, lent);
  ASSERT_TRUE(h.is_ok()) << h.error().to_string();
  EXPECT_EQ(std::memcmp(held.data(), img.bytes.data(), img.bytes.size()), 0);
  // Without the lent regions the slot's garbage fails the checksums.
  EXPECT_EQ(pull_image(*lanes_, rb, held.span(), &img.header).error().code(), errc::corruption);
  // A lent index out of range, or twice, is refused.
  std::vector<lent_region> bad = {lent[0], lent[0]};
  EXPECT_EQ(pull_image(*lanes_, rb, held.span(), &img.header, bad).error().code(), errc::corruption);
  bad = {{7, 0, 0}};
  EXPECT_EQ(pull_image(*lanes_, rb, held.span(), &img.header, bad).error().code(), errc::corruption);
}

TEST(AgentMessages, LentRegionsRoundTripAndMalformedAreRefused) {
  std::vector<lent_region> v = {{0, 140737488355328ull, 7}, {3, 0, 18446744073709551615ull}};
  auto d = agents::decode_lent(agents::encode_lent(v));
  ASSERT_TRUE(d.is_ok());
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ((*d)[1].index, 3u);
  EXPECT_EQ((*d)[1].key, 18446744073709551615ull);
  EXPECT_EQ((*d)[0].addr, 140737488355328ull);
  for (const char* bad : {"1:2", "x:1:2", "1:2:3:4", "4294967296:1:1", "1:2:3,"})
    EXPECT_FALSE(agents::decode_lent(bad).is_ok()) << bad;
  EXPECT_TRUE(agents::decode_lent("").is_ok());
}

TEST_P(TransferTest, DamagedImageIsNotHeld) {
  auto img = make_image(9, 300000);
  auto slot = buffer(img.bytes.size());
  std::memcpy(slot.data(), img.bytes.data(), img.bytes.size());
  slot.data()[img.header.regions[0].offset + 1000] ^= std::byte{1};  // one bit in the data
  auto mr = app_->register_memory(slot.data(), img.bytes.size(), kRemoteRead);
  ASSERT_TRUE(mr.is_ok());
  remote_buffer rb{app_->name(), mr->remote_address(), mr->key(), img.bytes.size()};
  auto held = buffer(img.bytes.size());
  auto h = pull_image(*lanes_, rb, held.span());
  ASSERT_FALSE(h.is_ok());
  EXPECT_EQ(h.error().code(), errc::corruption) << h.error().to_string();
  // A length that does not match the header is refused before the data moves.
  rb.length -= 4096;
  h = pull_image(*lanes_, rb, held.span());
  EXPECT_EQ(h.error().code(), errc::corruption) << h.error().to_string();
}

TEST_P(TransferTest, AFailedPullLeavesTheEngineUsable) {
  if (!checks_keys()) GTEST_SKIP() << "provider " << test_options().provider << " does not check keys";
  const size_t n = 3 << 20;
  auto slot = buffer(n);
  fill(slot.data(), n, 99);
  auto mr = app_->register_memory(slot.data(), n, kRemoteRead);
  ASSERT_TRUE(mr.is_ok());
  auto local = buffer(n);
  extent all{0, n};
  remote_buffer bad{app_->name(), mr->remote_address(), mr->key() ^ 0x5555, n};
  status st = lanes_->pull(bad, local.span(), std::span<const extent>(&all, 1));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("pull of"), std::string::npos) << st.to_string();
  // The lanes of the failed call were replaced: the next pull works.
  remote_buffer good{app_->name(), mr->remote_address(), mr->key(), n};
  st = lanes_->pull(good, local.span(), std::span<const extent>(&all, 1));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(std::memcmp(local.data(), slot.data(), n), 0);
}

TEST_P(TransferTest, ExtentsOutsideTheBuffersAreRefused) {
  auto slot = buffer(8192);
  auto mr = app_->register_memory(slot.data(), 8192, kRemoteRead);
  ASSERT_TRUE(mr.is_ok());
  remote_buffer rb{app_->name(), mr->remote_address(), mr->key(), 8192};
  auto local = buffer(8192);
  extent e{4096, 8192};
  EXPECT_EQ(lanes_->pull(rb, local.span(), std::span<const extent>(&e, 1)).code(), errc::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Lanes, TransferTest, ::testing::Values(1, 2, 4));

// The FI_MR_LOCAL path (verbs, efa) on loopback: lanes register the local
// buffer in their own domains and pass descriptors; an unregistered local
// buffer is refused.
TEST(TransferLocalRegistration, LanesRegisterLocalBuffers) {
  SKIP_WITHOUT_FABRIC();
  fabric_options t = test_options();
  t.progress_thread = true;
  auto app = fabric_context::create(t);
  ASSERT_TRUE(app.is_ok());
  transfer_options o;
  o.fabric = test_options();
  o.fabric.force_local_mr = true;
  o.fabric.max_chunk = 1 << 20;
  o.threads = 2;
  o.piece_bytes = 1 << 20;
  auto lanes = transfer_engine::create(o);
  ASSERT_TRUE(lanes.is_ok()) << lanes.error().to_string();
  EXPECT_TRUE((*lanes)->properties().needs_local_mr);
  auto img = make_image(3, 500000);
  auto slot = buffer(img.bytes.size());
  std::memcpy(slot.data(), img.bytes.data(), img.bytes.size());
  auto mr = (*app)->register_memory(slot.data(), img.bytes.size(), kRemoteRead | kRemoteWrite);
  ASSERT_TRUE(mr.is_ok());
  remote_buffer rb{(*app)->name(), mr->remote_address(), mr->key(), img.bytes.size()};
  auto held = buffer(img.bytes.size());
  auto h = pull_image(**lanes, rb, held.span(), &img.header);
  ASSERT_TRUE(h.is_ok()) << h.error().to_string();
  std::memset(slot.data(), 0, img.bytes.size());
  status st = (*lanes)->push(rb, held.span().first(img.bytes.size()), image_extents(img.header));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(std::memcmp(slot.data(), img.bytes.data(), img.bytes.size()), 0);

  fabric_options f = test_options();
  f.force_local_mr = true;
  auto ctx = fabric_context::create(f);
  ASSERT_TRUE(ctx.is_ok());
  auto peer = (*ctx)->insert_peer((*app)->name());
  ASSERT_TRUE(peer.is_ok());
  EXPECT_EQ((*ctx)->read(*peer, held.data(), nullptr, 4096, rb.addr, rb.key).code(), errc::invalid_argument);
}

}  // namespace
}  // namespace cairn::fabric
