#!/usr/bin/env bash
# End-to-end test of spillway-flowcheck (meson suite 'e2e', test 'flow-check'):
# the drills' flow checker against its own server, with nftables standing in
# for the load balancer.
#
#   fcPID-c                                fcPID-s
#   fcPIDc 10.201.0.10/24 ============ fcPIDs 10.201.0.1/24  serve b1 :7000
#     spillway-flowcheck client                  10.201.0.2/24  serve b2 :7000
#     --target 10.201.0.100:7000                 10.201.0.100/24 (the VIP)
#                                          nft: VIP:7000 DNAT, alternating
#                                               b1/b2 per new connection
#
# Phases, each with its own client run and report:
#   A  50 flows and 20 probes/s, SIGTERM: every flow has a backend and echoed
#      bytes, all open_at_end; timeline and probes show both backends.
#      Every flow has echo round-trip points (--rtt-ms 200).
#   B  40 flows: `close b1` on stdin closes b1's flows ("closed", no reset);
#      then an nft drop of b2's traffic for 1.5 s gives b2's flows stall
#      episodes >= 1000 ms while they stay unbroken, and b1's none; b2's
#      round trips show the block as one sample >= 1000 ms (default 1 s
#      points).
#   C  40 flows: SIGKILL of b2 resets b2's flows and nobody else's.
#   and bad arguments exit 2.
#
# usage: flow_check_test.sh SPILLWAY_FLOWCHECK
# Exit 77 (meson: skipped) without root, ip netns, veth or nftables NAT.
set -uo pipefail

fc=$(realpath "${1:?usage: flow_check_test.sh SPILLWAY_FLOWCHECK}")
python=/usr/bin/python3

skip() { echo "flow-check: SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, veth, nftables)"
command -v ip >/dev/null || skip "iproute2 'ip' not found"
command -v nft >/dev/null || skip "nftables 'nft' not found"
command -v nsenter >/dev/null || skip "nsenter (util-linux) not found"
[ -x "$python" ] || skip "$python not found"

tag=$$
cns=fc$tag-c
sns=fc$tag-s
cveth=fc${tag}c
sveth=fc${tag}s
vip=10.201.0.100
port=7000
work=$(mktemp -d /tmp/fc-test.XXXXXX)
pids=()
failures=0

cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  ip netns del "$cns" 2>/dev/null
  ip netns del "$sns" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

in_c() { nsenter --net=/run/netns/"$cns" "$@"; }
in_s() { nsenter --net=/run/netns/"$sns" "$@"; }
# Tools in the background start with a bare nsenter, which execs them (a
# function would add a subshell, ip netns exec a fork), so $! is the tool's
# own PID for the signals the phases send.

ip netns add "$cns" 2>/dev/null || skip "cannot create network namespaces"
ip netns add "$sns" 2>/dev/null || skip "cannot create network namespaces"
ip link add "$cveth" netns "$cns" type veth peer name "$sveth" netns "$sns" 2>/dev/null ||
  skip "cannot create a veth pair"
in_c ip link set lo up
in_s ip link set lo up
in_c ip addr add 10.201.0.10/24 dev "$cveth"
in_s ip addr add 10.201.0.1/24 dev "$sveth"
in_s ip addr add 10.201.0.2/24 dev "$sveth"
in_s ip addr add "$vip"/24 dev "$sveth"
in_c ip link set "$cveth" up
in_s ip link set "$sveth" up
in_s nft -f - 2>/dev/null <<EOF || skip "nftables NAT unavailable in this kernel"
table ip fclb {
  chain pre {
    type nat hook prerouting priority -100;
    ip daddr $vip tcp dport $port dnat to numgen inc mod 2 map { 0 : 10.201.0.1, 1 : 10.201.0.2 }
  }
}
EOF

# Query helper: evaluates a Python expression over a report (r), its flows
# (flows), a timeline (tl: every line; last: the last) and names given as
# NAME=VALUE arguments (floats). Exit 0 when true.
cat >"$work/q.py" <<'EOF'
import json, sys
report, timeline, expr = sys.argv[1:4]
env = {k: float(v) for k, v in (a.split("=", 1) for a in sys.argv[4:])}
try:
    r = json.load(open(report)) if report != "-" else None
    flows = r["flows"] if r else []
    tl = [json.loads(l) for l in open(timeline) if l.endswith("\n")] if timeline != "-" else []
    last = tl[-1] if tl else None
    ok = bool(eval("(" + expr + ")", {"r": r, "flows": flows, "tl": tl, "last": last, **env}))
except Exception as e:
    print(f"    ({type(e).__name__}: {e})", file=sys.stderr)
    ok = False
sys.exit(0 if ok else 1)
EOF
q() { "$python" "$work/q.py" "$@" 2>/dev/null; }

result() {
  if [ "$1" -eq 0 ]; then echo "ok   $2"; else echo "FAIL $2"; failures=$((failures + 1)); fi
}
# info LABEL REPORT EXPR: prints a value for the log.
info() {
  echo "     $1: $("$python" -c 'import json, sys; r = json.load(open(sys.argv[1])); flows = r["flows"]
print(eval(sys.argv[2]))' "$2" "$3" 2>&1)"
}
# check DESCRIPTION REPORT TIMELINE EXPR [NAME=VALUE...]
check() {
  local desc=$1; shift
  "$python" "$work/q.py" "$@"
  result $? "$desc"
}
# wait_for SECONDS COMMAND...: polls COMMAND every 50 ms until it succeeds.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.05
  done
}
alive() { kill -0 "$1" 2>/dev/null; }
not_alive() { ! kill -0 "$1" 2>/dev/null; }

start_server() {  # NAME ADDRESS: sets server_pid
  nsenter --net=/run/netns/"$sns" "$fc" serve --name "$1" --bind "$2" --port "$port" 2>>"$work/serve-$1.log" &
  server_pid=$!
  pids+=("$server_pid")
  wait_for 5 in_s bash -c "exec 3<>/dev/tcp/$2/$port" 2>/dev/null
}

# start_client PHASE FLOWS PROBE_RATE [ARG...]: sets client_pid; stdin from a
# FIFO held open on fd 7, so commands are `echo ... >&7`.
start_client() {
  local phase=$1 flows=$2 rate=$3
  shift 3
  mkfifo "$work/$phase.cmd"
  exec 7<>"$work/$phase.cmd"
  nsenter --net=/run/netns/"$cns" "$fc" client --target "$vip:$port" --flows "$flows" \
    --probe-rate "$rate" "$@" --bind 10.201.0.10 --timeline "$work/$phase.tl" --timeline-ms 100 \
    --report "$work/$phase.json" --ready "$work/$phase.ready" \
    <"$work/$phase.cmd" 2>>"$work/$phase.log" &
  client_pid=$!
  pids+=("$client_pid")
}

# stop_client PHASE: SIGTERM, wait for the report; checks the exit status.
stop_client() {
  kill -TERM "$client_pid"
  wait_for 10 not_alive "$client_pid"
  wait "$client_pid"
  result $? "phase $1: client exits 0 after SIGTERM and writes its report"
  exec 7>&-
}

start_server b1 10.201.0.1
start_server b2 10.201.0.2; b2_pid=$server_pid

# --- A: 50 flows, probes, SIGTERM --------------------------------------------
start_client A 50 20 --rtt-ms 200
wait_for 15 test -e "$work/A.ready"
result $? "phase A: all 50 flows have their hello (--ready)"
wait_for 5 q - "$work/A.tl" 'last["active"].get("b1", 0) + last["active"].get("b2", 0) == 50'
wait_for 5 q - "$work/A.tl" 'len(tl) >= 15'  # about a second of echo traffic
stop_client A
check "phase A: 50 flows, each with a backend (b1/b2) and its bytes echoed" "$work/A.json" - \
  'len(flows) == 50 and all(f["backend"] in ("b1", "b2") and f["bytes_echoed"] > 0
   and f["bytes_echoed"] == f["bytes_sent"] for f in flows)'
check "phase A: the VIP spread flows over both backends" "$work/A.json" - \
  'set(r["summary"]["by_backend"]) == {"b1", "b2"}'
check "phase A: by_state is all open_at_end after SIGTERM" "$work/A.json" - \
  'r["summary"]["by_state"] == {"open_at_end": 50}'
# Echo round trips: [t, median_ms, samples, max_ms] per 200 ms interval, the
# intervals on one grid from the client's start, in order, within the run.
check "phase A: every flow has round-trip points on the --rtt-ms grid" "$work/A.json" - \
  'r["rtt_ms"] == 200 and all(len(f["rtt"]) >= 2 and all(len(p) == 4
   and r["started"] - 1e-6 <= p[0] <= r["ended"] and p[2] >= 1 and 0 < p[1] <= p[3]
   and abs(round((p[0] - r["started"]) / 0.2) * 0.2 - (p[0] - r["started"])) < 1e-3
   for p in f["rtt"]) and all(a[0] < b[0] for a, b in zip(f["rtt"], f["rtt"][1:]))
   for f in flows)'
info "rtt median of medians (ms), flow 0" "$work/A.json" \
  'sorted(p[1] for p in flows[0]["rtt"])[len(flows[0]["rtt"]) // 2]'
check "phase A: timeline lines parse and show active counts (50 live)" - "$work/A.tl" \
  'len(tl) >= 10 and all(set(d) >= {"t", "active", "probes", "probe_failures", "broken", "stalled"}
   for d in tl) and any(sum(d["active"].values()) == 50 for d in tl)
   and all(d["broken"] == 0 for d in tl)'
check "phase A: probes record their backends (both, none failed)" "$work/A.json" "$work/A.tl" \
  'len(r["probes"]) >= 10 and all(p["ok"] for p in r["probes"])
   and {p["backend"] for p in r["probes"]} == {"b1", "b2"}
   and sum(sum(d["probes"].values()) for d in tl) == len(r["probes"])'

# --- B: close b1 by command, then block b2 for 1.5 s --------------------------
start_client B 40 0
wait_for 15 test -e "$work/B.ready"
result $? "phase B: all 40 flows have their hello"
wait_for 5 q - "$work/B.tl" 'len(tl) >= 5 and last["active"].get("b1", 0) > 0'
echo "close b1" >&7
wait_for 5 q - "$work/B.tl" 'last["active"].get("b1") == 0 and last["active"].get("b2", 0) > 0'
result $? "phase B: 'close b1' on stdin empties b1 in the timeline"
echo "no-such-command" >&7
block_start=$(date +%s.%N)
in_s nft add table ip fcblock
in_s nft add chain ip fcblock in '{ type filter hook input priority 0; }'
in_s nft add rule ip fcblock in ip daddr 10.201.0.2 tcp dport "$port" drop
sleep 1.5  # the outage itself, not a wait for readiness
in_s nft delete table ip fcblock
block_end=$(date +%s.%N)
wait_for 5 q - "$work/B.tl" 'any(d["stalled"] > 0 for d in tl)'
wait_for 10 q - "$work/B.tl" 'tl[-1]["stalled"] == 0 and tl[-2]["stalled"] == 0'
result $? "phase B: the stall ends once traffic passes again"
stop_client B
check "phase B: b1's flows are 'closed', no flow reset or corrupt" "$work/B.json" - \
  'any(f["backend"] == "b1" for f in flows) and all(f["state"] == "closed" and f["ended"]
   for f in flows if f["backend"] == "b1") and not set(r["summary"]["by_state"]) - {"closed", "open_at_end"}'
check "phase B: b2's flows stalled >= 1000 ms in the block and ended unbroken" "$work/B.json" - \
  'any(f["backend"] == "b2" for f in flows) and all(f["state"] == "open_at_end"
   and f["bytes_echoed"] == f["bytes_sent"] and f["max_stall_ms"] >= 1000
   and any(d >= 1000 and s0 - 0.2 <= s <= s1 for s, d in f["stalls"])
   for f in flows if f["backend"] == "b2")' s0="$block_start" s1="$block_end"
info "b2 max_stall_ms (min, max)" "$work/B.json" \
  '(min(f["max_stall_ms"] for f in flows if f["backend"] == "b2"), max(f["max_stall_ms"] for f in flows if f["backend"] == "b2"))'
info "b2 flow 1st episode [start-block_start, ms]" "$work/B.json" \
  '[[round(s - '"$block_start"', 3), d] for f in flows if f["backend"] == "b2" for s, d in f["stalls"]][:3]'
# A byte sent in the block is echoed after it: one sample spans most of it.
check "phase B: b2's round trips show the block (a sample >= 1000 ms in it)" "$work/B.json" - \
  'r["rtt_ms"] == 1000 and all(any(p[3] >= 1000 and s0 - 1 <= p[0] <= s1 + 5
   for p in f["rtt"]) for f in flows if f["backend"] == "b2")' s0="$block_start" s1="$block_end"
info "b2 flow rtt points around the block [t-block_start, median, n, max]" "$work/B.json" \
  '[[round(p[0] - '"$block_start"', 1)] + p[1:] for p in next(f for f in flows if f["backend"] == "b2")["rtt"]]'
check "phase B: b1's flows (closed before the block) have no stall episode" "$work/B.json" - \
  'all(not f["stalls"] and f["max_stall_ms"] < 1000 for f in flows if f["backend"] == "b1")'
check "phase B: the timeline counted every b2 flow as stalled" "$work/B.json" "$work/B.tl" \
  'max(d["stalled"] for d in tl) == r["summary"]["by_backend"]["b2"]'
grep -q 'unknown command "no-such-command"' "$work/B.log"
result $? "phase B: an unknown command is reported on stderr and ignored"

# --- C: SIGKILL b2 ------------------------------------------------------------
start_client C 40 0
wait_for 15 test -e "$work/C.ready"
result $? "phase C: all 40 flows have their hello"
wait_for 5 q - "$work/C.tl" 'len(tl) >= 5 and last["active"].get("b1", 0) > 0 and last["active"].get("b2", 0) > 0'
{ kill -KILL "$b2_pid"; wait "$b2_pid"; } 2>/dev/null  # quiet: no "Killed" job notice
wait_for 5 q - "$work/C.tl" 'last["active"].get("b2") == 0'
result $? "phase C: killing b2 empties b2 in the timeline"
stop_client C
check "phase C: b2's flows are 'reset', b1's stay open_at_end" "$work/C.json" "$work/C.tl" \
  'any(f["backend"] == "b2" for f in flows) and all(f["state"] == "reset" and f["ended"]
   for f in flows if f["backend"] == "b2") and all(f["state"] == "open_at_end"
   for f in flows if f["backend"] == "b1") and r["summary"]["by_backend"]["b1"] > 0
   and last["broken"] == r["summary"]["by_backend"]["b2"]'

# --- bad arguments --------------------------------------------------------------
bad=0
for args in "" "client --flows 5" "client --target 10.0.0.1 --flows 5" \
    "client --target 10.0.0.1:80 --flows x" "client --target 10.0.0.1:80 --flows 1 --bogus" \
    "client --target 10.0.0.1:80 --flows 1 --interval-ms 0" \
    "client --target 10.0.0.1:80 --flows 1 --rtt-ms 5" "serve --port 7000" \
    "serve --name b1 --port 70000" "serve --name b1 --port 7000 --bind nowhere" "frobnicate"; do
  # shellcheck disable=SC2086
  "$fc" $args </dev/null >/dev/null 2>&1
  rc=$?
  if [ "$rc" -ne 2 ]; then echo "    '$args' exited $rc"; bad=1; fi
done
result $bad "bad arguments exit 2"

if [ "$failures" -ne 0 ]; then
  echo "flow-check: $failures check(s) failed; logs:"
  tail -n 20 "$work"/*.log
  exit 1
fi
echo "flow-check: all checks passed"
