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

The judge trusts nothing the balancer says about itself where the scenario
knows better: expected shares, the windows in which new flows must avoid a
backend, and the intent check are computed from what the actions ASKED for
(intent.py), so a drain that a restart silently lost fails the drill. Every
new flow (probe or long-lived flow) that failed or took longer than the
scenario's connect_slow_ms to connect is counted, except in the windows the
drill's own failures excuse (a killed backend until it left the tables, a
restart's outage).
"""
import math

import attribution
import discovery
import hop_cost
import intent as intent_mod
import tier as tier_mod
from estate import CLIENT, DATA_PORT, SEED, VIP_FLOWS
from estate_harness import maglev_model
from scenario import DEFAULT_AVOID_GRACE_S, DEFAULT_CONNECT_SLOW_MS

# "error": a gRPC stream that ended in an RPC error (reset, unavailable,
# corrupt echo) is broken whether or not it stalled first.
BROKEN_STATES = {"reset", "corrupt", "connect_failed", "error"}
# A restart's outage excuses new flows in flight during it, and up to this
# long after the daemon was ready again.
RESTART_SLACK_S = 0.2
# How early before the monitor saw a victim fail its failure may have begun
# (one monitor period and then some).
VICTIM_SLACK_S = 0.5
# A SYN flood excuses new flows until this long after it (TCP's first SYN
# retransmission is 1 s after the SYN).
FLOOD_SLACK_S = 1.5
# How many broken or failed flows a verdict names.
NAMED = 8
TAKEDOWN = {"kill", "link-down"}
LEAVE = {"kill", "link-down", "drain", "remove", "disable"}
# What ends a leave: the actions that bring the backend back. Anything else on
# it (close-flows, weight, set-load) leaves the no-new-flows window open.
RETURNS = {"kill": {"start-servers"}, "link-down": {"link-up"},
           "drain": {"undrain", "enable", "add"}, "remove": {"add", "undrain", "enable"},
           "disable": {"enable", "undrain"}, "reload-remove": {"add"}}
# The operator's leaves that live only in the tier's memory (journals,
# checkpoints, peers): a crash-tier that deletes every instance's state
# directory makes the tier forget them, so their window ends there; the
# scenario gives them again and judges them anew (lb-state-loss). A kill or
# a link down is the estate's own state and outlives the wipe.
FORGOTTEN_BY_WIPE = {"drain", "remove", "disable"}


def flood_seen(drops):
    """Frames of a flood's window that reached the gateway's port: what
    spillwayd received and what its packet sockets dropped (ring full)."""
    return (drops.get("spillwayd", {}).get("rx_packets", 0) +
            drops.get("af_packet_ring", {}).get("lost", 0))


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
                                       "max_stall_ms": f.get("max_stall_ms"), "theirs": theirs,
                                       "opened": f.get("opened"), "ended": f.get("ended"),
                                       "error": f.get("error")})
    return out


def describe_broken(kind, rows, t0, limit=NAMED):
    """A readable list of broken flows for a verdict."""
    out = []
    for r in rows[:limit]:
        when = f" at {round(r['ended'] - t0, 2)} s" if r.get("ended") else ""
        why = f" ({r['error']})" if r.get("error") else ""
        stall = (f", stalled {round(r['max_stall_ms'])} ms"
                 if r.get("max_stall_ms") and r["state"] not in BROKEN_STATES else "")
        out.append(f"{kind} {r['id']} on {r['backend']} {r['state']}{when}{why}{stall}")
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return "; ".join(out) + more


def checkpoint_time(probe):
    """The wall time of the daemon's last flow-exception checkpoint from a
    runner.Drill.checkpoint_probe() record, or None when it reported none.
    `status` "checkpoint" {"last_ms", ...} is read as: unix milliseconds when
    it is that large, else milliseconds on the daemon's own clock, the one
    `uptime_ms` counts (ms since start) or CLOCK_MONOTONIC (when it is ahead of
    uptime); an "age_ms" is taken as is. The last event of kind "checkpoint"
    (its time_ms, on the daemon's clock) is the fallback."""
    if not probe:
        return None
    t, mono, uptime = probe.get("t"), probe.get("mono"), probe.get("uptime_ms")

    def from_daemon_ms(ms):
        if ms is None:
            return None
        if ms > 1e12:
            return ms / 1000.0
        if uptime is not None and ms <= uptime + 1000:
            return t - (uptime - ms) / 1000.0
        if mono is not None:
            return t - (mono * 1000.0 - ms) / 1000.0
        return None

    st = probe.get("status")
    if isinstance(st, dict):
        if st.get("age_ms") is not None:
            return t - st["age_ms"] / 1000.0
        got = from_daemon_ms(st.get("last_ms"))
        if got is not None:
            return got
    ev = probe.get("event")
    if isinstance(ev, dict):
        return from_daemon_ms(ev.get("time_ms"))
    return None


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


def expected_shares(sc, pool_of, lf, states, vip_pools, weights=None, preferred=None):
    """Pool shares of new flows per the documented policy formula. lf: name
    -> load factor (load_factors); states: name -> intended state (active /
    draining / failed / disabled / removed / None); weights: name -> base
    weight (default the scenario's); preferred: the preferred region of the
    level it belongs to (README "Latency"): the level's share fills its
    regions preferred first, each up to overprovisioning x its active
    capacity over the level's weight, the others in the scenario's order."""
    pol = dict(POLICY_DEFAULTS, **sc.get("policy", {}))
    weights = sc["weights"] if weights is None else weights
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
        if preferred in pools:
            # A region level: preferred first, each region up to its capacity.
            left = s
            for p in [preferred] + [q for q in pools if q != preferred]:
                cap = pol["overprovisioning"] * sum(
                    weights.get(n, 100) * lf[n] for n in members
                    if pool_of[n] == p and states.get(n) == "active") / total if total else 0.0
                shares[p] = min(left, cap)
                left -= shares[p]
            used += s
            continue
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


def percentile(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def byte_balance(per_backend, backends):
    """max / mean of bytes over `backends` (those with none count as 0)."""
    values = [per_backend.get(b, 0) for b in backends]
    mean = sum(values) / len(values) if values else 0
    return round(max(values) / mean, 3) if mean > 0 else None


def judge_byte_balance(d, model, inv, m, check):
    """The long-lived flows' bytes per backend (the flow checker's own count
    of what each flow sent, by the backend its hello named), their max/mean
    over the VIP's backends, and what plain Maglev would have made of the
    same connections (each flow's bytes on the model's backend)."""
    backends = sorted(d.e.backends)
    placed, table = {}, {}
    for f in d.flow_report["flows"]:
        if not f.get("backend") or not f.get("local_port"):
            continue
        placed[f["backend"]] = placed.get(f["backend"], 0) + f["bytes_sent"]
        would = model.backend(CLIENT, f["local_port"], VIP_FLOWS, DATA_PORT)
        table[would] = table.get(would, 0) + f["bytes_sent"]
    m["byte_balance"] = {"backends": len(backends), "placed": byte_balance(placed, backends),
                         "plain_maglev": byte_balance(table, backends),
                         "bytes": placed, "plain_maglev_bytes": table}
    limit = inv.get("bytes_balance_max")
    if limit is not None:
        got = m["byte_balance"]["placed"]
        check("bytes_balance", got is not None and got <= limit,
              f"max/mean bytes per backend {got} (at most {limit}; plain Maglev on the same "
              f"connections: {m['byte_balance']['plain_maglev']})")


def judge(d):
    sc, inv, mon = d.sc, d.sc["invariants"], d.monitor
    stall = sc["stall_ms"]
    slow_ms = sc.get("connect_slow_ms", DEFAULT_CONNECT_SLOW_MS)
    t0 = d.t0
    t_end = t0 + sc["duration"] + 5
    verdicts = []

    def check(name, ok, detail):
        verdicts.append({"name": name, "ok": bool(ok), "detail": detail})

    def rel(t):
        return round(t - t0, 2)

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
         "reactions": [], "shares": [], "restarts": []}
    names = sorted(d.e.backends)
    intended = intent_mod.Intent(names, sc.get("start_members", names), sc["weights"],
                                 d.actions)
    probes = d.flow_report["probes"]

    def returns_at(target, after, leave):
        """When the backend left by `leave` at `after` comes back: the first
        later action that returns it (a reload that adds it again counts for
        a reload's removal), or the drill's end."""
        back = RETURNS[leave]
        return min([b["t"] for b in d.actions if b["t"] > after and (
            (b.get("target") == target and b["do"] in back) or
            (leave in FORGOTTEN_BY_WIPE and b["do"] == "crash-tier" and
             (b.get("wiped") or b.get("wipe_state"))) or
            (leave == "reload-remove" and b["do"] == "reload" and target in b.get("add", [])))] +
            [t_end])

    # Restarts: outage windows, and for a crash the loss window from the last
    # checkpoint the daemon reported before the kill.
    excused = []  # (from, to, why): new flows that began in here may fail or be slow
    for r in d.restarts:
        row = {"at": r["at"], "signal": r.get("signal", "TERM"), "outage_s": r["outage_s"]}
        if r.get("signal") == "KILL":
            t_cp = checkpoint_time(r.get("before"))
            row["checkpoint_t"] = rel(t_cp) if t_cp is not None else None
            row["loss_window_s"] = (round(r["t_stop"] - t_cp, 3) if t_cp is not None
                                    else "unknown")
        # How long the new daemon held its start-up tables (warm-up), from the
        # first control sample after the restart that says it is over.
        if "t_ready" in r:
            done = [s_ for s_ in d.monitor.samples
                    if s_["t"] >= r["t_ready"] and not s_.get("down") and
                    s_.get("warmup") is False and s_.get("warmup_ms") is not None]
            if done:
                row["warmup_s"] = round(done[0]["warmup_ms"] / 1000.0, 3)
        m["restarts"].append(row)
        if "t_stop" in r:
            excused.append((r["t_stop"], r["t_ready"] + RESTART_SLACK_S,
                            f"restart at {r['at']} s"))

    if getattr(d, "tier_monitor", None):
        excused += tier_mod.excused_windows(d)

    # SYN floods: new flows during a flood (and a SYN retransmission after
    # it) are reported with the flood, not judged: the flood's subject is the
    # flows already established.
    m["syn_floods"] = []
    for fr in getattr(d, "flood_reports", []):
        lo, hi = fr["t_start"], fr["t_end"] + FLOOD_SLACK_S
        excused.append((lo, hi, f"syn flood at {rel(lo)} s"))
        inside = [p for p in probes if lo <= p["t"] <= hi]
        row = {k: v for k, v in fr.items() if k not in ("t_start", "t_end")}
        row.update({"from": rel(lo), "to": rel(fr["t_end"]),
                    "new_flows": len(inside),
                    "new_flows_failed": sum(1 for p in inside if not p["ok"]),
                    "new_flows_slow": sum(1 for p in inside if p["ok"] and p.get("ms") and
                                          p["ms"] > slow_ms)})
        m["syn_floods"].append(row)
        sent = (fr.get("generator") or {}).get("sent", 0)
        seen = flood_seen(fr.get("drops", {}))
        check(f"syn_flood[{rel(lo)} s]", sent > 0 and seen > 0,
              f"{sent} SYNs sent at {round((fr.get('generator') or {}).get('pps', 0))}/s; "
              f"{seen} reached the gateway's port (spillwayd read them or its ring "
              f"dropped them)" + ("" if sent else f": {fr.get('generator', {}).get('error', '')}"))

    # Reactions: detection (state failed) and the backend out of every table
    # for good, per action that takes one away.
    # A reload whose edited file no longer names a backend retires it (it
    # drains): judged like a drain.
    leaves = [(a, a["target"], a["do"]) for a in d.actions if a["do"] in LEAVE]
    leaves += [(a, n, "reload-remove") for a in d.actions if a["do"] == "reload"
               for n in a.get("remove", [])]
    for a, target, do in sorted(leaves, key=lambda x: x[0]["t"]):
        a = dict(a, do=do)
        until = returns_at(target, a["t"], do)
        r = {"at": a["at"], "do": a["do"], "target": target}
        if a["do"] in TAKEDOWN:
            t = mon.first(a["t"], lambda s: s["backends"].get(target, {}).get("state") ==
                          "failed")
            r["detection_s"] = round(t - a["t"], 3) if t else None
        t = mon.left_tables(target, a["t"], until if until < t_end else None)
        r["table_removal_s"] = round(t - a["t"], 3) if t else None
        bound = per_target(inv.get("table_removal_max_s", float("inf")), target)
        if bound == float("inf"):
            det = per_target(inv.get("detection_max_s", float("inf")), target)
            bound = (det + DEFAULT_AVOID_GRACE_S if a["do"] in TAKEDOWN and det != float("inf")
                     else DEFAULT_AVOID_GRACE_S if a["do"] not in TAKEDOWN else 3.0)
        r["avoid_from_s"] = round(bound, 3)
        if a["do"] in TAKEDOWN:
            # New flows the drill's own failure hit before the balancer could
            # know: until the backend was out (or the bound, if later).
            out = (t - a["t"]) if t else (until - a["t"])
            excused.append((a["t"], a["t"] + max(bound, out) + 0.3,
                            f"{a['do']} {target} at {a['at']} s"))
        r["_window"] = (a["t"] + bound, until, f"{a['do']} {target} at {a['at']} s")
        m["reactions"].append(r)

    # The estate's start-up: the first burst of flows, until the flow
    # checker's and the gRPC client's initial flows were all up. New flows
    # then are counted in new_flow_connect but not judged (the scenario's
    # subject starts with its first action).
    if getattr(d, "traffic_ready", None):
        excused.append((t0, d.traffic_ready, "traffic start-up"))
    # A victim's failure (a takedown's target, or a backend the scenario
    # names as a victim: ejected by health on purpose) also hits the new
    # flows still connecting to it when it failed (they are re-steered and
    # reset): around the moment the monitor saw it.
    for name in sorted(victims):
        for tf, _, to in mon.state_changes(name):
            if to == "failed":
                excused.append((tf - VICTIM_SLACK_S, tf + 0.3, f"{name} failed at {rel(tf)} s"))

    def excuse(t, ms=None, backend=None, slow_only=False, own=None):
        """Why a new flow that began at t and lasted ms (to its hello, or to
        its failure) is excused: its life overlaps a window of the drill's own
        doing."""
        end = t + (ms or 0) / 1000.0
        for lo, hi, why in excused:
            if t <= hi and end >= lo and why != own:
                return why
        if slow_only and backend in victims:
            return f"{backend} is a victim"
        return None

    # New flows that avoid a backend: from the bound after the action until
    # the next action on it, every new flow that reached it counts, and so
    # does every new flow that failed (its backend unknown: it may well have
    # been sent there) unless something else the drill did excuses it.
    for r in m["reactions"]:
        lo, hi, own = r.pop("_window")
        reached = [p for p in probes if p["ok"] and p["backend"] == r["target"] and
                   lo < p["t"] < hi]
        failed = [p for p in probes if not p["ok"] and lo < p["t"] < hi and
                  not excuse(p["t"], p.get("ms"), own=own)]
        r["new_flows_after_removal"] = len(reached)
        r["failed_new_flows_after_removal"] = len(failed)
        r["_reached"], r["_failed"] = reached, failed

    # Drains completing: after the flows on a draining backend were closed.
    for a in d.actions:
        if a["do"] != "close-flows":
            continue
        target = a["target"]
        t = mon.first(a["t"], lambda s: target not in s["backends"] or
                      s["backends"][target]["state"] == "removed" or
                      (s["backends"][target]["state"] == "draining" and
                       (s["backends"][target]["live_flows"] == 0 or
                        s["backends"][target].get("drain_complete") is True)))
        m["reactions"].append({"at": a["at"], "do": "drain-complete", "target": target,
                               "complete_s": round(t - a["t"], 3) if t else None})

    # Share of new flows per pool, in the scenario's windows, for every VIP:
    # the formula from the INTENDED states and weights; the control plane's
    # figure per VIP; the measured share of new flows (probes: VIP nccl).
    pool_of = {n: b["pool"] for n, b in d.e.backends.items()}
    for w in inv.get("share", []):
        lo, hi = t0 + w["from"], t0 + w["to"]
        inside = [p for p in probes if lo <= p["t"] <= hi and p["ok"]]
        measured = {}
        for p in inside:
            pool = pool_of.get(p["backend"], "?")
            measured[pool] = measured.get(pool, 0) + 1
        n = len(inside)
        measured = {p: c / n for p, c in measured.items()} if n else {}
        lf = load_factors(sc, pool_of, d.actions, lo)
        states = intended.states(lo)
        expect = expected_shares(sc, pool_of, lf, states, list(sc["pools"]),
                                 intended.weights_at(lo), w.get("preferred"))
        mid = [s for s in mon.samples if lo <= s["t"] <= hi and not s.get("down")]
        for vip in w.get("vips", mon.vips):
            reported = mid[-1]["shares"].get(vip, {}) if mid else {}
            row = {"from": w["from"], "to": w["to"], "vip": vip,
                   "expected": {p: round(v, 3) for p, v in expect.items()},
                   "reported": {p: round(v, 3) for p, v in reported.items()},
                   "intended_states": {k: v for k, v in states.items() if v != "active"}}
            if vip == "nccl":
                row["probes"] = n
                row["measured"] = {p: round(v, 3) for p, v in measured.items()}
            m["shares"].append(row)

    # Placement: until the first action, every new flow (long-lived or probe)
    # must land where the independent Maglev model puts it from the starting
    # configuration (the tables are a pure function of configuration + seed).
    first = min([a["t"] for a in d.actions] + [float("inf")])
    model = maglev_model.Model(getattr(d.e, "config_at_start", None) or d.e.config)
    placed = [(f["local_port"], f["backend"]) for f in d.flow_report["flows"]
              if f.get("backend") and f.get("local_port") and f["opened"] < first]
    placed += [(p["local_port"], p["backend"]) for p in probes
               if p["ok"] and p.get("local_port") and p["t"] < first]
    wrong = [(port, got, model.backend(CLIENT, port, VIP_FLOWS, DATA_PORT))
             for port, got in placed
             if model.backend(CLIENT, port, VIP_FLOWS, DATA_PORT) != got]
    m["placement"] = {"checked": len(placed), "wrong": len(wrong)}
    if "bytes_balance_max" in inv or "nccl_placement" in sc["estate"]:
        judge_byte_balance(d, model, inv, m, check)
    if sc["estate"].get("nccl_placement") == "bytes":
        # Placed by load, not by the table alone: judged by their balance.
        m["placement"]["by_load"] = True
    else:
        # What the control plane changed on its own before the first action
        # (a latency mark, a health state): the first sample of each.
        changed = {}
        for s in mon.samples:
            if s["t"] >= first or s.get("down"):
                continue
            for name, b in s["backends"].items():
                what = (b.get("state"), b.get("latency"))
                if what != ("active", "normal") and (name, what) not in changed:
                    changed[(name, what)] = round(s["t"] - t0, 2)
        check("placement", placed and not wrong,
              f"{len(placed) - len(wrong)} of {len(placed)} new flows before the first action "
              f"on the backend the Maglev model predicts" +
              (f"; first mismatches (port, got, model): {wrong[:5]}" if wrong else "") +
              (f"; before it the control plane showed (backend, (state, latency)) at t: "
               f"{sorted(changed.items(), key=lambda x: x[1])[:6]}" if wrong and changed else ""))

    # Every new flow: failed or slower than connect_slow_ms to connect + hello.
    news = [{"kind": "probe", "t": p["t"], "backend": p["backend"], "ok": p["ok"],
             "ms": p.get("ms"), "error": p.get("error")} for p in probes]
    news += [{"kind": "flow", "t": f["opened"], "backend": f.get("backend"),
              "ok": f["state"] != "connect_failed",
              "ms": (f.get("connect_ms") if f["state"] != "connect_failed" else
                     ((f.get("ended") or f["opened"]) - f["opened"]) * 1000.0),
              "error": f.get("error"), "id": f.get("id")} for f in d.flow_report["flows"]
             if f["state"] != "not_opened"]
    bad, excused_n = [], 0
    for x in news:
        slow = x["ok"] and x["ms"] is not None and x["ms"] > slow_ms
        if x["ok"] and not slow:
            continue
        if excuse(x["t"], x["ms"], x["backend"], slow_only=slow):
            excused_n += 1
            continue
        bad.append(dict(x, slow=slow))
    connect = [x["ms"] for x in news if x["ok"] and x["ms"] is not None]
    m["new_flow_connect"] = {"count": len(connect), "p50_ms": percentile(connect, 0.5),
                             "p99_ms": percentile(connect, 0.99),
                             "max_ms": max(connect) if connect else None,
                             "slow_bound_ms": slow_ms,
                             "failed": sum(1 for x in news if not x["ok"]),
                             "slow": sum(1 for x in news if x["ok"] and x["ms"] is not None
                                         and x["ms"] > slow_ms),
                             "excused": excused_n, "judged_bad": len(bad)}
    limit = inv.get("new_flows_failed_max", 0)
    check("new_flows", len(bad) <= limit,
          f"{len(bad)} new flows failed or took over {slow_ms} ms to connect (at most "
          f"{limit}; {excused_n} excused: the estate's start-up, the drill's own failures "
          f"and restarts)" +
          ("" if not bad else ": " + "; ".join(
              f"{x['kind']}{' ' + str(x['id']) if x.get('id') is not None else ''} at "
              f"{rel(x['t'])} s " +
              (f"to {x['backend']} took {round(x['ms'])} ms" if x["slow"] else
               f"failed ({x['error']})") for x in bad[:NAMED]) +
           (f" and {len(bad) - NAMED} more" if len(bad) > NAMED else "")))

    # -- the invariants the scenario names ------------------------------------------------
    broken_rows = [("flow", r) for r in flows["broken_list"]]
    if grpc:
        broken_rows += [("gRPC stream", r) for r in grpc["broken_list"]]
    broken_rows += [("elephant", {"id": x["id"], "backend": x["backend"], "state": "broken",
                                  "error": x.get("error") or
                                  f"exit {x['exit']}, silent {x['longest_silence_ms']} ms",
                                  "theirs": x["backend"] in victims,
                                  "opened": t0 + x.get("started", 0)})
                    for x in elephants if x["broken"]]

    def named(rows):
        out, groups = [], {}
        for kind, r in rows:
            groups.setdefault(kind, []).append(r)
        for kind, rs in groups.items():
            out.append(describe_broken(kind, rs, t0))
        return "; ".join(out)

    if "others_broken_max" in inv:
        rows = [(k, r) for k, r in broken_rows if not r["theirs"]]
        check("others_broken", others <= inv["others_broken_max"],
              f"{others} flows broken on backends no action took down "
              f"(at most {inv['others_broken_max']})" + (": " + named(rows) if rows else ""))
    if "victims_broken_min" in inv:
        check("victims_broken", theirs >= inv["victims_broken_min"],
              f"{theirs} flows of {', '.join(sorted(victims)) or 'no victim'} broken "
              f"(the drill's failure must hit them: at least {inv['victims_broken_min']})")
    if inv.get("all_flows_keep_backend"):
        total = others + theirs
        check("all_flows_keep_backend", total == 0,
              f"{total} flows broken or moved (a flow that moves is reset by its new backend)" +
              (": " + named(broken_rows) if broken_rows else ""))
    if inv.get("flows_before_checkpoint_keep_backend"):
        crashes = [r for r in d.restarts if r.get("signal") == "KILL"]
        if not crashes:
            check("flows_before_checkpoint", False, "no restart-lb with signal KILL in the drill")
        for r in crashes:
            t_cp = checkpoint_time(r.get("before"))
            rows = [(k, x) for k, x in broken_rows if not x["theirs"]]
            if t_cp is None:
                check(f"flows_before_checkpoint[{r['at']} s]", False,
                      f"the daemon reported no checkpoint before the kill at {r['at']} s "
                      f"(status \"checkpoint\", event kind \"checkpoint\"): loss window "
                      f"unknown; {len(rows)} flows broken" +
                      (": " + named(rows) if rows else ""))
                continue
            before = [(k, x) for k, x in rows if (x.get("opened") or 0) <= t_cp]
            window = [(k, x) for k, x in rows if t_cp < (x.get("opened") or 0) <= r["t_stop"]]
            check(f"flows_before_checkpoint[{r['at']} s]", not before,
                  f"last checkpoint {rel(t_cp)} s, kill {rel(r['t_stop'])} s: loss window "
                  f"{round(r['t_stop'] - t_cp, 3)} s; {len(before)} flows that began before "
                  f"the checkpoint broken" + (": " + named(before) if before else "") +
                  f"; {len(window)} flows begun in the loss window broken")
    for r in m["reactions"]:
        if "detection_s" in r and "detection_max_s" in inv:
            v, limit = r["detection_s"], per_target(inv["detection_max_s"], r["target"])
            check(f"detection[{r['target']}]", v is not None and v <= limit,
                  f"{r['do']} at {r['at']} s: failed after {v} s (at most {limit})")
        if "table_removal_s" in r and "table_removal_max_s" in inv:
            v, limit = r["table_removal_s"], per_target(inv["table_removal_max_s"], r["target"])
            check(f"table_removal[{r['target']}]", v is not None and v <= limit,
                  f"{r['do']} at {r['at']} s: out of every table for good after {v} s "
                  f"(at most {limit})")
        if "_reached" in r:
            reached, failed = r.pop("_reached"), r.pop("_failed")
            if inv.get("new_flows_avoid"):
                check(f"new_flows_avoid[{r['target']}]", not reached and not failed,
                      f"{r['do']} at {r['at']} s: {len(reached)} new flows reached "
                      f"{r['target']} and {len(failed)} new flows failed from "
                      f"{r['avoid_from_s']} s after it" +
                      ("" if not reached else "; reached at " + ", ".join(
                          f"{rel(p['t'])} s" for p in reached[:NAMED])) +
                      ("" if not failed else "; failed at " + ", ".join(
                          f"{rel(p['t'])} s ({p.get('error')})" for p in failed[:NAMED])))
        if r["do"] == "drain-complete" and "drain_complete_max_s" in inv:
            v = r["complete_s"]
            check(f"drain_complete[{r['target']}]", v is not None and
                  v <= inv["drain_complete_max_s"],
                  f"drain of {r['target']} complete {v} s after its last flows were closed "
                  f"(at most {inv['drain_complete_max_s']})")
    for name in inv.get("receives_new_flows", []):
        # Since it was last added (a re-add: since the add, not the remove).
        added = [a["t"] for a in d.actions if a.get("target") == name and a["do"] == "add"]
        since = added[-1] if added else t0
        got = sum(1 for p in probes if p["ok"] and p["backend"] == name and p["t"] >= since)
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
    if inv.get("intent_kept"):
        judge_intent(d, intended, check, rel)
    for name in inv.get("stays_draining", []):
        judge_stays_draining(d, name, returns_at, check, rel)
    m["discovery"] = discovery.judge(d, check, rel)
    judge_latency(d, inv, check, rel, probes)
    tol = inv.get("share_tolerance", 0.12)
    for s in m["shares"]:
        for pool, want in s["expected"].items():
            rep = s["reported"].get(pool)
            rep_ok = rep is not None and abs(rep - want) <= 0.02
            label = f"share[{s['vip']} {s['from']}-{s['to']} s, {pool}]"
            if "probes" not in s:
                check(label, rep_ok, f"control plane {rep}, formula {want:.3f} (intended "
                      f"states {s['intended_states'] or 'all active'}; within 0.02)")
                continue
            got = s["measured"].get(pool, 0.0)
            # Sampling error of the probes (3 sigma) on top of the tolerance.
            sigma = math.sqrt(max(want * (1 - want), 0.01) / max(s["probes"], 1))
            ok = s["probes"] >= 20 and abs(got - want) <= tol + 3 * sigma and rep_ok
            check(label, ok,
                  f"new flows {got:.3f} of {s['probes']}, control plane {rep}, formula "
                  f"{want:.3f} from the intended states "
                  f"({s['intended_states'] or 'all active'}; tolerance {tol} + 3 sigma "
                  f"{3 * sigma:.3f}; control plane 0.02)")
    for a in d.actions:
        if a["do"] == "flap" and a["what"] == "health":
            # The flap must really have failed health checks, or the drill
            # proves nothing about damping.
            h = d.health_end.get(a["target"], {})
            check(f"flap_effective[{a['target']}]", (h.get("failures") or 0) > 0,
                  f"{h.get('failures')} failed health checks of {a['target']} "
                  f"out of {h.get('probes')}")
        if a["do"] == "flap" and a["what"] == "load":
            for target in a.get("targets") or [a["target"]]:
                sat = [s for s in mon.samples if not s.get("down") and
                       s["backends"].get(target, {}).get("saturated")]
                check(f"flap_effective[{target}]", len(sat) > 0,
                      f"{target} seen saturated in {len(sat)} control samples")
    if inv.get("churn_within_budget"):
        pol = sc.get("policy", {})
        budget, interval = pol.get("churn_budget", 0.05), pol.get("churn_interval", 1.0)
        up = [x for x in mon.samples if not x.get("down")]
        if not up or interval <= 3 * mon.period:
            check("churn", False, "no control-plane sample to judge churn by" if not up else
                  f"churn_interval {interval} s is too short for the monitor's "
                  f"{mon.period} s samples")
        # Each daemon's life on its own (the samples on either side of an
        # outage are further apart than an interval); then each restart: the
        # tables before the stop against the first ones after it.
        stops = [r["t_stop"] for r in d.restarts if "t_stop" in r]
        lives = [t0 - 60] + stops
        for vip, size in (up[0]["table_size"] if up else {}).items():
            limit = max(1, math.floor(budget * size))
            worst = max(mon.churn(vip, interval, since=lo, until=hi) for lo, hi in
                        zip(lives, lives[1:] + [None]))
            check(f"churn[{vip}]", worst <= limit,
                  f"at most {worst} entries moved per churn interval ({interval} s); "
                  f"budget {limit} ({budget} of {size})")
            for r in d.restarts:
                before = [x for x in up if x["t"] < r["t_stop"]]
                after = [x for x in up if x["t"] > r["t_stop"]]
                if not before or not after:
                    continue
                a, b = before[-1]["entries"], after[0]["entries"]
                moved = sum(abs(b.get(n, {}).get(vip, 0) - a.get(n, {}).get(vip, 0))
                            for n in set(a) | set(b)) // 2
                check(f"churn_across_restart[{vip}, {r['at']} s]", moved <= limit,
                      f"{moved} entries moved between the last tables before the restart "
                      f"and the first after it (budget {limit}: a restart moves no more "
                      f"than a churn step)")
    if "restart_outage_max_s" in inv:
        for r in d.restarts:
            check("restart_outage", r["outage_s"] <= inv["restart_outage_max_s"],
                  f"spillwayd ({'SIGKILL' if r.get('signal') == 'KILL' else 'SIGTERM'}) down "
                  f"and ready again in {r['outage_s']} s (at most {inv['restart_outage_max_s']})")
    if inv.get("reload_reply_names_changes"):
        for a in d.actions:
            if a["do"] != "reload":
                continue
            changed = sorted(set(a.get("add", [])) | set(a.get("remove", [])) |
                             set(a.get("weights", {})))
            reply = a.get("reply") or ""
            missing = [n for n in changed if n not in reply]
            check(f"reload_reply[{a['at']} s]", a["result"] == "ok" and not missing,
                  f"the reply to config reload names {len(changed) - len(missing)} of the "
                  f"{len(changed)} backends the edit changed" +
                  (f" (missing: {', '.join(missing)})" if missing else "") +
                  f"; reply: {reply[:300]}")
    if inv.get("elephants_placed", bool(elephants)):
        for x in elephants:
            by = x.get("served_by") or {}
            ok = by.get("control") == [x["backend"]] and by.get("data") == [x["backend"]]
            check(f"elephant_placed[{x['id']}]", ok,
                  f"elephant {x['id']} planned on {x['backend']}: control connection served "
                  f"by {by.get('control')}, data by {by.get('data')}")
    if getattr(d, "tier_monitor", None):
        m["tier"] = tier_mod.judge_tier(d, check, rel)
    for a in d.actions:
        if a["result"] != "ok":
            check(f"action[{a['do']} {a.get('target', '')}]", False, a["result"])
    m["attribution"] = judge_attribution(d, check)
    # Measured, not judged: the extra hop's latency and how long the flows
    # the second chance kept lived on it.
    m["second_chance_cost"] = hop_cost.measure(
        m["attribution"], [f for f in d.flow_report["flows"]
                           if not flow_broken(f, d.sc["stall_ms"])],
        d.t0, d.flow_report.get("rtt_ms", 1000))
    judge_floor(d, flows, grpc, len(verdicts), check)
    return m, verdicts


def judge_attribution(d, check):
    """Which layer kept each surviving long-lived flow (attribution.py), for
    the drills that kill, restart or withdraw a load balancer."""
    model_hasher = maglev_model.ref.FlowHasher(maglev_model.parse_u64(SEED))
    surviving = [f for f in d.flow_report["flows"] if not flow_broken(f, d.sc["stall_ms"])]
    return attribution.judge(
        d, surviving, check,
        lambda src, sport, dst, dport: maglev_model.flow_hash(model_hasher, src, dst, sport,
                                                              dport, 6),
        maglev_model.slot_of, CLIENT, VIP_FLOWS, DATA_PORT)


def judge_floor(d, flows, grpc, evaluated, check):
    """A floor under the verdicts: a drill that judged no invariant, or less
    traffic than its scenario declares ([traffic]: flows, grpc_streams,
    elephants, probe_rate; the runner's defaults), proves nothing and fails."""
    traffic = d.sc.get("traffic", {})
    want = {"long-lived flows": traffic.get("flows", 60),
            "gRPC streams": traffic.get("grpc_streams", 0),
            "elephants": len(traffic.get("elephants", [])),
            "new-flow probes": 1 if traffic.get("probe_rate", 20) > 0 else 0}
    got = {"long-lived flows": flows["total"],
           "gRPC streams": grpc["total"] if grpc else 0,
           "elephants": len(d.elephant_results),
           "new-flow probes": len(d.flow_report["probes"])}
    short = [f"{k} {got[k]} (declared {'some' if k == 'new-flow probes' else want[k]})"
             for k in want if got[k] < want[k]]
    check("judged", evaluated > 0 and not short,
          f"{evaluated} invariant verdicts over " +
          ", ".join(f"{got[k]} {k}" for k in got) +
          ("" if evaluated else "; no invariant was evaluated") +
          ("" if not short else "; fewer than the scenario declares: " + ", ".join(short)))


def judge_intent(d, intended, check, rel, grace_s=1.0):
    """Every control-plane sample against the intent: each backend's state
    must be one the intended state allows (intent.REPORTED_OK), and its base
    weight the intended one, from grace_s after the action that asked for it.
    A restart gets no grace: the restarted daemon must know at once. A
    sample's states are as of its backend.list answer (t_states), which may
    come after an action that began once the sample had started. One
    verdict per backend, naming the first deviation."""
    for name in intended.names:
        first_bad = None
        seen = 0
        for s in d.monitor.samples:
            if s.get("down") or s["t"] < d.t0:
                continue
            t_states = s.get("t_states", s["t"])
            last = intended.last_change(name, t_states)
            if last is not None and s["t"] - last < grace_s:
                continue
            want = intended.states(s["t"])[name]
            row = s["backends"].get(name)
            got = row.get("state") if row else None
            seen += 1
            if got not in intent_mod.REPORTED_OK[want]:
                first_bad = (s["t"], f"intended {want}, control plane says {got}")
                break
            if want in ("active", "draining", "disabled") and row and \
                    row.get("base_weight") is not None:
                w = intended.weights_at(s["t"]).get(name)
                if w is not None and row["base_weight"] != w:
                    first_bad = (s["t"], f"intended weight {w}, control plane says "
                                         f"{row['base_weight']}")
                    break
        if first_bad is None:
            check(f"intent_kept[{name}]", True, f"{seen} control samples agree with the intent")
        else:
            t, what = first_bad
            restarts = [r for r in d.restarts if r.get("t_ready", 0) <= t]
            after = (f" (after the restart at {restarts[-1]['at']} s)" if restarts else "")
            check(f"intent_kept[{name}]", False, f"at {rel(t)} s{after}: {what}")


def judge_stays_draining(d, name, returns_at, check, rel, grace_s=1.0):
    """An operator's drain holds: from grace_s after the (first) drain of
    `name` until an action returns it, every control sample says "draining"
    (not active, not removed, not gone: a drain that a discovery refresh, a
    reload or a restart undid or turned into a removal). The drill proves
    nothing unless samples were taken after each restart, reload and
    discovery write in that window; a missing one fails the check."""
    drains = [a for a in d.actions if a["do"] == "drain" and a.get("target") == name]
    if not drains:
        check(f"stays_draining[{name}]", False, f"no drain of {name} in the drill")
        return
    a = drains[0]
    lo, hi = a["t"] + grace_s, returns_at(name, a["t"], "drain")
    window = [s for s in d.monitor.samples if lo <= s["t"] < hi and not s.get("down")]
    bad = next(((s["t"], (s["backends"].get(name) or {}).get("state")) for s in window
                if (s["backends"].get(name) or {}).get("state") != "draining"), None)
    events = [(b["t"], f"{b['do']} at {b['at']} s") for b in d.actions
              if lo <= b["t"] < hi and b["do"] in ("reload", "discovery-write",
                                                    "discovery-torn-write")]
    events += [(r["t_ready"], f"restart at {r['at']} s") for r in d.restarts
               if lo <= r.get("t_ready", 0) < hi]
    unseen = [what for t, what in sorted(events) if not any(s["t"] > t for s in window)]
    through = ", ".join(what for _, what in sorted(events)) or "nothing"
    if bad is not None:
        check(f"stays_draining[{name}]", False,
              f"drained at {a['at']} s; at {rel(bad[0])} s the control plane says "
              f"{bad[1]} (through {through})")
    elif not window or unseen:
        check(f"stays_draining[{name}]", False,
              f"drained at {a['at']} s: no control sample " +
              (f"after {', '.join(unseen)}" if unseen else "after the drain"))
    else:
        check(f"stays_draining[{name}]", True,
              f"drained at {a['at']} s: draining in all {len(window)} control samples from "
              f"{rel(lo)} s to {rel(hi)} s, through {through}")


def judge_latency(d, inv, check, rel, probes):
    """The latency invariants (issue #12), from the control samples and the
    probes:
      region: [[invariants.region]] from, to, preferred, optional vips: in
        every sample of the window each VIP's preferred region is `preferred`;
      region_switches_max: a number (every VIP) or a table per VIP: changes
        of the preferred region over the whole drill (the first choice is
        not one);
      latency_mark: [[invariants.latency_mark]] from, to, backend, mark: the
        backend's latency mark (normal, degraded, recovering) in every sample
        of the window;
      backend_share: [[invariants.backend_share]] from, to, backend, min,
        max: the measured share of new flows (nccl probes) the backend got
        in the window."""
    mon, t0 = d.monitor, d.t0
    for w in inv.get("region", []):
        lo, hi = t0 + w["from"], t0 + w["to"]
        for vip in w.get("vips", mon.vips):
            seen = [s for s in mon.samples if lo <= s["t"] <= hi and not s.get("down")]
            wrong = [s for s in seen
                     if w["preferred"] not in s.get("preferred", {}).get(vip, {}).values()]
            check(f"region[{vip} {w['from']}-{w['to']} s]", seen and not wrong,
                  f"preferred region {w['preferred']} in {len(seen) - len(wrong)} of "
                  f"{len(seen)} control samples" +
                  ("" if not wrong else f"; first other at {rel(wrong[0]['t'])} s: "
                   f"{wrong[0].get('preferred', {}).get(vip)}"))
    limit = inv.get("region_switches_max")
    if limit is not None:
        for vip in mon.vips:
            most = limit.get(vip, float("inf")) if isinstance(limit, dict) else limit
            changes = mon.region_changes(vip)
            check(f"region_switches[{vip}]", len(changes) <= most,
                  f"{len(changes)} changes of the preferred region (at most {most})" +
                  ("" if not changes else ": " + ", ".join(
                      f"{rel(t)} s {a}->{b}" for t, _, a, b in changes)))
    for w in inv.get("latency_mark", []):
        lo, hi = t0 + w["from"], t0 + w["to"]
        name = w["backend"]
        seen = [s for s in mon.samples if lo <= s["t"] <= hi and not s.get("down")]
        wrong = [s for s in seen if s["backends"].get(name, {}).get("latency") != w["mark"]]
        check(f"latency_mark[{name} {w['from']}-{w['to']} s]", seen and not wrong,
              f"{name} {w['mark']} in {len(seen) - len(wrong)} of {len(seen)} control samples" +
              ("" if not wrong else
               f"; first other at {rel(wrong[0]['t'])} s: "
               f"{wrong[0]['backends'].get(name, {}).get('latency')} "
               f"(latency {wrong[0]['backends'].get(name, {}).get('latency_ms')} ms)"))
    for w in inv.get("backend_share", []):
        lo, hi = t0 + w["from"], t0 + w["to"]
        name = w["backend"]
        inside = [p for p in probes if lo <= p["t"] <= hi and p["ok"]]
        got = sum(1 for p in inside if p["backend"] == name) / len(inside) if inside else 0.0
        low, high = w.get("min", 0.0), w.get("max", 1.0)
        check(f"backend_share[{name} {w['from']}-{w['to']} s]",
              len(inside) >= 20 and low <= got <= high,
              f"{name} got {got:.3f} of {len(inside)} new flows (want {low}..{high})")
