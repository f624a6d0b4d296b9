#!/usr/bin/env bash
# The drill runner itself: it must fail a drill whose invariants do not hold
# (exit 1, the broken invariants marked FAIL in report.json), and refuse bad
# scenario files with exit 2 and a message naming the problem.
#
#   violation_test.sh DRILL BUILD_DIR WORK_DIR
set -u
drill=$1 build=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root"; exit 77; fi
pass=0 fail=0
check() {  # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; pass=$((pass + 1)); else echo "FAIL $name"; fail=$((fail + 1)); fi
}
rm -rf "$work" && mkdir -p "$work"

"$drill" "$here/violation.toml" --build "$build" --out "$work/run" >"$work/run.log" 2>&1
rc=$?
check "a violated drill exits 1 (got $rc)" [ "$rc" -eq 1 ]
verdicts=$(/usr/bin/python3 - "$work/run/report.json" <<'PY' 2>&1
import json, sys
r = json.load(open(sys.argv[1]))
print(" ".join(f"{v['name']}={v['ok']}" for v in r["invariants"]), f"passed={r['passed']}")
PY
)
echo "     $verdicts"
check "report.json marks detection[onprem2] failed" grep -q "detection\[onprem2\]=False" <<<"$verdicts"
check "report.json marks all_flows_keep_backend failed" grep -q "all_flows_keep_backend=False" <<<"$verdicts"
check "report.json says passed=False" grep -q "passed=False" <<<"$verdicts"
check "the summary prints FAIL lines" grep -q "^  FAIL detection\[onprem2\]" "$work/run.log"
check "the verdict names the broken flows" grep -qE "^  FAIL all_flows_keep_backend: .*flow [0-9]+ on onprem2" "$work/run.log"
# This drill's own namespaces (other drills may run on the machine).
prefix=$(sed -n 's/^ *namespaces \(swd[0-9]*\)-\*.*/\1/p' "$work/run.log" | head -1)
check "the estate ($prefix) is gone" bash -c '[ -n "$0" ] && ! ip netns list | grep -q "^$0-"' "$prefix"

bad() {  # bad NAME TOML EXPECTED_MESSAGE
  printf '%s\n' "$2" >"$work/bad.toml"
  local out rc
  out=$("$drill" "$work/bad.toml" --build "$build" 2>&1); rc=$?
  check "$1: exit 2 (got $rc) naming '$3'" bash -c '[ "$0" -eq 2 ] && grep -qF -- "$1" <<<"$2"' "$rc" "$3" "$out"
}
bad "unknown action" $'duration = 5\n[[action]]\nat = 1\ndo = "explode"\ntarget = "onprem1"' \
  "do = 'explode' is not one of"
bad "unknown target" $'duration = 5\n[[action]]\nat = 1\ndo = "kill"\ntarget = "onprem9"' \
  "target = 'onprem9' is not a backend"
bad "action after the end" $'duration = 5\n[[action]]\nat = 7\ndo = "kill"\ntarget = "onprem1"' \
  "must be a time within the drill's duration"
bad "unknown restart signal" $'duration = 5\n[[action]]\nat = 1\ndo = "restart-lb"\nsignal = "HUP"' \
  "signal = 'HUP' is not one of"
bad "reload without an edit" $'duration = 5\n[[action]]\nat = 1\ndo = "reload"' \
  "a reload needs an edit"
bad "unknown invariant" $'duration = 5\n[invariants]\nno_flow_breaks = 1' \
  "invariants.no_flow_breaks is not a known invariant"
bad "not TOML" $'duration = = 5' "bad.toml"
out=$("$drill" no-such-scenario --build "$build" 2>&1); rc=$?
check "no such scenario: exit 2 (got $rc)" bash -c '[ "$0" -eq 2 ] && grep -q "no scenario" <<<"$1"' "$rc" "$out"
echo "drill-runner: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
