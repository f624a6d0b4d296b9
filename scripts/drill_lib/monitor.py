"""Samples spillwayd's control plane while a drill runs: each backend's
state, live flows and Maglev entries, each VIP's pool shares and the
snapshot generation, every `period` seconds, straight from the CLI socket
(src/control/protocol.hpp). Detection times, table removals, drain
completion and table churn are read from these samples.

A sample that cannot be taken (spillwayd restarting in the lb-restart drill)
is recorded as {"t": ..., "down": true}. Each sample also keeps the daemon's
`status` "checkpoint" object when it reports one (the flow-exception
checkpoint, issue #10) and its uptime, so the crash drill can state its loss
window.
"""
import json
import threading
import time

from estate import DrillError


class Sampler:
    """A daemon thread that calls self.tick() every `period` s until stop()."""

    def __init__(self, period):
        self.period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join(5)

    def _run(self):
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.period)


class Monitor(Sampler):
    def __init__(self, ctl, vips, period=0.1, aliases=None):
        super().__init__(period)
        self.ctl = ctl
        self.vips = vips
        self.samples = []
        # spillwayd's name -> the estate's (a backend discovered from DNS is
        # named after its address, d-10-2-0-5: discovery.aliases).
        self.aliases = aliases or {}

    def _take(self):
        t = time.time()
        try:
            # Tables before states: a backend's state changes before its
            # table entries do, so a sample never shows it out of the tables
            # and not yet failed (a report would say "out of the tables"
            # before "detected").
            tables = self.ctl.call("table.show")
            backends = self.ctl.call("backend.list")
            # States are as of this answer, after `t`: an action that began
            # between the two may already show (the judge's intent check).
            t_states = time.time()
            status = self.ctl.call("status")
            shares, preferred = {}, {}
            for vip in self.vips:
                shown = self.ctl.call("vip.show", name=vip)
                shares[vip] = {p["pool"]: p["share"] for p in shown.get("pools", [])}
                # The preferred region per priority level that has one.
                preferred[vip] = {str(p["priority"]): p["pool"] for p in shown.get("pools", [])
                                  if p.get("preferred")}
        except (OSError, ValueError, DrillError):
            return {"t": t, "down": True}
        entries = {}
        for table in tables["tables"]:
            for b in table["backends"]:
                name = self.aliases.get(b["backend"], b["backend"])
                entries.setdefault(name, {})[table["vip"]] = b["entries"]
        return {
            "t": t,
            "t_states": t_states,
            "generation": tables["generation"],
            "backends": {self.aliases.get(b["name"], b["name"]): {"state": b.get("state"), "health": b.get("health"),
                                     "live_flows": b.get("live_flows"),
                                     "drain_complete": (b.get("drain") or {}).get("complete"),
                                     "admin": b.get("admin"),
                                     "base_weight": b.get("base_weight"),
                                     "gpu": b.get("gpu_utilization"),
                                     "queue": b.get("queue_depth"),
                                     "saturated": b.get("saturated"),
                                     "latency_ms": b.get("latency_ms"),
                                     "latency": b.get("latency"),
                                     "latency_factor": b.get("latency_factor")}
                         for b in backends},
            "entries": entries,
            "table_size": {t_["vip"]: t_["table_size"] for t_ in tables["tables"]},
            "shares": shares,
            "preferred": preferred,
            "uptime_ms": status.get("uptime_ms"),
            "checkpoint": status.get("checkpoint"),
            "warmup": status.get("warmup"),
            "warmup_ms": status.get("warmup_ms"),
        }

    def tick(self):
        self.samples.append(self._take())

    def write(self, path):
        with open(path, "w") as f:
            for s in self.samples:
                f.write(json.dumps(s) + "\n")

    # -- queries over the samples ------------------------------------------------
    def first(self, after, predicate):
        """The time of the first sample at or after `after` for which
        predicate(sample) holds (samples while down are skipped)."""
        for s in self.samples:
            if s["t"] >= after and not s.get("down") and predicate(s):
                return s["t"]
        return None

    def left_tables(self, name, after, until=None):
        """When the backend left every table for good after `after`: the first
        sample of the last run of samples (up to `until`) in which it owns no
        entry. None when it still owns entries at the end of the window. A
        backend that had none yet and entered later is not "out" until it
        leaves again (the first zero sample alone would be fooled by it)."""
        out = None
        for s in self.samples:
            if s["t"] < after or s.get("down"):
                continue
            if until is not None and s["t"] > until:
                break
            if sum(s["entries"].get(name, {}).values()) == 0:
                if out is None:
                    out = s["t"]
            else:
                out = None
        return out

    def state_changes(self, name, since=0.0):
        """[(t, from, to)] of a backend's effective state over the samples."""
        out, last = [], None
        for s in self.samples:
            if s.get("down") or s["t"] < since:
                continue
            state = s["backends"].get(name, {}).get("state")
            if last is not None and state != last:
                out.append((s["t"], last, state))
            last = state
        return out

    def region_changes(self, vip):
        """[(t, level, from, to)] of a VIP's preferred region per priority
        level over the samples (the first choice, from none, is not one)."""
        out, last = [], {}
        for s in self.samples:
            if s.get("down"):
                continue
            for level, pool in s.get("preferred", {}).get(vip, {}).items():
                if last.get(level) not in (None, pool):
                    out.append((s["t"], level, last[level], pool))
                last[level] = pool
        return out

    def churn(self, vip, interval, since=0.0, until=None):
        """The most table entries of a VIP that changed owner within any
        window shorter than the churn interval (0.9 of it, so that one window
        never holds two of the control plane's steps), bounded from below by
        the entry counts: half the sum of |change| per backend between the
        first and last sample of each window (a reassignment that keeps every
        count is invisible here; Maglev moves for weight changes always
        change counts)."""
        points = [s for s in self.samples if not s.get("down") and s["t"] >= since and
                  (until is None or s["t"] <= until)]
        worst = 0
        for i, a in enumerate(points):
            for b in points[i + 1:]:
                if b["t"] - a["t"] >= 0.9 * interval:
                    break
                names = set(a["entries"]) | set(b["entries"])
                moved = sum(abs(b["entries"].get(n, {}).get(vip, 0) -
                                a["entries"].get(n, {}).get(vip, 0)) for n in names) // 2
                worst = max(worst, moved)
        return worst
