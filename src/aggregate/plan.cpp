#include "aggregate/plan.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <queue>
#include <tuple>
#include <unordered_map>

namespace cairn::aggregate {
namespace {

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Leaders spread over nodes: nodes by total bytes (descending; then lower mean
// load, then node id), ranks within a node by bytes (descending; then load,
// then rank); one leader per node per round until M.
std::vector<uint32_t> elect(std::span<const rank_input> ranks, uint32_t m) {
  struct node_info {
    uint64_t bytes = 0;
    double load = 0;
    std::vector<uint32_t> ranks;
  };
  std::map<uint32_t, node_info> nodes;
  for (uint32_t r = 0; r < ranks.size(); ++r) {
    auto& n = nodes[ranks[r].node];
    n.bytes += ranks[r].bytes;
    n.load += ranks[r].load;
    n.ranks.push_back(r);
  }
  std::vector<std::pair<uint32_t, node_info*>> order;
  for (auto& [id, n] : nodes) {
    n.load /= static_cast<double>(n.ranks.size());
    std::sort(n.ranks.begin(), n.ranks.end(), [&](uint32_t a, uint32_t b) {
      if (ranks[a].bytes != ranks[b].bytes) return ranks[a].bytes > ranks[b].bytes;
      if (ranks[a].load != ranks[b].load) return ranks[a].load < ranks[b].load;
      return a < b;
    });
    order.emplace_back(id, &n);
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    if (a.second->bytes != b.second->bytes) return a.second->bytes > b.second->bytes;
    if (a.second->load != b.second->load) return a.second->load < b.second->load;
    return a.first < b.first;
  });
  std::vector<uint32_t> out;
  for (size_t round = 0; out.size() < m; ++round)
    for (auto& [id, n] : order) {
      if (out.size() == m) break;
      if (round < n->ranks.size()) out.push_back(n->ranks[round]);
    }
  return out;
}

}  // namespace

// Longer than 120 lines for a reason: its phases (leaders, capacities, the
// assignment of every rank's bytes, what each leader owns) share the plan
// under construction; paper 004, section 3 and docs/design/aggregation.md.
result<plan> make_plan(std::span<const rank_input> ranks, const plan_options& o) {
  const uint64_t n = ranks.size();
  if (n == 0) return status(errc::invalid_argument, "aggregation plan: no rank");
  if (n > UINT32_MAX) return status(errc::invalid_argument, "aggregation plan: more than 2^32 ranks");
  if (o.leaders < 1 || o.leaders > n)
    return status(errc::invalid_argument, "aggregate_files = " + std::to_string(o.leaders) + ": must be 1 to the " +
                                              std::to_string(n) + " ranks of the job");
  if (o.stripe == 0 || o.stripe % 4096 != 0)
    return status(errc::invalid_argument, "stripe size " + std::to_string(o.stripe) +
                                              " must be a positive multiple of 4096 (set stripe_size)");
  const uint32_t m = o.leaders;
  plan p;
  p.kind = o.kind;
  p.stripe = o.stripe;
  for (const auto& r : ranks) p.nodes.push_back(r.node);
  uint64_t total = 0;
  for (const auto& r : ranks) total += r.bytes;

  std::vector<int64_t> leader_of(n, -1);  // rank -> leader index
  if (o.naive) {
    p.leaders.resize(m);
    std::iota(p.leaders.begin(), p.leaders.end(), 0u);
  } else {
    p.leaders = elect(ranks, m);
  }
  for (uint32_t k = 0; k < m; ++k) leader_of[p.leaders[k]] = k;

  // Capacities: an equal, stripe-aligned share, or more for a leader whose
  // own image is larger (it never sends its own data away).
  const uint64_t share = align_up(std::max<uint64_t>(1, (total + m - 1) / m), o.stripe);
  p.capacity.assign(m, share);
  if (!o.naive)
    for (uint32_t k = 0; k < m; ++k)
      p.capacity[k] = std::max(share, align_up(ranks[p.leaders[k]].bytes, o.stripe));
  p.used.assign(m, 0);
  p.pieces.reserve(n + m);

  auto put = [&](uint32_t rank, uint64_t src, uint64_t len, uint32_t k) {
    p.pieces.push_back({rank, src, len, k, p.used[k]});
    p.used[k] += len;
    const uint32_t lr = p.leaders[k];
    if (lr == rank) return;
    if (ranks[lr].node == ranks[rank].node) p.bytes_within_nodes += len;
    else p.bytes_between_nodes += len;
  };

  if (o.naive) {
    // A prefix sum: rank after rank into leader 0's stream, then leader 1's ...
    uint32_t k = 0;
    for (uint32_t r = 0; r < n; ++r) {
      uint64_t src = 0;
      while (src < ranks[r].bytes) {
        while (p.used[k] == p.capacity[k]) ++k;
        uint64_t len = std::min(ranks[r].bytes - src, p.capacity[k] - p.used[k]);
        put(r, src, len, k);
        src += len;
      }
    }
  } else {
    // Leaders keep their own data; the others go, largest first, to a leader
    // on their node with room, then to the leader with the most room.
    for (uint32_t k = 0; k < m; ++k)
      if (ranks[p.leaders[k]].bytes) put(p.leaders[k], 0, ranks[p.leaders[k]].bytes, k);
    std::unordered_map<uint32_t, std::vector<uint32_t>> node_leaders;
    for (uint32_t k = 0; k < m; ++k) node_leaders[ranks[p.leaders[k]].node].push_back(k);
    std::vector<std::pair<uint64_t, uint32_t>> by_size;  // (~bytes, rank): largest first, then rank
    for (uint32_t r = 0; r < n; ++r)
      if (leader_of[r] < 0 && ranks[r].bytes) by_size.push_back({~ranks[r].bytes, r});
    std::sort(by_size.begin(), by_size.end());
    // Max-heap of (room, -leader) with lazy updates: an entry whose room is
    // stale is pushed again with the current room when it comes up.
    using entry = std::pair<uint64_t, int64_t>;
    std::priority_queue<entry> roomiest;
    for (uint32_t k = 0; k < m; ++k)
      if (p.capacity[k] > p.used[k]) roomiest.push({p.capacity[k] - p.used[k], -static_cast<int64_t>(k)});
    for (const auto& [unused, r] : by_size) {
      uint64_t src = 0;
      const uint64_t bytes = ranks[r].bytes;
      if (auto it = node_leaders.find(ranks[r].node); it != node_leaders.end()) {
        std::vector<uint32_t>& local = it->second;  // most room first
        std::sort(local.begin(), local.end(), [&](uint32_t a, uint32_t b) {
          uint64_t ra = p.capacity[a] - p.used[a], rb = p.capacity[b] - p.used[b];
          return ra != rb ? ra > rb : a < b;
        });
        for (uint32_t k : local) {
          if (src == bytes) break;
          uint64_t len = std::min(bytes - src, p.capacity[k] - p.used[k]);
          if (len) put(r, src, len, k);
          src += len;
        }
      }
      while (src < bytes) {
        if (roomiest.empty()) return status(errc::internal, "aggregation plan: capacity exhausted");
        auto [room, neg] = roomiest.top();
        roomiest.pop();
        const uint32_t k = static_cast<uint32_t>(-neg);
        const uint64_t now = p.capacity[k] - p.used[k];
        if (now != room) {
          if (now) roomiest.push({now, neg});
          continue;
        }
        uint64_t len = std::min(bytes - src, now);
        put(r, src, len, k);
        src += len;
        if (now > len) roomiest.push({now - len, neg});
      }
    }
    // By rank (a counting sort: each rank's pieces were made in src order).
    std::vector<uint64_t> first(n + 1, 0);
    for (const auto& x : p.pieces) ++first[x.rank + 1];
    for (uint64_t r = 0; r < n; ++r) first[r + 1] += first[r];
    std::vector<piece> sorted(p.pieces.size());
    for (const auto& x : p.pieces) sorted[first[x.rank]++] = x;
    p.pieces = std::move(sorted);
  }

  // What each leader owns, and the files' sizes.
  p.owned.resize(m);
  if (o.kind == layout::file_per_leader) {
    p.file_bytes.assign(m, 0);
    for (uint32_t k = 0; k < m; ++k) {
      p.owned[k] = {k, 0, p.capacity[k], 1, 0};
      p.file_bytes[k] = p.used[k];
    }
  } else {
    p.file_bytes.assign(1, 0);
    for (uint32_t k = 0; k < m; ++k) {
      p.owned[k] = {0, uint64_t{k} * o.stripe, o.stripe, p.capacity[k] / o.stripe, uint64_t{m} * o.stripe};
      if (p.used[k]) {
        uint64_t last = (p.used[k] - 1) / o.stripe;  // the leader's last stripe written
        p.file_bytes[0] = std::max(p.file_bytes[0], (last * m + k) * o.stripe + (p.used[k] - last * o.stripe));
      }
    }
  }
  return p;
}

result<plan> make_self_plan(std::span<const rank_input> ranks, uint32_t files, uint64_t align) {
  const uint64_t n = ranks.size();
  if (n == 0) return status(errc::invalid_argument, "aggregation plan: no rank");
  if (n > UINT32_MAX) return status(errc::invalid_argument, "aggregation plan: more than 2^32 ranks");
  if (files < 1 || files > n)
    return status(errc::invalid_argument, "aggregate_files = " + std::to_string(files) + ": must be 1 to the " +
                                              std::to_string(n) + " ranks of the job");
  if (align % 4096 != 0)
    return status(errc::invalid_argument, "stripe size " + std::to_string(align) + " must be a multiple of 4096");
  plan p;
  p.kind = layout::file_per_leader;
  p.stripe = align;
  for (const auto& r : ranks) p.nodes.push_back(r.node);
  p.file_bytes.assign(files, 0);
  p.leaders.resize(n);
  std::iota(p.leaders.begin(), p.leaders.end(), 0u);
  p.owned.resize(n);
  p.capacity.resize(n);
  p.used.resize(n);
  p.pieces.reserve(n);
  const uint64_t per = n / files, extra = n % files;  // the first `extra` files get one rank more
  uint64_t r = 0;
  for (uint32_t f = 0; f < files; ++f) {
    uint64_t at = 0;
    for (uint64_t i = 0; i < per + (f < extra ? 1 : 0); ++i, ++r) {
      const uint64_t bytes = ranks[r].bytes;
      const uint64_t room = align ? align_up(bytes, align) : bytes;
      p.owned[r] = {f, at, room, 1, 0};
      p.capacity[r] = room;
      p.used[r] = bytes;
      if (bytes) {
        p.pieces.push_back({static_cast<uint32_t>(r), 0, bytes, static_cast<uint32_t>(r), 0});
        p.file_bytes[f] = at + bytes;
      }
      at += room;
    }
    // Padding: the gaps before the file's last byte.
    uint64_t data = 0;
    for (uint64_t q = r - per - (f < extra ? 1 : 0); q < r; ++q) data += ranks[q].bytes;
    p.padding += p.file_bytes[f] - data;
  }
  return p;
}

std::span<const piece> pieces_of(const plan& p, uint32_t rank) {
  auto first = std::lower_bound(p.pieces.begin(), p.pieces.end(), rank,
                                [](const piece& x, uint32_t r) { return x.rank < r; });
  auto last = std::upper_bound(first, p.pieces.end(), rank, [](uint32_t r, const piece& x) { return r < x.rank; });
  return std::span<const piece>(first, last);
}

std::vector<file_run> locate(const plan& p, const piece& x) {
  const owned_extents& e = p.owned[x.leader];
  std::vector<file_run> out;
  uint64_t at = x.stream, left = x.length;
  while (left > 0) {
    const uint64_t i = at / e.length, within = at % e.length;
    const uint64_t len = std::min(left, e.length - within);
    out.push_back({e.file, e.offset + i * e.stride + within, len});
    at += len;
    left -= len;
  }
  return out;
}

status check_plan(std::span<const rank_input> ranks, const plan_options& o, const plan& p) {
  auto bad = [](const std::string& what) { return status(errc::internal, "aggregation plan: " + what); };
  const uint32_t m = o.leaders;
  if (p.leaders.size() != m || p.owned.size() != m || p.capacity.size() != m || p.used.size() != m)
    return bad("wrong number of leaders");
  std::vector<uint64_t> leader_count(ranks.size(), 0);
  for (uint32_t r : p.leaders) {
    if (r >= ranks.size()) return bad("leader " + std::to_string(r) + " is not a rank");
    if (leader_count[r]++) return bad("rank " + std::to_string(r) + " leads twice");
  }
  // Every byte of every image exactly once: pieces by (rank, src), contiguous.
  std::vector<uint64_t> covered(ranks.size(), 0);
  const piece* prev = nullptr;
  for (const auto& x : p.pieces) {
    if (x.rank >= ranks.size() || x.leader >= m || x.length == 0) return bad("a piece names no rank or leader");
    if (prev && std::tie(prev->rank, prev->src) >= std::tie(x.rank, x.src)) return bad("pieces out of order");
    if (x.src != covered[x.rank])
      return bad("rank " + std::to_string(x.rank) + ": bytes from " + std::to_string(covered[x.rank]) +
                 " missing or twice");
    covered[x.rank] += x.length;
    prev = &x;
  }
  for (size_t r = 0; r < ranks.size(); ++r)
    if (covered[r] != ranks[r].bytes)
      return bad("rank " + std::to_string(r) + ": " + std::to_string(covered[r]) + " of " +
                 std::to_string(ranks[r].bytes) + " bytes assigned");
  // Each leader's stream: pieces inside its capacity, never overlapping.
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> streams(m);
  for (const auto& x : p.pieces) streams[x.leader].push_back({x.stream, x.stream + x.length});
  for (uint32_t k = 0; k < m; ++k) {
    auto& s = streams[k];
    std::sort(s.begin(), s.end());
    uint64_t sum = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (i && s[i].first < s[i - 1].second) return bad("leader " + std::to_string(k) + ": pieces overlap");
      sum += s[i].second - s[i].first;
    }
    if (!s.empty() && s.back().second > p.capacity[k]) return bad("leader " + std::to_string(k) + " over capacity");
    if (sum != p.used[k]) return bad("leader " + std::to_string(k) + ": used bytes disagree");
    // Owned extents: stripe-aligned and holding the whole stream.
    const auto& e = p.owned[k];
    if (e.offset % o.stripe || e.length % o.stripe || (e.count > 1 && e.stride % o.stripe) || e.count == 0)
      return bad("leader " + std::to_string(k) + ": extents not aligned to the stripe");
    if (e.length * e.count != p.capacity[k]) return bad("leader " + std::to_string(k) + ": extents != capacity");
  }
  // No two leaders own the same bytes: every stripe has one writer.
  if (o.kind == layout::file_per_leader) {
    std::vector<uint32_t> files;
    for (const auto& e : p.owned) files.push_back(e.file);
    std::sort(files.begin(), files.end());
    if (std::adjacent_find(files.begin(), files.end()) != files.end()) return bad("two leaders write one file");
  } else {
    for (uint32_t k = 0; k < m; ++k) {
      const auto& e = p.owned[k];
      if (e.length != o.stripe || e.stride != uint64_t{m} * o.stripe || e.offset != uint64_t{k} * o.stripe)
        return bad("leader " + std::to_string(k) + " does not own stripes k, k+M, ...");
    }
  }
  return {};
}

}  // namespace cairn::aggregate
