// Unit and property tests of src/analytics: the element rules of
// compare_elements against an independent per-element reference, and
// history_diff (trees, mismatch-only mode, damaged or missing trees, local
// copies, global layouts across rank counts) against brute force over the raw
// arrays: every count, maximum error and first mismatch must be equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "analytics/compare.hpp"
#include "analytics/history_diff.hpp"
#include "cairn.h"
#include "format/layout.hpp"
#include "format/shard.hpp"
#include "format/tree.hpp"
#include "history_store.hpp"
#include "storage/storage_env.hpp"
#include "test_store.hpp"

namespace cairn {
namespace {

using analytics::compare_elements;
using analytics::compare_stats;
using analytics::diff_options;
using analytics::diff_result;
using analytics::region_diff;
using analytics::region_state;
using analytics::tolerance;
using test::history_version;
using test::region_data;

constexpr uint8_t kAllTypes[] = {CAIRN_BYTE,   CAIRN_INT8,   CAIRN_INT16,  CAIRN_INT32,   CAIRN_INT64,  CAIRN_UINT8,
                                 CAIRN_UINT16, CAIRN_UINT32, CAIRN_UINT64, CAIRN_FLOAT32, CAIRN_FLOAT64};

// ---- data generation ---------------------------------------------------------------

template <typename T>
std::vector<std::byte> as_bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <typename T>
T get(const std::vector<std::byte>& b, uint64_t i) {
  T v;
  std::memcpy(&v, b.data() + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void set(std::vector<std::byte>& b, uint64_t i, T v) {
  std::memcpy(b.data() + i * sizeof(T), &v, sizeof(T));
}

double nan_with_payload(uint64_t payload, bool negative = false) {
  uint64_t bits = 0x7ff8000000000000ULL | (payload & 0x0007ffffffffffffULL);
  if (negative) bits |= 1ULL << 63;
  return std::bit_cast<double>(bits);
}

float nanf_with_payload(uint32_t payload, bool negative = false) {
  uint32_t bits = 0x7fc00000U | (payload & 0x003fffffU);
  if (negative) bits |= 1U << 31;
  return std::bit_cast<float>(bits);
}

// Adversarial floating-point values around a quantum q: boundary straddlers
// k*q +- a few ulps, NaN payloads, infinities, signed zeros, subnormals,
// values whose quantum index is rounded (2^53 q .. 2^62 q) or beyond 2^62 q.
template <typename F>
F adversarial(std::mt19937_64& rng, double q) {
  std::uniform_int_distribution<int> pick(0, 13);
  std::uniform_int_distribution<int64_t> k(-1000, 1000);
  std::uniform_int_distribution<int> steps(-3, 3);
  auto nudge = [&](F v) {
    int s = steps(rng);
    for (; s > 0; --s) v = std::nextafter(v, std::numeric_limits<F>::infinity());
    for (; s < 0; ++s) v = std::nextafter(v, -std::numeric_limits<F>::infinity());
    return v;
  };
  switch (pick(rng)) {
    case 0: return nudge(static_cast<F>(static_cast<double>(k(rng)) * q));
    case 1: return static_cast<F>(static_cast<double>(k(rng)) * q + q * 0.5);
    case 2:
      if constexpr (sizeof(F) == 8) return nan_with_payload(rng() % 4);
      else return nanf_with_payload(static_cast<uint32_t>(rng() % 4));
    case 3: return (rng() & 1) ? std::numeric_limits<F>::infinity() : -std::numeric_limits<F>::infinity();
    case 4: return (rng() & 1) ? F(0) : -F(0);
    case 5: return std::numeric_limits<F>::denorm_min() * static_cast<F>(1 + rng() % 5) * ((rng() & 1) ? 1 : -1);
    case 6: return static_cast<F>(std::ldexp(q, 53 + static_cast<int>(rng() % 9)) * (1 + (rng() % 1000) / 1000.0));
    case 7: return static_cast<F>(std::ldexp(q, 63 + static_cast<int>(rng() % 3)) * ((rng() & 1) ? 1 : -1));
    case 8: return std::numeric_limits<F>::max() * ((rng() & 1) ? F(1) : F(-1));
    default: {
      std::normal_distribution<double> nd(0.0, 1.0);
      return static_cast<F>(nd(rng) * std::pow(10.0, static_cast<double>(rng() % 7) - 3));
    }
  }
}

std::vector<std::byte> random_array(uint8_t type, uint64_t n, std::mt19937_64& rng, double q, bool adversarial_floats) {
  std::vector<std::byte> b(n * format::type_size(type));
  if (type == CAIRN_FLOAT64) {
    std::normal_distribution<double> nd(0.0, 10.0);
    for (uint64_t i = 0; i < n; ++i) set<double>(b, i, adversarial_floats ? adversarial<double>(rng, q) : nd(rng));
  } else if (type == CAIRN_FLOAT32) {
    std::normal_distribution<float> nd(0.0f, 10.0f);
    for (uint64_t i = 0; i < n; ++i) set<float>(b, i, adversarial_floats ? adversarial<float>(rng, q) : nd(rng));
  } else {
    for (auto& x : b) x = static_cast<std::byte>(rng() % 7 == 0 ? rng() : rng() % 3);  // many small, some wide
  }
  return b;
}

// Changes about `fraction` of the elements of b (a copy of A's data), with
// small, tolerance-sized, boundary-straddling and large changes, NaN/inf/zero
// swaps for floats; whole chunks stay untouched so that exact leaves match.
template <typename F>
void perturb_float(std::vector<std::byte>& b, uint64_t i, std::mt19937_64& rng, double q, double abs_tol) {
  F v = get<F>(b, i);
  std::uniform_int_distribution<int> pick(0, 10);
  F w = v;
  switch (pick(rng)) {
    case 0: w = std::nextafter(v, std::numeric_limits<F>::infinity()); break;
    case 1: w = static_cast<F>(static_cast<double>(v) + abs_tol); break;  // at the tolerance
    case 2: w = static_cast<F>(static_cast<double>(v) + q * 0.3); break;  // may straddle a boundary
    case 3: w = static_cast<F>(static_cast<double>(v) * (1 + 1e-7)); break;
    case 4: w = static_cast<F>(static_cast<double>(v) + 1.0); break;
    case 5:
      if constexpr (sizeof(F) == 8) w = nan_with_payload(rng() % 3 + 1, rng() & 1);
      else w = nanf_with_payload(static_cast<uint32_t>(rng() % 3 + 1), rng() & 1);
      break;
    case 6: w = -v; break;  // +0 <-> -0, inf <-> -inf
    case 7: w = std::numeric_limits<F>::infinity(); break;
    case 8: w = static_cast<F>(static_cast<double>(v) + 5 * q); break;  // equal quanta possible for huge v
    default: w = static_cast<F>(static_cast<double>(v) - q * 0.7); break;
  }
  set<F>(b, i, w);
}

void perturb(std::vector<std::byte>& b, uint8_t type, double fraction, std::mt19937_64& rng, double q,
             double abs_tol) {
  const uint64_t n = b.size() / format::type_size(type);
  std::uniform_real_distribution<double> u(0, 1);
  for (uint64_t i = 0; i < n; ++i) {
    if (u(rng) >= fraction) continue;
    if (type == CAIRN_FLOAT64) {
      perturb_float<double>(b, i, rng, q, abs_tol);
    } else if (type == CAIRN_FLOAT32) {
      perturb_float<float>(b, i, rng, q, abs_tol);
    } else {
      b[i * format::type_size(type)] ^= static_cast<std::byte>(1 + rng() % 255);
    }
  }
}

// Moves about `fraction` of the float elements by one ulp: most stay in their
// quantum, those on a quantum boundary straddle it.
void perturb_tiny(std::vector<std::byte>& b, uint8_t type, double fraction, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  const uint64_t n = b.size() / format::type_size(type);
  for (uint64_t i = 0; i < n; ++i) {
    if (u(rng) >= fraction) continue;
    if (type == CAIRN_FLOAT64) {
      set<double>(b, i, std::nextafter(get<double>(b, i), (rng() & 1) ? 1e308 : -1e308));
    } else {
      set<float>(b, i, std::nextafter(get<float>(b, i), (rng() & 1) ? 1e38f : -1e38f));
    }
  }
}

// ---- independent reference of the element rules --------------------------------------

// ULP distance by counting: same sign -> difference of magnitudes; opposite
// signs -> sum of magnitudes (distance through zero, +0 == -0).
template <typename F, typename U>
uint64_t ref_ulps(F a, F b) {
  U ua = std::bit_cast<U>(a), ub = std::bit_cast<U>(b);
  const U sign = U(1) << (sizeof(U) * 8 - 1);
  uint64_t ma = ua & ~sign, mb = ub & ~sign;
  if ((ua & sign) == (ub & sign)) return ma > mb ? ma - mb : mb - ma;
  return ma + mb;
}

template <typename F, typename U>
compare_stats ref_floats(const std::vector<std::byte>& a, const std::vector<std::byte>& b, uint8_t type,
                         const tolerance& tol) {
  compare_stats s;
  const uint64_t n = a.size() / sizeof(F);
  for (uint64_t i = 0; i < n; ++i) {
    F x = get<F>(a, i), y = get<F>(b, i);
    U ux = std::bit_cast<U>(x), uy = std::bit_cast<U>(y);
    auto first = [&]() {
      if (!s.first) s.first = analytics::element_mismatch{i, {type, ux}, {type, uy}};
    };
    if (ux == uy || (std::isnan(x) && std::isnan(y))) {
      ++s.exact;
      continue;
    }
    if (!std::isfinite(x) || !std::isfinite(y)) {
      ++s.mismatch;
      ++s.nonfinite_mismatch;
      first();
      continue;
    }
    double d = std::fabs(static_cast<double>(x) - static_cast<double>(y));
    double m = std::max(std::fabs(static_cast<double>(x)), std::fabs(static_cast<double>(y)));
    double r = m == 0 ? 0 : d / m;
    bool ok = d <= tol.abs || d <= tol.rel * m || ref_ulps<F, U>(x, y) <= tol.ulps;
    s.max_abs = std::max(s.max_abs, d);
    s.max_rel = std::max(s.max_rel, r);
    if (ok) {
      ++s.approximate;
    } else {
      ++s.mismatch;
      s.mismatch_max_abs = std::max(s.mismatch_max_abs, d);
      s.mismatch_max_rel = std::max(s.mismatch_max_rel, r);
      first();
    }
  }
  return s;
}

template <typename T>
compare_stats ref_ints(const std::vector<std::byte>& a, const std::vector<std::byte>& b, uint8_t type) {
  compare_stats s;
  const uint64_t n = a.size() / sizeof(T);
  for (uint64_t i = 0; i < n; ++i) {
    T x = get<T>(a, i), y = get<T>(b, i);
    if (x == y) {
      ++s.exact;
      continue;
    }
    ++s.mismatch;
    __int128 d = static_cast<__int128>(x) - static_cast<__int128>(y);
    if (d < 0) d = -d;
    double dd = static_cast<double>(d);
    __int128 ax = x < 0 ? -static_cast<__int128>(x) : static_cast<__int128>(x);
    __int128 ay = y < 0 ? -static_cast<__int128>(y) : static_cast<__int128>(y);
    double m = static_cast<double>(std::max(ax, ay));
    double r = m == 0 ? 0 : dd / m;
    s.max_abs = std::max(s.max_abs, dd);
    s.max_rel = std::max(s.max_rel, r);
    s.mismatch_max_abs = std::max(s.mismatch_max_abs, dd);
    s.mismatch_max_rel = std::max(s.mismatch_max_rel, r);
    if (!s.first) {
      analytics::element_mismatch e;
      e.index = i;
      e.a.type = e.b.type = type;
      using U = std::make_unsigned_t<T>;
      e.a.bits = static_cast<U>(x);
      e.b.bits = static_cast<U>(y);
      s.first = e;
    }
  }
  return s;
}

compare_stats reference(const std::vector<std::byte>& a, const std::vector<std::byte>& b, uint8_t type,
                        const tolerance& tol) {
  switch (type) {
    case CAIRN_INT8: return ref_ints<int8_t>(a, b, type);
    case CAIRN_INT16: return ref_ints<int16_t>(a, b, type);
    case CAIRN_INT32: return ref_ints<int32_t>(a, b, type);
    case CAIRN_INT64: return ref_ints<int64_t>(a, b, type);
    case CAIRN_UINT16: return ref_ints<uint16_t>(a, b, type);
    case CAIRN_UINT32: return ref_ints<uint32_t>(a, b, type);
    case CAIRN_UINT64: return ref_ints<uint64_t>(a, b, type);
    case CAIRN_FLOAT32: return ref_floats<float, uint32_t>(a, b, type, tol);
    case CAIRN_FLOAT64: return ref_floats<double, uint64_t>(a, b, type, tol);
    default: return ref_ints<uint8_t>(a, b, type);
  }
}

compare_stats brute(const std::vector<std::byte>& a, const std::vector<std::byte>& b, uint8_t type,
                    const tolerance& tol) {
  return compare_elements(a.data(), b.data(), a.size() / format::type_size(type), type, tol);
}

std::string describe(const compare_stats& s) {
  std::string t = "exact " + std::to_string(s.exact) + " approx " + std::to_string(s.approximate) + " mismatch " +
                  std::to_string(s.mismatch) + " nonfinite " + std::to_string(s.nonfinite_mismatch) + " max_abs " +
                  std::to_string(s.max_abs) + " max_rel " + std::to_string(s.max_rel) + " mm_abs " +
                  std::to_string(s.mismatch_max_abs) + " mm_rel " + std::to_string(s.mismatch_max_rel);
  if (s.first) {
    t += " first #" + std::to_string(s.first->index) + " " + s.first->a.to_string() + " vs " +
         s.first->b.to_string();
  }
  return t;
}

// ---- compare_elements ---------------------------------------------------------------

TEST(CompareElements, MatchesReferenceOnRandomAndAdversarialData) {
  for (uint64_t seed = 0; seed < 40; ++seed) {
    std::mt19937_64 rng(seed);
    const double q = seed % 2 ? 1e-3 : 0.25;
    tolerance tol;
    tol.abs = (seed % 4 == 0) ? 0 : q;
    tol.rel = (seed % 3 == 0) ? 1e-9 : 0;
    tol.ulps = (seed % 5 == 0) ? 4 : 0;
    for (uint8_t type : kAllTypes) {
      const uint64_t n = 1 + rng() % 3000;
      auto a = random_array(type, n, rng, q, true);
      auto b = a;
      perturb(b, type, seed % 3 == 0 ? 0.001 : 0.2, rng, q, tol.abs);
      compare_stats got = brute(a, b, type, tol);
      compare_stats want = reference(a, b, type, tol);
      ASSERT_EQ(got, want) << "seed " << seed << " type " << int(type) << "\n got  " << describe(got)
                           << "\n want " << describe(want);
      ASSERT_EQ(got.elements(), n);
    }
  }
}

// Long arrays that agree within tolerance almost everywhere (the blocks the
// fast path takes) with sparse mismatches, non-finite values and +0/-0 (the
// blocks it refuses, and the ones after them).
TEST(CompareElements, MatchesReferenceOnMostlyTolerableData) {
  for (uint64_t seed = 0; seed < 12; ++seed) {
    std::mt19937_64 rng(seed + 77);
    for (uint8_t type : {uint8_t(CAIRN_FLOAT32), uint8_t(CAIRN_FLOAT64)}) {
      const uint64_t n = 50000 + rng() % 1000;
      auto a = random_array(type, n, rng, 0, false);
      auto b = a;
      perturb_tiny(b, type, seed % 2 ? 1.0 : 0.5, rng);
      for (uint64_t i = rng() % 3000; i < n; i += 1000 + rng() % 9000) {
        const uint64_t es = format::type_size(type);
        std::vector<std::byte> one(b.begin() + i * es, b.begin() + (i + 1) * es);
        perturb(one, type, 1.0, rng, 1e-3, 1e-3);
        std::copy(one.begin(), one.end(), b.begin() + i * es);
      }
      tolerance tol;
      tol.abs = seed % 3 == 1 ? 1e-3 : 0;
      tol.rel = seed % 3 == 0 ? 1e-6 : 0;
      tol.ulps = seed % 3 == 2 ? 1 : 0;
      compare_stats got = brute(a, b, type, tol);
      compare_stats want = reference(a, b, type, tol);
      ASSERT_EQ(got, want) << "seed " << seed << " type " << int(type) << "\n got  " << describe(got)
                           << "\n want " << describe(want);
      EXPECT_GT(got.approximate, n / 4);
    }
  }
}

TEST(CompareElements, ElementRules) {
  tolerance none;
  auto one = [&](double x, double y, const tolerance& t) {
    std::vector<double> a{x}, b{y};
    return compare_elements(a.data(), b.data(), 1, CAIRN_FLOAT64, t);
  };
  // NaN: same place, any payloads -> exact; against a number -> mismatch.
  EXPECT_EQ(one(nan_with_payload(1), nan_with_payload(7, true), none).exact, 1u);
  auto nan_num = one(nan_with_payload(0), 1.0, none);
  EXPECT_EQ(nan_num.mismatch, 1u);
  EXPECT_EQ(nan_num.nonfinite_mismatch, 1u);
  EXPECT_EQ(nan_num.max_abs, 0.0);  // non-finite mismatches carry no error
  // Infinities: equal -> exact; different signs or against finite -> mismatch.
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(one(inf, inf, none).exact, 1u);
  EXPECT_EQ(one(inf, -inf, none).mismatch, 1u);
  tolerance huge;
  huge.abs = 1e308;
  huge.ulps = ~uint64_t{0};
  EXPECT_EQ(one(inf, std::numeric_limits<double>::max(), huge).mismatch, 1u);
  // +0 / -0: not bitwise equal, approximate with error 0 even with no tolerance.
  auto zeros = one(0.0, -0.0, none);
  EXPECT_EQ(zeros.approximate, 1u);
  EXPECT_EQ(zeros.max_abs, 0.0);
  EXPECT_EQ(analytics::ulp_distance(0.0, -0.0), 0u);
  EXPECT_EQ(analytics::ulp_distance(-0.0f, std::numeric_limits<float>::denorm_min()), 1u);
  EXPECT_EQ(analytics::ulp_distance(-std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::denorm_min()),
            2u);
  // Exactly at the tolerance: approximate; one ulp beyond: mismatch.
  tolerance t;
  t.abs = 0.5;
  EXPECT_EQ(one(1.0, 1.5, t).approximate, 1u);
  EXPECT_EQ(one(1.0, std::nextafter(1.5, 2.0), t).mismatch, 1u);
  tolerance r;
  r.rel = 0.25;
  EXPECT_EQ(one(3.0, 4.0, r).approximate, 1u);  // 1 <= 0.25 * 4
  EXPECT_EQ(one(3.0, std::nextafter(4.0, 5.0), r).mismatch, 1u);
  tolerance u;
  u.ulps = 2;
  EXPECT_EQ(one(1.0, std::nextafter(std::nextafter(1.0, 2.0), 2.0), u).approximate, 1u);
  EXPECT_EQ(one(1.0, std::nextafter(std::nextafter(std::nextafter(1.0, 2.0), 2.0), 2.0), u).mismatch, 1u);
  // Errors cover approximate and mismatching finite pairs; first mismatch is the lowest index.
  std::vector<double> a{1.0, 2.0, 3.0, 4.0}, b{1.0, 2.25, 13.0, 4.5};
  tolerance q;
  q.abs = 0.3;
  auto s = compare_elements(a.data(), b.data(), 4, CAIRN_FLOAT64, q);
  EXPECT_EQ(s.exact, 1u);
  EXPECT_EQ(s.approximate, 1u);
  EXPECT_EQ(s.mismatch, 2u);
  EXPECT_EQ(s.max_abs, 10.0);
  EXPECT_EQ(s.mismatch_max_abs, 10.0);
  ASSERT_TRUE(s.first);
  EXPECT_EQ(s.first->index, 2u);
  EXPECT_EQ(s.first->a.to_string(), "3");
  EXPECT_EQ(s.first->b.to_string(), "13");
  // Integers compare exactly whatever the tolerance; errors of 64-bit extremes are exact before rounding.
  std::vector<int64_t> ia{INT64_MIN, 5}, ib{INT64_MAX, 5};
  auto is = compare_elements(ia.data(), ib.data(), 2, CAIRN_INT64, huge);
  EXPECT_EQ(is.mismatch, 1u);
  EXPECT_EQ(is.max_abs, 18446744073709551615.0);
  EXPECT_EQ(is.first->a.to_string(), "-9223372036854775808");
  // Values as text.
  EXPECT_EQ((analytics::element_value{CAIRN_FLOAT32, std::bit_cast<uint32_t>(0.1f)}.to_string()), "0.1");
  EXPECT_EQ((analytics::element_value{CAIRN_FLOAT64, std::bit_cast<uint64_t>(-inf)}.to_string()), "-inf");
  EXPECT_EQ((analytics::element_value{CAIRN_FLOAT64, std::bit_cast<uint64_t>(nan_with_payload(5))}.to_string()),
            "nan(0x7ff8000000000005)");
  EXPECT_EQ((analytics::element_value{CAIRN_UINT64, ~uint64_t{0}}.to_string()), "18446744073709551615");
}

// Equal quanta do not bound |a - b| by the quantum once |a| / q passes 2^53:
// the naive "quantum <= abs" rule would call this pair within tolerance.
TEST(TolerantProof, NaiveQuantumRuleIsUnsoundAndTheProofRefusesIt) {
  const double q = 1e-3;
  bool found = false;
  for (int k = 0; k < 2000 && !found; ++k) {
    const double a = std::ldexp(q, 60) * (1 + k * 1e-6);
    const double b = std::nextafter(a, 1e300);  // 125 quanta above a
    if (format::quantize(a, q) != format::quantize(b, q)) continue;
    tolerance t;
    t.abs = q;
    std::vector<double> x{a}, y{b};
    if (compare_elements(x.data(), y.data(), 1, CAIRN_FLOAT64, t).mismatch == 1) found = true;
  }
  EXPECT_TRUE(found) << "expected a pair with equal quanta that is not within abs = quantum";

  tolerance t;
  t.abs = q;
  EXPECT_FALSE(analytics::tolerant_leaves_prove(q, t).usable);
  t.abs = 2 * q;
  auto p = analytics::tolerant_leaves_prove(q, t);
  EXPECT_FALSE(p.usable);
  EXPECT_GT(p.min_rel, 4e-16);
  EXPECT_LT(p.min_rel, 5e-16);
  t.rel = 1e-15;
  EXPECT_TRUE(analytics::tolerant_leaves_prove(q, t).usable);
  t.abs = std::numeric_limits<double>::infinity();
  t.rel = 0;
  EXPECT_TRUE(analytics::tolerant_leaves_prove(q, t).usable);
  EXPECT_FALSE(analytics::tolerant_leaves_prove(0.0, t).usable);
}

// The proof itself: random pairs with equal quanta (straddling nothing) are
// never mismatches under a tolerance it accepts.
TEST(TolerantProof, AcceptedTolerancesCoverEveryPairWithEqualQuanta) {
  std::mt19937_64 rng(7);
  for (double q : {1e-3, 0.25, 1e-9, 3.0}) {
    tolerance t;
    t.abs = q * (1 + std::ldexp(1.0, -30));
    auto p = analytics::tolerant_leaves_prove(q, t);
    ASSERT_FALSE(p.usable);
    t.rel = p.min_rel;
    ASSERT_TRUE(analytics::tolerant_leaves_prove(q, t).usable);
    for (int i = 0; i < 200000; ++i) {
      const int e = static_cast<int>(rng() % 66) - 5;  // |a| / q < 2^61: no raw tokens
      const double a = std::ldexp(q, e) * (1 + (rng() % 1000000) / 1e6) * ((rng() & 1) ? 1 : -1);
      // b: a little above, in the same quantum when possible.
      double b = a;
      const int steps = static_cast<int>(rng() % 64);
      for (int s = 0; s < steps; ++s) b = std::nextafter(b, 1e308);
      if (format::quantize(a, q) != format::quantize(b, q)) continue;
      std::vector<double> x{a}, y{b};
      ASSERT_EQ(compare_elements(x.data(), y.data(), 1, CAIRN_FLOAT64, t).mismatch, 0u)
          << "q " << q << " a " << a << " b " << b;
    }
  }
}

// ---- history_diff helpers -------------------------------------------------------------

const region_diff* find(const diff_result& r, int64_t version, const std::string& region, int64_t rank = -1,
                        const std::string& name = "ck") {
  for (auto& c : r.checkpoints) {
    if (c.name != name) continue;
    for (auto& v : c.versions) {
      if (v.version != version) continue;
      for (auto& rd : v.regions)
        if (rd.region == region && rd.rank == rank) return &rd;
    }
  }
  return nullptr;
}

// rd (from history_diff) against brute force over the raw arrays.
void expect_equal_to_brute(const region_diff* rd, const compare_stats& want, bool mismatches_only,
                           const std::string& what) {
  ASSERT_NE(rd, nullptr) << what;
  ASSERT_EQ(rd->state, region_state::compared) << what;
  if (!mismatches_only) {
    EXPECT_EQ(rd->tolerant_within, 0u) << what;
    EXPECT_EQ(rd->stats, want) << what << "\n got  " << describe(rd->stats) << "\n want " << describe(want);
  } else {
    EXPECT_EQ(rd->within(), want.exact + want.approximate) << what;
    EXPECT_EQ(rd->stats.mismatch, want.mismatch) << what;
    EXPECT_EQ(rd->stats.nonfinite_mismatch, want.nonfinite_mismatch) << what;
    EXPECT_EQ(rd->stats.mismatch_max_abs, want.mismatch_max_abs) << what;
    EXPECT_EQ(rd->stats.mismatch_max_rel, want.mismatch_max_rel) << what;
    ASSERT_EQ(rd->stats.first.has_value(), want.first.has_value()) << what;
    if (want.first) {
      EXPECT_EQ(rd->stats.first->index, want.first->index) << what;
      EXPECT_EQ(rd->stats.first->a.bits, want.first->a.bits) << what;
      EXPECT_EQ(rd->stats.first->b.bits, want.first->b.bits) << what;
    }
  }
  ASSERT_EQ(rd->first.has_value(), want.first.has_value()) << what;
  if (want.first) {
    EXPECT_EQ(rd->first->index, want.first->index) << what;
    EXPECT_EQ(rd->first->a.bits, want.first->a.bits) << what;
    EXPECT_EQ(rd->first->b.bits, want.first->b.bits) << what;
  }
}

diff_result run_diff(const std::string& store, diff_options o) {
  o.store = store;
  if (o.run_a.empty()) o.run_a = "a";
  if (o.run_b.empty()) o.run_b = "b";
  if (o.read_bytes == diff_options{}.read_bytes) o.read_bytes = 8192;  // small buffers: many pieces
  auto r = analytics::diff_runs(o);
  EXPECT_TRUE(r.is_ok()) << r.error().to_string();
  return r.is_ok() ? std::move(r).value() : diff_result{};
}

void flip_byte(const std::string& path, uint64_t at) {
  auto env = storage::storage_env::posix();
  auto data = env->read_all(path);
  ASSERT_TRUE(data.is_ok());
  std::string s = *data;
  ASSERT_LT(at, s.size());
  s[at] = static_cast<char>(s[at] ^ 0x5a);
  ASSERT_TRUE(test::write_file(path, s.data(), s.size()).is_ok());
}

std::string tree_path(const std::string& root, const std::string& run, int64_t v, uint32_t rank,
                      const std::string& name = "ck") {
  return storage::join(format::version_dir(root, run, name, v), format::tree_file_name(rank));
}

// ---- per-rank regions: property test ----------------------------------------------------

// For every type and many seeds: two runs of 2 ranks x 2 versions, B a
// perturbation of A in a few chunks (sizes not multiples of the chunk), compared
// with trees, without, with a damaged tree, a missing tree and a tree of another
// shard, in full and mismatch-only mode: always brute force exactly.
TEST(HistoryDiff, PerRankMatchesBruteForceOnRandomAndAdversarialData) {
  int iteration = 0;
  // Coverage: the trees must really have decided chunks, both ways, and data been read.
  uint64_t skipped = 0, tolerant_skipped = 0, read = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    for (uint8_t type : kAllTypes) {
      std::mt19937_64 rng(seed * 131 + type);
      test::temp_dir dir;
      const double q = (seed % 2) ? 1e-3 : 0.5;
      const uint64_t chunk = uint64_t{64} << (rng() % 4);  // 64..512 bytes
      tolerance tol;
      switch (seed % 4) {
        case 0: break;
        case 1: tol.abs = q; break;                     // the naive rule's case: proof refuses it
        case 2: tol.abs = 2 * q, tol.rel = 1e-12; break;  // provable: tolerant leaves skip reads
        default: tol.abs = 4 * q, tol.ulps = 8, tol.rel = 1e-6; break;
      }
      const bool adversarial_floats = seed % 3 != 2;
      // data[run][version][rank]
      std::vector<uint8_t> types = {type};
      std::vector<std::byte> data[2][2][2];
      for (int v = 0; v < 2; ++v) {
        for (int r = 0; r < 2; ++r) {
          const uint64_t n = 1 + rng() % 1500;
          data[0][v][r] = random_array(type, n, rng, q, adversarial_floats);
          data[1][v][r] = data[0][v][r];
          // Perturb a few random chunks only.
          const uint64_t per = format::elements_per_chunk(chunk, type);
          const uint64_t nch = (n + per - 1) / per;
          for (uint64_t c = 0; c < nch; ++c) {
            if (rng() % 3 != 0 || (seed % 5 == 4)) continue;  // seed%5==4: identical histories
            const uint64_t es = format::type_size(type);
            const uint64_t lo = c * per, hi = std::min(n, lo + per);
            std::vector<std::byte> part(data[1][v][r].begin() + lo * es, data[1][v][r].begin() + hi * es);
            if (format::type_is_float(type) && rng() % 2) {
              perturb_tiny(part, type, 0.3, rng);  // mostly the same quanta: tolerant leaves decide
            } else {
              perturb(part, type, 0.3, rng, q, tol.abs);
            }
            std::copy(part.begin(), part.end(), data[1][v][r].begin() + lo * es);
          }
        }
      }
      for (int run = 0; run < 2; ++run) {
        for (int v = 0; v < 2; ++v) {
          history_version hv;
          hv.run = run == 0 ? "a" : "b";
          hv.name = "ck";
          hv.version = v + 1;
          hv.tree.chunk_bytes = chunk;
          hv.tree.quantum = q;
          for (int r = 0; r < 2; ++r) {
            region_data rd;
            rd.name = "x";
            rd.type = type;
            rd.bytes = data[run][v][r];
            region_data other;  // a second region, always equal
            other.name = "step";
            other.type = CAIRN_INT64;
            other.bytes = as_bytes_of(std::vector<int64_t>{v, r});
            hv.ranks.push_back({rd, other});
          }
          ASSERT_TRUE(test::write_history_version(dir.path(), hv).is_ok());
        }
      }
      auto check_all = [&](const std::string& label) {
        for (bool mo : {false, true}) {
          for (bool trees : {true, false}) {
            diff_options o;
            o.tol = tol;
            o.mismatches_only = mo;
            o.use_trees = trees;
            diff_result res = run_diff(dir.path(), o);
            ASSERT_EQ(res.versions_compared, 2u);
            for (int v = 0; v < 2; ++v) {
              for (int r = 0; r < 2; ++r) {
                const std::string what = label + " seed " + std::to_string(seed) + " type " +
                                         std::to_string(type) + " v" + std::to_string(v + 1) + " r" +
                                         std::to_string(r) + (mo ? " mismatches-only" : "") +
                                         (trees ? "" : " no-trees");
                const region_diff* x = find(res, v + 1, "x", r);
                expect_equal_to_brute(x, brute(data[0][v][r], data[1][v][r], type, tol), mo, what);
                if (x) {
                  skipped += x->chunks_skipped;
                  tolerant_skipped += x->tolerant_within;
                  read += x->chunks_read;
                }
                const region_diff* step = find(res, v + 1, "step", r);
                ASSERT_NE(step, nullptr);
                EXPECT_EQ(step->stats.exact, 2u);
              }
            }
            if (trees && label == "intact") {
              EXPECT_EQ(res.io.trees_unusable, 0u);
              EXPECT_EQ(res.io.trees_used, 8u);
            }
          }
        }
      };
      check_all("intact");
      // A damaged tree (checksum fails), a missing tree, a tree of another shard.
      flip_byte(tree_path(dir.path(), "b", 1, 1), 40);
      ASSERT_TRUE(storage::storage_env::posix()->remove_file(tree_path(dir.path(), "a", 2, 0)).is_ok());
      {
        auto t = storage::storage_env::posix()->read_all(tree_path(dir.path(), "a", 1, 1));
        ASSERT_TRUE(t.is_ok());
        ASSERT_TRUE(test::write_file(tree_path(dir.path(), "a", 2, 1), t->data(), t->size()).is_ok());
      }
      check_all("damaged trees");
      diff_options o;
      o.tol = tol;
      diff_result res = run_diff(dir.path(), o);
      EXPECT_EQ(res.io.trees_unusable, 3u);
      EXPECT_EQ(res.io.trees_used, 5u);
      EXPECT_EQ(res.io.tree_notes.size(), 3u);
      ++iteration;
    }
  }
  EXPECT_EQ(iteration, 12 * 11);
  EXPECT_GT(skipped, 1000u);
  EXPECT_GT(tolerant_skipped, 1000u);
  EXPECT_GT(read, 1000u);
}

// Mismatch-only mode with a tolerance the proof accepts really skips reading
// chunks that differ bitwise but not in quanta, and stays exact.
TEST(HistoryDiff, MismatchOnlyModeSkipsChunksWithEqualTolerantLeaves) {
  test::temp_dir dir;
  const double q = 1e-6;
  const uint64_t n = 100000;
  std::vector<double> a(n), b(n);
  for (uint64_t i = 0; i < n; ++i) {
    a[i] = (static_cast<double>(i % 1000) + 0.5) * q;  // mid-quantum values
    b[i] = a[i] + ((i % 2) ? 1e-3 * q : 0.0);          // same quantum, not bitwise equal
  }
  b[77777] += 10 * q;  // one real mismatch
  for (int run = 0; run < 2; ++run) {
    history_version hv;
    hv.run = run ? "b" : "a";
    hv.name = "ck";
    hv.version = 1;
    hv.tree.quantum = q;
    region_data rd;
    rd.name = "u";
    rd.type = CAIRN_FLOAT64;
    rd.bytes = as_bytes_of(run ? b : a);
    hv.ranks = {{rd}};
    ASSERT_TRUE(test::write_history_version(dir.path(), hv).is_ok());
  }
  tolerance tol;
  tol.abs = 2 * q;
  tol.rel = 1e-14;
  diff_options o;
  o.tol = tol;
  o.mismatches_only = true;
  o.read_bytes = size_t{1} << 20;
  diff_result res = run_diff(dir.path(), o);
  EXPECT_TRUE(res.tolerant.usable) << res.tolerant.reason;
  const region_diff* rd = find(res, 1, "u", 0);
  expect_equal_to_brute(rd, brute(as_bytes_of(a), as_bytes_of(b), CAIRN_FLOAT64, tol), true, "mismatch-only");
  EXPECT_EQ(rd->chunks_read, 1u);  // only the chunk with the mismatch
  EXPECT_EQ(res.io.data_bytes, 2u * 65536u);
  EXPECT_EQ(rd->stats.mismatch, 1u);
  EXPECT_EQ(rd->first->index, 77777u);
  // The naive case (abs = quantum): the proof refuses, everything differing is read; same answer.
  o.tol.abs = q;
  o.tol.rel = 0;
  res = run_diff(dir.path(), o);
  EXPECT_FALSE(res.tolerant.usable);
  EXPECT_NE(res.tolerant.reason.find("does not exceed the tree quantum"), std::string::npos) << res.tolerant.reason;
  rd = find(res, 1, "u", 0);
  expect_equal_to_brute(rd, brute(as_bytes_of(a), as_bytes_of(b), CAIRN_FLOAT64, o.tol), true, "naive");
  EXPECT_EQ(res.io.data_bytes, 2u * n * 8u);
}

// Values whose quantum index is rounded (|v| between 2^53 and 2^62 quanta),
// moved by one ulp: equal tolerant leaves with mismatches inside. With
// abs = quantum (the naive rule) and with tolerances the proof accepts, the
// mismatch-only answer must still be brute force's.
TEST(HistoryDiff, MismatchOnlyModeIsExactWhereQuantaAreRounded) {
  uint64_t equal_leaves_with_mismatch = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 rng(seed + 1000);
    const double q = seed % 2 ? 1e-3 : 0.1;
    const uint8_t type = seed % 4 < 2 ? CAIRN_FLOAT64 : CAIRN_FLOAT32;
    const uint64_t n = 3000 + rng() % 100;
    std::vector<std::byte> a(n * format::type_size(type));
    for (uint64_t i = 0; i < n; ++i) {
      const double v = std::ldexp(q, 53 + static_cast<int>(rng() % 9)) * (1 + (rng() % 1000) / 1000.0) *
                       ((rng() & 1) ? 1 : -1);
      if (type == CAIRN_FLOAT64) set<double>(a, i, v); else set<float>(a, i, static_cast<float>(v));
    }
    auto b = a;
    perturb_tiny(b, type, 0.05, rng);
    const uint64_t chunk = 64;
    const uint64_t per = format::elements_per_chunk(chunk, type);
    for (uint64_t c = 0; c * per < n; ++c) {
      const uint64_t m = std::min(per, n - c * per);
      const uint64_t off = c * per * format::type_size(type);
      if (format::tolerant_leaf(a.data() + off, m, type, q) == format::tolerant_leaf(b.data() + off, m, type, q) &&
          format::exact_leaf(a.data() + off, m, type) != format::exact_leaf(b.data() + off, m, type)) {
        tolerance t;
        t.abs = q;
        if (compare_elements(a.data() + off, b.data() + off, m, type, t).mismatch > 0) ++equal_leaves_with_mismatch;
      }
    }
    test::temp_dir dir;
    for (int run = 0; run < 2; ++run) {
      history_version hv;
      hv.run = run ? "b" : "a";
      hv.name = "ck";
      hv.version = 1;
      hv.tree.chunk_bytes = chunk;
      hv.tree.quantum = q;
      region_data rd;
      rd.name = "x";
      rd.type = type;
      rd.bytes = run ? b : a;
      hv.ranks = {{rd}};
      ASSERT_TRUE(test::write_history_version(dir.path(), hv).is_ok());
    }
    for (int k = 0; k < 3; ++k) {
      diff_options o;
      o.mismatches_only = true;
      o.tol.abs = k == 0 ? q : 2 * q;
      o.tol.rel = k == 2 ? 1e-15 : 0;
      diff_result res = run_diff(dir.path(), o);
      EXPECT_EQ(res.tolerant.usable, k == 2);
      expect_equal_to_brute(find(res, 1, "x", 0), brute(a, b, type, o.tol), true,
                            "seed " + std::to_string(seed) + " tolerance " + std::to_string(k));
    }
  }
  EXPECT_GT(equal_leaves_with_mismatch, 10u);  // the data do trap the naive rule
}

// ---- global layouts across rank counts -------------------------------------------------

struct box {
  std::vector<uint64_t> start, dims;
};

// Cuts a row-major global array into blocks.
std::vector<std::byte> cut(const std::vector<std::byte>& g, const std::vector<uint64_t>& global, const box& b,
                           uint64_t es) {
  std::vector<std::byte> out;
  const size_t nd = global.size();
  uint64_t vol = 1;
  for (auto d : b.dims) vol *= d;
  out.reserve(vol * es);
  std::vector<uint64_t> c(nd, 0);
  for (uint64_t i = 0; i < vol; ++i) {
    uint64_t rem = i;
    for (size_t d = nd; d-- > 0;) {
      c[d] = rem % b.dims[d];
      rem /= b.dims[d];
    }
    uint64_t gi = 0;
    for (size_t d = 0; d < nd; ++d) gi = gi * global[d] + b.start[d] + c[d];
    out.insert(out.end(), g.begin() + gi * es, g.begin() + (gi + 1) * es);
  }
  return out;
}

void write_global(const std::string& root, const std::string& run, int64_t version, const std::string& region,
                  uint8_t type, const std::vector<uint64_t>& global, const std::vector<box>& parts,
                  const std::vector<std::byte>& g, uint64_t chunk = 1024) {
  history_version hv;
  hv.run = run;
  hv.name = "ck";
  hv.version = version;
  hv.tree.chunk_bytes = chunk;
  hv.tree.quantum = 1e-3;
  for (auto& p : parts) {
    region_data rd;
    rd.name = region;
    rd.type = type;
    rd.dims = p.dims;
    rd.global = global;
    rd.start = p.start;
    rd.bytes = cut(g, global, p, format::type_size(type));
    hv.ranks.push_back({rd});
  }
  ASSERT_TRUE(test::write_history_version(root, hv).is_ok());
}

TEST(HistoryDiff, GlobalLayoutAcrossRankCountsMatchesBruteForce) {
  const std::vector<uint64_t> g2 = {37, 53};
  // Partitions of the 37x53 array: 1 rank; rows 2 ranks; columns 3 ranks; 2-D blocks 3 ranks (uneven).
  const std::vector<std::vector<box>> parts = {
      {{{0, 0}, {37, 53}}},
      {{{0, 0}, {20, 53}}, {{20, 0}, {17, 53}}},
      {{{0, 0}, {37, 10}}, {{0, 10}, {37, 20}}, {{0, 30}, {37, 23}}},
      {{{0, 0}, {15, 53}}, {{15, 0}, {22, 25}}, {{15, 25}, {22, 28}}},
  };
  int compared = 0;
  for (uint8_t type : {uint8_t(CAIRN_FLOAT64), uint8_t(CAIRN_INT32), uint8_t(CAIRN_FLOAT32)}) {
    for (uint64_t seed = 0; seed < 3; ++seed) {
      std::mt19937_64 rng(seed + 100 * type);
      const uint64_t n = 37 * 53;
      auto ga = random_array(type, n, rng, 1e-3, seed == 1);
      auto gb = ga;
      if (seed != 2) perturb(gb, type, seed == 0 ? 0.002 : 0.05, rng, 1e-3, 1e-3);
      tolerance tol;
      tol.abs = seed == 1 ? 1e-3 : 0;
      for (size_t pa = 0; pa < parts.size(); ++pa) {
        for (size_t pb = 0; pb < parts.size(); ++pb) {
          test::temp_dir dir;
          write_global(dir.path(), "a", 1, "field", type, g2, parts[pa], ga);
          write_global(dir.path(), "b", 1, "field", type, g2, parts[pb], gb);
          for (bool mo : {false, true}) {
            diff_options o;
            o.tol = tol;
            o.mismatches_only = mo;
            diff_result res = run_diff(dir.path(), o);
            const region_diff* rd = find(res, 1, "field", -1);
            const compare_stats want = brute(ga, gb, type, tol);
            const std::string what = "type " + std::to_string(type) + " seed " + std::to_string(seed) +
                                     " partitions " + std::to_string(pa) + " vs " + std::to_string(pb);
            expect_equal_to_brute(rd, want, mo, what);
            ASSERT_TRUE(rd->global);
            EXPECT_EQ(rd->unmatched_a, 0u);
            EXPECT_EQ(rd->unmatched_b, 0u);
            if (want.first) {
              const uint64_t idx = want.first->index;
              EXPECT_EQ(rd->first->coords, (std::vector<uint64_t>{idx / 53, idx % 53})) << what;
              // The ranks named hold the element.
              for (auto [side, rank] : {std::pair{pa, rd->first->rank_a}, std::pair{pb, rd->first->rank_b}}) {
                const box& bx = parts[side][static_cast<size_t>(rank)];
                EXPECT_TRUE(idx / 53 >= bx.start[0] && idx / 53 < bx.start[0] + bx.dims[0] &&
                            idx % 53 >= bx.start[1] && idx % 53 < bx.start[1] + bx.dims[1])
                    << what;
              }
              ASSERT_TRUE(res.first);
              EXPECT_EQ(res.first->kind, "mismatch");
              EXPECT_EQ(res.first->rank, rd->first->rank_a);
            } else {
              EXPECT_FALSE(res.first) << what;
            }
            if (pa == pb && seed == 2) {
              EXPECT_EQ(res.io.data_bytes, 0u) << what;  // coincident blocks: equal roots
            }
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 3 * 3 * 4 * 4 * 2);
}

TEST(HistoryDiff, GlobalLayoutOneAndThreeDimensional) {
  std::mt19937_64 rng(5);
  // 1-D: 1000 elements, 1 rank vs 3 uneven ranks vs 2 ranks.
  {
    const std::vector<uint64_t> g = {1000};
    auto ga = random_array(CAIRN_FLOAT64, 1000, rng, 1e-3, true);
    auto gb = ga;
    perturb(gb, CAIRN_FLOAT64, 0.01, rng, 1e-3, 0);
    test::temp_dir dir;
    write_global(dir.path(), "a", 1, "v", CAIRN_FLOAT64, g, {{{0}, {1000}}}, ga);
    write_global(dir.path(), "b", 1, "v", CAIRN_FLOAT64, g, {{{0}, {333}}, {{333}, {1}}, {{334}, {666}}}, gb);
    diff_result res = run_diff(dir.path(), {});
    expect_equal_to_brute(find(res, 1, "v"), brute(ga, gb, CAIRN_FLOAT64, {}), false, "1-D");
    // Rows longer than the buffer (4096 bytes = 512 elements) go in pieces.
    diff_options small;
    small.read_bytes = 4096;
    small.use_trees = false;
    res = run_diff(dir.path(), small);
    expect_equal_to_brute(find(res, 1, "v"), brute(ga, gb, CAIRN_FLOAT64, {}), false, "1-D, small buffer");
    EXPECT_GE(find(res, 1, "v")->chunks_read, 3u);
  }
  // 3-D: 7x6x5 in 2 slabs vs 4 pencils.
  {
    const std::vector<uint64_t> g = {7, 6, 5};
    auto ga = random_array(CAIRN_INT16, 210, rng, 1, false);
    auto gb = ga;
    perturb(gb, CAIRN_INT16, 0.05, rng, 1, 0);
    test::temp_dir dir;
    write_global(dir.path(), "a", 1, "v", CAIRN_INT16, g, {{{0, 0, 0}, {3, 6, 5}}, {{3, 0, 0}, {4, 6, 5}}}, ga);
    write_global(dir.path(), "b", 1, "v", CAIRN_INT16, g,
                 {{{0, 0, 0}, {7, 3, 2}}, {{0, 3, 0}, {7, 3, 2}}, {{0, 0, 2}, {7, 3, 3}}, {{0, 3, 2}, {7, 3, 3}}}, gb);
    diff_result res = run_diff(dir.path(), {});
    const compare_stats want = brute(ga, gb, CAIRN_INT16, {});
    expect_equal_to_brute(find(res, 1, "v"), want, false, "3-D");
    ASSERT_TRUE(want.first);
    const uint64_t i = want.first->index;
    EXPECT_EQ(find(res, 1, "v")->first->coords, (std::vector<uint64_t>{i / 30, (i / 5) % 6, i % 5}));
  }
}

TEST(HistoryDiff, GlobalLayoutReportsWhatCannotBeMatched) {
  const std::vector<uint64_t> g = {10, 10};
  std::mt19937_64 rng(9);
  auto ga = random_array(CAIRN_FLOAT64, 100, rng, 1e-3, false);
  test::temp_dir dir;
  write_global(dir.path(), "a", 1, "f", CAIRN_FLOAT64, g, {{{0, 0}, {10, 10}}}, ga);
  write_global(dir.path(), "b", 1, "f", CAIRN_FLOAT64, g, {{{0, 0}, {6, 10}}, {{6, 0}, {4, 7}}}, ga);  // 12 missing
  diff_result res = run_diff(dir.path(), {});
  const region_diff* rd = find(res, 1, "f");
  ASSERT_NE(rd, nullptr);
  EXPECT_EQ(rd->state, region_state::compared);
  EXPECT_EQ(rd->stats.exact, 88u);
  EXPECT_EQ(rd->unmatched_a, 12u);
  EXPECT_EQ(rd->unmatched_b, 0u);
  ASSERT_TRUE(res.first);
  EXPECT_EQ(res.first->kind, "structural");
  EXPECT_NE(res.first->message.find("12 elements of the global array are held by run A's blocks but by no block of run B"),
            std::string::npos)
      << res.first->message;

  // Overlapping blocks in one run and a different global shape are structural.
  test::temp_dir dir2;
  write_global(dir2.path(), "a", 1, "f", CAIRN_FLOAT64, g, {{{0, 0}, {6, 10}}, {{5, 0}, {5, 10}}}, ga);
  write_global(dir2.path(), "b", 1, "f", CAIRN_FLOAT64, g, {{{0, 0}, {10, 10}}}, ga);
  res = run_diff(dir2.path(), {});
  rd = find(res, 1, "f");
  ASSERT_NE(rd, nullptr);
  EXPECT_EQ(rd->state, region_state::structural);
  EXPECT_NE(rd->problems.at(0).find("blocks of ranks 0 and 1 of run A overlap"), std::string::npos);

  test::temp_dir dir3;
  write_global(dir3.path(), "a", 1, "f", CAIRN_FLOAT64, g, {{{0, 0}, {10, 10}}}, ga);
  const auto gb = random_array(CAIRN_FLOAT64, 110, rng, 1e-3, false);  // a 10x11 global array
  write_global(dir3.path(), "b", 1, "f", CAIRN_FLOAT64, {10, 11}, {{{0, 0}, {10, 10}}}, gb);
  res = run_diff(dir3.path(), {});
  rd = find(res, 1, "f");
  ASSERT_NE(rd, nullptr);
  EXPECT_EQ(rd->state, region_state::structural);
  EXPECT_EQ(rd->problems.at(0), "global shape differs: A 10x10, B 10x11");
}

// ---- structural differences and bad input ---------------------------------------------

history_version simple(const std::string& run, int64_t version, uint32_t nranks, uint8_t type, uint64_t n,
                       uint64_t salt = 0) {
  history_version hv;
  hv.run = run;
  hv.name = "ck";
  hv.version = version;
  for (uint32_t r = 0; r < nranks; ++r) {
    region_data rd;
    rd.name = "u";
    rd.type = type;
    rd.bytes.resize(n * format::type_size(type));
    for (size_t i = 0; i < rd.bytes.size(); ++i) rd.bytes[i] = static_cast<std::byte>((i * 7 + r + salt) & 0xff);
    hv.ranks.push_back({rd});
  }
  return hv;
}

TEST(HistoryDiff, PerRankRegionsWithDifferentRankCountsAreNotComparable) {
  test::temp_dir dir;
  ASSERT_TRUE(test::write_history_version(dir.path(), simple("a", 1, 2, CAIRN_FLOAT64, 100)).is_ok());
  ASSERT_TRUE(test::write_history_version(dir.path(), simple("b", 1, 3, CAIRN_FLOAT64, 100)).is_ok());
  diff_result res = run_diff(dir.path(), {});
  const region_diff* rd = find(res, 1, "u");
  ASSERT_NE(rd, nullptr);
  EXPECT_EQ(rd->state, region_state::not_comparable);
  EXPECT_EQ(rd->problems.at(0), "not comparable: per-rank region and different rank counts (A has 2 ranks, B has 3)");
  ASSERT_TRUE(res.first);
  EXPECT_EQ(res.first->kind, "not_comparable");
  EXPECT_EQ(res.outcome(), "diverged");
  EXPECT_EQ(res.io.data_bytes, 0u);
}

TEST(HistoryDiff, TypeShapeAndLayoutDifferencesAreStructural) {
  test::temp_dir dir;
  ASSERT_TRUE(test::write_history_version(dir.path(), simple("a", 1, 1, CAIRN_FLOAT64, 100)).is_ok());
  ASSERT_TRUE(test::write_history_version(dir.path(), simple("b", 1, 1, CAIRN_FLOAT32, 100)).is_ok());
  ASSERT_TRUE(test::write_history_version(dir.path(), simple("a", 2, 1, CAIRN_INT32, 100)).is_ok());
  ASSERT_TRUE(test::write_history_version(dir.path(), simple("b", 2, 1, CAIRN_INT32, 101)).is_ok());
  history_version a3 = simple("a", 3, 1, CAIRN_INT32, 100), b3 = simple("b", 3, 1, CAIRN_INT32, 100);
  b3.ranks[0][0].global = {100};
  b3.ranks[0][0].dims = {100};
  b3.ranks[0][0].start = {0};
  ASSERT_TRUE(test::write_history_version(dir.path(), a3).is_ok());
  ASSERT_TRUE(test::write_history_version(dir.path(), b3).is_ok());
  history_version a4 = simple("a", 4, 1, CAIRN_INT32, 100), b4 = simple("b", 4, 1, CAIRN_INT32, 100);
  b4.ranks[0][0].name = "w";
  ASSERT_TRUE(test::write_history_version(dir.path(), a4).is_ok());
  ASSERT_TRUE(test::write_history_version(dir.path(), b4).is_ok());
  diff_result res = run_diff(dir.path(), {});
  EXPECT_EQ(find(res, 1, "u", 0)->problems.at(0), "type differs: A float64, B float32");
  EXPECT_EQ(find(res, 2, "u", 0)->problems.at(0), "shape differs: A 100, B 101");
  EXPECT_NE(find(res, 3, "u", -1)->problems.at(0).find("global layout declared on some ranks only"), std::string::npos);
  EXPECT_EQ(find(res, 4, "u", -1)->problems.at(0), "region only in run A");
  EXPECT_EQ(find(res, 4, "w", -1)->problems.at(0), "region only in run B");
  for (int v = 1; v <= 2; ++v) EXPECT_EQ(find(res, v, "u", 0)->state, region_state::structural);
  ASSERT_TRUE(res.first);
  EXPECT_EQ(res.first->version, 1);
  EXPECT_EQ(res.first->kind, "structural");
  EXPECT_EQ(res.structural, 5u);
  EXPECT_EQ(res.io.data_bytes, 0u);
}

TEST(HistoryDiff, FirstDivergenceIsLowestVersionThenRankThenRegion) {
  test::temp_dir dir;
  auto make = [&](const std::string& run, int64_t v, bool diverge_r1_x, bool diverge_r0_y) {
    history_version hv;
    hv.run = run;
    hv.name = "ck";
    hv.version = v;
    for (int r = 0; r < 2; ++r) {
      std::vector<double> x(50, 1.0), y(50, 2.0);
      if (run == "b" && r == 1 && diverge_r1_x) x[10] = 1.5;
      if (run == "b" && r == 0 && diverge_r0_y) y[20] = 2.5;
      region_data rx, ry;
      rx.name = "x";
      rx.type = ry.type = CAIRN_FLOAT64;
      ry.name = "y";
      rx.bytes = as_bytes_of(x);
      ry.bytes = as_bytes_of(y);
      hv.ranks.push_back({rx, ry});
    }
    ASSERT_TRUE(test::write_history_version(dir.path(), hv).is_ok());
  };
  for (const char* run : {"a", "b"}) {
    make(run, 1, false, false);
    make(run, 2, true, true);
    make(run, 3, true, true);
  }
  diff_result res = run_diff(dir.path(), {});
  ASSERT_TRUE(res.first);
  EXPECT_EQ(res.first->version, 2);
  EXPECT_EQ(res.first->rank, 0);
  EXPECT_EQ(res.first->region, "y");
  ASSERT_TRUE(res.first->at);
  EXPECT_EQ(res.first->at->index, 20u);
  EXPECT_EQ(res.first->at->a.to_string(), "2");
  EXPECT_EQ(res.first->at->b.to_string(), "2.5");
  EXPECT_EQ(res.total.mismatch, 4u);
}

TEST(HistoryDiff, BadInputIsReportedClearly) {
  test::temp_dir dir;
  for (int64_t v : {1, 2, 3}) ASSERT_TRUE(test::write_history_version(dir.path(), simple("a", v, 1, CAIRN_INT64, 64)).is_ok());
  for (int64_t v : {1, 3}) ASSERT_TRUE(test::write_history_version(dir.path(), simple("b", v, 1, CAIRN_INT64, 64)).is_ok());
  history_version unc = simple("b", 4, 1, CAIRN_INT64, 64);
  unc.commit = false;
  ASSERT_TRUE(test::write_history_version(dir.path(), unc).is_ok());

  diff_options o;
  o.store = dir.path();
  o.run_a = "a";
  o.run_b = "zeta";
  auto r = analytics::diff_runs(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.error().code(), errc::not_found);
  EXPECT_EQ(r.error().message(), "run 'zeta' not found in " + dir.path() + " (runs: a, b)");
  o.run_b = "b";
  o.name = "nope";
  r = analytics::diff_runs(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.error().message(), "no checkpoint 'nope' in run 'a' or 'b' (checkpoints: ck)");
  o.name.clear();
  o.regions = {"u", "missing"};
  r = analytics::diff_runs(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.error().message(), "region 'missing' not found in the compared versions (regions: u)");
  o.regions.clear();
  o.tol.abs = -1;
  r = analytics::diff_runs(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.error().code(), errc::invalid_argument);

  diff_result res = run_diff(dir.path(), {});
  ASSERT_EQ(res.checkpoints.size(), 1u);
  EXPECT_EQ(res.checkpoints[0].only_a, (std::vector<int64_t>{2}));
  EXPECT_TRUE(res.checkpoints[0].only_b.empty());
  EXPECT_EQ(res.checkpoints[0].uncommitted_b, (std::vector<int64_t>{4}));
  EXPECT_EQ(res.versions_compared, 2u);
  EXPECT_EQ(res.outcome(), "identical");  // data are a function of rank, not run

  // A damaged shard header: unreadable, reported, a divergence.
  flip_byte(format::shard_path(dir.path(), "b", "ck", 3, 0), 70);
  res = run_diff(dir.path(), {});
  ASSERT_TRUE(res.first);
  EXPECT_EQ(res.first->kind, "unreadable");
  EXPECT_EQ(res.first->version, 3);
  EXPECT_NE(res.first->message.find("header checksum mismatch"), std::string::npos) << res.first->message;
  const region_diff* rd = find(res, 3, "u", 0);  // known from run A's shard
  ASSERT_NE(rd, nullptr);
  EXPECT_EQ(rd->state, region_state::unreadable);
  EXPECT_EQ(res.problems, 1u);

  // Nothing in common.
  test::temp_dir dir2;
  ASSERT_TRUE(test::write_history_version(dir2.path(), simple("a", 1, 1, CAIRN_INT64, 8)).is_ok());
  ASSERT_TRUE(test::write_history_version(dir2.path(), simple("b", 2, 1, CAIRN_INT64, 8)).is_ok());
  res = run_diff(dir2.path(), {});
  EXPECT_EQ(res.outcome(), "nothing_compared");
}

// More shards than the comparator keeps open (256): files are closed and reopened.
TEST(HistoryDiff, ManyRanks) {
  test::temp_dir dir;
  history_version a = simple("a", 1, 300, CAIRN_INT32, 16), b = simple("b", 1, 300, CAIRN_INT32, 16);
  b.ranks[299][0].bytes[5] ^= std::byte{1};
  ASSERT_TRUE(test::write_history_version(dir.path(), a).is_ok());
  ASSERT_TRUE(test::write_history_version(dir.path(), b).is_ok());
  diff_options o;
  o.use_trees = false;
  diff_result res = run_diff(dir.path(), o);
  EXPECT_EQ(res.problems, 0u);
  EXPECT_EQ(res.regions_compared, 300u);
  EXPECT_EQ(res.total.mismatch, 1u);
  ASSERT_TRUE(res.first);
  EXPECT_EQ(res.first->rank, 299);
  EXPECT_EQ(res.first->at->index, 1u);
}

// ---- I/O: trees only for identical histories; local copies ----------------------------

TEST(HistoryDiff, IdenticalHistoriesReadOnlyTrees) {
  test::temp_dir dir;
  std::mt19937_64 rng(3);
  for (int64_t v = 1; v <= 3; ++v) {
    std::vector<std::vector<region_data>> ranks;
    for (int r = 0; r < 2; ++r) {
      region_data big, ints;
      big.name = "field";
      big.type = CAIRN_FLOAT64;
      big.bytes = random_array(CAIRN_FLOAT64, (1 << 17) + 1000, rng, 0, false);  // > 1 MiB
      ints.name = "ids";
      ints.type = CAIRN_INT32;
      ints.bytes = random_array(CAIRN_INT32, (1 << 18) + 17, rng, 0, false);
      ranks.push_back({big, ints});
    }
    for (const char* run : {"a", "b"}) {
      history_version hv;
      hv.run = run;
      hv.name = "ck";
      hv.version = v;
      hv.ranks = ranks;
      hv.tree.quantum = 1e-9;
      ASSERT_TRUE(test::write_history_version(dir.path(), hv).is_ok());
    }
  }
  diff_options o;
  o.read_bytes = size_t{4} << 20;
  o.store = dir.path();
  o.run_a = "a";
  o.run_b = "b";
  auto r = analytics::diff_runs(o);
  ASSERT_TRUE(r.is_ok());
  const diff_result& res = *r;
  EXPECT_EQ(res.outcome(), "identical");
  EXPECT_EQ(res.io.data_bytes, 0u);
  EXPECT_EQ(res.io.trees_used, 12u);
  EXPECT_GT(res.io.tree_bytes, 0u);
  EXPECT_GT(res.io.checkpoint_bytes, 12u * (2u << 20));
  EXPECT_LE(static_cast<double>(res.io.tree_bytes), 0.05 * static_cast<double>(res.io.checkpoint_bytes));
  EXPECT_LE(static_cast<double>(res.io.tree_bytes + res.io.metadata_bytes),
            0.05 * static_cast<double>(res.io.checkpoint_bytes));
  EXPECT_EQ(res.total.exact, 3u * 2u * ((1u << 17) + 1000u + (1u << 18) + 17u));
}

TEST(HistoryDiff, LocalCopiesAreReadFirstAndDamagedOnesAbandoned) {
  test::temp_dir store, scratch;
  std::mt19937_64 rng(11);
  auto a = random_array(CAIRN_FLOAT64, 20000, rng, 0, false);
  auto b = a;
  for (uint64_t i = 0; i < 20000; i += 997) set<double>(b, i, get<double>(b, i) + 1.0);
  auto version_of = [&](const std::string& run, const std::vector<std::byte>& data) {
    history_version hv;
    hv.run = run;
    hv.name = "ck";
    hv.version = 1;
    region_data rd;
    rd.name = "u";
    rd.type = CAIRN_FLOAT64;
    rd.bytes = data;
    hv.ranks = {{rd}};
    return hv;
  };
  ASSERT_TRUE(test::write_history_version(store.path(), version_of("a", a)).is_ok());
  ASSERT_TRUE(test::write_history_version(store.path(), version_of("b", b)).is_ok());
  ASSERT_TRUE(test::write_history_version(scratch.path(), version_of("b", b), false).is_ok());
  diff_options o;
  o.scratch_b = scratch.path();
  diff_result res = run_diff(store.path(), o);
  const compare_stats want = brute(a, b, CAIRN_FLOAT64, {});
  expect_equal_to_brute(find(res, 1, "u", 0), want, false, "local copy");
  EXPECT_EQ(res.io.shards_local, 1u);
  EXPECT_GT(res.io.data_bytes_local, 0u);
  EXPECT_EQ(res.io.data_bytes_local * 2, res.io.data_bytes);  // B's half came from the local copy

  // Damage the local copy's data (its header stays valid): detected by the leaves,
  // the persistent shard is read instead, the answer does not change.
  const std::string local = format::shard_path(scratch.path(), "b", "ck", 1, 0);
  flip_byte(local, 4096 + 8 * 997 + 3);
  res = run_diff(store.path(), o);
  expect_equal_to_brute(find(res, 1, "u", 0), want, false, "damaged local copy");
  ASSERT_EQ(res.checkpoints[0].versions[0].notes.size(), 1u);
  EXPECT_NE(res.checkpoints[0].versions[0].notes[0].find("damaged local copy"), std::string::npos);
  EXPECT_FALSE(res.first && res.first->kind != "mismatch");
  EXPECT_EQ(res.problems, 0u);

  // A local copy of another image (header checksum differs from the MANIFEST) is not used.
  ASSERT_TRUE(test::write_history_version(scratch.path(), version_of("b", a), false).is_ok());
  res = run_diff(store.path(), o);
  EXPECT_EQ(res.io.shards_local, 0u);
  EXPECT_EQ(res.io.data_bytes_local, 0u);
  expect_equal_to_brute(find(res, 1, "u", 0), want, false, "foreign local copy");
  ASSERT_EQ(res.checkpoints[0].versions[0].notes.size(), 1u);
  EXPECT_NE(res.checkpoints[0].versions[0].notes[0].find("do not match the MANIFEST"), std::string::npos);
}

}  // namespace
}  // namespace cairn
