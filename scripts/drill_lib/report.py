"""The drill's report: report.json (schema in README.md, "Failover drills"),
summary.txt (the text printed at the end) and flows.png (matplotlib, Agg:
active flows per backend and per pool over time, the share of new flows per
pool, the drill's actions marked).
"""
import json
import os

import attribution
import hop_cost

SCHEMA = 1


def build(d, measurements, verdicts):
    sc = d.sc
    # No verdict is no proof: a report without any fails.
    ok = bool(verdicts) and all(v["ok"] for v in verdicts)
    return {
        "schema": SCHEMA,
        "scenario": sc["name"],
        "description": sc.get("description", "").strip(),
        "short": sc.get("_short", False),
        "started": d.t0,
        "duration_s": sc["duration"],
        "stall_ms": sc["stall_ms"],
        "estate": {"onprem": sc["estate"]["onprem"], "cloud": sc["estate"]["cloud"],
                   "wan": sc["estate"].get("wan"), "wan_counters": d.wan_counters},
        "actions": d.actions,
        "victims": measurements["victims"],
        "flows": {k: v for k, v in measurements["flows"].items()},
        "grpc": measurements["grpc"],
        "elephants": measurements["elephants"],
        "broken": {"theirs": measurements["broken_theirs"],
                   "others": measurements["broken_others"]},
        "reactions": measurements["reactions"],
        "shares": measurements["shares"],
        "restarts": measurements["restarts"],
        "tier": measurements.get("tier"),
        "new_flow_connect": measurements.get("new_flow_connect"),
        "placement": measurements.get("placement"),
        "byte_balance": measurements.get("byte_balance"),
        "syn_floods": measurements.get("syn_floods", []),
        "discovery": measurements.get("discovery", []),
        "second_chance": getattr(d, "second_chance", None),
        "attribution": measurements.get("attribution"),
        "second_chance_cost": measurements.get("second_chance_cost"),
        "new_flows": new_flow_shares(d),
        "invariants": verdicts,
        "passed": ok,
        "files": {"report": "report.json", "summary": "summary.txt", "plot": "flows.png",
                  "timeline": "flows-timeline.jsonl", "control": "control-samples.jsonl",
                  "flows": "flows.json"},
    }


def flood_lines(fl):
    """Where a SYN flood's frames went: sent, then each place that counted
    some (only the counters that moved)."""
    g = fl.get("generator") or {}
    dr = fl.get("drops") or {}
    sw = {k: v for k, v in dr.get("spillwayd", {}).items() if v}
    out = [f"  syn flood {fl['from']}-{fl['to']} s ({fl['for']} s, "
           f"{'full speed' if not fl.get('rate') else str(fl['rate']) + '/s'}, port "
           f"{fl['port']}): {g.get('sent', 0)} SYNs sent at {round(g.get('pps', 0))}/s, "
           f"{g.get('send_errors', 0)} refused by the sender's socket"]
    out.append(f"    spillwayd: {sw or 'nothing'}")
    out.append(f"    af_packet ring: {dr.get('af_packet_ring', {}).get('lost', 0)} frames the "
               f"gateway's eth0 took in and spillwayd never read (ring full); the packet "
               f"sockets' sk_drops: {dr.get('af_packet_socket', {}).get('drops', 0)}")
    for where, c in dr.get("links", {}).items():
        moved = {k: v for k, v in c.items() if v}
        if moved:
            out.append(f"    {where}: {moved}")
    for name, c in dr.get("backends", {}).items():
        moved = {k: v for k, v in c.items() if v}
        if moved:
            out.append(f"    backend {name} TcpExt: {moved}")
    out.append(f"    new flows during it: {fl['new_flows']} ({fl['new_flows_failed']} failed, "
               f"{fl['new_flows_slow']} slow; reported, not judged)")
    return out


def new_flow_shares(d):
    """Share of new flows (probes) per pool over the whole drill."""
    pool_of = {n: b["pool"] for n, b in d.e.backends.items()}
    counts, n = {}, 0
    for p in d.flow_report["probes"]:
        if p["ok"]:
            n += 1
            pool = pool_of.get(p["backend"], "?")
            counts[pool] = counts.get(pool, 0) + 1
    failed = sum(1 for p in d.flow_report["probes"] if not p["ok"])
    return {"probes": n, "failed": failed,
            "by_pool": {p: round(c / n, 3) for p, c in sorted(counts.items())} if n else {}}


def summary(rep, out_dir):
    lines = [f"drill {rep['scenario']}{' (short)' if rep['short'] else ''}: "
             f"{'PASSED' if rep['passed'] else 'FAILED'}"]
    f = rep["flows"]
    g = rep["grpc"]
    lines.append(f"  flows: {f['total']} long-lived TCP"
                 + (f", {g['total']} gRPC streams" if g else "")
                 + (f", {len(rep['elephants'])} iperf3 elephants" if rep["elephants"] else ""))
    bb = rep.get("byte_balance")
    if bb and bb.get("placed") is not None:
        lines.append(f"  bytes per backend, max/mean over {bb['backends']}: {bb['placed']} "
                     f"(plain Maglev on the same connections: {bb['plain_maglev']})")
    lines.append(f"  broken: {rep['broken']['theirs']} theirs (on "
                 f"{', '.join(rep['victims']) or 'no victim'}), {rep['broken']['others']} others'"
                 f" (stall threshold {rep['stall_ms']} ms); longest pause of a surviving flow "
                 f"{round(f['longest_stall_ms'])} ms")
    skip = {"at", "t", "do", "target", "result", "source"}
    lines.append("  actions: " + "; ".join(
        f"{a['at']} s {a['do']}" + (f" {a['target']}" if a.get("target") else "") +
        "".join(f" {k}={v}" for k, v in a.items() if k not in skip)
        for a in rep["actions"]))
    for r in rep["reactions"]:
        parts = []
        if "detection_s" in r:
            parts.append(f"detected in {r['detection_s']} s")
        if "table_removal_s" in r:
            parts.append(f"out of the tables in {r['table_removal_s']} s")
        if "new_flows_after_removal" in r:
            parts.append(f"{r['new_flows_after_removal']} new flows after")
        if "failed_new_flows_after_removal" in r:
            parts.append(f"{r['failed_new_flows_after_removal']} failed new flows after")
        if "complete_s" in r:
            parts.append(f"drain complete {r['complete_s']} s after its flows closed")
        lines.append(f"  {r['do']} {r['target']} at {r['at']} s: " + ", ".join(parts))
    for r in rep["restarts"]:
        line = (f"  restart ({'SIGKILL' if r.get('signal') == 'KILL' else 'SIGTERM'}) at "
                f"{r['at']} s: spillwayd back and ready in {r['outage_s']} s")
        if "warmup_s" in r:
            line += f"; held its start-up tables for {r['warmup_s']} s (warm-up)"
        if r.get("signal") == "KILL":
            line += (f"; last checkpoint at {r.get('checkpoint_t')} s, loss window "
                     f"{r.get('loss_window_s')}" + (" s" if isinstance(
                         r.get("loss_window_s"), (int, float)) else ""))
        lines.append(line)
    for fl in rep.get("syn_floods", []):
        lines += flood_lines(fl)
    tier = rep.get("tier")
    if tier:
        lines.append("  instances (tracked flows, most / at the end): " + ", ".join(
            f"{n} {c['max']} / {c['last']}" for n, c in tier["instances"].items()))
        for w in tier["withdrawals"]:
            lines.append(f"  {w['do']} {w['instance']} at {w['at']} s: the router stopped using "
                         f"it after " + ", ".join(
                             f"{w[v]} s ({v})" for v in w
                             if v not in ("at", "do", "instance", "tables_unchanged_for_s",
                                          "own_tables_unchanged_for_s")) +
                         f"; its own tables had not changed for "
                         f"{w.get('own_tables_unchanged_for_s')} s (the monitored instance's "
                         f"for {w['tables_unchanged_for_s']} s)")
        for th in tier.get("thaws", []):
            lines.append(f"  thaw-instance {th['instance']} at {th['at']} s: in the router's next "
                         f"hops again after {th['announced_after_s']} s")
        for j in tier["joins"]:
            lines.append(f"  start-instance {j['instance']} at {j['at']} s: warm after "
                         f"{j['warm_after_s']} s, in the router's next hops after "
                         f"{j['announced_after_s']} s")
        hops = {}
        for r in tier["router"]:
            hops.setdefault(r["vip"], []).append(f"{r['t']} s {'+'.join(r['next_hops']) or '-'}")
        for vip, rows in hops.items():
            lines.append(f"  router next hops for {vip}: " + "; ".join(rows[-8:]))
    sc2 = rep.get("second_chance")
    if sc2:
        tot = {k: sum(b[k] for b in sc2["backends"].values())
               for k in ("sc_redirected", "sc_arrived", "sc_kept", "sc_unknown_lb")}
        lines.append(f"  second chance (hold {sc2['hold_ms']} ms): instances sent / unsent "
                     + ", ".join(f"{n} {c['second_chance_sent']} / {c['second_chance_unsent']}"
                                 for n, c in sc2["instances"].items())
                     + f"; backends {tot} ("
                     + ", ".join(f"{n} {c['sc_redirected']} redirected, {c['sc_arrived']} arrived"
                                 for n, c in sc2["backends"].items()
                                 if c["sc_redirected"] or c["sc_arrived"]) + ")")
    for s in rep["shares"]:
        seen = (f"measured {s['measured']} ({s['probes']} flows), " if "probes" in s else "")
        lines.append(f"  share of new flows, VIP {s.get('vip', 'nccl')}, {s['from']:.1f}-"
                     f"{s['to']:.1f} s: {seen}formula {s['expected']}, control plane "
                     f"{s['reported']}")
    c = rep.get("new_flow_connect")
    if c:
        lines.append(f"  new flows' connect + hello: p50 {c['p50_ms']} ms, p99 {c['p99_ms']} ms, "
                     f"max {c['max_ms']} ms; {c['failed']} failed, {c['slow']} over "
                     f"{c['slow_bound_ms']} ms, {c['excused']} of those excused")
    nf = rep["new_flows"]
    lines.append(f"  new flows over the drill: {nf['probes']} ({nf['failed']} failed), by pool "
                 f"{nf['by_pool']}")
    for e in rep["elephants"]:
        lines.append(f"  iperf3 elephant {e['id']} on {e['backend']} (from "
                     f"{e.get('started', 0)} s, {e.get('planned_s')} s): {e['mbps']} Mbit/s, "
                     f"longest silence {e['longest_silence_ms']} ms, "
                     f"{'BROKEN' if e['broken'] else 'unbroken'}")
    lines += attribution.report_lines(rep.get("attribution"))
    lines += hop_cost.report_lines(rep.get("second_chance_cost"))
    for v in rep["invariants"]:
        lines.append(f"  {'ok  ' if v['ok'] else 'FAIL'} {v['name']}: {v['detail']}")
    lines.append(f"  report: {os.path.join(out_dir, 'report.json')}")
    lines.append(f"  plot:   {os.path.join(out_dir, 'flows.png')}")
    return "\n".join(lines)


def plot(d, rep, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib missing (Debian package python3-matplotlib)"
    t0 = d.t0
    tl = d.timeline
    pool_of = {n: b["pool"] for n, b in d.e.backends.items()}
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    times = [x["t"] - t0 for x in tl]
    for name in sorted(pool_of):
        ax1.plot(times, [x["active"].get(name, 0) for x in tl], label=name,
                 linestyle="-" if pool_of[name] == "onprem" else "--")
    ax1.set_ylabel("active flows")
    ax1.set_title(f"drill {rep['scenario']}: active flows per backend (client's view)")
    ax1.legend(loc="upper right", fontsize=8, ncol=2)
    for pool in sorted(set(pool_of.values())):
        ax2.plot(times, [sum(v for n, v in x["active"].items() if pool_of.get(n) == pool)
                         for x in tl], label=pool, linewidth=2)
    ax2.set_ylabel("active flows")
    ax2.set_title("per pool")
    ax2.legend(loc="upper right", fontsize=8)
    # Share of new flows per pool, over a sliding second.
    probes = sorted((p["t"] - t0, pool_of.get(p["backend"], "?")) for p in
                    d.flow_report["probes"] if p["ok"])
    for pool in sorted(set(pool_of.values())):
        xs, ys = [], []
        for i, (t, _) in enumerate(probes):
            window = [q for s, q in probes if t - 1.0 < s <= t]
            xs.append(t)
            ys.append(sum(1 for q in window if q == pool) / len(window))
        ax3.plot(xs, ys, label=f"{pool} (measured, 1 s window)")
    samples = [s for s in d.monitor.samples if not s.get("down")]
    for pool in sorted(set(pool_of.values())):
        ax3.plot([s["t"] - t0 for s in samples],
                 [s["shares"].get("nccl", {}).get(pool, 0) for s in samples],
                 linestyle=":", label=f"{pool} (control plane)")
    for s in rep["shares"]:
        for pool, v in s["expected"].items():
            ax3.hlines(v, s["from"], s["to"], colors="black", linewidth=2)
    ax3.set_ylabel("share of new flows")
    ax3.set_xlabel("drill time (s)")
    ax3.set_ylim(-0.05, 1.05)
    ax3.legend(loc="upper right", fontsize=7)
    for ax in (ax1, ax2, ax3):
        for a in d.actions:
            ax.axvline(a["at"], color="red", alpha=0.4)
    for a in d.actions:
        ax1.annotate(f"{a['do']} {a.get('target', '')}", (a["at"], ax1.get_ylim()[1]),
                     rotation=90, fontsize=7, va="top", ha="right", color="red")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


def write(d, measurements, verdicts, out_dir):
    rep = build(d, measurements, verdicts)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(rep, f, indent=1)
    err = plot(d, rep, os.path.join(out_dir, "flows.png"))
    text = summary(rep, out_dir)
    if err:
        text += f"\n  (no plot: {err})"
    with open(os.path.join(out_dir, "summary.txt"), "w") as f:
        f.write(text + "\n")
    return rep, text
