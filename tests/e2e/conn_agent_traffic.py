#!/usr/bin/env python3
"""Runs inside conn_agent_test.sh's namespace: starts `spillway-decap agent`
for VIPs 192.0.2.10, 192.0.2.11 and 2001:db8:ffff::10, opens real TCP
connections to them from client addresses of their own, and checks what the
agent reports:
  - /metrics counts per VIP equal the connections open (IPv4, IPv6, and IPv4
    accepted on a dual-stack [::] listener, reported under its IPv4 VIP);
    a VIP without connections reports 0;
  - closed connections leave the count (TIME_WAIT is not counted);
  - /connections lists client address and port per VIP with the token, is
    refused (401) and counted without it or with a wrong one, is cut at
    --list-cap with "truncated": true and the full total;
  - a malformed request is answered 400 and counted; the agent keeps serving;
  - 70 clients that send nothing delay no scrape, and are dropped and counted.
Polls with a deadline; prints how long each wait took; asserts no timing.
usage: conn_agent_traffic.py SPILLWAY_DECAP TOKEN_FILE"""
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

decap, token_file = sys.argv[1], sys.argv[2]
token = open(token_file).read().strip()
PORT = 9411
AGENT = f"http://127.0.0.1:{PORT}"
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        print(f"FAIL: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def get(path, bearer=None):
    req = urllib.request.Request(AGENT + path)
    if bearer is not None:
        req.add_header("Authorization", f"Bearer {bearer}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def counts():
    status, body = get("/metrics")
    if status != 200:
        return None, body
    out = {}
    for line in body.splitlines():
        if line.startswith("spillway_backend_connections{"):
            vip = line.split('vip="', 1)[1].split('"', 1)[0]
            out[vip] = int(line.rsplit(" ", 1)[1])
        elif line.startswith("spillway_backend_agent_"):
            name, value = line.rsplit(" ", 1)
            out[name] = int(value)
    return out, body


def wait_counts(want, what):
    start = time.monotonic()
    got = None
    while time.monotonic() - start < 15:
        got, _ = counts()
        if got is not None and all(got.get(k) == v for k, v in want.items()):
            print(f"  ({what}: {time.monotonic() - start:.3f} s)")
            return got
        time.sleep(0.05)
    check(False, f"{what}: want {want}, agent says {got}")


def listener(family, addr, port):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(128)
    return s


def connect(family, src, dst, port, server):
    c = socket.socket(family, socket.SOCK_STREAM)
    c.bind((src, 0))
    c.connect((dst, port))
    a, _ = server.accept()
    return c, a


agent = subprocess.Popen([decap, "agent", "--listen", f"127.0.0.1:{PORT}",
                          "--vip", "192.0.2.10", "--vip", "192.0.2.11",
                          "--vip", "2001:db8:ffff::10", "--token-file", token_file,
                          "--list-cap", "5"])
try:
    start = time.monotonic()
    while True:
        try:
            got, _ = counts()
            break
        except (urllib.error.URLError, ConnectionError):
            check(time.monotonic() - start < 10 and agent.poll() is None, "the agent starts")
            time.sleep(0.05)
    check(got == {**got, "192.0.2.10": 0, "192.0.2.11": 0, "2001:db8:ffff::10": 0},
          f"no connections yet: {got}")

    l4 = listener(socket.AF_INET, "192.0.2.10", 8080)
    l6 = listener(socket.AF_INET6, "2001:db8:ffff::10", 8080)
    dual = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    dual.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    dual.bind(("::", 9090))
    dual.listen(16)

    conns4 = [connect(socket.AF_INET, "198.51.100.7", "192.0.2.10", 8080, l4) for _ in range(7)]
    conns6 = [connect(socket.AF_INET6, "2001:db8:c::7", "2001:db8:ffff::10", 8080, l6)
              for _ in range(3)]
    # IPv4 to the dual-stack listener: an AF_INET6 socket with ::ffff:192.0.2.10.
    mapped = [connect(socket.AF_INET, "198.51.100.7", "192.0.2.10", 9090, dual)
              for _ in range(2)]
    wait_counts({"192.0.2.10": 9, "192.0.2.11": 0, "2001:db8:ffff::10": 3},
                "counts of open connections")
    check(True, "IPv4, IPv6 and v4-mapped connections counted per VIP, an idle VIP at 0")

    # Close 4 IPv4 connections, the server side first (its socket goes to
    # TIME_WAIT, which the agent does not count).
    for c, a in conns4[:4]:
        a.close()
        c.close()
    wait_counts({"192.0.2.10": 5, "2001:db8:ffff::10": 3}, "closed connections leave")
    check(True, "closed connections leave the count (TIME_WAIT not counted)")

    # The list, authenticated.
    status, body = get("/connections", bearer=token)
    check(status == 200, f"list with the token: {status}")
    lst = json.loads(body)
    check(lst["total"] == 8 and lst["listed"] == 5 and lst["truncated"] is True and
          lst["cap"] == 5, f"list cut at --list-cap 5 of 8, says so: {lst}")
    status, body = get("/connections?vip=2001%3Adb8%3Affff%3A%3A10", bearer=token)
    lst = json.loads(body)
    got6 = sorted(e["client_port"] for e in lst["vips"]["2001:db8:ffff::10"])
    want6 = sorted(c.getsockname()[1] for c, _ in conns6)
    check(status == 200 and lst["truncated"] is False and got6 == want6 and
          all(e["client"] == "2001:db8:c::7" and e["vip_port"] == 8080
              for e in lst["vips"]["2001:db8:ffff::10"]),
          f"one VIP's list: client address and port of each connection: {got6} == {want6}")
    status, body = get("/connections?vip=192.0.2.10", bearer=token)
    lst = json.loads(body)
    ports = sorted((e["client_port"], e["vip_port"]) for e in lst["vips"]["192.0.2.10"])
    want4 = sorted([(c.getsockname()[1], 8080) for c, _ in conns4[4:]] +
                   [(c.getsockname()[1], 9090) for c, _ in mapped])
    check(ports == want4 and all(e["client"] == "198.51.100.7"
                                 for e in lst["vips"]["192.0.2.10"]),
          f"IPv4 list incl. the v4-mapped ones as IPv4: {ports}")

    # Refused: no token, a wrong one, a prefix of the right one.
    for bearer in (None, "x" * len(token), token[:-1]):
        status, _ = get("/connections", bearer=bearer)
        check(status == 401, f"list without the right token refused: {status}")
    got, _ = counts()
    check(got["spillway_backend_agent_refused_total"] == 3,
          f"refusals counted: {got['spillway_backend_agent_refused_total']}")

    # A malformed request: 400, counted, and the agent still serves.
    s = socket.create_connection(("127.0.0.1", PORT))
    s.sendall(b"NONSENSE\r\n\r\n")
    reply = s.recv(4096)
    s.close()
    check(reply.startswith(b"HTTP/1.1 400"), f"malformed request answered 400: {reply[:20]}")
    status, _ = get("/nowhere")
    check(status == 404, f"unknown path 404: {status}")
    got, _ = counts()
    check(got["spillway_backend_agent_bad_requests_total"] == 1 and got["192.0.2.10"] == 5,
          f"bad request counted, agent still counting: {got}")
    # Clients that connect and send nothing (70: more than the agent's 64
    # pending slots) delay no one: a scrape is answered while they hang
    # (one at a time, they would hold it for 70 x the 2 s read timeout), and
    # each is dropped and counted once its read timeout passes.
    silent = [socket.create_connection(("127.0.0.1", PORT)) for _ in range(70)]
    start = time.monotonic()
    got, _ = counts()
    print(f"  (answered beside 70 silent clients in {time.monotonic() - start:.3f} s)")
    check(got is not None and got["192.0.2.10"] == 5,
          "a scrape is answered while 70 silent clients hang")
    wait_counts({"spillway_backend_agent_bad_requests_total": 71},
                "silent clients dropped and counted")
    check(True, "every silent client dropped (6 as the oldest beyond 64 slots, 64 at the "
          "read timeout) and counted")
    for s_ in silent:
        s_.close()
    check(agent.poll() is None, "the agent is still running")
finally:
    agent.terminate()
    try:
        agent.wait(timeout=5)
    except subprocess.TimeoutExpired:
        agent.kill()
check(agent.returncode == 0, f"the agent exits 0 on SIGTERM: {agent.returncode}")
print(f"conn-agent: {checks} checks passed")
