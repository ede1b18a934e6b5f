#include "redundancy/sets.hpp"

#include <algorithm>
#include <map>

namespace cairn::redundancy {

result<scheme> parse_scheme(const std::string& s) {
  if (s == "none") return scheme::none;
  if (s == "partner") return scheme::partner;
  if (s == "xor") return scheme::xor_parity;
  if (s == "rs") return scheme::rs;
  return status(errc::invalid_argument, "redundancy = '" + s + "': expected none, partner, xor or rs");
}

const char* scheme_name(scheme s) {
  switch (s) {
    case scheme::partner: return "partner";
    case scheme::xor_parity: return "xor";
    case scheme::rs: return "rs";
    default: return "none";
  }
}

std::vector<uint32_t> geometry::holders(uint32_t s) const {
  std::vector<uint32_t> out;
  for (uint32_t r = 0; r < m; ++r) out.push_back((s + r) % k);
  return out;
}

std::vector<uint32_t> geometry::contributors(uint32_t s) const {
  std::vector<uint32_t> out;
  if (kind == scheme::partner) return {(s + k - 1) % k};  // the holder keeps its predecessor's copy
  for (uint32_t t = 0; t < d(); ++t) out.push_back((s + m + t) % k);
  return out;
}

int geometry::chunk_of(uint32_t p, uint32_t s) const {
  if (kind == scheme::partner) return (s + k - 1) % k == p ? 0 : -1;
  // p contributes to stripes p+1 .. p+d (mod k), its chunks 0 .. d-1 in that order.
  const uint32_t j = (s + k - p - 1) % k;
  return j < d() ? static_cast<int>(j) : -1;
}

std::vector<uint32_t> geometry::held_stripes(uint32_t p) const {
  std::vector<uint32_t> out;
  for (uint32_t s = 0; s < k; ++s)
    for (uint32_t h : holders(s))
      if (h == p) out.push_back(s);
  return out;
}

uint64_t geometry::chunk_bytes(uint64_t size) const {
  const uint64_t n = d();
  const uint64_t c = (size + n - 1) / n;
  return std::max<uint64_t>(4096, (c + 4095) / 4096 * 4096);
}

std::string geometry::describe() const {
  std::string s = scheme_name(kind);
  if (kind == scheme::partner) return s + "(k=" + std::to_string(k) + ")";
  return s + "(k=" + std::to_string(k) + ", m=" + std::to_string(m) + ")";
}

result<std::vector<std::vector<uint32_t>>> form_sets(const std::vector<std::string>& nodes, scheme kind,
                                                     int set_size, int rs_parity) {
  const size_t n = nodes.size();
  // Nodes in order of their first rank, each with its ranks.
  std::vector<std::string> order;
  std::map<std::string, std::vector<uint32_t>> ranks_of;
  for (uint32_t r = 0; r < n; ++r) {
    if (!ranks_of.count(nodes[r])) order.push_back(nodes[r]);
    ranks_of[nodes[r]].push_back(r);
  }
  const size_t need = kind == scheme::rs ? static_cast<size_t>(rs_parity) + 1 : 2;
  const size_t size = std::min<size_t>(static_cast<size_t>(set_size), order.size());
  if (size < need)
    return status(errc::invalid_argument,
                  "redundancy = " + std::string(scheme_name(kind)) + " needs sets of at least " + std::to_string(need) +
                      " ranks on distinct nodes, but this job's " + std::to_string(n) + " ranks are on " +
                      std::to_string(order.size()) + " node(s)" +
                      (kind == scheme::rs ? " (rs_parity = " + std::to_string(rs_parity) + ")" : "") +
                      ": run on more nodes, lower rs_parity, or set redundancy = none");
  std::vector<uint32_t> seq;  // round-robin over nodes
  for (size_t i = 0; seq.size() < n; ++i)
    for (const auto& node : order)
      if (i < ranks_of[node].size()) seq.push_back(ranks_of[node][i]);
  const size_t nsets = (n + size - 1) / size;
  std::vector<std::vector<uint32_t>> sets(nsets);
  size_t at = 0;
  for (size_t s = 0; s < nsets; ++s) {
    const size_t len = n / nsets + (s < n % nsets ? 1 : 0);
    sets[s].assign(seq.begin() + static_cast<long>(at), seq.begin() + static_cast<long>(at + len));
    at += len;
    if (len < need)
      return status(errc::invalid_argument, "redundancy: set " + std::to_string(s) + " would have " +
                                                std::to_string(len) + " member(s), fewer than the " +
                                                std::to_string(need) + " " + scheme_name(kind) + " needs");
    std::map<std::string, uint32_t> seen;
    for (uint32_t r : sets[s]) {
      auto [it, fresh] = seen.emplace(nodes[r], r);
      if (!fresh)
        return status(errc::invalid_argument,
                      "redundancy: ranks " + std::to_string(it->second) + " and " + std::to_string(r) +
                          " would share a set on node '" + nodes[r] + "' (nodes hold different numbers of ranks); "
                          "a set must span distinct nodes: lower redundancy_set or place ranks evenly");
    }
  }
  return sets;
}

}  // namespace cairn::redundancy
