// plane_seal_bench: what sealing the job's data-plane messages costs
// (fabric/mailbox.hpp), in one run on one provider.
//
//   unsealed   a READY sent with fabric_context::send and answered with a
//              HELD, both as bare encoded messages: the simple alternative
//              (what the planes did before the seal);
//   sealed     the same exchange through two joined mailboxes (tag on send,
//              verification and decoding on await);
//   version    the bytes of one rank's image of --bytes pulled through the
//              mailbox's lanes: what each exchange announces and answers.
//
// Prints the median round trip of each message kind, the seal's added time
// per exchange, and that time as a share of a version's pull (target: within
// 3 %). Rounds alternate between the kinds.
//
// usage: plane_seal_bench [--messages N] [--bytes B] [--reps R]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fabric/mailbox.hpp"
#include "util/aligned_buffer.hpp"

using namespace cairn;
using clk = std::chrono::steady_clock;

namespace {

double secs(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void die(const status& st) {
  std::fprintf(stderr, "plane_seal_bench: %s\n", st.to_string().c_str());
  std::exit(1);
}

fabric::data_message ready(int64_t v, uint32_t rank) {
  fabric::data_message m;
  m.type = fabric::data_msg::ready;
  m.run = "bench";
  m.name = "ckpt";
  m.version = v;
  m.rank = rank;
  m.nranks = 2;
  m.addr = 4096;
  m.key = 7;
  m.length = 1 << 26;
  m.text = "/dev/shm/cairn\n0123456789abcdef";
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int messages = 2000, reps = 5;
  uint64_t bytes = 64ull << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--messages") messages = std::atoi(argv[i + 1]);
    else if (a == "--bytes") bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
  }
  fabric::mailbox_options o;
  o.bind = "127.0.0.1";
  o.timeout_s = 30;
  auto a = fabric::mailbox::create(o), b = fabric::mailbox::create(o);
  if (!a) die(a.error());
  if (!b) die(b.error());
  auto key = fabric::new_plane_key();
  if (!key) die(key.error());
  for (auto [box, self] : {std::pair{*a, 0u}, std::pair{*b, 1u}})
    if (status st = box->join(self, {(*a)->address(), (*b)->address()}, *key); !st) die(st);

  // Unsealed: two bare contexts.
  fabric::fabric_options f;
  f.node = "127.0.0.1";
  auto ca = fabric::fabric_context::create(f), cb = fabric::fabric_context::create(f);
  if (!ca || !cb) die(!ca ? ca.error() : cb.error());
  auto to_b = (*ca)->insert_peer((*cb)->name()), to_a = (*cb)->insert_peer((*ca)->name());
  if (!to_b || !to_a) die(!to_b ? to_b.error() : to_a.error());

  // The image a version's pull reads: b registers it, a pulls it.
  auto image = util::aligned_buffer::allocate(bytes);
  auto into = util::aligned_buffer::allocate(bytes);
  if (!image || !into) die(status(errc::no_space, "allocating the image"));
  std::memset(image->data(), 1, bytes);
  std::memset(into->data(), 0, bytes);
  auto mr = (*b)->context().register_memory(image->data(), bytes, fabric::kRemoteRead);
  if (!mr) die(mr.error());

  std::atomic<bool> never{false};
  std::vector<double> unsealed, sealed, pull;
  int64_t v = 0;
  for (int rep = 0; rep < reps; ++rep) {
    // Unsealed round trips: b answers in a thread, as a peer would.
    std::thread peer([&] {
      for (int i = 0; i < messages; ++i) {
        auto in = (*cb)->recv();
        if (!in) die(in.error());
        auto m = fabric::decode_data_message(*in);
        if (!m) die(m.error());
        fabric::data_message h = *m;
        h.type = fabric::data_msg::held;
        if (status st = (*cb)->send(*to_a, fabric::encode_data_message(h)); !st) die(st);
      }
    });
    auto t0 = clk::now();
    for (int i = 0; i < messages; ++i) {
      if (status st = (*ca)->send(*to_b, fabric::encode_data_message(ready(i, 0))); !st) die(st);
      auto in = (*ca)->recv();
      if (!in) die(in.error());
      if (!fabric::decode_data_message(*in)) die(status(errc::corruption, "reply"));
    }
    unsealed.push_back(secs(t0, clk::now()) / messages);
    peer.join();

    // Sealed round trips through the mailboxes.
    const int64_t first = v;
    std::thread sealed_peer([&] {
      for (int i = 0; i < messages; ++i) {
        auto m = (*b)->await(fabric::data_msg::ready, "ckpt", first + i, 0, never);
        if (!m) die(m.error());
        fabric::data_message h = *m;
        h.type = fabric::data_msg::held;
        h.rank = 1;
        if (status st = (*b)->send(0, h); !st) die(st);
      }
    });
    t0 = clk::now();
    for (int i = 0; i < messages; ++i, ++v) {
      if (status st = (*a)->send(1, ready(v, 0)); !st) die(st);
      auto m = (*a)->await(fabric::data_msg::held, "ckpt", v, 1, never);
      if (!m) die(m.error());
    }
    sealed.push_back(secs(t0, clk::now()) / messages);
    sealed_peer.join();

    t0 = clk::now();
    if (status st = (*a)->pull(1, mr->remote_address(), mr->key(), into->data(), bytes); !st) die(st);
    pull.push_back(secs(t0, clk::now()));
  }
  const double u = median(unsealed), s = median(sealed), p = median(pull);
  std::printf("round trip READY -> HELD, median of %d reps x %d messages (tcp;ofi_rxm, loopback):\n", reps, messages);
  std::printf("  unsealed (bare fabric_context)   %8.2f us\n", u * 1e6);
  std::printf("  sealed (mailbox, BLAKE2b tags)   %8.2f us   (%.2fx)\n", s * 1e6, s / u);
  std::printf("pull of one rank's image of %llu MiB  %8.2f ms   (%.2f GB/s)\n",
              static_cast<unsigned long long>(bytes >> 20), p * 1e3, static_cast<double>(bytes) / p / 1e9);
  std::printf("seal's cost per version exchange: %.2f us = %.3f %% of the pull (target: within 3 %%)\n",
              (s - u) * 1e6, 100.0 * (s - u) / p);
  return 0;
}
