#!/usr/bin/env bash
# End-to-end test of spillway-decap's connection agent (meson suite 'e2e',
# test 'conn-agent'): in a network namespace of its own, real TCP connections
# to VIP addresses on lo, counted and listed by `spillway-decap agent` from
# the kernel's socket diagnostics (conn_agent_traffic.py says what is checked).
#
# usage: conn_agent_test.sh SPILLWAY_DECAP_BINARY CONN_AGENT_TRAFFIC_PY
# Exit 77 (meson: skipped) without root or ip netns.
set -euo pipefail

decap=$(realpath "${1:?usage: conn_agent_test.sh SPILLWAY_DECAP TRAFFIC_PY}")
traffic=$(realpath "${2:?usage: conn_agent_test.sh SPILLWAY_DECAP TRAFFIC_PY}")
python=/usr/bin/python3

skip() { echo "conn-agent: SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "iproute2 'ip' not found"
[ -x "$python" ] || skip "$python not found"

ns=swca-$$
workdir=$(mktemp -d /tmp/swca.XXXXXX)
cleanup() {
  set +e
  ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null
  ip netns del "$ns" 2>/dev/null
  rm -rf "$workdir"
}
trap cleanup EXIT

ip netns add "$ns"
ip -n "$ns" link set lo up
# Two VIPs and a client address of their own, so that a client socket's local
# address is never a VIP.
ip -n "$ns" addr add 192.0.2.10/32 dev lo
ip -n "$ns" addr add 192.0.2.11/32 dev lo
ip -n "$ns" addr add 198.51.100.7/32 dev lo
ip -n "$ns" addr add 2001:db8:ffff::10/128 dev lo nodad
ip -n "$ns" addr add 2001:db8:c::7/128 dev lo nodad
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$workdir/token"

ip netns exec "$ns" "$python" "$traffic" "$decap" "$workdir/token"
