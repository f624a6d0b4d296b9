#!/usr/bin/env bash
# e2e: the exception path. The gateway's kernel has no address on the NIC that
# spillwayd owns (here a veth read through af_packet, standing in for a NIC
# bound to vfio-pci); the host's address lives on the exception tap that
# spillwayd creates. Checks that ARP, ping and a TCP service of the host work
# through spillwayd, that backends' next hops resolve through the tap's
# neighbour table, and that VIP traffic flows at the same time.
#
#   exception_path_test.sh SPILLWAYD SPILLWAY_DECAP
set -euo pipefail
spillwayd=${1:?spillwayd path}
export SW_DECAP=${2:?spillway-decap path}
root=$(cd "$(dirname "$0")/../.." && pwd)
py=/usr/bin/python3

if [ "$(id -u)" -ne 0 ]; then echo "exception-path: needs root (namespaces, tap); skipped"; exit 77; fi
if ! ip netns list >/dev/null 2>&1 || [ ! -c /dev/net/tun ]; then
  echo "exception-path: needs ip netns and /dev/net/tun; skipped"; exit 77
fi

prefix="swx$$"
work=$(mktemp -d)
lb_pid=""
cleanup() {
  [ -n "$lb_pid" ] && kill "$lb_pid" 2>/dev/null && wait "$lb_pid" 2>/dev/null || true
  "$root/scripts/topology" down --prefix "$prefix" || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

passed=0
failed=0
check() {  # check NAME COMMAND...
  local name=$1
  shift
  if "$@"; then passed=$((passed + 1)); echo "ok   $name"; else failed=$((failed + 1)); echo "FAIL $name"; fi
}
wait_for() {  # wait_for SECONDS COMMAND...
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.1
  done
}

"$root/scripts/topology" up --prefix "$prefix" --onprem 2 --cloud 0
lb="$prefix-lb"
# The NIC belongs to DPDK: the kernel keeps no address on it and must not
# answer ARP for the host's address through it.
ip -n "$lb" addr flush dev eth0
# And the kernel must not process what arrives on it: af_packet sees frames
# before the netdev ingress hook, so a drop-all nftables chain there leaves
# spillwayd as the only receiver, as with a vfio-bound NIC.
ip netns exec "$lb" nft add table netdev spillway_test
ip netns exec "$lb" nft add chain netdev spillway_test nic \
  '{ type filter hook ingress device "eth0" priority 0; policy drop; }'
ip netns exec "$lb" sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.rp_filter=0

backends=$("$root/scripts/topology" env --prefix "$prefix" --onprem 2 --cloud 0 | awk '$1 == "backend" {print $2, $3, $4}')
while read -r name ns addr; do
  ip netns exec "$ns" "$py" "$root/tests/tools/identity_server.py" "$name" 8000 >/dev/null 2>&1 &
done <<<"$backends"
# A service of the gateway host itself (think SSH or a health endpoint).
ip netns exec "$lb" "$py" "$root/tests/tools/identity_server.py" gateway-host 2222 >/dev/null 2>&1 &

cat >"$work/spillway.toml" <<CONF
[dataplane]
lcores = [1]
hash_seed = 7

[[port]]
name = "fabric"
devargs = "net_af_packet0,iface=eth0"
address = "10.99.0.2"
mtu = 1600
exception = "tap"
exception_name = "sw-fab"

[[pool]]
name = "onprem"
site = "onprem"
encap = "ipip"

[[vip]]
name = "nccl"
address = "192.0.2.10"
protocol = "tcp"
pools = ["onprem"]
CONF
while read -r name ns addr; do
  printf '\n[[backend]]\nname = "%s"\naddress = "%s"\npool = "onprem"\n' "$name" "$addr" \
    >>"$work/spillway.toml"
done <<<"$backends"

ip netns exec "$lb" "$spillwayd" --no-huge -m 512 --file-prefix "$prefix" -- \
  --config "$work/spillway.toml" --stats-file "$work/stats.json" --stats-interval-ms 200 \
  --control-socket "$work/spillway.sock" --metrics-listen "" --state-dir "$work/state" \
  >"$work/final.json" 2>"$work/spillwayd.log" &
lb_pid=$!

if ! wait_for 30 ip -n "$lb" link show sw-fab >/dev/null 2>&1; then
  echo "exception-path: spillwayd created no tap"; cat "$work/spillwayd.log"; exit 1
fi
ip -n "$lb" addr add 10.99.0.2/24 dev sw-fab
ip -n "$lb" link set sw-fab up

resolved() {
  [ -f "$work/stats.json" ] && "$py" -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if all(b["next_hop_resolved"] for b in s["backends"]) else 1)' "$work/stats.json"
}
check "backends' next hops resolve through the tap's neighbour table" wait_for 30 resolved
[ "$failed" -eq 0 ] || { cat "$work/stats.json"; echo; cat "$work/spillwayd.log"; }
check "client reaches the gateway host by ping (ARP + ICMP via the tap)" \
  ip netns exec "$prefix-client" ping -c 3 -i 0.2 -W 2 10.99.0.2 >"$work/ping.log"
no_duplicates() { ! grep -q DUP "$work/ping.log"; }
check "the host answers each ping once (the kernel sees the NIC only through the tap)" no_duplicates
host_service() {
  ip netns exec "$prefix-client" "$py" "$root/tests/tools/fanout_client.py" 10.99.0.2 2222 5 \
    --json "$work/host.json" && grep -q '"gateway-host": 5' "$work/host.json"
}
check "client reaches a TCP service of the gateway host" wait_for 20 host_service
vip_flows() {
  ip netns exec "$prefix-client" "$py" "$root/tests/tools/fanout_client.py" 192.0.2.10 8000 200 \
    --json "$work/vip.json"
}
check "200 VIP connections complete while the exception path is in use" vip_flows
kill "$lb_pid"
wait "$lb_pid" || true
lb_pid=""
counted() {
  "$py" - "$work/final.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"exception_tx={s['exception_tx']} exception_rx={s['exception_rx']} "
      f"forwarded={s['forwarded']} new_flows={s['new_flows']}")
sys.exit(0 if s["exception_tx"] > 0 and s["exception_rx"] > 0 and s["new_flows"] >= 200 else 1)
PY
}
check "spillwayd counted both directions of the exception path" counted
echo "exception-path: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
