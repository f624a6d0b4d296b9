"""A tier estate's own watch and verdicts ([estate] instances = N): the
router's next hops for each VIP over time (sampled from its kernel FIB, which
FRR fills from BGP), each instance's tracked flows and announcement state,
and the invariants of the lb-* drills: how fast the router stops using an
instance that dies, drains or stops, that a joining instance is used only
after its warm-up, and that ECMP really spread the flows over the instances.
"""
import json
import subprocess
import time

import intent as intent_mod
from estate import VIP_FLOWS, VIP_GRPC, DrillError
from monitor import Sampler


def next_hops(route_json):
    """The gateways of `ip -j route show PREFIX` output: [] without a route,
    one for a single path, several for an ECMP (multipath) route."""
    hops = set()
    for r in route_json:
        if r.get("type", "unicast") != "unicast":
            continue
        if r.get("gateway"):
            hops.add(r["gateway"])
        for nh in r.get("nexthops", []):
            if nh.get("gateway"):
                hops.add(nh["gateway"])
    return sorted(hops)


class TierMonitor(Sampler):
    """Samples the router's routes every `period` s (changes only) and, on a
    thread of its own, each running instance's status and stats every
    `status_period` s: a status call to an instance frozen a moment after
    the list was taken waits for the socket's timeout (2 s), and must not
    hold up the router's samples (a withdrawal would read 2 s late)."""

    def __init__(self, estate, period=0.02, status_period=0.25, with_backends=False):
        super().__init__(period)
        self.e = estate
        self.with_backends = with_backends
        self.status_period = status_period
        self.router = []     # [(t, vip, [next hops])], a row per change
        self.instances = {n: [] for n in estate.instances}  # name -> [sample]
        self._last = {}
        self._status = _StatusSampler(self, status_period)
        # Backends whose drain the scenario judges on every instance.
        self.drains = set()
        if "drain_complete_every_instance_max_s" in estate.sc.get("invariants", {}):
            self.drains = {a["target"] for a in estate.sc.get("action", [])
                           if a.get("do") in ("drain", "remove")}

    def routes(self, vip):
        r = subprocess.run(["ip", "-j", "-n", self.e.ns("router"), "route", "show", vip],
                           capture_output=True, text=True, timeout=5)
        if r.returncode != 0:
            return None
        try:
            return next_hops(json.loads(r.stdout or "[]"))
        except ValueError:
            return None

    def sample_router(self):
        t = time.time()
        for vip in (VIP_FLOWS, VIP_GRPC):
            hops = self.routes(vip)
            if hops is not None and hops != self._last.get(vip):
                self._last[vip] = hops
                self.router.append((t, vip, hops))

    def sample_instances(self):
        for inst in self.e.running():
            t = time.time()
            row = {"t": t}
            try:
                st = inst.ctl.call("status")
                row.update(warmup=st.get("warmup"), announce=st.get("announce"),
                           tier=st.get("tier"))
            except (OSError, ValueError, DrillError):
                row["down"] = True
            if self.with_backends or (self.drains and not row.get("down")):
                # Each instance's own view of the backends: state and base
                # weight (what it holds of the operator's intent:
                # joins_with_intent), and for the drained ones its own count
                # and the drain's verdict (drain_complete_every_instance_max_s).
                try:
                    row["backends"] = {
                        b["name"]: {"state": b.get("state"), "base_weight": b.get("base_weight"),
                                    "live_flows": b.get("live_flows"),
                                    "backend_connections": b.get("backend_connections"),
                                    "drain_complete": (b.get("drain") or {}).get("complete"),
                                    "judged_by": (b.get("drain") or {}).get("judged_by")}
                        for b in inst.ctl.call("backend.list")}
                except (OSError, ValueError, DrillError, KeyError, TypeError):
                    pass
            try:
                with open(inst.stats) as f:
                    stats = json.load(f)
                row["flows"] = sum(w.get("flow_table_occupancy", 0) for w in stats["workers"])
                row["rx_packets"] = stats.get("rx_packets")
            except (OSError, ValueError, KeyError, TypeError):
                pass
            self.instances[inst.name].append(row)

    def start(self):
        super().start()
        self._status.start()

    def stop(self):
        super().stop()
        self._status.stop()

    def tick(self):
        try:
            self.sample_router()
        except (OSError, subprocess.SubprocessError):
            pass

    def write(self, path):
        with open(path, "w") as f:
            for t, vip, hops in self.router:
                f.write(json.dumps({"t": t, "vip": vip, "next_hops": hops}) + "\n")
            for name, rows in self.instances.items():
                for row in rows:
                    f.write(json.dumps(dict(row, instance=name)) + "\n")

    # -- queries ----------------------------------------------------------------
    def hops_at(self, vip, t):
        """The router's next hops for `vip` at time t (None before any sample)."""
        out = None
        for ts, v, hops in self.router:
            if v != vip:
                continue
            if ts > t:
                break
            out = hops
        return out

    def first_change(self, vip, after, predicate):
        """The time of the first router state at or after `after` whose next
        hops satisfy predicate (the state current at `after` counts at
        `after`)."""
        current = self.hops_at(vip, after)
        if current is not None and predicate(current):
            return after
        for ts, v, hops in self.router:
            if v == vip and ts >= after and predicate(hops):
                return ts
        return None

    def warm_since(self, name, after):
        """The first status sample of `name` at or after `after` that says its
        warm-up is over."""
        for row in self.instances.get(name, []):
            if row["t"] >= after and not row.get("down") and row.get("warmup") is False:
                return row["t"]
        return None

    def flow_counts(self, name):
        rows = [r for r in self.instances.get(name, []) if "flows" in r]
        if not rows:
            return {"max": None, "last": None}
        return {"max": max(r["flows"] for r in rows), "last": rows[-1]["flows"]}


class _StatusSampler(Sampler):
    """The TierMonitor's instance samples, on their own thread."""

    def __init__(self, monitor, period):
        super().__init__(period)
        self.monitor = monitor

    def tick(self):
        try:
            self.monitor.sample_instances()
        except (OSError, subprocess.SubprocessError):
            pass


def excused_windows(d):
    """New flows whose first SYN went to an instance the drill killed or
    froze, before the router stopped sending to it: lost with the instance,
    or waiting in a process that does not run (TCP retries after 1 s). From
    the kill or freeze until the router's last next hop through it went (or
    1 s, if it never went: router_withdraw_max_s / freeze_withdraw_max_s
    fail then)."""
    out, mon = [], d.tier_monitor
    for a in d.actions:
        if a["do"] not in ("kill-instance", "freeze-instance"):
            continue
        x = d.e.instances[a["target"]].address
        gone = [mon.first_change(v, a["t"], lambda h: x not in h) for v in (VIP_FLOWS, VIP_GRPC)]
        until = max((g for g in gone if g is not None), default=a["t"] + 1.0)
        out.append((a["t"], until + 0.1, f"{a['do']} {a['target']} at {a['at']} s"))
    return out


def last_table_change(samples, before):
    """The time of the last control sample before `before` whose table
    entries differ from the sample preceding it (None: none changed)."""
    last, prev = None, None
    for s in samples:
        if s.get("down") or s["t"] >= before:
            continue
        if prev is not None and s["entries"] != prev:
            last = s["t"]
        prev = s["entries"]
    return last


def intent_mismatches(row, intended_states, intended_weights):
    """What an instance's sampled backend list (row["backends"]) shows that
    differs from the operator's intent: [text] (empty when it honours it)."""
    shown = row.get("backends")
    if shown is None:
        return ["no backend list in the sample"]
    out = []
    for name, want in intended_states.items():
        got = shown.get(name, {}).get("state")
        if got not in intent_mod.REPORTED_OK.get(want, {want}):
            out.append(f"{name} {got} (intended {want})")
    for name, want in intended_weights.items():
        got = shown.get(name, {}).get("base_weight")
        if name in shown and got != want:
            out.append(f"{name} base weight {got} (intended {want})")
    return out


def judge_joins_with_intent(d, check, rel, out):
    """joins_with_intent: a joining instance holds every operator change made
    through the tier before it joined (drains, weights...), in every status
    sample from the moment the router first sends to it, and it said that
    its intent agreed with its peers'."""
    e, mon = d.e, d.tier_monitor
    sc = d.sc
    names = sorted(e.backends)
    intended = intent_mod.Intent(names, sc.get("start_members", names), sc["weights"], d.actions)
    for a in d.actions:
        if a["do"] != "start-instance":
            continue
        name = a["target"]
        x = e.instances[name].address
        t_add = mon.first_change(VIP_FLOWS, a["t"], lambda h, x=x: x in h)
        if t_add is None:
            check(f"joins_with_intent[{name}]", False,
                  f"{name} never in the router's next hops after its start")
            continue
        rows = [r for r in mon.instances.get(name, []) if r["t"] >= t_add and
                not r.get("down") and "backends" in r]
        bad = []
        for r in rows:
            # The intent as of the sample, less the actions of the last
            # status period (a change the operator makes while the sample is
            # taken may show in the next one).
            t_i = r["t"] - mon.status_period
            miss = intent_mismatches(r, intended.states(t_i), intended.weights_at(t_i))
            agreed = ((r.get("tier") or {}).get("intent") or {}).get("agreed")
            if agreed is False:
                miss.append("its tier intent did not agree with its peers'")
            if miss:
                bad.append((r["t"], miss))
        first = rows[0] if rows else None
        join = next((j for j in out["joins"] if j["instance"] == name and j["at"] == a["at"]),
                    None)
        if join is not None:
            join["intent_samples"] = len(rows)
            join["intent_mismatched_samples"] = len(bad)
            join["first_sample_after_join_s"] = (round(first["t"] - t_add, 3)
                                                 if first else None)
        check(f"joins_with_intent[{name}]", bool(rows) and not bad,
              f"{name} joined {round(t_add - a['t'], 3)} s after its start; "
              f"{len(rows)} status samples from then, "
              + (f"{len(bad)} differ from the operator's intent, first at "
                 f"{rel(bad[0][0])} s: {'; '.join(bad[0][1])}" if bad else
                 "every one holds the operator's intent" if rows else "none taken"))


def judge_tier(d, check, rel):
    """The tier invariants; returns the report's "tier" measurements."""
    e, inv, mon = d.e, d.sc["invariants"], d.tier_monitor
    addr = {n: i.address for n, i in e.instances.items()}
    out = {"instances": {}, "router": [], "withdrawals": [], "joins": [], "thaws": []}
    for name in e.instances:
        out["instances"][name] = mon.flow_counts(name)
    out["router"] = [{"t": rel(t), "vip": vip, "next_hops": hops}
                     for t, vip, hops in mon.router]
    for a in d.actions:
        name = a.get("target")
        # A frozen process withdraws nothing itself: its freeze guard does,
        # within [announce] freeze_ms + a period + the speaker's update.
        bound = inv.get("freeze_withdraw_max_s" if a["do"] == "freeze-instance"
                        else "router_withdraw_max_s")
        if a["do"] == "thaw-instance":
            t_back = mon.first_change(VIP_FLOWS, a["t"], lambda h, x=addr[name]: x in h)
            out["thaws"].append({"at": a["at"], "instance": name,
                                 "announced_after_s": round(t_back - a["t"], 3)
                                 if t_back else None})
            check(f"rejoins_after_thaw[{name}]", t_back is not None,
                  f"{name} back in the router's next hops "
                  f"{round(t_back - a['t'], 3) if t_back else 'never'} s after SIGCONT")
        if a["do"] in ("kill-instance", "stop-instance", "lb-drain", "freeze-instance"):
            row = {"at": a["at"], "do": a["do"], "instance": name}
            # How settled the tables were: flows on entries that moved less
            # than one export before an instance dies may go with it.
            t_change = last_table_change(d.monitor.samples, a["t"])
            row["tables_unchanged_for_s"] = (round(a["t"] - t_change, 3)
                                             if t_change is not None else None)
            # The instance's own last table step, from its status just before
            # the action (the monitored instance's tables may have settled
            # earlier than the dying one's).
            row["own_tables_unchanged_for_s"] = a.get("own_tables_quiet_s")
            for vip in (VIP_FLOWS, VIP_GRPC):
                t = mon.first_change(vip, a["t"], lambda h, x=addr[name]: x not in h)
                row[vip] = round(t - a["t"], 3) if t is not None else None
            out["withdrawals"].append(row)
            if bound is not None:
                worst = [row[v] for v in (VIP_FLOWS, VIP_GRPC)]
                ok = all(w is not None and w <= bound for w in worst)
                check(f"router_withdraw[{a['do']} {name}]", ok,
                      f"the router stopped using {name} ({addr[name]}) "
                      f"{', '.join(f'{v} after {w} s' if w is not None else f'{v}: never' for v, w in zip((VIP_FLOWS, VIP_GRPC), worst))}"
                      f" (at most {bound})")
        elif a["do"] == "start-instance":
            t_add = mon.first_change(VIP_FLOWS, a["t"], lambda h, x=addr[name]: x in h)
            t_warm = mon.warm_since(name, a["t"])
            row = {"at": a["at"], "instance": name,
                   "announced_after_s": round(t_add - a["t"], 3) if t_add else None,
                   "warm_after_s": round(t_warm - a["t"], 3) if t_warm else None}
            out["joins"].append(row)
            if inv.get("joins_after_warmup"):
                # The status poll runs every status_period: a route that
                # appears before the first "warm" sample by less than that is
                # not evidence of an early announcement.
                ok = t_add is not None and t_warm is not None and \
                    t_add >= t_warm - mon.status_period - 0.05
                check(f"join_after_warmup[{name}]", ok,
                      f"{name} in the router's next hops {row['announced_after_s']} s after "
                      f"its start, warm-up over by {row['warm_after_s']} s")
    if inv.get("joins_with_intent"):
        judge_joins_with_intent(d, check, rel, out)
    if "drain_complete_every_instance_max_s" in inv:
        out["drains"] = judge_drains_everywhere(d, check, rel)
    if inv.get("instances_carry_flows"):
        for name, counts in out["instances"].items():
            ok = counts["max"] is not None and counts["max"] > 0
            check(f"carries_flows[{name}]", ok,
                  f"{name} tracked at most {counts['max']} flows (ECMP must spread flows over "
                  f"every instance, or the drill proves nothing about moving them)")
    return out


def judge_drains_everywhere(d, check, rel):
    """A drain completes on every instance within the bound after its last
    flows were closed (close-flows), and on none before: each running
    instance's own samples of the backend (drain.complete, or removed)."""
    mon, bound = d.tier_monitor, d.sc["invariants"]["drain_complete_every_instance_max_s"]
    out = []
    for a in d.actions:
        if a["do"] != "close-flows" or a["target"] not in mon.drains:
            continue
        target, t_close = a["target"], a["t"]
        started = [x["t"] for x in d.actions if x["do"] in ("drain", "remove") and
                   x["target"] == target and x["t"] <= t_close]
        t_drain = max(started) if started else None
        for name, rows in mon.instances.items():
            seen = [r for r in rows if target in r.get("backends", {})]
            if not seen or t_drain is None:
                continue

            def done(r):
                b = r["backends"][target]
                return b["drain_complete"] is True or b["state"] == "removed"
            early = [r for r in seen if t_drain <= r["t"] < t_close and done(r)]
            after = [r for r in seen if r["t"] >= t_close]
            first = next((r for r in after if done(r)), None)
            alive_at_end = bool(after) and not after[-1].get("down")
            # The instance's own count once the bound had passed: above zero,
            # the count alone would have held the drain open (entries of flows
            # ECMP moved away stay established for 7,200 s).
            late = [r for r in after if r["t"] >= t_close + bound] or after[-1:]
            row = {"instance": name, "target": target, "at": a["at"],
                   "complete_s": round(first["t"] - t_close, 3) if first else None,
                   "judged_by": first["backends"][target]["judged_by"] if first else None,
                   "own_flows_at_completion":
                       first["backends"][target]["live_flows"] if first else None,
                   "completed_early_at": rel(early[0]["t"]) if early else None,
                   "own_flows_after_bound":
                       late[0]["backends"][target]["live_flows"] if late else None}
            out.append(row)
            check(f"drain_never_early[{name} {target}]", not early,
                  f"{name} showed the drain of {target} complete at "
                  f"{row['completed_early_at']} s, before its flows were closed "
                  f"({rel(t_close)} s)" if early else
                  f"{name} never showed the drain of {target} complete before its flows "
                  f"were closed")
            if alive_at_end:
                check(f"drain_complete[{name} {target}]",
                      first is not None and first["t"] - t_close <= bound,
                      f"{name}: the drain of {target} complete {row['complete_s']} s after its "
                      f"last flows were closed, judged by {row['judged_by']} with "
                      f"{row['own_flows_at_completion']} flows still tracked there "
                      f"(at most {bound} s)")
        # The drill proves the point only if some instance's own count still
        # held flows of the backend once the bound had passed (entries of
        # flows ECMP had moved away): the count alone would not have completed.
        stale = [r for r in out if r["target"] == target and r["at"] == a["at"] and
                 (r["own_flows_after_bound"] or 0) > 0]
        check(f"drain_outvoted_stale_entries[{target}]", bool(stale),
              f"instances whose own count still held flows of {target} {bound} s after they "
              f"closed: {', '.join(r['instance'] + ' (' + str(r['own_flows_after_bound']) + ')' for r in stale) or 'none'} "
              f"(ECMP must have moved flows for the drill to prove anything)")
    return out
