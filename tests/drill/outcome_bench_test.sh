#!/bin/bash
# scripts/outcome_bench --smoke (meson suite 'drill', test 'outcome-bench'):
# the outcome benchmark of issue #27 still runs end to end: its estate comes
# up (gpu_sim.py backends, two cloud regions behind delay lines), every
# contender (spillwayd with the policy and without, HAProxy, nginx) carries
# the Poisson gRPC load and a training job's bulk flows through a backend
# crash, and each gives a sane
# outcome record. It checks that the run completed and its records are
# whole, never how fast (the numbers of a 5 s smoke run mean nothing).
#   outcome_bench_test.sh BUILD_DIR
# The estate's namespaces are made under flock on $SPILLWAY_NET_LOCK
# (default /tmp/spillway-net.lock): one estate at a time among the
# benchmarks run this way.
set -euo pipefail
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" -ne 0 ]; then
  echo "outcome-bench: needs root (network namespaces, XDP); skipped"
  exit 77
fi
out=$(mktemp -d /tmp/spillway-outcome-smoke.XXXXXX)
trap 'rm -rf "$out"' EXIT
flock "${SPILLWAY_NET_LOCK:-/tmp/spillway-net.lock}" \
  "$root/scripts/outcome_bench" --smoke --build "$build" --out "$out" >"$out/stdout.md"
/usr/bin/python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
doc = json.load(open(os.path.join(out, "result.json")))
failed = []
def need(cond, what):
    if not cond:
        failed.append(what)
contenders = ("spillway", "spillway-off", "haproxy", "nginx")
for c in contenders:
    rs = [r for r in doc["runs"] if r["contender"] == c]
    need(len(rs) == 1 and rs[0]["event"] == "backend-crash", f"{c}: no backend-crash run")
    for r in rs:
        need(r["requests"] > 0 and r["ok"] > 0, f"{c}: no request completed")
        need(r["ok"] + r["failed"] == r["requests"], f"{c}: requests do not add up")
        need(r["p50_ms"] is not None and 0 < r["p50_ms"] <= r["p99_ms"] <= r["p999_ms"],
             f"{c}: latency percentiles missing or out of order")
        need(sum(r["served"].values()) == r["ok"], f"{c}: served per backend != ok")
        # The crashed backend has no utilisation; every other one has.
        need(set(r["util"]) == {"onprem2", "onprem3", "cloud1", "cloud2", "cloud3", "cloud4"},
             f"{c}: utilisation of {sorted(r['util'])}")
        need(all(0 <= u <= 1.05 for u in r["util"].values()), f"{c}: utilisation outside 0..1")
        need(r["spread"] is not None and r["spread"] >= 1, f"{c}: no utilisation spread")
        need(r["wan_bytes"] > 0, f"{c}: no byte crossed the WAN (health checks do)")
        # The training job's flows went through the balancer too.
        need(r.get("steps", 0) > 0 and r["step_mean_ms"] > 0 and
             r["step_worst_ms"] >= r["step_mean_ms"] and sum(r["bulk_backends"].values()) ==
             4 * r["steps"], f"{c}: no training step, or steps without their 4 flows")
need({e["contender"] for e in doc["summary"]} == set(contenders), "summary misses a contender")
md = open(os.path.join(out, "result.md")).read()
need(all(f"| backend-crash | {c} |" in md for c in contenders), "result.md misses a row")
for f in failed:
    print("outcome-bench: FAIL", f)
if failed:
    sys.exit(1)
print(f"outcome-bench: PASS ({len(doc['runs'])} runs; {doc['load']})")
PY
