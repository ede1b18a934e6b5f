#include "analytics/compare.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

namespace cairn::analytics {
namespace {

// Elements per block whose bytes are first compared with memcmp: equal blocks
// (the common case of runs that agree) cost one memcmp instead of n element
// comparisons.
constexpr uint64_t kBlock = 256;

template <typename T>
T load(const std::byte* p, uint64_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));  // inputs need not be aligned
  return v;
}

// Running totals of one call, kept in locals: the inputs are byte pointers,
// which may alias anything, so accumulating through compare_stats* would
// force a store and reload per element.
struct accum {
  uint64_t exact = 0, approximate = 0, mismatch = 0, nonfinite = 0;
  double max_abs = 0, max_rel = 0, mm_abs = 0, mm_rel = 0;
  // Lowest-index mismatch of this call (indices only grow within a call).
  bool have_first = false;
  uint64_t first_index = 0;
  uint64_t first_a = 0, first_b = 0;

  // d = |a - b| (may be inf), m = max(|a|, |b|), both of finite values.
  inline void error(double d, double m, bool is_mismatch) {
    if (d > max_abs) max_abs = d;
    // r = d / m only when it may beat the maximum it could update (mm_rel <=
    // max_rel): d > best * m * (1 - 2^-50) is looser than fl(d / m) > best by
    // more than the roundings involved, so no new maximum is skipped; products
    // near underflow and infinite d always divide.
    const double best = is_mismatch ? mm_rel : max_rel;
    const double p = best * m;
    if (m > 0 && (p < 0x1p-1000 || d > p * (1 - 0x1p-50) || std::isinf(d))) {
      const double r = d / m;
      if (r > max_rel) max_rel = r;
      if (is_mismatch && r > mm_rel) mm_rel = r;
    }
    if (is_mismatch && d > mm_abs) mm_abs = d;
  }

  template <typename U>
  inline void first(uint64_t index, U a, U b) {
    if (!have_first) {
      have_first = true;
      first_index = index;
      first_a = a;
      first_b = b;
    }
  }

  void flush(compare_stats* s, uint8_t type) const {
    compare_stats o;
    o.exact = exact;
    o.approximate = approximate;
    o.mismatch = mismatch;
    o.nonfinite_mismatch = nonfinite;
    o.max_abs = max_abs;
    o.max_rel = max_rel;
    o.mismatch_max_abs = mm_abs;
    o.mismatch_max_rel = mm_rel;
    if (have_first) o.first = element_mismatch{first_index, {type, first_a}, {type, first_b}};
    s->merge(o);
  }
};

// Ordered integer of a float's bits: negative values map below zero so that
// adjacent representable values differ by 1 and +0 / -0 both map to 0.
template <typename F>
inline int64_t ordered(F v) {
  if constexpr (sizeof(F) == 8) {
    const uint64_t u = std::bit_cast<uint64_t>(v);
    const int64_t mag = static_cast<int64_t>(u & 0x7fffffffffffffffULL);
    return (u >> 63) ? -mag : mag;
  } else {
    const uint32_t u = std::bit_cast<uint32_t>(v);
    const int64_t mag = static_cast<int64_t>(u & 0x7fffffffU);
    return (u >> 31) ? -mag : mag;
  }
}

template <typename F>
inline uint64_t ulp_distance_t(F a, F b) {
  const int64_t x = ordered(a), y = ordered(b);
  // |x - y| < 2^64 always (|x|, |y| < 2^63); unsigned wrap gives it exactly.
  return x >= y ? static_cast<uint64_t>(x) - static_cast<uint64_t>(y)
                : static_cast<uint64_t>(y) - static_cast<uint64_t>(x);
}

template <typename T>
void compare_ints(compare_stats* s, const std::byte* a, const std::byte* b, uint64_t n, uint8_t type,
                  uint64_t base) {
  using U = std::make_unsigned_t<T>;
  accum acc;
  for (uint64_t i0 = 0; i0 < n; i0 += kBlock) {
    const uint64_t m = std::min(kBlock, n - i0);
    if (std::memcmp(a + i0 * sizeof(T), b + i0 * sizeof(T), m * sizeof(T)) == 0) {
      acc.exact += m;
      continue;
    }
    for (uint64_t i = i0; i < i0 + m; ++i) {
      const T x = load<T>(a, i), y = load<T>(b, i);
      if (x == y) {
        ++acc.exact;
        continue;
      }
      ++acc.mismatch;
      // |x - y| exactly as an unsigned integer (wrapping in U: small types are
      // promoted to int before subtracting), then rounded once to double.
      const uint64_t d = x > y ? static_cast<uint64_t>(static_cast<U>(static_cast<U>(x) - static_cast<U>(y)))
                               : static_cast<uint64_t>(static_cast<U>(static_cast<U>(y) - static_cast<U>(x)));
      const double ax = std::fabs(static_cast<double>(x)), ay = std::fabs(static_cast<double>(y));
      acc.error(static_cast<double>(d), std::max(ax, ay), true);
      acc.first(base + i, static_cast<U>(x), static_cast<U>(y));
    }
  }
  acc.flush(s, type);
}

// A block of floats where every pair is bitwise equal or finite and within
// tolerance (the common case of runs that agree), accounted with selects
// instead of branches per element. False (nothing accounted) when some pair
// is a mismatch or non-finite: the per-element loop then takes the block.
// Same d, m, d / m and criteria as that loop, hence the same counts and maxima.
// kUlps = false when tol.ulps is 0: a distance of 0 means equal values, which
// |a - b| = 0 <= abs already accepts, so the term can be left out.
template <typename F, typename U, bool kUlps>
bool within_block(const std::byte* a, const std::byte* b, uint64_t i0, uint64_t m, const tolerance& tol,
                  accum* acc) {
  constexpr U kExp = sizeof(F) == 8 ? U(0x7ff0000000000000ULL) : U(0x7f800000U);
  const double abs_tol = tol.abs, rel_tol = tol.rel;
  const uint64_t ulps = tol.ulps;
  uint64_t equal = 0;
  bool bad = false;
  double max_d = 0, max_r = 0;
  for (uint64_t i = i0; i < i0 + m; ++i) {
    const U ux = load<U>(a, i), uy = load<U>(b, i);
    const bool eq = ux == uy;
    const bool finite = ((ux & kExp) != kExp) & ((uy & kExp) != kExp);
    const F x = std::bit_cast<F>(ux), y = std::bit_cast<F>(uy);
    const double dx = static_cast<double>(x), dy = static_cast<double>(y);
    // Computed unconditionally and selected: equal lanes give d = 0 and r = 0
    // or NaN (which never wins a maximum); +0 / -0 lanes give 0 / 1.
    const double diff = std::fabs(dx - dy);
    const double d = eq ? 0.0 : diff;
    const double ax = std::fabs(dx), ay = std::fabs(dy);
    const double mag = ax > ay ? ax : ay;
    const double r = d / (mag > 0 ? mag : 1.0);
    bool ok = (d <= abs_tol) | (d <= rel_tol * mag);
    if constexpr (kUlps) ok |= ulp_distance_t(x, y) <= ulps;
    bad |= (!eq) & ((!finite) | (!ok));
    equal += eq;
    max_d = d > max_d ? d : max_d;
    max_r = r > max_r ? r : max_r;
  }
  if (bad) return false;
  acc->exact += equal;
  acc->approximate += m - equal;
  acc->max_abs = std::max(acc->max_abs, max_d);
  acc->max_rel = std::max(acc->max_rel, max_r);
  return true;
}

template <typename F>
void compare_floats(compare_stats* s, const std::byte* a, const std::byte* b, uint64_t n, uint8_t type,
                    const tolerance& tol, uint64_t base) {
  using U = std::conditional_t<sizeof(F) == 8, uint64_t, uint32_t>;
  constexpr U kExp = sizeof(F) == 8 ? U(0x7ff0000000000000ULL) : U(0x7f800000U);
  const double abs_tol = tol.abs, rel_tol = tol.rel;
  const uint64_t ulps = tol.ulps;
  accum acc;
  int skip_fast = 0;
  for (uint64_t i0 = 0; i0 < n; i0 += kBlock) {
    const uint64_t m = std::min(kBlock, n - i0);
    if (std::memcmp(a + i0 * sizeof(F), b + i0 * sizeof(F), m * sizeof(F)) == 0) {
      acc.exact += m;
      continue;
    }
    // After a block the fast path refused, the next ones likely hold
    // mismatches too: go straight to the per-element loop for a while.
    if (skip_fast > 0) {
      --skip_fast;
    } else if (ulps ? within_block<F, U, true>(a, b, i0, m, tol, &acc)
                    : within_block<F, U, false>(a, b, i0, m, tol, &acc)) {
      continue;
    } else {
      skip_fast = 16;
    }
    for (uint64_t i = i0; i < i0 + m; ++i) {
      const U ux = load<U>(a, i), uy = load<U>(b, i);
      if (ux == uy) {  // bitwise equal (equal infinities included)
        ++acc.exact;
        continue;
      }
      const F x = std::bit_cast<F>(ux), y = std::bit_cast<F>(uy);
      if ((ux & kExp) != kExp && (uy & kExp) != kExp) [[likely]] {  // both finite
        const double dx = static_cast<double>(x), dy = static_cast<double>(y);
        const double d = std::fabs(dx - dy);
        const double mag = std::max(std::fabs(dx), std::fabs(dy));
        const bool ok = d <= abs_tol || d <= rel_tol * mag || ulp_distance_t(x, y) <= ulps;
        if (ok) {
          ++acc.approximate;
        } else {
          ++acc.mismatch;
          acc.first(base + i, ux, uy);
        }
        acc.error(d, mag, !ok);
        continue;
      }
      if (std::isnan(x) && std::isnan(y)) {
        ++acc.exact;
        continue;
      }
      // NaN against a number, an infinity against anything but itself.
      ++acc.mismatch;
      ++acc.nonfinite;
      acc.first(base + i, ux, uy);
    }
  }
  acc.flush(s, type);
}

}  // namespace

bool element_value::is_float() const { return type == 9 || type == 10; }
bool element_value::is_signed() const { return type >= 1 && type <= 4; }

int64_t element_value::as_int64() const {
  switch (type) {
    case 1: return static_cast<int8_t>(bits);
    case 2: return static_cast<int16_t>(bits);
    case 3: return static_cast<int32_t>(bits);
    case 4: return static_cast<int64_t>(bits);
    default: return static_cast<int64_t>(bits);
  }
}

uint64_t element_value::as_uint64() const { return bits; }

double element_value::as_double() const {
  if (type == 9) return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  if (type == 10) return std::bit_cast<double>(bits);
  if (is_signed()) return static_cast<double>(as_int64());
  return static_cast<double>(bits);
}

std::string element_value::to_string() const {
  if (!is_float()) return is_signed() ? std::to_string(as_int64()) : std::to_string(bits);
  const double v = as_double();
  if (std::isnan(v)) {
    const bool quiet_default = type == 9 ? (bits & 0x7fffffffU) == 0x7fc00000U
                                         : (bits & 0x7fffffffffffffffULL) == 0x7ff8000000000000ULL;
    if (quiet_default) return (bits >> (type == 9 ? 31 : 63)) ? "-nan" : "nan";
    char hex[24];
    auto [end, ec] = std::to_chars(hex, hex + sizeof hex, bits, 16);
    (void)ec;
    return "nan(0x" + std::string(hex, end) + ")";
  }
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::to_chars_result r = type == 9 ? std::to_chars(buf, buf + sizeof buf, std::bit_cast<float>(static_cast<uint32_t>(bits)))
                                     : std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

void compare_stats::merge(const compare_stats& o) {
  exact += o.exact;
  approximate += o.approximate;
  mismatch += o.mismatch;
  nonfinite_mismatch += o.nonfinite_mismatch;
  max_abs = std::max(max_abs, o.max_abs);
  max_rel = std::max(max_rel, o.max_rel);
  mismatch_max_abs = std::max(mismatch_max_abs, o.mismatch_max_abs);
  mismatch_max_rel = std::max(mismatch_max_rel, o.mismatch_max_rel);
  if (o.first && (!first || o.first->index < first->index)) first = o.first;
}

bool compare_stats::operator==(const compare_stats& o) const {
  auto same_first = [&]() {
    if (first.has_value() != o.first.has_value()) return false;
    if (!first) return true;
    return first->index == o.first->index && first->a.type == o.first->a.type && first->a.bits == o.first->a.bits &&
           first->b.type == o.first->b.type && first->b.bits == o.first->b.bits;
  };
  // Maxima compared bitwise-equal as numbers (never NaN).
  return exact == o.exact && approximate == o.approximate && mismatch == o.mismatch &&
         nonfinite_mismatch == o.nonfinite_mismatch && max_abs == o.max_abs && max_rel == o.max_rel &&
         mismatch_max_abs == o.mismatch_max_abs && mismatch_max_rel == o.mismatch_max_rel && same_first();
}

void compare_into(compare_stats* s, const void* a_, const void* b_, uint64_t n, uint8_t type, const tolerance& tol,
                  uint64_t index_base) {
  const auto* a = static_cast<const std::byte*>(a_);
  const auto* b = static_cast<const std::byte*>(b_);
  switch (type) {
    case 1: compare_ints<int8_t>(s, a, b, n, type, index_base); break;
    case 2: compare_ints<int16_t>(s, a, b, n, type, index_base); break;
    case 3: compare_ints<int32_t>(s, a, b, n, type, index_base); break;
    case 4: compare_ints<int64_t>(s, a, b, n, type, index_base); break;
    case 6: compare_ints<uint16_t>(s, a, b, n, type, index_base); break;
    case 7: compare_ints<uint32_t>(s, a, b, n, type, index_base); break;
    case 8: compare_ints<uint64_t>(s, a, b, n, type, index_base); break;
    case 9: compare_floats<float>(s, a, b, n, type, tol, index_base); break;
    case 10: compare_floats<double>(s, a, b, n, type, tol, index_base); break;
    default: compare_ints<uint8_t>(s, a, b, n, type, index_base); break;  // byte, uint8
  }
}

compare_stats compare_elements(const void* a, const void* b, uint64_t n, uint8_t type, const tolerance& tol) {
  compare_stats s;
  compare_into(&s, a, b, n, type, tol, 0);
  return s;
}

uint64_t ulp_distance(double a, double b) { return ulp_distance_t(a, b); }
uint64_t ulp_distance(float a, float b) { return ulp_distance_t(a, b); }

// Proof that equal quanta imply "within tolerance" (u = 2^-53, the unit
// roundoff of double; c = 1 + 2^-40 absorbs every (1 + u) factor below).
// Let a, b be finite with floor(fl(a/q)) = floor(fl(b/q)) = k (the reserved
// tokens carry NaN, infinities and raw bits, which equal leaves make equal or
// both NaN, i.e. exact). X = fl(a/q) and Y = fl(b/q) lie in [k, k+1), so
// |X - Y| < 1, and |X - a/q| <= u |a/q| (+ 2^-1075 if the quotient is
// subnormal), likewise for b. Hence, with M = max(|a|, |b|),
//   |a - b| < q (1 + 2^-1073) + 2u M.
// The comparator computes d = fl(|a - b|) <= (1 + u) |a - b| < c (q + 2u M).
//  - If M <= T = (abs / c - q) / (2u): d < c (q + 2u T) = abs, so d <= abs.
//  - If M > T: q < q M / T, so d < c M (q / T + 2u) <= M rel / c (by
//    rel >= c^2 (q / T + 2u)) <= fl(rel * M), since rel * M > rel * T >= 2^-1000
//    is normal and rounding loses at most a factor (1 - u) >= 1 / c.
// Either way the pair is approximate (or exact): no mismatch. T and min_rel
// are computed with a further margin of 2^-30 against their own rounding.
tolerant_proof tolerant_leaves_prove(double quantum, const tolerance& tol) {
  tolerant_proof p;
  const double c = 1.0 + std::ldexp(1.0, -40);
  const double two_u = std::ldexp(1.0, -52);
  const double margin = std::ldexp(1.0, -30);
  if (!(quantum > 0) || std::isinf(quantum)) {
    p.reason = "the trees have no tolerant leaves (hash_abs = 0)";
    return p;
  }
  if (std::isinf(tol.abs)) {
    p.usable = true;
    return p;
  }
  if (!(tol.abs > quantum * c)) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "--abs %g does not exceed the tree quantum %g (hash_abs, by a margin of 2^-40): equal quanta "
                  "do not prove a pair within tolerance",
                  tol.abs, quantum);
    p.reason = buf;
    return p;
  }
  const double t = (tol.abs / c - quantum) / two_u * (1.0 - margin);
  if (std::isinf(t)) {  // every finite M is below T: abs alone covers
    p.usable = true;
    return p;
  }
  p.min_rel = c * c * (quantum / t + two_u) * (1.0 + margin);
  if (tol.rel >= p.min_rel && tol.rel * t >= std::ldexp(1.0, -1000)) {
    p.usable = true;
    return p;
  }
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "--rel %g is below %.3g, which equal quanta need to prove large values within tolerance "
                "(the quanta of values near 2^53 x quantum and above are rounded)",
                tol.rel, p.min_rel);
  p.reason = buf;
  return p;
}

}  // namespace cairn::analytics
