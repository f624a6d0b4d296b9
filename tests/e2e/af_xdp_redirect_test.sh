#!/usr/bin/env bash
# End-to-end test of AF_XDP mode's XDP program, spillway_redirect.bpf.o, and
# of XdpVipMap (meson suite 'e2e', test 'af_xdp_redirect').
#
# Topology, all names carry this shell's PID so parallel runs do not collide:
#
#   swx-cl-PID                               swx-gw-PID (the gateway)
#   swxc-PID 10.77.0.1/24 fd00:77::1/64 ==== swxg-PID 10.77.0.2/24 fd00:77::2/64
#     scapy, as clients 198.51.100.7 and      lo: VIPs 192.0.2.100-102,
#     2001:db8:c::7 (not assigned, so the         2001:db8:77::100-101, so the
#     client's kernel stays out)                  kernel would answer them
#                                             TCP echo on 10.77.0.2:2222 and
#                                               [fd00:77::2]:2222 ("SSH")
# vip_map: 192.0.2.100 tcp/80, 192.0.2.101 udp (every port), 192.0.2.102
# (address marker), 2001:db8:77::100 (marker), 2001:db8:77::101 tcp/443.
#
# Phase 1, the program alone: xdp_redirect_probe attaches it the way DPDK's
# PMD does (libbpf, XDP_FLAGS_UPDATE_IF_NOEXIST) but puts no socket into
# xsks_map; every case must land in its counter (VIP cases: passed_no_socket)
# and the kernel must keep ARP, ND, ping and TCP to the host working.
# Phase 2, the real PMD: dpdk-testpmd with
#   --vdev net_af_xdp0,iface=swxg-PID,xdp_prog=<object>,queue_count=1
# loads and attaches the program and fills xsks_map; XdpVipMap finds vip_map
# through the interface and fills it; VIP frames must reach testpmd (its RX
# counter) and never the kernel (no RST, no echo reply although the VIPs are
# on its loopback), everything else must still reach the kernel. Then a
# resync without 192.0.2.102's marker hands that address back to the kernel,
# and stopping testpmd must detach the program.
# Takeover (spillwayd's start-up check, takeOverStaleRedirect, run by the
# probe): phase 1's program, held by no process, is detached; spillway-decap's
# program is refused and left alone; in phase 2 the program of the running
# testpmd is refused, and after `kill -9` of testpmd (the program stays
# attached and blocks the next start) it is detached and testpmd starts and
# receives VIP frames again.
#
# usage: af_xdp_redirect_test.sh XDP_REDIRECT_PROBE SPILLWAY_REDIRECT_BPF_O TRAFFIC_PY SPILLWAY_DECAP
# Exit 77 (meson: skipped) without root, ip netns, unshare or scapy; when only
# dpdk-testpmd (Debian package dpdk-dev) is missing, phase 1 still runs and
# decides failure, and the test then reports skipped.
set -euo pipefail

usage="usage: af_xdp_redirect_test.sh PROBE BPF_OBJECT TRAFFIC_PY SPILLWAY_DECAP"
probe=$(realpath "${1:?$usage}")
object=$(realpath "${2:?$usage}")
traffic=$(realpath "${3:?$usage}")
decap=$(realpath "${4:?$usage}")
python=/usr/bin/python3
testpmd=${SPILLWAY_TESTPMD-$(command -v dpdk-testpmd || true)}  # set empty: phase 1 only

skip() { echo "af_xdp: SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, XDP, AF_XDP)"
command -v ip >/dev/null || skip "iproute2 'ip' not found"
command -v nsenter >/dev/null || skip "nsenter (util-linux) not found"
command -v unshare >/dev/null || skip "unshare (util-linux) not found"
[ -x "$python" ] || skip "$python not found"
"$python" -c 'import scapy.all' 2>/dev/null || skip "python3-scapy not installed"
[ -f "$object" ] || { echo "af_xdp: FAIL: no BPF object at $object"; exit 1; }

# A private mount namespace: the /run/netns entries vanish with it even if
# the trap never runs.
if [ -z "${SWX_PRIVATE_MOUNTS:-}" ]; then
  SWX_PRIVATE_MOUNTS=1 exec unshare --mount --propagation private "$0" "$@"
fi

tag=$$
client=swx-cl-$tag
gw=swx-gw-$tag
cveth=swxc-$tag
gveth=swxg-$tag
prefix=swdxdp$tag
host4=10.77.0.2
host6=fd00:77::2
vip4_exact=192.0.2.100
vip4_udp=192.0.2.101
vip4_marker=192.0.2.102
vip6_marker=2001:db8:77::100
vip6_exact=2001:db8:77::101
vips=("$vip4_exact/tcp/80" "$vip4_udp/udp" "$vip4_marker" "$vip6_marker" "$vip6_exact/tcp/443")
workdir=$(mktemp -d /tmp/swx-afxdp.XXXXXX)
server_pid=
testpmd_pid=

in_client() { nsenter --net=/run/netns/"$client" "$@"; }
in_gw() { nsenter --net=/run/netns/"$gw" "$@"; }

cleanup() {
  local status=$?
  set +e
  if [ -n "$testpmd_pid" ]; then
    kill -INT "$testpmd_pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$testpmd_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$testpmd_pid" 2>/dev/null
    wait "$testpmd_pid" 2>/dev/null
  fi
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  ip netns del "$client" 2>/dev/null
  ip netns del "$gw" 2>/dev/null
  rm -rf "/var/run/dpdk/$prefix" "$workdir"
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$client" 2>/dev/null || skip "cannot create network namespaces (ip netns add)"
ip netns add "$gw"
ip link add "$cveth" type veth peer name "$gveth" || skip "cannot create a veth pair"
ip link set "$cveth" netns "$client"
ip link set "$gveth" netns "$gw"

for ns in "$client" "$gw"; do ip -n "$ns" link set lo up; done
ip -n "$client" addr add 10.77.0.1/24 dev "$cveth"
ip -n "$client" addr add fd00:77::1/64 dev "$cveth" nodad
ip -n "$client" link set "$cveth" up
ip -n "$gw" addr add "$host4/24" dev "$gveth"
ip -n "$gw" addr add "$host6/64" dev "$gveth" nodad
for vip in "$vip4_exact" "$vip4_udp" "$vip4_marker"; do ip -n "$gw" addr add "$vip/32" dev lo; done
for vip in "$vip6_marker" "$vip6_exact"; do ip -n "$gw" addr add "$vip/128" dev lo; done
ip -n "$gw" link set "$gveth" up
ip -n "$gw" route add 198.51.100.0/24 via 10.77.0.1 dev "$gveth"
ip -n "$gw" route add 2001:db8:c::/64 via fd00:77::1 dev "$gveth"
for key in net.ipv4.conf.all.rp_filter net.ipv4.conf.default.rp_filter \
    "net.ipv4.conf.$gveth.rp_filter"; do
  in_gw sysctl -qw "$key=0"
done

mac_of() { ip -n "$1" link show "$2" | awk '/link\/ether/ {print $2}'; }
client_mac=$(mac_of "$client" "$cveth")
gateway_mac=$(mac_of "$gw" "$gveth")

# nsenter execs python, so $! is the server itself.
nsenter --net=/run/netns/"$gw" "$python" "$traffic" serve --host4 "$host4" --host6 "$host6" \
  --ready "$workdir/server.ready" &
server_pid=$!
deadline=$((SECONDS + 20))
until [ -s "$workdir/server.ready" ]; do
  kill -0 "$server_pid" 2>/dev/null || { echo "af_xdp: FAIL: host echo server died"; exit 1; }
  [ $SECONDS -lt $deadline ] || { echo "af_xdp: FAIL: host echo server not ready in 20 s"; exit 1; }
  sleep 0.05
done

passed=0
failed=0
check() {  # name, command...
  local name=$1; shift
  if "$@"; then
    echo "af_xdp: PASS $name"; passed=$((passed + 1))
  else
    echo "af_xdp: FAIL $name"; failed=$((failed + 1))
  fi
}
# Adds the summary line of one af_xdp_redirect_traffic.py run to the totals.
traffic_run() {  # log, args...
  local log=$1; shift
  in_client "$python" "$traffic" run --iface "$cveth" \
    --client-mac "$client_mac" --gateway-mac "$gateway_mac" \
    --host4 "$host4" --host6 "$host6" --peer4 10.77.0.1 --peer6 fd00:77::1 \
    --client4 198.51.100.7 --client6 2001:db8:c::7 \
    --vip4-exact "$vip4_exact" --vip4-udp "$vip4_udp" --vip4-marker "$vip4_marker" \
    --vip6-marker "$vip6_marker" --vip6-exact "$vip6_exact" \
    --counters-cmd "nsenter --net=/run/netns/$gw $probe counters --dev $gveth" "$@" |
    tee "$log" || true
  local summary
  summary=$(grep -E '^af_xdp: [0-9]+ passed, [0-9]+ failed$' "$log" | tail -1 || true)
  if [ -n "$summary" ]; then
    local p f
    read -r p f < <(echo "$summary" | awk '{print $2, $4}')
    passed=$((passed + p)); failed=$((failed + f))
  else
    echo "af_xdp: FAIL traffic: af_xdp_redirect_traffic.py ended without a summary"
    failed=$((failed + 1))
  fi
}
keys_are() {  # expected keys, as the probe prints them
  local want got
  want=$(printf '%s\n' "$@" | sort)
  got=$(in_gw "$probe" keys --dev "$gveth" | tr -d '[]" ' | tr ',' '\n' | sed '/^$/d' | sort)
  [ "$want" = "$got" ] || { echo "  keys: want [$want] got [$got]"; return 1; }
}
attached_name() {
  ip -n "$gw" -d link show "$gveth" | sed -n 's/.*prog\/xdp id [0-9]* name \([^ ]*\).*/\1/p'
}
all_keys=("$vip4_exact/6/80" "$vip4_udp/17/0" "$vip4_marker/0/0" "$vip6_marker/0/0"
  "$vip6_exact/6/443")
fails_with() {  # text, command...: the command fails and says text
  local text=$1 out; shift
  if out=$("$@" 2>&1); then echo "  unexpectedly succeeded: $out"; return 1; fi
  echo "$out" | grep -q -- "$text" || { echo "  message: $out"; return 1; }
}

echo "af_xdp: phase 1: program attached by libbpf alone, no AF_XDP socket"
check "object-path-found" "$probe" path
check "object-path-env-override" test \
  "$(SPILLWAY_REDIRECT_BPF_OBJECT="$object" "$probe" path)" = "$object"
check "object-path-env-missing-fails" fails_with "tried: $workdir/none.bpf.o" \
  env SPILLWAY_REDIRECT_BPF_OBJECT="$workdir/none.bpf.o" "$probe" path
in_gw "$probe" attach --dev "$gveth" --object "$object"
check "attached" test "$(attached_name)" = spillway_redir
check "sync" in_gw "$probe" sync --dev "$gveth" "${vips[@]}"
check "keys-after-sync" keys_are "${all_keys[@]}"
check "sync-rejects-port-without-proto" fails_with "a port needs a protocol" \
  in_gw "$probe" sync --dev "$gveth" "$vip4_exact/0/80"
check "sync-rejects-icmp-port" fails_with "ports exist only for TCP" \
  in_gw "$probe" sync --dev "$gveth" "$vip4_exact/icmp/7"
check "rejected-sync-left-map-alone" keys_are "${all_keys[@]}"
check "sync-is-idempotent" in_gw "$probe" sync --dev "$gveth" "${vips[@]}" "${vips[@]}"
check "keys-after-resync" keys_are "${all_keys[@]}"
traffic_run "$workdir/phase1.log"
# Held by no process (the probe exited): what a killed spillwayd leaves.
check "takeover-detaches-stale-program" sh -c \
  "nsenter --net=/run/netns/$gw $probe takeover --dev $gveth | grep -q 'detached the stale redirect program'"
check "takeover-left-nothing" test -z "$(attached_name)"
check "takeover-of-free-interface" in_gw "$probe" takeover --dev "$gveth"
in_gw "$decap" attach --dev "$gveth" --address "$host4" --pin-root "$workdir/pins" >/dev/null 2>&1
check "takeover-refuses-foreign-program" fails_with \
  "XDP program 'spillway_decap' (id [0-9]*, native mode), which is not Spillway's" \
  in_gw "$probe" takeover --dev "$gveth"
check "refusal-says-how-to-remove" fails_with "ip link set dev $gveth xdpdrv off" \
  in_gw "$probe" takeover --dev "$gveth"
check "foreign-program-left-alone" test "$(attached_name)" = spillway_decap
in_gw "$decap" detach --dev "$gveth" --pin-root "$workdir/pins" >/dev/null
in_gw "$probe" detach --dev "$gveth"
check "open-without-program-fails" fails_with "no XDP program is attached" \
  in_gw "$probe" keys --dev "$gveth"
check "open-missing-interface-fails" fails_with "does not exist" \
  in_gw "$probe" keys --dev "swxz-$tag"

if [ -z "$testpmd" ]; then
  echo "af_xdp: $passed passed, $failed failed (phase 1 only)"
  [ "$failed" -eq 0 ] || exit 1
  skip "phase 2 needs dpdk-testpmd (Debian package dpdk-dev) for DPDK's net_af_xdp PMD"
fi

echo "af_xdp: phase 2: DPDK's net_af_xdp PMD (dpdk-testpmd) with xdp_prog=$object"
lcores=(-l 0,1)
[ "$(nproc)" -ge 2 ] || lcores=(--lcores 0@0,1@0)
devargs="net_af_xdp0,iface=$gveth,xdp_prog=$object,queue_count=1"
echo "af_xdp: $testpmd ${lcores[*]} --no-huge -m 512 --no-pci --file-prefix $prefix" \
  "--vdev $devargs -- --forward-mode=rxonly --stats-period 1 --total-num-mbufs=8192"
start_testpmd() {  # log: starts testpmd, waits until it forwards; 1 if it exits first
  local log=$1
  ip netns exec "$gw" stdbuf -oL "$testpmd" "${lcores[@]}" --no-huge -m 512 --no-pci \
    --file-prefix "$prefix" --vdev "$devargs" -- \
    --forward-mode=rxonly --stats-period 1 --total-num-mbufs=8192 \
    </dev/null >"$log" 2>&1 &
  testpmd_pid=$!  # ip and stdbuf exec, so this is testpmd itself
  local deadline=$((SECONDS + 60))
  until grep -q 'NIC statistics for port 0' "$log"; do
    if ! kill -0 "$testpmd_pid" 2>/dev/null; then
      wait "$testpmd_pid" 2>/dev/null || true
      testpmd_pid=
      return 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      echo "af_xdp: FAIL: dpdk-testpmd not forwarding after 60 s; its output:"
      sed 's/^/  /' "$log"
      exit 1
    fi
    sleep 0.2
  done
}
if ! start_testpmd "$workdir/testpmd.log"; then
  echo "af_xdp: FAIL: dpdk-testpmd exited early; its output:"
  sed 's/^/  /' "$workdir/testpmd.log"
  exit 1
fi
check "pmd-attached-our-program" test "$(attached_name)" = spillway_redir
check "sync-into-pmd-program" in_gw "$probe" sync --dev "$gveth" "${vips[@]}"
check "keys-in-pmd-program" keys_are "${all_keys[@]}"
traffic_run "$workdir/phase2.log" --testpmd-log "$workdir/testpmd.log"

# Resync without 192.0.2.102's marker: the kernel answers that address again.
check "resync-drops-stale-key" in_gw "$probe" sync --dev "$gveth" \
  "$vip4_exact/tcp/80" "$vip4_udp/udp" "$vip6_marker" "$vip6_exact/tcp/443"
check "keys-after-removal" keys_are "$vip4_exact/6/80" "$vip4_udp/17/0" "$vip6_marker/0/0" \
  "$vip6_exact/6/443"
traffic_run "$workdir/phase2-removed.log" --testpmd-log "$workdir/testpmd.log" \
  --cases ping-removed-marker

echo "af_xdp: program counters: $(in_gw "$probe" counters --dev "$gveth")"
kill -INT "$testpmd_pid"
testpmd_status=0
wait "$testpmd_pid" || testpmd_status=$?
testpmd_pid=
check "testpmd-exits-cleanly" test "$testpmd_status" -eq 0
check "pmd-detached-program" test -z "$(attached_name)"

echo "af_xdp: takeover: a live PMD's program is refused; after kill -9 it is taken over"
if start_testpmd "$workdir/testpmd-2.log"; then
  check "takeover-refuses-live-pmd" fails_with "for a live process: pid $testpmd_pid" \
    in_gw "$probe" takeover --dev "$gveth"
  check "live-pmd-program-left-alone" test "$(attached_name)" = spillway_redir
  kill -KILL "$testpmd_pid"
  wait "$testpmd_pid" 2>/dev/null || true
  testpmd_pid=
  check "killed-pmd-left-program-attached" test "$(attached_name)" = spillway_redir
  check "takeover-detaches-killed-pmd-program" sh -c \
    "nsenter --net=/run/netns/$gw $probe takeover --dev $gveth | grep -q 'detached the stale'"
  if start_testpmd "$workdir/testpmd-3.log"; then
    check "restart-after-takeover" test "$(attached_name)" = spillway_redir
    check "sync-after-takeover" in_gw "$probe" sync --dev "$gveth" "${vips[@]}"
    traffic_run "$workdir/phase2-takeover.log" --testpmd-log "$workdir/testpmd-3.log" \
      --cases tcp4-exact,udp4-all-ports,ping-host
    # Without the takeover, the start after a kill -9 fails (the PMD attaches
    # with XDP_FLAGS_UPDATE_IF_NOEXIST): what spillwayd ran into.
    kill -KILL "$testpmd_pid"
    wait "$testpmd_pid" 2>/dev/null || true
    testpmd_pid=
    if start_testpmd "$workdir/testpmd-4.log"; then
      check "stale-program-blocks-restart" false
    else
      check "stale-program-blocks-restart" true
    fi
  else
    check "restart-after-takeover" false
    sed 's/^/  /' "$workdir/testpmd-3.log"
  fi
else
  check "second-testpmd-start" false
  sed 's/^/  /' "$workdir/testpmd-2.log"
fi
if [ "$failed" -ne 0 ]; then
  echo "af_xdp: dpdk-testpmd output (first 40 lines):"
  head -40 "$workdir/testpmd.log" | sed 's/^/  /'
fi

echo "af_xdp: $passed passed, $failed failed (packet cases and map checks)"
[ "$failed" -eq 0 ]
