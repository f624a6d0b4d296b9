#!/usr/bin/env bash
# End-to-end test of spillway-delayline (meson suite 'e2e', test 'delay-line').
#
# Three namespaces, named after this shell's PID so parallel runs do not
# collide:
#
#   dlPID-left                dlPID-mid                      dlPID-right
#   eth0 10.98.0.1/24 ===== a   spillway-delayline   b ===== eth0 10.98.0.2/24
#
# Offloads are off on every veth, so frames cross the packet sockets as they
# are on the wire. The delay line runs in mid; `set` and `show` run from the
# test's own namespace (the control socket is a path, not an abstract name).
# Each check prints "ok  ..." or "FAIL ..."; the test exits 1 if any failed.
# Timing bounds are lower bounds from the configuration plus a slack on the
# minimum of several pings, so a loaded machine adds delay without failing.
#
# usage: delay_line_test.sh SPILLWAY_DELAYLINE
# Exit 77 (meson: skipped) without root, ip netns, veth, ethtool or python3.
set -euo pipefail

dl=$(realpath "${1:?usage: delay_line_test.sh SPILLWAY_DELAYLINE}")
python=/usr/bin/python3
slack_ms=${DELAY_LINE_SLACK_MS:-20}

skip() { echo "delay-line: SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, AF_PACKET)"
command -v ip >/dev/null || skip "iproute2 'ip' not found"
command -v nsenter >/dev/null || skip "nsenter (util-linux) not found"
command -v ethtool >/dev/null || skip "ethtool not found (offloads must be off on the veths)"
command -v ping >/dev/null || skip "ping (iputils-ping) not found"
[ -x "$python" ] || skip "$python not found"

tag=dl$$
left=$tag-left
mid=$tag-mid
right=$tag-right
workdir=$(mktemp -d /tmp/spillway-delayline-test.XXXXXX)
control=$workdir/control.sock
dl_pid=
server_pid=

cleanup() {
  local status=$?
  set +e
  if [ -n "$dl_pid" ]; then kill "$dl_pid" 2>/dev/null; wait "$dl_pid" 2>/dev/null; fi
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  for ns in "$left" "$mid" "$right"; do ip netns del "$ns" 2>/dev/null; done
  if [ "$status" -ne 0 ] && [ "$status" -ne 77 ] && [ -s "$workdir/dl.err" ]; then
    echo "--- spillway-delayline stderr:"; cat "$workdir/dl.err"
  fi
  rm -rf "$workdir"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

in_ns() { local ns=$1; shift; nsenter --net=/run/netns/"$ns" "$@"; }

ip netns add "$left" 2>/dev/null || skip "cannot create network namespaces (ip netns add)"
ip netns add "$mid"
ip netns add "$right"
ip -n "$left" link add eth0 type veth peer name a netns "$mid" 2>/dev/null ||
  skip "cannot create a veth pair"
ip -n "$right" link add eth0 type veth peer name b netns "$mid"
for ns in "$left" "$mid" "$right"; do ip -n "$ns" link set lo up; done
# mid only bridges: no addresses, and no IPv6 chatter of its own.
in_ns "$mid" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
ip -n "$left" addr add 10.98.0.1/24 dev eth0
ip -n "$right" addr add 10.98.0.2/24 dev eth0
for end in "$left eth0" "$mid a" "$mid b" "$right eth0"; do
  read -r ns dev <<<"$end"
  in_ns "$ns" ethtool -K "$dev" tx off tso off gso off gro off >/dev/null 2>&1 ||
    skip "ethtool -K could not turn off offloads on $dev in $ns"
  ip -n "$ns" link set dev "$dev" up
done

passed=0
failed=0
ok() { echo "ok   $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }

# json_field JSON KEY: the number under KEY in a flat JSON object.
json_field() { sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p" <<<"$1"; }
# float_ge A B: A >= B, as floats.
float_ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 >= b + 0) }'; }
float_lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }

show() { "$dl" show --control "$control"; }
set_line() { "$dl" set --control "$control" "$@" >/dev/null; }

# ping_left COUNT INTERVAL: "received min max" (min and max empty when none).
ping_left() {
  local out received rtt
  out=$(in_ns "$left" ping -n -q -c "$1" -i "$2" -W 1 10.98.0.2 2>&1 || true)
  received=$(sed -n 's/.* \([0-9]*\) received.*/\1/p' <<<"$out")
  rtt=$(sed -n 's|^rtt min/avg/max/mdev = \([0-9.]*\)/[0-9.]*/\([0-9.]*\)/.*|\1 \2|p' <<<"$out")
  echo "${received:-0} $rtt"
}

# Start the delay line in mid and wait for its ready file. nsenter execs the
# delay line, so $! is the delay line itself.
nsenter --net=/run/netns/"$mid" "$dl" run --a a --b b --control "$control" --ready "$workdir/ready" --seed 7 \
  >"$workdir/dl.out" 2>"$workdir/dl.err" &
dl_pid=$!
deadline=$((SECONDS + 15))
until [ -e "$workdir/ready" ]; do
  kill -0 "$dl_pid" 2>/dev/null || { echo "FAIL delay line exited at start-up"; exit 1; }
  [ $SECONDS -lt $deadline ] || { echo "FAIL delay line not ready in 15 s"; exit 1; }
  sleep 0.05
done

# (1) No delay: the bridge forwards.
read -r received min max < <(ping_left 3 0.2)
if [ "$received" -eq 3 ]; then
  ok "delay 0: ping through the bridge (3/3, rtt min $min ms)"
else
  fail "delay 0: $received/3 pings answered"
fi

# (2) 20 ms each way.
set_line --delay-ms 20
read -r received min max < <(ping_left 5 0.2)
if [ "$received" -ge 1 ] && float_ge "$min" 40 && float_lt "$min" $((40 + slack_ms)); then
  ok "delay 20 ms: min rtt $min ms in [40, $((40 + slack_ms)))"
else
  fail "delay 20 ms: $received/5 answered, min rtt '${min:-none}' not in [40, $((40 + slack_ms)))"
fi

# (3) Changed at run time to 50 ms.
set_line --delay-ms 50
read -r received min max < <(ping_left 5 0.2)
if [ "$received" -ge 1 ] && float_ge "$min" 100 && float_lt "$min" $((100 + slack_ms)); then
  ok "delay 50 ms: min rtt $min ms in [100, $((100 + slack_ms)))"
else
  fail "delay 50 ms: $received/5 answered, min rtt '${min:-none}' not in [100, $((100 + slack_ms)))"
fi

# (4) Jitter 10 ms: spread, and never below delay - jitter each way.
set_line --jitter-ms 10
read -r received min max < <(ping_left 20 0.02)
spread=$(awk -v a="${max:-0}" -v b="${min:-0}" 'BEGIN { printf "%.3f", a - b }')
if [ "$received" -ge 10 ] && float_ge "$min" 80 && float_lt 5 "$spread"; then
  ok "jitter 10 ms: $received/20 answered, min $min ms >= 80, spread $spread ms > 5"
else
  fail "jitter 10 ms: $received/20 answered, min '${min:-none}' (>= 80?), spread $spread (> 5?)"
fi

# (5) Loss 0.5 each way: about a quarter of the echoes come back.
set_line --delay-ms 1 --jitter-ms 0 --loss 0.5
before=$(show)
read -r received min max < <(ping_left 100 0.01)
after=$(show)
if [ "$received" -ge 10 ] && [ "$received" -le 60 ]; then
  ok "loss 0.5: $received/100 answered, within [10, 60]"
else
  fail "loss 0.5: $received/100 answered, outside [10, 60]"
fi

# (6) Loss off, 5 ms: a TCP transfer arrives byte-exact.
set_line --delay-ms 5 --loss 0
cat >"$workdir/tcp.py" <<'EOF'
import hashlib, random, socket, sys

SIZE = 4 << 20
role, address, ready = sys.argv[1], sys.argv[2], sys.argv[3]
if role == "serve":
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, 5201))
    listener.listen(1)
    listener.settimeout(30)
    open(ready, "w").close()
    conn, _ = listener.accept()
    conn.settimeout(30)
    digest, length = hashlib.sha256(), 0
    while chunk := conn.recv(1 << 16):
        digest.update(chunk)
        length += len(chunk)
    conn.sendall(f"{length} {digest.hexdigest()}".encode())
    conn.close()
else:
    data = random.Random(7).randbytes(SIZE)
    expected = f"{SIZE} {hashlib.sha256(data).hexdigest()}"
    conn = socket.create_connection((address, 5201), timeout=30)
    conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)
    reply = b""
    while chunk := conn.recv(4096):
        reply += chunk
    if reply.decode() != expected:
        print(f"server saw '{reply.decode()}', sent '{expected}'")
        sys.exit(1)
    print(f"{SIZE} bytes, sha256 matches")
EOF
nsenter --net=/run/netns/"$right" "$python" "$workdir/tcp.py" serve 10.98.0.2 \
  "$workdir/server.ready" &
server_pid=$!
deadline=$((SECONDS + 15))
until [ -e "$workdir/server.ready" ] || [ $SECONDS -ge $deadline ]; do sleep 0.05; done
tcp_start=$SECONDS
if tcp_out=$(timeout 40 nsenter --net=/run/netns/"$left" "$python" "$workdir/tcp.py" send \
    10.98.0.2 - 2>&1); then
  ok "tcp at 5 ms: $tcp_out in $((SECONDS - tcp_start)) s"
else
  fail "tcp at 5 ms: ${tcp_out:-timed out}"
fi
wait "$server_pid" 2>/dev/null || true
server_pid=

# (7) Bad values are refused with a reason and change nothing.
settings_of() {
  local json=$1
  echo "$(json_field "$json" delay_ms) $(json_field "$json" jitter_ms) $(json_field "$json" loss)"
}
expected_settings=$(settings_of "$(show)")
for args in "--loss 2" "--delay-ms -1" "--jitter-ms abc"; do
  rc=0
  # shellcheck disable=SC2086
  message=$("$dl" set --control "$control" $args 2>&1) || rc=$?
  if [ "$rc" -eq 0 ]; then
    fail "set $args: accepted ('$message')"
  elif [ "$rc" -eq 1 ] && grep -q "error" <<<"$message"; then
    ok "set $args: exit 1, '$message'"
  else
    fail "set $args: wrong exit status or no error message ('$message')"
  fi
done
# The server's own checks, past the client's: raw datagrams on the socket.
cat >"$workdir/raw.py" <<'EOF'
import os, socket, sys

client = os.path.join(os.path.dirname(sys.argv[1]), "raw-client.sock")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(client)
s.settimeout(2)
try:
    s.sendto(sys.argv[2].encode(), sys.argv[1])
    print(s.recv(4096).decode())
finally:
    os.unlink(client)
EOF
for request in "set loss=2" "set delay_ms=-1" "set foo=1" "set delay_ms=1 loss=2" \
    "set delay_ms=x"; do
  reply=$("$python" "$workdir/raw.py" "$control" "$request" 2>&1 || true)
  if [[ $reply == "error: "* ]]; then
    ok "'$request': $reply"
  else
    fail "'$request': expected 'error: ...', got '$reply'"
  fi
done
actual_settings=$(settings_of "$(show)")
if [ "$actual_settings" = "$expected_settings" ]; then
  ok "settings unchanged after the refused sets ($actual_settings)"
else
  fail "settings changed by refused sets: '$expected_settings' -> '$actual_settings'"
fi

# (8) Counters: the loss phase's frames are all accounted for, and the queues
# drain once traffic stops.
delta() { echo $(($(json_field "$after" "$1") - $(json_field "$before" "$1"))); }
seen_ab=$(($(delta forwarded_ab) + $(delta lost_ab)))
lost_ab=$(delta lost_ab)
fwd_ba=$(delta forwarded_ba)
if [ "$seen_ab" -ge 100 ] && [ "$lost_ab" -ge 20 ] && [ "$lost_ab" -le 80 ] &&
    [ "$fwd_ba" -ge "$received" ] && [ "$(delta lost_ba)" -ge 1 ]; then
  ok "loss phase counters: a->b saw $seen_ab frames, lost $lost_ab; b->a forwarded $fwd_ba >= $received replies, lost $(delta lost_ba)"
else
  fail "loss phase counters inconsistent: before $before after $after (received $received)"
fi
deadline=$((SECONDS + 5))
while final=$(show); do
  [ "$(json_field "$final" queued_ab)" -eq 0 ] && [ "$(json_field "$final" queued_ba)" -eq 0 ] &&
    break
  [ $SECONDS -lt $deadline ] || break
  sleep 0.05
done
if [ "$(json_field "$final" forwarded_ab)" -gt 0 ] && [ "$(json_field "$final" forwarded_ba)" -gt 0 ] &&
    [ "$(json_field "$final" lost_ab)" -gt 0 ] && [ "$(json_field "$final" lost_ba)" -gt 0 ] &&
    [ "$(json_field "$final" queued_ab)" -eq 0 ] && [ "$(json_field "$final" queued_ba)" -eq 0 ] &&
    [ "$(json_field "$final" queue_drops)" -eq 0 ]; then
  ok "show: $final"
else
  fail "show counters: $final"
fi

# SIGTERM: exit 0 with the final counters on stdout, control socket removed.
kill -TERM "$dl_pid"
status=0
wait "$dl_pid" || status=$?
dl_pid=
exit_json=$(tail -n 1 "$workdir/dl.out")
if [ "$status" -eq 0 ] && [ ! -e "$control" ] &&
    [ "$(json_field "$exit_json" forwarded_ab)" -ge "$(json_field "$final" forwarded_ab)" ] &&
    [ "$(json_field "$exit_json" lost_ba)" -eq "$(json_field "$final" lost_ba)" ]; then
  ok "SIGTERM: exit 0, final counters printed"
else
  fail "SIGTERM: exit $status, control socket left: $([ -e "$control" ] && echo yes || echo no), stdout '$exit_json'"
fi

echo "delay-line: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
