"""Talking to a running spillwayd: Ctl runs spillwayctl --json (what an
operator types), CliSocket speaks the CLI socket directly
(src/control/api/protocol.hpp) for frequent reads. Both raise Fail on an
error reply.

Thread contract: one caller at a time per object; each call opens its own
process or connection.
"""
import json
import socket
import subprocess

from estate_harness.estate import Fail


class Ctl:
    """spillwayctl --json against the estate's daemon."""

    def __init__(self, exe, sock):
        self.exe, self.sock = exe, sock

    def raw(self, *args, timeout=10):
        return subprocess.run([self.exe, "--socket", self.sock, "--json"] + [str(a) for a in args],
                              capture_output=True, text=True, timeout=timeout)

    def __call__(self, *args):
        r = self.raw(*args)
        if r.returncode != 0:
            raise Fail(f"spillwayctl {' '.join(map(str, args))} exited {r.returncode}: "
                       f"{r.stderr.strip()[-400:]}")
        try:
            return json.loads(r.stdout)
        except ValueError:
            raise Fail(f"spillwayctl {' '.join(map(str, args))}: not JSON: {r.stdout[:300]!r}") \
                from None

    # -- views ----------------------------------------------------------------
    def backends(self):
        return {b["name"]: b for b in self("backend", "list")}

    def entries(self, vip=None):
        """{vip: {backend: entries}} from table show."""
        t = self("table", "show", *([vip] if vip else []))
        return {v["vip"]: {b["backend"]: b["entries"] for b in v["backends"]} for v in t["tables"]}

    def pool_share(self, vip, pool):
        return {p["pool"]: p["share"] for p in self("vip", "show", vip).get("pools", [])}.get(pool)

    def events(self):
        """Every event in the daemon's log, page by page."""
        out, after = [], 0
        while True:
            page = self("events", "--after", after, "--limit", 1000)
            out += page["events"]
            if len(page["events"]) < 1000 or page["next"] <= after:
                return out
            after = page["next"]


class CliSocket:
    """The CLI socket spoken directly (src/control/protocol.hpp), for the
    monitor's frequent reads; operator actions go through spillwayctl."""

    def __init__(self, path):
        self.path = path

    def call(self, cmd, **args):
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.settimeout(2.0)
            s.connect(self.path)
            s.send(json.dumps({"v": 1, "cmd": cmd, "args": args}).encode())
            reply = json.loads(s.recv(1 << 22))
        if not reply.get("ok"):
            raise Fail(f"{cmd}: {reply.get('error')}")
        return reply["result"]
