#!/bin/bash
# scripts/estate_bench --smoke (meson suite 'e2e', test 'estate-bench'): the
# side-by-side estate benchmark of issue #15 still runs end to end on this
# machine: every contender (spillwayd af_xdp, spillwayd af_packet, HAProxy,
# nginx stream) carries iperf streams both ways and new connections through
# the VIP, and spillwayd's idle and latency runs give figures for every idle
# setting. It checks that each figure exists and traffic flowed; never how
# fast (the numbers of a 1 s smoke run mean nothing).
#   estate_bench_test.sh BUILD_DIR
set -euo pipefail
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mktemp -d /tmp/spillway-estate-smoke.XXXXXX)
trap 'rm -rf "$out"' EXIT
"$root/scripts/estate_bench" --smoke --json --no-build --build-dir "$build" \
  --prefix "swbs$$" --out "$out/work" >"$out/result.json"
/usr/bin/python3 - "$out/result.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
runs = doc["runs"]
failed = []
def need(cond, what):
    if not cond:
        failed.append(what)
for c in ("af_xdp", "af_packet", "haproxy", "nginx"):
    for test in ("up", "down"):
        r = [x for x in runs if x["contender"] == c and x["test"] == test]
        need(r and r[0]["bytes"] > 0, f"{c} {test}: no bytes moved")
        need(r and r[0]["spread"] and sum(r[0]["spread"]) > 0, f"{c} {test}: no spread seen")
    r = [x for x in runs if x["contender"] == c and x["test"] == "conn"]
    need(r and r[0]["connections"] > 0, f"{c} conn: no connection completed")
need(any(x["contender"] == "direct" for x in runs), "no direct (client ceiling) run")
for c in ("af_xdp", "af_packet"):
    for idle in ("spin", "fixed", "adaptive500", "adaptive"):
        r = [x for x in runs if x["contender"] == c and x.get("idle") == idle]
        need(any(x["test"] == "idle" and x["cpu_pct"] >= 0 for x in r), f"{c} idle {idle}: missing")
        need(any(x["test"] == "latency" and x["connections"] > 0 for x in r),
             f"{c} latency {idle}: no connection completed")
need(any(e["vs_haproxy"] for e in doc["summary"]), "no ratio against HAProxy")
for f in failed:
    print("estate-bench: FAIL", f)
if failed:
    sys.exit(1)
print(f"estate-bench: PASS ({len(runs)} runs)")
PY
