// Element-by-element comparison of two arrays of one cairn type: the rules of
// docs/design/history.md §4 and the brute-force comparator every accelerated
// comparison (history_diff) must agree with exactly.
//
// Rules, per element pair (a from run A, b from run B):
//   integers and bytes: equal -> exact, else mismatch;
//   floats: bitwise equal, or both NaN (any payloads) -> exact;
//           NaN against a number, an infinity against anything but the same
//           infinity -> mismatch ("non-finite mismatch");
//           otherwise (both finite) approximate when within ANY tolerance:
//             |a - b| <= abs, |a - b| <= rel * max(|a|, |b|), ulp_distance(a, b) <= ulps;
//           else mismatch.
//   +0 and -0 are not bitwise equal: the pair is "approximate" with error 0
//   (|a - b| = 0 <= abs and ulp distance 0), even with all tolerances 0.
// Arithmetic is in double for both float types (a float32 difference is
// rounded once, to double).
//
// Errors: max_abs = max |a - b|, max_rel = max |a - b| / max(|a|, |b|) (0 when
// both are zero), over pairs of finite values that are not exact (approximate
// and mismatching alike; for integers, the mismatching pairs). Non-finite
// mismatches have no error: they are counted in nonfinite_mismatch and leave
// max_abs / max_rel alone, so max_abs is finite unless two finite values
// overflow when subtracted. mismatch_max_abs / mismatch_max_rel are the same
// maxima over the finite mismatching pairs only (all the mismatch-only mode
// can know).
//
// Thread-safety: pure functions.
#ifndef CAIRN_ANALYTICS_COMPARE_HPP
#define CAIRN_ANALYTICS_COMPARE_HPP

#include <cstdint>
#include <optional>
#include <string>

namespace cairn::analytics {

struct tolerance {
  double abs = 0;     // absolute: |a - b| <= abs
  double rel = 0;     // relative: |a - b| <= rel * max(|a|, |b|)
  uint64_t ulps = 0;  // units in the last place of the element's own type
};

// One element's value: its type (cairn_type_t) and raw bits, zero-extended.
struct element_value {
  uint8_t type = 0;
  uint64_t bits = 0;

  bool is_float() const;
  bool is_signed() const;   // signed integer types
  double as_double() const;  // rounded for 64-bit integers
  int64_t as_int64() const;     // signed integer types
  uint64_t as_uint64() const;   // unsigned integer types and bytes
  // Exact decimal for integers; shortest round-trip decimal for floats;
  // "nan", "inf", "-inf" for the non-finite values (NaN payloads shown as
  // "nan(0x...)" when not the default quiet NaN).
  std::string to_string() const;
};

struct element_mismatch {
  uint64_t index = 0;  // in the index space the caller chose (see compare_into)
  element_value a, b;
};

struct compare_stats {
  uint64_t exact = 0;
  uint64_t approximate = 0;
  uint64_t mismatch = 0;
  uint64_t nonfinite_mismatch = 0;  // of `mismatch`: NaN or infinity involved
  double max_abs = 0;
  double max_rel = 0;
  double mismatch_max_abs = 0;
  double mismatch_max_rel = 0;
  std::optional<element_mismatch> first;  // the mismatch with the lowest index

  uint64_t elements() const { return exact + approximate + mismatch; }
  // Adds o's counts and maxima; keeps the first mismatch of lower index (both
  // must use the same index space).
  void merge(const compare_stats& o);
  bool operator==(const compare_stats& o) const;
};

// Brute force over n elements of `type` at a and b (not necessarily aligned).
// Runs at memory speed: typed loops, blocks that compare equal with memcmp are
// counted exact without looking at elements. An unknown type compares bytes.
compare_stats compare_elements(const void* a, const void* b, uint64_t n, uint8_t type, const tolerance& tol);

// Same, accumulating into *s; element i is reported at index index_base + i.
void compare_into(compare_stats* s, const void* a, const void* b, uint64_t n, uint8_t type, const tolerance& tol,
                  uint64_t index_base);

// Distance in representable values between two finite values, on the ordered
// integer representation (sign-magnitude mapped to two's complement, so that
// +0 and -0 are both 0 and their distance is 0). Not meaningful for NaN.
uint64_t ulp_distance(double a, double b);
uint64_t ulp_distance(float a, float b);

// Whether equal tolerant leaves of quantum `quantum` prove that every element
// pair of a chunk is within `tol` (so that the mismatch-only question needs no
// read). Equal quanta floor(a/q) = floor(b/q) bound the real difference only
// by |a - b| < q + 2^-52 * max(|a|, |b|) (the division a/q is rounded), so
// "quantum <= abs" alone is not a proof: for |a| near 2^53 q and above, two
// values many quanta apart can share an index. A proof needs abs > quantum
// (margin 2^-40) for small values and rel >= min_rel for large ones:
//   T = (abs / c - q) / 2^-52, min_rel = c^2 (q / T + 2^-52), c = 1 + 2^-40
// (the derivation is in compare.cpp). With abs = +inf no rel is needed.
struct tolerant_proof {
  bool usable = false;
  double min_rel = 0;  // the rel tolerance the proof needs (0 if none)
  std::string reason;  // why not usable, for the report
};
tolerant_proof tolerant_leaves_prove(double quantum, const tolerance& tol);

}  // namespace cairn::analytics

#endif
