#!/usr/bin/env bash
# End-to-end test of spillway-decap (meson suite 'e2e', test 'decap').
#
# Topology, all names carry this shell's PID so parallel runs do not collide:
#
#   swd-client-PID                          swd-backend-PID
#   swdc-PID 10.99.0.1/24 fd00:99::1/64 === swdb-PID 10.99.0.21/24 fd00:99::21/64
#     scapy: plays the LB (10.99.0.100,       spillway-decap attached (native XDP)
#     fd00:99::100) and the client            lo: VIP 192.0.2.10/32,
#     (198.51.100.7, 2001:db8:c::7;               2001:db8:ffff::10/128
#     not assigned, so its kernel stays       TCP echo server on VIP:8080
#     out of the connection)                  routes to the client via 10.99.0.1 /
#                                             fd00:99::1
#
# decap_traffic.py sends each encapsulation from the "LB" to the backend's
# tunnel address and expects the SYN-ACK and the echoed data from the VIP,
# bare, straight to the client (DSR). The test runs in a private mount
# namespace, so the bpffs that spillway-decap mounts for its pins and the
# /run/netns entries vanish with it even if the trap never runs.
#
# usage: decap_test.sh SPILLWAY_DECAP_BINARY DECAP_TRAFFIC_PY
# SPILLWAY_DECAP_E2E_MODE=generic runs the same test with generic (skb) XDP.
# Exit 77 (meson: skipped) without root, ip netns, unshare or scapy.
set -euo pipefail

decap=$(realpath "${1:?usage: decap_test.sh SPILLWAY_DECAP DECAP_TRAFFIC_PY}")
traffic=$(realpath "${2:?usage: decap_test.sh SPILLWAY_DECAP DECAP_TRAFFIC_PY}")
python=/usr/bin/python3
mode=${SPILLWAY_DECAP_E2E_MODE:-native}

skip() { echo "decap: SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, XDP)"
command -v ip >/dev/null || skip "iproute2 'ip' not found"
command -v nsenter >/dev/null || skip "nsenter (util-linux) not found"
command -v unshare >/dev/null || skip "unshare (util-linux) not found"
[ -x "$python" ] || skip "$python not found"
"$python" -c 'import scapy.all' 2>/dev/null || skip "python3-scapy not installed"

if [ -z "${SWD_PRIVATE_MOUNTS:-}" ]; then
  SWD_PRIVATE_MOUNTS=1 exec unshare --mount --propagation private "$0" "$@"
fi

tag=$$
client=swd-client-$tag
backend=swd-backend-$tag
cveth=swdc-$tag
bveth=swdb-$tag
vip4=192.0.2.10
vip6=2001:db8:ffff::10
workdir=$(mktemp -d /tmp/swd-decap.XXXXXX)
server_pid=
attached=

in_client() { nsenter --net=/run/netns/"$client" "$@"; }
in_backend() { nsenter --net=/run/netns/"$backend" "$@"; }

cleanup() {
  local status=$?
  set +e
  if [ -n "$attached" ]; then in_backend "$decap" detach --dev "$bveth" >/dev/null 2>&1; fi
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  ip netns del "$client" 2>/dev/null
  ip netns del "$backend" 2>/dev/null
  rm -rf "$workdir"
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$client" 2>/dev/null || skip "cannot create network namespaces (ip netns add)"
ip netns add "$backend"
ip link add "$cveth" type veth peer name "$bveth" || skip "cannot create a veth pair"
ip link set "$cveth" netns "$client"
ip link set "$bveth" netns "$backend"

for ns in "$client" "$backend"; do ip -n "$ns" link set lo up; done
ip -n "$client" addr add 10.99.0.1/24 dev "$cveth"
ip -n "$client" addr add fd00:99::1/64 dev "$cveth" nodad
ip -n "$client" link set "$cveth" up

ip -n "$backend" addr add 10.99.0.21/24 dev "$bveth"
ip -n "$backend" addr add fd00:99::21/64 dev "$bveth" nodad
ip -n "$backend" addr add "$vip4/32" dev lo
ip -n "$backend" addr add "$vip6/128" dev lo
ip -n "$backend" link set "$bveth" up
ip -n "$backend" route add 198.51.100.0/24 via 10.99.0.1 dev "$bveth"
ip -n "$backend" route add 2001:db8:c::/64 via fd00:99::1 dev "$bveth"
# The deployment recipe (README): no reverse-path filter on the tunnel-facing
# interface, and the VIP on lo is never announced or answered for by ARP.
for key in net.ipv4.conf.all.rp_filter net.ipv4.conf.default.rp_filter \
    "net.ipv4.conf.$bveth.rp_filter" net.ipv4.conf.lo.rp_filter; do
  in_backend sysctl -qw "$key=0"
done
in_backend sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2

mac_of() { ip -n "$1" link show "$2" | awk '/link\/ether/ {print $2}'; }
client_mac=$(mac_of "$client" "$cveth")
backend_mac=$(mac_of "$backend" "$bveth")

# The echo server on the VIPs; ready when it has written its ready file.
# nsenter execs python, so $! is the server itself.
nsenter --net=/run/netns/"$backend" "$python" "$traffic" serve --vip4 "$vip4" --vip6 "$vip6" \
  --ready "$workdir/server.ready" &
server_pid=$!
deadline=$((SECONDS + 20))
until [ -s "$workdir/server.ready" ]; do
  kill -0 "$server_pid" 2>/dev/null || { echo "decap: FAIL: echo server died"; exit 1; }
  [ $SECONDS -lt $deadline ] || { echo "decap: FAIL: echo server not ready in 20 s"; exit 1; }
  sleep 0.05
done

# Attach with the default BPF object path (the build tree's, compiled in).
in_backend "$decap" attach --dev "$bveth" --mode "$mode" \
  --address 10.99.0.21 --address fd00:99::21 --gue-port 6080
attached=1
ip -n "$backend" link show "$bveth" | grep -q 'prog/xdp' ||
  { echo "decap: FAIL: no XDP program on $bveth after attach"; exit 1; }

passed=0
failed=0
check() {  # name, command...: a loader check outside the packet cases
  local name=$1; shift
  if "$@"; then
    echo "decap: PASS $name"; passed=$((passed + 1))
  else
    echo "decap: FAIL $name"; failed=$((failed + 1))
  fi
}

check "stats-through-pins" test -e /sys/fs/bpf/spillway-decap/"$bveth"/decap_counters
# `ip netns exec` remounts /sys: stats must find the maps through the device.
check "stats-without-pins" sh -c \
  "ip netns exec '$backend' '$decap' stats --dev '$bveth' --json | grep -Eq '\"mode\": ?\"$mode\"'"
check "attach-missing-device-fails" sh -c \
  "! in=\$('$decap' attach --dev swdx-$tag --address 10.0.0.1 2>&1) && \
   echo \"\$in\" | grep -q 'does not exist'"

in_client "$python" "$traffic" run --iface "$cveth" \
  --client-mac "$client_mac" --backend-mac "$backend_mac" \
  --lb4 10.99.0.100 --lb6 fd00:99::100 --backend4 10.99.0.21 --backend6 fd00:99::21 \
  --client4 198.51.100.7 --client6 2001:db8:c::7 --vip4 "$vip4" --vip6 "$vip6" \
  --other4 10.99.0.99 --other6 fd00:99::99 --gue-port 6080 \
  --stats-cmd "nsenter --net=/run/netns/$backend $decap stats --dev $bveth --json" |
  tee "$workdir/traffic.log" || true
summary=$(grep -E '^decap: [0-9]+ passed, [0-9]+ failed$' "$workdir/traffic.log" | tail -1 || true)
if [ -n "$summary" ]; then
  read -r case_passed case_failed < <(echo "$summary" | awk '{print $2, $4}')
  passed=$((passed + case_passed)); failed=$((failed + case_failed))
else
  echo "decap: FAIL traffic: decap_traffic.py ended without a summary"; failed=$((failed + 1))
fi

echo "decap: counters after the run:"
in_backend "$decap" stats --dev "$bveth" | sed 's/^/  /'

in_backend "$decap" detach --dev "$bveth"
attached=
check "detached" sh -c "! ip -n '$backend' link show '$bveth' | grep -q 'prog/xdp'"
check "pins-removed" test ! -e /sys/fs/bpf/spillway-decap/"$bveth"

echo "decap: $passed passed, $failed failed (packet cases and loader checks)"
[ "$failed" -eq 0 ]
