#!/usr/bin/env bash
# End-to-end test of `cairn diff` on the store written by cairn_make_diff_store
# (see make_diff_store.cpp for its runs): exit statuses, human output, --json.
# usage: diff_test.sh CAIRN_BINARY CAIRN_MAKE_DIFF_STORE_BINARY
set -euo pipefail

cairn=${1:?usage: diff_test.sh CAIRN MAKE_DIFF_STORE}
make_store=${2:?usage: diff_test.sh CAIRN MAKE_DIFF_STORE}

tmp=$(mktemp -d /tmp/cairn-diff-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
store=$tmp/store
scratch=$tmp/scratch

failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# run_cmd EXPECTED_STATUS CMD...: runs CMD, stdout to $tmp/out, stderr to $tmp/err.
run_cmd() {
  local want=$1; shift
  local got=0
  "$@" >"$tmp/out" 2>"$tmp/err" || got=$?
  if [[ $got -ne $want ]]; then
    fail "'$*' exited $got, expected $want"
    sed 's/^/  stdout: /' "$tmp/out" >&2
    sed 's/^/  stderr: /' "$tmp/err" >&2
    return 1
  fi
  return 0
}

contains() {
  if ! grep -qF -- "$2" "$1"; then
    fail "expected '$2' in $(basename "$1"):"
    sed 's/^/  | /' "$1" >&2
    return 1
  fi
}

is_json() { python3 -c 'import json,sys; json.load(sys.stdin)' <"$tmp/out" || { fail "stdout is not JSON"; return 1; }; }

json_eq() {
  local got
  got=$(python3 -c "import json,sys; j=json.load(sys.stdin); v=($1); print(v)" <"$tmp/out")
  [[ $got == "$2" ]] || fail "JSON: $1 is '$got', expected '$2'"
}

"$make_store" "$store" "$scratch"

# ---- usage errors: exit 2 ------------------------------------------------------------
run_cmd 0 "$cairn" diff --help && contains "$tmp/out" "Exit status: 0 no mismatch" && pass "diff --help documents exit codes"
run_cmd 2 "$cairn" diff "$store" ref && pass "diff without RUN_B: exit 2"
run_cmd 2 "$cairn" diff "$store" ref same --abs -1 && pass "negative tolerance: exit 2"
run_cmd 2 "$cairn" diff "$store" ref same --abs x && pass "tolerance not a number: exit 2"
run_cmd 2 "$cairn" diff "$tmp/nowhere" ref same && contains "$tmp/err" "store $tmp/nowhere does not exist" &&
  pass "missing store"
run_cmd 2 "$cairn" diff "$store" ref gamma && contains "$tmp/err" "run 'gamma' not found" &&
  contains "$tmp/err" "(runs: close, far, ref, same, short, typed, wide)" && pass "unknown run lists the runs"
run_cmd 2 "$cairn" diff "$store" ref same --name nothing && contains "$tmp/err" "no checkpoint 'nothing'" &&
  contains "$tmp/err" "(checkpoints: sim)" && pass "unknown checkpoint lists the names"
run_cmd 2 "$cairn" diff "$store" ref same --region nope && contains "$tmp/err" "region 'nope' not found" &&
  contains "$tmp/err" "(regions: field, step)" && pass "unknown region lists the regions"
run_cmd 2 "$cairn" diff "$store" ref same --scratch-a "$tmp/noscratch" && contains "$tmp/err" "$tmp/noscratch" &&
  pass "missing scratch directory"

# ---- identical: trees only -----------------------------------------------------------
run_cmd 0 "$cairn" diff "$store" ref same && contains "$tmp/out" "runs are identical (2 versions, 128004 elements)" &&
  contains "$tmp/out" "data 0 B" && pass "identical runs: exit 0, no data read"
contains "$tmp/out" "NAME  VERSION  REGION  RANK  STATE"
contains "$tmp/out" "sim         1  field   all   exact     64000"
run_cmd 0 "$cairn" diff "$store" ref same --json && is_json && pass "--json parses"
json_eq 'j["summary"]["outcome"], j["io"]["data_bytes"], j["first_divergence"]' "('identical', 0, None)"
json_eq 'j["io"]["tree_bytes"] > 0 and j["io"]["tree_bytes"] + j["io"]["metadata_bytes"] <= 0.05 * j["io"]["checkpoint_bytes"]' "True"
json_eq '[(r["region"], r["layout"], r["rank"], r["exact"]) for r in j["checkpoints"][0]["versions"][0]["regions"]]' \
  "[('field', 'global', None, 64000), ('step', 'per_rank', 0, 1), ('step', 'per_rank', 1, 1)]"
json_eq 'j["io"]["trees"]["used"], j["io"]["trees"]["unusable"]' "(8, 0)"

# ---- within tolerance, mismatch-only -------------------------------------------------
run_cmd 1 "$cairn" diff "$store" ref close && contains "$tmp/out" "first divergence: sim version 1, rank 0, region 'field': element 0 [0,0]" &&
  pass "close runs differ without tolerance: exit 1"
run_cmd 0 "$cairn" diff "$store" ref close --abs 1e-6 && contains "$tmp/out" "runs are equal within tolerance" &&
  pass "close runs within --abs 1e-6: exit 0"
run_cmd 0 "$cairn" diff "$store" ref close --abs 1e-6 --json && is_json
json_eq 'j["summary"]["approximate"], j["summary"]["mismatch"], j["summary"]["exact"]' "(42668, 0, 85336)"
run_cmd 0 "$cairn" diff "$store" ref close --mismatches-only --abs 2e-6 --rel 1e-14 --json && is_json &&
  pass "mismatch-only with a provable tolerance"
json_eq 'j["mode"], j["tolerant_leaves"]["used"], j["summary"]["exact"], j["summary"]["within"]' \
  "('mismatches_only', True, None, 128004)"
json_eq 'j["io"]["data_bytes"]' 0
run_cmd 0 "$cairn" diff "$store" ref close --mismatches-only --abs 1e-6 && contains "$tmp/out" "tolerant leaves: not used: --abs" &&
  pass "mismatch-only with abs = quantum reads the data and says why"

# ---- a mismatch ------------------------------------------------------------------------
run_cmd 1 "$cairn" diff "$store" ref far && pass "far: exit 1"
contains "$tmp/out" "first divergence: sim version 2, rank 1, region 'field': element 40007 [40,7]: A "
contains "$tmp/out" ", B 99"
run_cmd 1 "$cairn" diff "$store" ref far --json && is_json
json_eq 'j["first_divergence"]["version"], j["first_divergence"]["rank"], j["first_divergence"]["kind"]' "(2, 1, 'mismatch')"
json_eq 'j["first_divergence"]["at"]["index"], j["first_divergence"]["at"]["coords"], j["first_divergence"]["at"]["b"]' \
  "(40007, [40, 7], 99.0)"
json_eq '[r["mismatch"] for v in j["checkpoints"][0]["versions"] for r in v["regions"]]' "[0, 0, 0, 1, 0, 0]"
run_cmd 0 "$cairn" diff "$store" ref far --name sim --region step && pass "--region step: exit 0"

# ---- different rank counts -----------------------------------------------------------
run_cmd 1 "$cairn" diff "$store" ref wide && contains "$tmp/out" "not comparable: per-rank region and different rank counts (A has 2 ranks, B has 3)" &&
  pass "per-rank region, 2 vs 3 ranks: not comparable, exit 1"
run_cmd 0 "$cairn" diff "$store" ref wide --region field --json && is_json && pass "global region, 2 vs 3 ranks: exit 0"
json_eq '[(r["exact"], r["unmatched_a"], r["unmatched_b"]) for v in j["checkpoints"][0]["versions"] for r in v["regions"]]' \
  "[(64000, 0, 0), (64000, 0, 0)]"

# ---- structural: type ------------------------------------------------------------------
run_cmd 1 "$cairn" diff "$store" ref typed && contains "$tmp/out" "type differs: A float64, B float32" &&
  pass "type difference: structural, exit 1"

# ---- missing and uncommitted versions --------------------------------------------------
run_cmd 0 "$cairn" diff "$store" ref short && contains "$tmp/out" "sim: versions only in A: 2" &&
  contains "$tmp/out" "sim: uncommitted versions of B skipped: 3" && pass "versions in one run are listed"

# ---- local level -------------------------------------------------------------------------
run_cmd 1 "$cairn" diff "$store" close same --scratch-b "$scratch" --json && is_json
json_eq 'j["io"]["shards_local"], j["io"]["data_bytes_local"] > 0, j["io"]["data_bytes_local"] * 2 == j["io"]["data_bytes"]' \
  "(2, True, False)"
json_eq 'j["io"]["data_bytes_local"] > 0 and j["io"]["data_bytes_local"] < j["io"]["data_bytes"]' "True"
pass "--scratch-b reads run B's local copies"

# ---- a damaged tree: detected, data read, same answer -----------------------------------
tree=$store/runs/same/sim/v000000000001/tree.000000
printf '\xff' | dd of="$tree" bs=1 seek=30 conv=notrunc status=none
run_cmd 0 "$cairn" diff "$store" ref same --json && is_json && pass "damaged tree: still identical"
json_eq 'j["io"]["trees"]["unusable"], j["io"]["data_bytes"] > 0, len(j["io"]["trees"]["notes"])' "(1, True, 1)"
run_cmd 0 "$cairn" diff "$store" ref same && contains "$tmp/out" "tree not used: $tree: tree checksum mismatch" &&
  pass "damaged tree reported"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all diff CLI tests passed"
