"""Helpers shared by the scapy-driven e2e traffic scripts (decap_traffic.py,
af_xdp_redirect_traffic.py): a threaded TCP echo server, an L2 listener that
keeps frames until a matcher claims them, and counter polling."""
import os
import select
import socket
import threading
import time


def serve_echo(port, address4, address6, backlog, ready_path):
    """Answers "echo:<data>" to one read on (address4, port) and (address6,
    port), then closes; writes our pid to ready_path once listening. Never
    returns."""
    def handle(conn):
        conn.settimeout(10)
        try:
            data = conn.recv(4096)
            if data:
                conn.sendall(b"echo:" + data)
        except OSError:
            pass
        finally:
            conn.close()

    def listen(family, address):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((address, port))
        sock.listen(backlog)
        return sock

    listeners = [listen(socket.AF_INET, address4), listen(socket.AF_INET6, address6)]

    def accept_loop(sock):
        while True:
            conn, _ = sock.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threads = [threading.Thread(target=accept_loop, args=(s,), daemon=True) for s in listeners]
    for t in threads:
        t.start()
    with open(ready_path, "w") as ready:
        ready.write(str(os.getpid()))
    for t in threads:
        t.join()


class Wire:
    """One L2 listen socket opened before anything is sent, so no answer is
    missed; received frames are kept until a matcher claims them."""

    def __init__(self, iface):
        from scapy.all import conf
        self.iface = iface
        self.sock = conf.L2listen(iface=iface)
        self.seen = []

    def _drain(self, timeout):
        ready, _, _ = select.select([self.sock], [], [], max(timeout, 0))
        if ready:
            pkt = self.sock.recv()
            if pkt is not None:
                self.seen.append(pkt)

    def wait_for(self, match, deadline_s):
        end = time.monotonic() + deadline_s
        while True:
            for i, pkt in enumerate(self.seen):
                if match(pkt):
                    return self.seen.pop(i)
            remaining = end - time.monotonic()
            if remaining <= 0:
                return None
            self._drain(min(remaining, 0.1))

    def collect(self, window_s):
        end = time.monotonic() + window_s
        while time.monotonic() < end:
            self._drain(end - time.monotonic())


def wait_counter(read_counters, before, name, expected, exact, deadline_s):
    """Polls read_counters() until counter `name` rose by `expected` from
    `before` (exactly, or at least). Returns (reached, delta, counters now)."""
    end = time.monotonic() + deadline_s
    while True:
        now = read_counters()
        delta = now[name] - before[name]
        if delta == expected or (not exact and delta >= expected):
            return True, delta, now
        if (exact and delta > expected) or time.monotonic() > end:
            return False, delta, now
        time.sleep(0.02)


def summarize(prefix, results):
    """Prints "<prefix>: N passed, M failed" over (name, ok) results; returns
    the exit status (0 when nothing failed)."""
    passed = sum(1 for _, ok in results if ok)
    failed = len(results) - passed
    print(f"{prefix}: {passed} passed, {failed} failed", flush=True)
    return 0 if failed == 0 else 1


def main(doc, serve, run, serve_options, run_options, add_run_extras=None):
    """The scripts' command line: `serve` and `run` roles, each taking its
    required --options; add_run_extras(parser) adds the optional ones of run.
    Returns the exit status."""
    import argparse
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("serve")
    for name in serve_options:
        s.add_argument("--" + name, required=True)
    r = sub.add_parser("run")
    for name in run_options:
        r.add_argument("--" + name, required=True)
    if add_run_extras:
        add_run_extras(r)
    args = parser.parse_args()
    if args.role == "serve":
        serve(args)
        return 0
    return run(args)
