#!/usr/bin/env bash
# End-to-end test of the cairn CLI on a store written by cairn_make_store
# (see make_store.cpp for its contents).
# usage: cli_test.sh CAIRN_BINARY CAIRN_MAKE_STORE_BINARY
set -euo pipefail

cairn=${1:?usage: cli_test.sh CAIRN MAKE_STORE}
make_store=${2:?usage: cli_test.sh CAIRN MAKE_STORE}

tmp=$(mktemp -d /tmp/cairn-cli-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
store=$tmp/store
scratch=$tmp/scratch
runs=$store/runs

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

# expect_out EXPECTED_TEXT: stdout of the last run_cmd equals EXPECTED_TEXT.
expect_out() {
  if ! diff -u <(printf '%s\n' "$1") "$tmp/out" >"$tmp/diff"; then
    fail "unexpected output of the last command:"
    cat "$tmp/diff" >&2
    return 1
  fi
}

# contains FILE PATTERN: FILE has a line with the fixed string PATTERN.
contains() {
  if ! grep -qF -- "$2" "$1"; then
    fail "expected '$2' in $(basename "$1"):"
    sed 's/^/  | /' "$1" >&2
    return 1
  fi
}

is_json() { python3 -c 'import json,sys; json.load(sys.stdin)' <"$tmp/out" || { fail "stdout is not JSON"; return 1; }; }

# json_eq PYTHON_EXPR EXPECTED: evaluates PYTHON_EXPR on the JSON document j.
json_eq() {
  local got
  got=$(python3 -c "import json,sys; j=json.load(sys.stdin); v=($1); print(v)" <"$tmp/out")
  [[ $got == "$2" ]] || fail "JSON: $1 is '$got', expected '$2'"
}

catalog_count() {
  python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchone()[0])' \
    "$store/catalog.sqlite" "$1"
}

# ---- usage errors --------------------------------------------------------------
run_cmd 0 "$cairn" --version && contains "$tmp/out" "cairn 0.1.0" && pass "--version"
run_cmd 0 "$cairn" --help && contains "$tmp/out" "verify" && pass "--help"
run_cmd 2 "$cairn" && pass "no subcommand: exit 2"
run_cmd 2 "$cairn" frobnicate "$tmp" && pass "unknown subcommand: exit 2"
run_cmd 2 "$cairn" ls && pass "ls without STORE: exit 2"
run_cmd 2 "$cairn" ls "$tmp/nowhere" && contains "$tmp/err" "store $tmp/nowhere does not exist" &&
  pass "missing store named"
run_cmd 2 "$cairn" verify "$tmp/nowhere" && contains "$tmp/err" "$tmp/nowhere" && pass "verify: missing store"
mkdir "$tmp/empty"
run_cmd 2 "$cairn" ls "$tmp/empty" && contains "$tmp/err" "is not a cairn store" && pass "not a store"

"$make_store" "$store" "$scratch"

run_cmd 2 "$cairn" gc "$store" && pass "gc without --keep: exit 2"
run_cmd 2 "$cairn" gc "$store" --keep 0 && pass "gc --keep 0: exit 2"
run_cmd 2 "$cairn" gc "$store" --keep x && pass "gc --keep x: exit 2"
run_cmd 2 "$cairn" show "$store" heat notanumber && pass "show with a bad version: exit 2"
run_cmd 2 "$cairn" ls "$store" --run gamma && contains "$tmp/err" "run 'gamma' not found" &&
  contains "$tmp/err" "(runs: alpha, beta)" && pass "unknown run"
run_cmd 2 "$cairn" ls "$store" --scratch "$tmp/noscratch" && contains "$tmp/err" "$tmp/noscratch" &&
  pass "missing scratch directory"

# ---- ls ---------------------------------------------------------------------------
run_cmd 0 "$cairn" ls "$store" && expect_out \
"RUN    NAME       VERSION  STATE           RANKS     BYTES  LEVELS      COMMITTED
alpha  heat             1  committed           2  24.0 KiB  persistent  2023-11-14T22:15:00Z
alpha  heat             2  incomplete 1/2      2  12.0 KiB  -           -
alpha  heat             3  committed           2  24.0 KiB  persistent  2023-11-14T22:18:20Z
alpha  heat             4  incomplete 1/2      2  12.0 KiB  -           -
alpha  particles       10  committed           1   8.0 KiB  persistent  2023-11-14T22:30:00Z
beta   heat             1  committed           1  12.0 KiB  persistent  2023-11-14T22:31:40Z
beta   heat             2  committed           1  12.0 KiB  persistent  2023-11-14T22:33:20Z" && pass "ls"

run_cmd 0 "$cairn" ls "$store" --run beta --scratch "$scratch" && expect_out \
"RUN   NAME  VERSION  STATE      RANKS     BYTES  LEVELS            COMMITTED
beta  heat        1  committed      1  12.0 KiB  persistent        2023-11-14T22:31:40Z
beta  heat        2  committed      1  12.0 KiB  local,persistent  2023-11-14T22:33:20Z" && pass "ls --run --scratch"

run_cmd 0 "$cairn" ls "$store" --scratch "$scratch" --json && is_json && pass "ls --json parses"
json_eq 'len(j["versions"])' 7
json_eq '[r["run"] for r in j["runs"]]' "['alpha', 'beta']"
json_eq '[r["checkpoints"] for r in j["runs"]][0]' "['heat', 'particles']"
json_eq '[(v["version"], v["state"], v["shards_present"], v["nranks"]) for v in j["versions"] if v["run"] == "alpha" and v["name"] == "heat"]' \
  "[(1, 'committed', 2, 2), (2, 'incomplete', 1, 2), (3, 'committed', 2, 2), (4, 'incomplete', 1, 2)]"
json_eq '[v["levels"] for v in j["versions"] if v["run"] == "alpha" and v["version"] == 3][0]' "['local', 'persistent']"
json_eq '[v["bytes"] for v in j["versions"]][0]' 24576
json_eq '[v["committed_at"] for v in j["versions"]][:2]' "[1700000100.0, None]"
json_eq '[v["redundancy"] for v in j["versions"]][:2]' "[None, None]"  # not protected

# ---- show -------------------------------------------------------------------------
run_cmd 0 "$cairn" show "$store" particles 10 && expect_out \
"run:         alpha
checkpoint:  particles
version:     10
state:       committed
ranks:       1
bytes:       8192 (8.0 KiB)
committed:   2023-11-14T22:30:00.000Z
executable:  /opt/alpha/bin/alpha
mode:        thread

regions:
RANK  REGION  TYPE     COUNT  SHAPE              OFFSET  LENGTH  CHECKSUM
   0  pos     float32    300  100x3 (col-major)    4096    1200  fdb2bb1d4e003284

shards:
RANK  FILE          SIZE  HEADER_CHECKSUM   HOST
   0  shard.000000  8192  c8ee8c8222da37da  node0

timings (seconds; times UTC):
RANK  CAPTURED_AT               CAPTURE_S  CHECKSUM_S   LOCAL_S  PERSISTENT_S  PERSISTENT_AT
   0  2023-11-14T22:29:59.000Z   0.001000    0.000500  0.002000      0.010000  2023-11-14T22:29:59.500Z" &&
  pass "show (name in one run, --run not needed)"

run_cmd 2 "$cairn" show "$store" heat 3 && contains "$tmp/err" "exists in several runs (alpha, beta)" &&
  contains "$tmp/err" "--run" && pass "show: ambiguous name lists the runs"
run_cmd 0 "$cairn" show "$store" heat 3 --run alpha && pass "show --run alpha heat 3"
contains "$tmp/out" "state:       committed"
contains "$tmp/out" "   1  temperature  float64     32  4x8      4096     256  "
contains "$tmp/out" "   1  step         int64        1  1        8192       8  "
contains "$tmp/out" "   1  2023-11-14T22:18:19.000Z   0.002000    0.001000  0.004000      0.020000  2023-11-14T22:18:19.510Z"
cp "$tmp/out" "$tmp/out_run_option"
# The order `cairn ls` prints (RUN NAME VERSION) is accepted too, with the same output.
run_cmd 0 "$cairn" show "$store" alpha heat 3 &&
  { cmp -s "$tmp/out" "$tmp/out_run_option" || fail "show alpha heat 3 differs from show heat 3 --run alpha"; } &&
  pass "show STORE RUN NAME VERSION (the order of cairn ls)"
# Arguments in another order: the message gives the order.
run_cmd 2 "$cairn" show "$store" heat 3 alpha && contains "$tmp/err" "VERSION 'alpha' is not a version number" &&
  contains "$tmp/err" "STORE [RUN] NAME VERSION" && pass "show with the arguments out of order says the order"
run_cmd 2 "$cairn" show "$store" alpha heat 3 --run beta && contains "$tmp/err" "disagree" &&
  pass "show: RUN and --run disagree"
run_cmd 0 "$cairn" show "$store" heat 4 --run alpha && contains "$tmp/out" "incomplete (1 of 2 shards, no MANIFEST)" &&
  pass "show of an incomplete version"
run_cmd 2 "$cairn" show "$store" heat 99 --run alpha && contains "$tmp/err" "versions: 1, 2, 3, 4" &&
  pass "show: unknown version lists the versions"
run_cmd 2 "$cairn" show "$store" nothing 1 && contains "$tmp/err" "no checkpoint named 'nothing'" &&
  pass "show: unknown checkpoint"
run_cmd 0 "$cairn" show "$store" heat 3 --run alpha --json && is_json && pass "show --json parses"
json_eq 'j["state"], j["nranks"], len(j["shards"])' "('committed', 2, 2)"
json_eq '[(r["name"], r["type"], r["shape"], r["offset"]) for r in j["shards"][1]["regions"]]' \
  "[('temperature', 'float64', [4, 8], 4096), ('step', 'int64', [1], 8192)]"
json_eq 'j["shards"][1]["timings"]["persistent_s"]' 0.02

# ---- verify -----------------------------------------------------------------------
run_cmd 0 "$cairn" verify "$store" && expect_out \
"verified 7 versions (5 committed, 2 incomplete, 0 invalid), 9 shards (9 persistent, 0 local), 17 regions, 3.7 KiB: no problems" &&
  pass "verify of an intact store"
[[ ! -s $tmp/err ]] || fail "verify printed on stderr when it is not a terminal: $(cat "$tmp/err")"
run_cmd 0 "$cairn" verify "$store" --scratch "$scratch" && contains "$tmp/out" "13 shards (9 persistent, 4 local)" &&
  pass "verify --scratch"
run_cmd 0 "$cairn" verify "$store" --json && is_json && json_eq 'j["ok"], j["problems"]' "(True, [])" &&
  pass "verify --json"
# One --scratch per node: an empty second node adds nothing, and no parity files.
mkdir -p "$tmp/scratch2/runs"
run_cmd 0 "$cairn" verify "$store" --scratch "$scratch" --scratch "$tmp/scratch2" &&
  contains "$tmp/out" "13 shards (9 persistent, 4 local)" && ! grep -q "parity" "$tmp/out" &&
  pass "verify with two --scratch directories"
run_cmd 0 "$cairn" verify "$store" --scratch "$scratch" --json && is_json &&
  json_eq 'sorted(j["parity"].items())' "[('blocks', 0), ('bytes', 0), ('files', 0), ('reencoded', 0)]" && pass "verify --json: no parity"
run_cmd 2 "$cairn" verify "$store" --scratch "$scratch" --scratch "$tmp/nowhere2" &&
  contains "$tmp/err" "$tmp/nowhere2" && pass "verify: a missing second scratch directory"

damaged=$runs/alpha/heat/v000000000003/shard.000001
printf '\xff' | dd of="$damaged" bs=1 seek=4100 conv=notrunc status=none
run_cmd 1 "$cairn" verify "$store" && expect_out \
"$damaged: checksum mismatch in region 'temperature' (offset 4096, length 256)
verified 7 versions (5 committed, 2 incomplete, 0 invalid), 9 shards (9 persistent, 0 local), 17 regions, 3.7 KiB: 1 problem" &&
  pass "verify names the damaged file, exit 1"
run_cmd 1 "$cairn" verify "$store" --run alpha --scratch "$scratch" --json && is_json && pass "verify --json, damaged"
json_eq 'j["ok"], len(j["problems"])' "(False, 1)"
json_eq 'j["problems"][0]["file"]' "$damaged"
json_eq 'j["problems"][0]["level"], j["problems"][0]["version"]' "('persistent', 3)"
run_cmd 0 "$cairn" verify "$store" --run beta && pass "verify --run beta: intact"

header_damaged=$runs/beta/heat/v000000000001/shard.000000
cp "$header_damaged" "$tmp/header_intact"
printf '\xff' | dd of="$header_damaged" bs=1 seek=100 conv=notrunc status=none
run_cmd 1 "$cairn" verify "$store" && contains "$tmp/out" "$header_damaged: header checksum mismatch" &&
  contains "$tmp/out" ": 2 problems" && pass "verify: damaged header"

# The MANIFEST no longer matching a (valid) shard: swap in another version's shard.
cp "$runs/beta/heat/v000000000002/shard.000000" "$tmp/keep"
cp "$runs/alpha/particles/v000000000010/shard.000000" "$runs/beta/heat/v000000000002/shard.000000"
run_cmd 1 "$cairn" verify "$store" --run beta &&
  contains "$tmp/out" "$runs/beta/heat/v000000000002/shard.000000: header says alpha/particles version 10 rank 0" &&
  contains "$tmp/out" "does not match the MANIFEST" && pass "verify: shard not matching the MANIFEST"
cp "$tmp/keep" "$runs/beta/heat/v000000000002/shard.000000"

# ---- reindex ----------------------------------------------------------------------
run_cmd 0 "$cairn" reindex "$store" &&
  expect_out "indexed 4 versions into $store/catalog.sqlite (skipped 2 uncommitted, 1 invalid)" &&
  contains "$tmp/err" "skipped: $header_damaged: header checksum mismatch" && pass "reindex"
[[ $(catalog_count 'SELECT count(*) FROM checkpoints') == 4 ]] || fail "catalog does not hold 4 versions"
run_cmd 0 "$cairn" reindex "$store" --json && is_json && json_eq 'j["indexed"], j["uncommitted"], j["invalid"]' \
  "(4, 2, 1)" && pass "reindex --json"
# Undo the header damage: every committed version is indexed again.
cp "$tmp/header_intact" "$header_damaged"
run_cmd 0 "$cairn" reindex "$store" && contains "$tmp/out" "indexed 5 versions" && pass "reindex after repair"
[[ $(catalog_count 'SELECT count(*) FROM regions') == 13 ]] || fail "catalog regions: $(catalog_count 'SELECT count(*) FROM regions')"
# A damaged catalog file is replaced.
head -c 8192 /dev/urandom >"$store/catalog.sqlite"
rm -f "$store/catalog.sqlite-wal" "$store/catalog.sqlite-shm"
run_cmd 0 "$cairn" reindex "$store" && contains "$tmp/out" "indexed 5 versions" &&
  contains "$tmp/err" "recreating it" && pass "reindex replaces a damaged catalog"

# ---- gc ---------------------------------------------------------------------------
run_cmd 0 "$cairn" gc "$store" --keep 1 --dry-run && pass "gc --dry-run"
contains "$tmp/out" "would delete alpha/heat version 1 (committed, "
contains "$tmp/out" "would delete alpha/heat version 2 (incomplete, 12.0 KiB)"
contains "$tmp/out" "would remove $runs/alpha/heat/v000000000003/shard.000001.tmp"
contains "$tmp/out" "would delete beta/heat version 1 (committed, "
contains "$tmp/out" "gc (dry run): would delete 3 versions"
[[ -d $runs/alpha/heat/v000000000001 && -e $runs/alpha/heat/v000000000003/shard.000001.tmp ]] ||
  fail "gc --dry-run deleted something"
run_cmd 0 "$cairn" gc "$store" --keep 1 --dry-run --json && is_json &&
  json_eq '[(d["run"], d["version"], d["state"]) for d in j["deleted"]]' \
  "[('alpha', 1, 'committed'), ('alpha', 2, 'incomplete'), ('beta', 1, 'committed')]" && pass "gc --dry-run --json"

run_cmd 0 "$cairn" gc "$store" --keep 1 && pass "gc --keep 1"
contains "$tmp/out" "deleted alpha/heat version 1 (committed, "
contains "$tmp/out" "deleted alpha/heat version 2 (incomplete, 12.0 KiB)"
contains "$tmp/out" "removed $runs/alpha/heat/v000000000003/shard.000001.tmp"
contains "$tmp/out" "deleted beta/heat version 1 (committed, "
contains "$tmp/out" "gc: deleted 3 versions"
contains "$tmp/out" "and 1 temporary file; kept 3 committed; left 1 newer uncommitted alone"
for gone in alpha/heat/v000000000001 alpha/heat/v000000000002 beta/heat/v000000000001; do
  [[ ! -e $runs/$gone ]] || fail "gc left $gone"
done
for kept in alpha/heat/v000000000003/MANIFEST alpha/heat/v000000000004/shard.000000 \
  alpha/heat/v000000000004/shard.000001.tmp alpha/particles/v000000000010/MANIFEST beta/heat/v000000000002/MANIFEST; do
  [[ -e $runs/$kept ]] || fail "gc removed $kept"
done
[[ ! -e $runs/alpha/heat/v000000000003/shard.000001.tmp ]] || fail "gc left the stray .tmp in a committed version"
[[ $(catalog_count 'SELECT count(*) FROM checkpoints') == 3 ]] || fail "gc did not update the catalog"
[[ $(catalog_count "SELECT count(*) FROM regions WHERE run = 'beta' AND version = 1") == 0 ]] ||
  fail "catalog still has regions of a deleted version"

run_cmd 0 "$cairn" ls "$store" && expect_out \
"RUN    NAME       VERSION  STATE           RANKS     BYTES  LEVELS      COMMITTED
alpha  heat             3  committed           2  24.0 KiB  persistent  2023-11-14T22:18:20Z
alpha  heat             4  incomplete 1/2      2  12.0 KiB  -           -
alpha  particles       10  committed           1   8.0 KiB  persistent  2023-11-14T22:30:00Z
beta   heat             2  committed           1  12.0 KiB  persistent  2023-11-14T22:33:20Z" && pass "ls after gc"
run_cmd 0 "$cairn" gc "$store" --keep 1 --json && is_json && json_eq 'j["deleted"], j["removed_tmp"]' "([], [])" &&
  json_eq '[(l["version"], l["state"]) for l in j["left_alone"]]' "[(4, 'incomplete')]" && pass "gc is idempotent"
# The damaged data byte of alpha/heat v3 (kept) is still reported.
run_cmd 1 "$cairn" verify "$store" && contains "$tmp/out" "$damaged: checksum mismatch" && pass "verify after gc"

if [[ $failures -ne 0 ]]; then
  echo "cli_test: $failures failure(s)" >&2
  exit 1
fi
echo "cli_test: all passed"
