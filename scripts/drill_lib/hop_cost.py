"""What second chance costs the flows it kept (issue 24, "measure the cost";
ARCHITECTURE.md "Second chance"): a measurement for the report, never a
verdict.

For each surviving flow the attribution puts on the "second_chance" layer
(attribution.second_chance_row: the first and last redirect its backends'
decap_sc_flows recorded, as unix times), from the flow checker's per-flow
echo round trips (flows.json, "rtt": [[t, median_ms, samples, max_ms], ...],
one point per interval of `rtt_ms`):

  before_ms   the median of its intervals that ended before its first
              redirect: the path client -> instance -> backend;
  during_ms   ... of its intervals wholly between its first and its last
              redirect (or the evidence's reading, when it was still being
              sent on then): the path with the extra backend-to-backend hop;
  extra_ms    during_ms - before_ms: the extra hop's latency, as the flow
              saw it;
  control_*   the same intervals' medians over the surviving flows that no
              backend sent on (the median across them per interval, then
              the median of those): what the drill's load did to everyone
              in the same seconds, so extra_ms - control_extra_ms is the
              hop's share;
  lived_s     from the first redirect to the last one, or to the reading
              when the last came within STILL_ON_S of it (still on its
              second chance at the end of the drill: the hold outlasts it).
              decap_sc_flows keeps the first and last time only: a flow sent
              on in two episodes spans the gap between them, which
              packets_per_s (redirected packets over lived_s) then shows low:
              under GAPS_RATE of the median rate of the flows that lived on
              it a second or more, the flow is marked `gaps` and left out of
              the extra hop's figures (its "during" mixes both paths).

legs: the same per backend that sent the flow on (its own first and last
redirect): as the survivors' tables step on, the backend that has the
flow's slot changes (an on-prem backend, then a cloud one), and each leg's
path costs its own. extra_by_path is by leg ("SENT-ON-BY -> BACKEND"): the
hop's latency per path; legs of two backends that overlap in time both
count the overlap.

measure() is pure (synthetic tests: tests/drill/judge_test.py).
"""
import statistics

# A last redirect this close to the listing's reading: still on it then
# (a live flow sends every 50 ms).
STILL_ON_S = 1.0
# Sent on at under this share of the others' packet rate: episodes with gaps.
GAPS_RATE = 0.5
# How many flows summary.txt names.
LISTED = 12


def median(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": median(xs), "min": round(min(xs), 3), "max": round(max(xs), 3),
            "n": len(xs)}


def phases(points, interval_s, first, end):
    """The flow's RTT points before `first` and within [first, end], each
    wholly inside its phase (an interval across a boundary counts in
    neither)."""
    before = [p for p in points if p[0] + interval_s <= first]
    during = [p for p in points if p[0] >= first and p[0] + interval_s <= end]
    return before, during


def measure(att, flows, t0, interval_ms):
    """The report's "second_chance_cost" from the attribution (attribution.
    attribute) and the flow checker's flows (flows.json "flows"); None when
    the attribution found no flow kept by second chance. t0: the drill's
    start (unix seconds), for times relative to it; interval_ms: the flow
    checker's RTT interval (flows.json "rtt_ms")."""
    kept = (att or {}).get("second_chance_flows") or []
    if not kept:
        return None
    interval_s = interval_ms / 1000
    by_id = {f.get("id"): f for f in flows}
    ids = {k["id"] for k in kept}
    # Per interval start: the median across the flows no backend sent on.
    by_t = {}
    for f in flows:
        if f.get("id") in ids:
            continue
        for p in f.get("rtt") or []:
            by_t.setdefault(p[0], []).append(p[1])
    control = {t: statistics.median(v) for t, v in by_t.items()}
    rows = []
    for k in kept:
        f = by_id.get(k["id"]) or {}
        row = {"id": k["id"], "backend": k["backend"], "by": k["by"], "hops": k["hops"],
               "packets": k["packets"], "other_layers": k.get("other_layers", [])}
        if k.get("first") is None:
            row["error"] = "no redirect times (the listing's read time is unknown)"
            rows.append(row)
            continue
        still_on = k["read_at"] - k["last"] <= STILL_ON_S
        end = k["read_at"] if still_on else k["last"]
        lived = max(0.0, end - k["first"])
        before, during = phases(f.get("rtt") or [], interval_s, k["first"], end)
        b = median(p[1] for p in before)
        d = median(p[1] for p in during)
        cb = median(control.get(p[0]) for p in before)
        cd = median(control.get(p[0]) for p in during)
        row.update({
            "first_s": round(k["first"] - t0, 3), "last_s": round(k["last"] - t0, 3),
            "still_on_at_end": still_on, "lived_s": round(lived, 3),
            "packets_per_s": round(k["packets"] / lived, 1) if lived > 0 else None,
            "intervals_before": len(before), "intervals_during": len(during),
            "before_ms": b, "during_ms": d,
            "extra_ms": round(d - b, 3) if b is not None and d is not None else None,
            "control_before_ms": cb, "control_during_ms": cd,
            "control_extra_ms": round(cd - cb, 3) if cb is not None and cd is not None
            else None})
        row["legs"] = [leg_of(x, f, interval_s, t0, b, cb, control) for x in k.get("legs", [])]
        rows.append(row)
    timed = [r for r in rows if "lived_s" in r]
    ref = median(r["packets_per_s"] for r in timed if r["lived_s"] >= 1)
    legs = [x for r in timed for x in r["legs"]]
    ref_leg = median(x["packets_per_s"] for x in legs if x["lived_s"] >= 1)
    for r in timed:
        r["gaps"] = gaps(r, ref)
        for x in r["legs"]:
            x["gaps"] = gaps(x, ref_leg)
    both = [r for r in timed if r["extra_ms"] is not None and not r["gaps"]]
    paths = {}
    for r in timed:
        for x in r["legs"]:
            if x["extra_ms"] is not None and not x["gaps"]:
                paths.setdefault(f"{x['by']} -> {r['backend']}", []).append(x["extra_ms"])
    return {
        "rtt_interval_ms": interval_ms,
        "flows": len(rows),
        "measured": len(both),
        "still_on_at_end": sum(1 for r in timed if r["still_on_at_end"]),
        "packets_per_s": ref,
        "with_gaps": sum(1 for r in timed if r["gaps"]),
        "before_ms": median(r["before_ms"] for r in both),
        "during_ms": median(r["during_ms"] for r in both),
        "extra_ms": spread([r["extra_ms"] for r in both]),
        "control_extra_ms": median(r["control_extra_ms"] for r in both),
        "extra_by_path": {path: spread(v) for path, v in sorted(paths.items())},
        "lived_s": spread([r["lived_s"] for r in timed]),
        "per_flow": rows,
    }


def gaps(row, ref):
    """Sent on at under GAPS_RATE of the reference rate for a second or
    more: episodes with gaps between them."""
    return bool(ref and row["lived_s"] >= 1 and row["packets_per_s"] is not None and
                row["packets_per_s"] < GAPS_RATE * ref)


def leg_of(leg, f, interval_s, t0, before_ms, control_before_ms, control):
    """One backend's part of a flow's second chance: its window, and the
    flow's round trips wholly inside it against the flow's before phase."""
    still_on = leg["read_at"] - leg["last"] <= STILL_ON_S
    end = leg["read_at"] if still_on else leg["last"]
    lived = max(0.0, end - leg["first"])
    _, during = phases(f.get("rtt") or [], interval_s, leg["first"], end)
    d = median(p[1] for p in during)
    cd = median(control.get(p[0]) for p in during)
    return {"by": leg["by"], "first_s": round(leg["first"] - t0, 3),
            "last_s": round(leg["last"] - t0, 3), "still_on_at_end": still_on,
            "lived_s": round(lived, 3), "packets": leg["packets"],
            "packets_per_s": round(leg["packets"] / lived, 1) if lived > 0 else None,
            "intervals_during": len(during), "during_ms": d,
            "extra_ms": round(d - before_ms, 3) if d is not None and before_ms is not None
            else None,
            "control_extra_ms": round(cd - control_before_ms, 3)
            if cd is not None and control_before_ms is not None else None}


def fmt(x, unit=" ms", sign=False):
    if x is None:
        return "n/a"
    return f"{'+' if sign and x >= 0 else ''}{x}{unit}"


def report_lines(cost):
    """The summary's lines for the report's "second_chance_cost"."""
    if not cost:
        return []
    e, lv = cost["extra_ms"], cost["lived_s"]
    lines = [f"  second chance's cost ({cost['flows']} flows kept by it; measured, not judged): "
             f"echo RTT median {fmt(cost['before_ms'])} before, {fmt(cost['during_ms'])} on "
             f"it: extra hop {fmt(e and e['median'], sign=True)} (flows' "
             f"{fmt(e and e['min'], '')}..{fmt(e and e['max'])}, {cost['measured']} with "
             f"both phases; the other flows in the same intervals "
             f"{fmt(cost['control_extra_ms'], sign=True)}); lived on it "
             f"{fmt(lv and lv['median'], ' s')} (min {fmt(lv and lv['min'], ' s')}, max "
             f"{fmt(lv and lv['max'], ' s')}), {cost['still_on_at_end']} still on it at the "
             f"end" + (f"; {cost['with_gaps']} sent on at under half the others' "
                       f"{cost['packets_per_s']} packets/s (episodes with gaps: not in the "
                       f"extra hop)" if cost.get("with_gaps") else "")]
    for path, s in cost["extra_by_path"].items():
        lines.append(f"    {path}: extra {fmt(s['median'], sign=True)} over {s['n']} flows' "
                     f"legs ({s['min']}..{s['max']} ms)")
    for r in cost["per_flow"][:LISTED]:
        if "error" in r:
            lines.append(f"    flow {r['id']} on {r['backend']}: {r['error']}")
            continue
        lines.append(
            f"    flow {r['id']} on {r['backend']} via {'+'.join(r['by'])}: "
            f"{r['first_s']}-{r['last_s']} s ({r['lived_s']} s"
            f"{', still on it at the end' if r['still_on_at_end'] else ''}), "
            f"{r['packets']} packets; RTT {fmt(r['before_ms'])} -> {fmt(r['during_ms'])} "
            f"({fmt(r['extra_ms'], sign=True)}; others {fmt(r['control_extra_ms'], sign=True)})"
            + (f"; {r['packets_per_s']} packets/s: episodes with gaps" if r["gaps"] else "")
            + ("; legs " + ", ".join(
                f"{x['by']} {x['first_s']}-{x['last_s']} s {fmt(x['extra_ms'], sign=True)}"
                for x in r["legs"]) if len(r["legs"]) > 1 else "")
            + (f"; also {', '.join(r['other_layers'])}" if r["other_layers"] else ""))
    more = len(cost["per_flow"]) - LISTED
    if more > 0:
        lines.append(f"    and {more} more (report.json)")
    return lines
