"""Judges a finished drill: classifies every flow, measures the control
plane's reactions from the monitor's samples, and checks each invariant the
scenario names. Returns the measurements and a list of verdicts
{"name", "ok", "detail"}.

The share formula is implemented here from its documentation
(conf/spillway.example.toml, [policy]: saturation with hysteresis, load
factors, priority levels with overprovisioning, panic), not from the C++: the
drill computes the pools' expected shares from what the exporters were told
to report and compares both the control plane's own figure and the measured
share of new flows with it. Load smoothing is not modelled: scenarios that
judge shares scrape unsmoothed (smoothing = 1) and open their windows after
the load has settled.
"""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "e2e"))
import maglev_model  # noqa: E402
from estate import CLIENT, DATA_PORT, VIP_FLOWS  # noqa: E402

BROKEN_STATES = {"reset", "corrupt", "connect_failed"}
TAKEDOWN = {"kill", "link-down"}
LEAVE = {"kill", "link-down", "drain", "remove", "disable"}


def per_target(limit, target):
    """A limit given as a number, or as a table per backend name."""
    return limit.get(target, float("inf")) if isinstance(limit, dict) else limit


def flow_broken(f, stall_ms):
    return f["state"] in BROKEN_STATES or (f.get("max_stall_ms") or 0) > stall_ms


def classify(flows, victims, stall_ms, backend_key="backend"):
    out = {"total": len(flows), "broken_theirs": 0, "broken_others": 0, "by_backend": {},
           "broken_list": [], "longest_stall_ms": 0}
    for f in flows:
        b = f.get(backend_key) or "(none)"
        row = out["by_backend"].setdefault(b, {"flows": 0, "broken": 0})
        row["flows"] += 1
        if not flow_broken(f, stall_ms):
            # How long a surviving flow went silent (a restart's pause).
            out["longest_stall_ms"] = max(out["longest_stall_ms"], f.get("max_stall_ms") or 0)
        else:
            row["broken"] += 1
            theirs = b in victims
            out["broken_theirs" if theirs else "broken_others"] += 1
            out["broken_list"].append({"id": f.get("id"), "backend": b, "state": f["state"],
                                       "max_stall_ms": f.get("max_stall_ms"), "theirs": theirs})
    return out


POLICY_DEFAULTS = {"gpu_high": 90.0, "gpu_low": 75.0, "queue_high": 16.0, "queue_low": 4.0,
                   "overprovisioning": 1.4, "min_load_factor": 0.1, "panic_threshold": 0.5}


def load_factors(sc, pool_of, history, until):
    """Each backend's load factor at time `until`, replaying the exporters'
    values in order (the start values, then every set-load up to `until`)
    through the saturation hysteresis: saturated on reaching gpu_high or
    queue_high, released only at gpu_low and queue_low or below. Backends of
    pools without load feedback have no load signal: factor 1."""
    pol = dict(POLICY_DEFAULTS, **sc.get("policy", {}))
    out = {}
    for name, pool in pool_of.items():
        load = sc["pools"].get(pool, {}).get("load")
        if not load:
            out[name] = 1.0
            continue
        values = [(load.get("gpu", 10), load.get("queue", 0))]
        values += [(a["gpu"], a["queue"]) for a in history
                   if a["do"] == "set-load" and a["t"] <= until and name in a["targets"]]
        saturated = False
        for gpu, queue in values:
            if gpu >= pol["gpu_high"] or queue >= pol["queue_high"]:
                saturated = True
            elif gpu <= pol["gpu_low"] and queue <= pol["queue_low"]:
                saturated = False
        gpu, queue = values[-1]
        if not saturated:
            out[name] = 1.0
            continue
        pg = min(max((gpu - pol["gpu_low"]) / (100 - pol["gpu_low"]), 0), 1)
        pq = min(max((queue - pol["queue_low"]) / (2 * pol["queue_high"] - pol["queue_low"]),
                     0), 1)
        out[name] = max(pol["min_load_factor"], 1 - max(pg, pq))
    return out


def expected_shares(sc, pool_of, lf, states, vip_pools):
    """Pool shares of new flows per the documented policy formula. lf: name
    -> load factor (load_factors); states: name -> effective state (active /
    draining / failed / disabled / removed)."""
    pol = dict(POLICY_DEFAULTS, **sc.get("policy", {}))
    weights = sc["weights"]
    counted = [n for n, p in pool_of.items() if p in vip_pools and
               states.get(n) not in ("disabled", "removed", None)]
    active = [n for n in counted if states.get(n) == "active"]
    total_w = sum(weights.get(n, 100) for n in counted)
    healthy = sum(weights.get(n, 100) for n in active) / total_w if total_w else 0.0
    if healthy < pol["panic_threshold"]:
        # Panic: priorities and load ignored, active backends by base weight.
        act_w = sum(weights.get(n, 100) for n in active)
        return {p: (sum(weights.get(n, 100) for n in active if pool_of[n] == p) / act_w
                    if act_w else 0.0) for p in vip_pools}
    levels = sorted({sc["pools"][p].get("priority", 0) for p in vip_pools})
    shares, used = {}, 0.0
    for k in levels:
        pools = [p for p in vip_pools if sc["pools"][p].get("priority", 0) == k]
        members = [n for n in counted if pool_of[n] in pools]
        total = sum(weights.get(n, 100) for n in members)
        a = sum(weights.get(n, 100) * lf[n] for n in members
                if states.get(n) == "active") / total if total else 0.0
        s = min(1 - used, a * pol["overprovisioning"])
        level_cap = sum(weights.get(n, 100) * lf[n] for n in members if states.get(n) == "active")
        for p in pools:
            # Pools of one level share its s_k by their active capacity.
            cap = sum(weights.get(n, 100) * lf[n] for n in members
                      if pool_of[n] == p and states.get(n) == "active")
            shares[p] = s * (cap / level_cap if level_cap else 0.0)
        used += s
    total = sum(shares.values())
    if 0 < total < 1:
        shares = {p: v / total for p, v in shares.items()}
    return shares


def judge(d):
    sc, inv, mon = d.sc, d.sc["invariants"], d.monitor
    stall = sc["stall_ms"]
    t0 = d.t0
    verdicts = []

    def check(name, ok, detail):
        verdicts.append({"name": name, "ok": bool(ok), "detail": detail})

    victims = set(d.victims)
    flows = classify(d.flow_report["flows"], victims, stall)
    grpc = classify(d.grpc_report["streams"], victims, stall) if d.grpc_report else None
    elephants = d.elephant_results
    ele_theirs = sum(1 for x in elephants if x["broken"] and x["backend"] in victims)
    ele_others = sum(1 for x in elephants if x["broken"] and x["backend"] not in victims)
    others = flows["broken_others"] + (grpc["broken_others"] if grpc else 0) + ele_others
    theirs = flows["broken_theirs"] + (grpc["broken_theirs"] if grpc else 0) + ele_theirs
    m = {"flows": flows, "grpc": grpc, "elephants": elephants,
         "broken_theirs": theirs, "broken_others": others, "victims": sorted(victims),
         "reactions": [], "shares": [], "restarts": d.restarts}

    # Reactions: detection (state failed) and the new snapshot without the
    # backend, per action that takes one away.
    for a in d.actions:
        if a["do"] not in LEAVE:
            continue
        target = a["target"]
        r = {"at": a["at"], "do": a["do"], "target": target}
        if a["do"] in TAKEDOWN:
            t = mon.first(a["t"], lambda s: s["backends"].get(target, {}).get("state") ==
                          "failed")
            r["detection_s"] = round(t - a["t"], 3) if t else None
        t = mon.first(a["t"], lambda s: sum(s["entries"].get(target, {}).values()) == 0)
        r["table_removal_s"] = round(t - a["t"], 3) if t else None
        if t:
            # Until the next action on the same backend (a restart, undrain...).
            until = min([b["t"] for b in d.actions if b.get("target") == target and
                         b["t"] > a["t"]] + [float("inf")])
            late = [p for p in d.flow_report["probes"] if p["ok"] and p["backend"] == target
                    and t + 0.3 < p["t"] < until]
            r["new_flows_after_removal"] = len(late)
        m["reactions"].append(r)

    # Drains completing: after the flows on a draining backend were closed.
    for a in d.actions:
        if a["do"] != "close-flows":
            continue
        target = a["target"]
        t = mon.first(a["t"], lambda s: target not in s["backends"] or
                      s["backends"][target]["state"] == "removed" or
                      (s["backends"][target]["state"] == "draining" and
                       s["backends"][target]["live_flows"] == 0))
        m["reactions"].append({"at": a["at"], "do": "drain-complete", "target": target,
                               "complete_s": round(t - a["t"], 3) if t else None})

    # Share of new flows per pool, in the scenario's windows.
    pool_of = {n: b["pool"] for n, b in d.e.backends.items()}
    for w in inv.get("share", []):
        lo, hi = t0 + w["from"], t0 + w["to"]
        probes = [p for p in d.flow_report["probes"] if lo <= p["t"] <= hi and p["ok"]]
        measured = {}
        for p in probes:
            pool = pool_of.get(p["backend"], "?")
            measured[pool] = measured.get(pool, 0) + 1
        n = len(probes)
        measured = {p: c / n for p, c in measured.items()} if n else {}
        lf = load_factors(sc, pool_of, d.actions, lo)
        mid = [s for s in mon.samples if lo <= s["t"] <= hi and not s.get("down")]
        states = {n: v["state"] for n, v in mid[-1]["backends"].items()} if mid else {}
        expect = expected_shares(sc, pool_of, lf, states, list(sc["pools"]))
        reported = mid[-1]["shares"].get("nccl", {}) if mid else {}
        m["shares"].append({"from": w["from"], "to": w["to"], "probes": n,
                            "measured": {p: round(v, 3) for p, v in measured.items()},
                            "expected": {p: round(v, 3) for p, v in expect.items()},
                            "reported": {p: round(v, 3) for p, v in reported.items()}})

    # Placement: until the first action, every new flow (long-lived or probe)
    # must land where the independent Maglev model puts it from the starting
    # configuration (the tables are a pure function of configuration + seed).
    first = min([a["t"] for a in d.actions] + [float("inf")])
    model = maglev_model.Model(d.e.config)
    placed = [(f["local_port"], f["backend"]) for f in d.flow_report["flows"]
              if f.get("backend") and f.get("local_port") and f["opened"] < first]
    placed += [(p["local_port"], p["backend"]) for p in d.flow_report["probes"]
               if p["ok"] and p.get("local_port") and p["t"] < first]
    wrong = [(port, got, model.backend(CLIENT, port, VIP_FLOWS, DATA_PORT))
             for port, got in placed
             if model.backend(CLIENT, port, VIP_FLOWS, DATA_PORT) != got]
    m["placement"] = {"checked": len(placed), "wrong": len(wrong)}
    check("placement", placed and not wrong,
          f"{len(placed) - len(wrong)} of {len(placed)} new flows before the first action on "
          f"the backend the Maglev model predicts" +
          (f"; first mismatches (port, got, model): {wrong[:5]}" if wrong else ""))

    # -- the invariants the scenario names ------------------------------------------------
    if "others_broken_max" in inv:
        check("others_broken", others <= inv["others_broken_max"],
              f"{others} flows broken on backends no action took down "
              f"(at most {inv['others_broken_max']})")
    if "victims_broken_min" in inv:
        check("victims_broken", theirs >= inv["victims_broken_min"],
              f"{theirs} flows of {', '.join(sorted(victims)) or 'no victim'} broken "
              f"(the drill's failure must hit them: at least {inv['victims_broken_min']})")
    if inv.get("all_flows_keep_backend"):
        total = others + theirs
        check("all_flows_keep_backend", total == 0,
              f"{total} flows broken or moved (a flow that moves is reset by its new backend)")
    for r in m["reactions"]:
        if "detection_s" in r and "detection_max_s" in inv:
            v, limit = r["detection_s"], per_target(inv["detection_max_s"], r["target"])
            check(f"detection[{r['target']}]", v is not None and v <= limit,
                  f"{r['do']} at {r['at']} s: failed after {v} s (at most {limit})")
        if "table_removal_s" in r and "table_removal_max_s" in inv:
            v, limit = r["table_removal_s"], per_target(inv["table_removal_max_s"], r["target"])
            check(f"table_removal[{r['target']}]", v is not None and v <= limit,
                  f"{r['do']} at {r['at']} s: out of every table after {v} s (at most {limit})")
        if "new_flows_after_removal" in r and inv.get("new_flows_avoid"):
            check(f"new_flows_avoid[{r['target']}]", r["new_flows_after_removal"] == 0,
                  f"{r['new_flows_after_removal']} new flows reached {r['target']} after its "
                  f"entries left the tables")
        if r["do"] == "drain-complete" and "drain_complete_max_s" in inv:
            v = r["complete_s"]
            check(f"drain_complete[{r['target']}]", v is not None and
                  v <= inv["drain_complete_max_s"],
                  f"drain of {r['target']} complete {v} s after its last flows were closed "
                  f"(at most {inv['drain_complete_max_s']})")
    for name in inv.get("receives_new_flows", []):
        added = [a["t"] for a in d.actions if a.get("target") == name]
        since = added[0] if added else t0
        got = sum(1 for p in d.flow_report["probes"]
                  if p["ok"] and p["backend"] == name and p["t"] >= since)
        check(f"receives_new_flows[{name}]", got > 0, f"{got} new flows reached {name}")
    for name, limit in inv.get("state_changes_max", {}).items():
        changes = mon.state_changes(name)
        check(f"state_changes[{name}]", len(changes) <= limit,
              f"{len(changes)} state changes (at most {limit}): " +
              ", ".join(f"{round(t - t0, 2)} s {a}->{b}" for t, a, b in changes))
    if "stable_until" in inv:
        until = t0 + inv["stable_until"]
        changes = [(n, t, a, b) for n in d.e.backends for t, a, b in mon.state_changes(n)
                   if t <= until]
        check("stable", not changes,
              f"{len(changes)} backend state changes before {inv['stable_until']} s" +
              ("" if not changes else ": " + ", ".join(
                  f"{n} {round(t - t0, 2)} s {a}->{b}" for n, t, a, b in changes)))
    tol = inv.get("share_tolerance", 0.12)
    for s in m["shares"]:
        for pool, want in s["expected"].items():
            got = s["measured"].get(pool, 0.0)
            rep = s["reported"].get(pool)
            # Sampling error of the probes (3 sigma) on top of the tolerance.
            sigma = math.sqrt(max(want * (1 - want), 0.01) / max(s["probes"], 1))
            ok = s["probes"] >= 20 and abs(got - want) <= tol + 3 * sigma and \
                rep is not None and abs(rep - want) <= 0.02
            check(f"share[{s['from']}-{s['to']} s, {pool}]", ok,
                  f"new flows {got:.3f} of {s['probes']}, control plane {rep}, formula "
                  f"{want:.3f} (tolerance {tol} + 3 sigma {3 * sigma:.3f}; control plane 0.02)")
    for a in d.actions:
        if a["do"] == "flap" and a["what"] == "health":
            # The flap must really have failed health checks, or the drill
            # proves nothing about damping.
            h = d.health_end.get(a["target"], {})
            check(f"flap_effective[{a['target']}]", (h.get("failures") or 0) > 0,
                  f"{h.get('failures')} failed health checks of {a['target']} "
                  f"out of {h.get('probes')}")
        if a["do"] == "flap" and a["what"] == "load":
            sat = [s for s in mon.samples if not s.get("down") and
                   s["backends"].get(a["target"], {}).get("saturated")]
            check(f"flap_effective[{a['target']}]", len(sat) > 0,
                  f"{a['target']} seen saturated in {len(sat)} control samples")
    if inv.get("churn_within_budget"):
        pol = sc.get("policy", {})
        budget, interval = pol.get("churn_budget", 0.05), pol.get("churn_interval", 1.0)
        up = [x for x in mon.samples if not x.get("down")]
        if not up or interval <= 3 * mon.period:
            check("churn", False, "no control-plane sample to judge churn by" if not up else
                  f"churn_interval {interval} s is too short for the monitor's "
                  f"{mon.period} s samples")
        for vip, size in (up[0]["table_size"] if up else {}).items():
            limit = max(1, math.floor(budget * size))
            worst = mon.churn(vip, interval)
            check(f"churn[{vip}]", worst <= limit,
                  f"at most {worst} entries moved per churn interval ({interval} s); "
                  f"budget {limit} ({budget} of {size})")
    if "restart_outage_max_s" in inv:
        for r in d.restarts:
            check("restart_outage", r["outage_s"] <= inv["restart_outage_max_s"],
                  f"spillwayd down and ready again in {r['outage_s']} s "
                  f"(at most {inv['restart_outage_max_s']})")
    for a in d.actions:
        if a["result"] != "ok":
            check(f"action[{a['do']} {a.get('target', '')}]", False, a["result"])
    return m, verdicts
