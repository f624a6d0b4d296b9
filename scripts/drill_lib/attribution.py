"""Which layer of flow affinity kept each surviving flow (README "Failover
drills", "Which layer kept each flow"; ARCHITECTURE.md "Layers of flow
affinity").

A flow keeps its backend through a kill, a restart or a table change because
one of these held it:
  second_chance  a backend's spillway-decap sent its packets on to the backend
                 that has its socket (decap_sc_flows: `spillway-decap
                 second-chance`): no load balancer remembered it;
  backend        an instance adopted it from an exception rebuilt from the
                 backends' connection lists;
  peer           ... from an exception a tier peer sent;
  checkpoint     ... from an exception restored from its own checkpoint
                 (`spillwayctl flows adopted`: the workers' adoption rings);
  flow_table     an instance tracks it on a backend its table no longer gives
                 (the last export's tracked exceptions, `flows adopted`'s
                 flow_table): the instance that placed it kept it;
  table          every running instance's table gives its backend: its entry
                 never moved (or moved back), so any instance places it there;
  unknown        none of these: its backend differs from the tables and no
                 layer shows it (a record overwritten in a full ring, an export
                 older than the move, an instance that died with its memory).
The first that applies, in that order, is the flow's layer; every one that
applies is listed with it. Flows whose layer is not "table" moved (their
entry, or their instance with it): those are the ones the report counts.

collect() reads the evidence from the running estate at the end of a drill,
before the traffic stops; attribute() is pure (synthetic tests:
tests/drill/judge_test.py).
"""
import ipaddress

LAYERS = ("second_chance", "backend", "peer", "checkpoint", "flow_table", "table", "unknown")
ORIGINS = ("backend", "peer", "checkpoint")
# How many flows the report names per layer.
LISTED = 12
# Actions after which the drill attributes its surviving flows.
TRIGGERS = {"restart-lb", "kill-instance", "stop-instance", "start-instance", "lb-drain",
            "freeze-instance"}


def wanted(sc):
    """Whether a scenario's report attributes flows: it kills, restarts,
    withdraws or adds a load balancer, or names the invariant."""
    return ("layers_unknown_max" in sc.get("invariants", {}) or
            any(a.get("do") in TRIGGERS for a in sc.get("action", [])))


def tuple_key(src, sport, dst, dport):
    """The key of a redirected flow: addresses normalised."""
    return (str(ipaddress.ip_address(src)), int(sport), str(ipaddress.ip_address(dst)),
            int(dport))


def read_table(call, vip):
    """An instance's table of `vip` as backend ids per slot, through
    `table digest` and its chunks (call: CliSocket.call)."""
    d = call("table.digest", vip=vip)
    tables = d.get("tables", [d]) if isinstance(d, dict) else d
    size = next(t["table_size"] for t in tables if t.get("vip") == vip)
    ids = [0] * size
    for chunk in range(len(next(t["chunks"] for t in tables if t.get("vip") == vip))):
        c = call("table.digest", vip=vip, chunk=chunk)
        backends, entries, first = c["backends"], c["entries"], c["first"]
        for i in range(len(entries) // 4):
            k = int(entries[4 * i:4 * i + 4], 16)
            ids[first + i] = backends[k - 1] if k else 0
    return ids


def collect(d, vip="nccl", log=None):
    """The evidence of every running instance and every backend, read now.
    Errors are kept in the result (the report shows them) rather than
    raised: attribution never fails a drill that could not read it."""
    import json
    import subprocess
    import time
    ev = {"instances": {}, "backends": {}, "errors": []}
    for inst in d.e.running():
        row = {}
        try:
            row["adopted"] = inst.ctl.call("flows.adopted")
        except Exception as e:  # noqa: BLE001 - recorded, reported
            ev["errors"].append(f"{inst.name}: flows adopted: {e}")
        try:
            names = {b["id"]: b["name"] for b in inst.ctl.call("backend.list")}
            row["table"] = [names.get(i) if i else None for i in read_table(inst.ctl.call, vip)]
        except Exception as e:  # noqa: BLE001
            ev["errors"].append(f"{inst.name}: table {vip}: {e}")
        ev["instances"][inst.name] = row
    for name, b in d.e.backends.items():
        try:
            asked = time.time()
            r = subprocess.run(["ip", "netns", "exec", b["ns"], d.e.tools.decap, "second-chance",
                                "--dev", "eth0", "--json"], capture_output=True, text=True,
                               timeout=10)
            if r.returncode != 0:
                ev["errors"].append(f"{name}: spillway-decap second-chance exited "
                                    f"{r.returncode}: {r.stderr.strip()[-200:]}")
                continue
            ev["backends"][name] = json.loads(r.stdout)
            # When its times were taken (its first_ms_ago and last_ms_ago
            # count back from then): between asking and the answer.
            ev["backends"][name]["read_at"] = round((asked + time.time()) / 2, 3)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            ev["errors"].append(f"{name}: spillway-decap second-chance: {e}")
    if log:
        log(f"attribution evidence: {len(ev['instances'])} instances, {len(ev['backends'])} "
            f"backends, {len(ev['errors'])} errors")
    return ev


def index(ev):
    """The evidence by flow: redirected tuples (with the unix times of their
    first and last redirect, where the listing's read time is known),
    adoptions and tracked exceptions by hash, and the running instances'
    tables."""
    redirected, adopted, tracked, tables = {}, {}, {}, {}
    for backend, rep in ev.get("backends", {}).items():
        read_at = rep.get("read_at")
        for f in rep.get("redirected", []):
            key = tuple_key(f["src"], f["sport"], f["dst"], f["dport"])
            row = {"by": backend, "hop": f.get("hop"), "packets": f.get("packets")}
            if read_at is not None and "first_ms_ago" in f and "last_ms_ago" in f:
                row.update(first=read_at - f["first_ms_ago"] / 1000,
                           last=read_at - f["last_ms_ago"] / 1000, read_at=read_at)
            redirected.setdefault(key, []).append(row)
    for inst, row in ev.get("instances", {}).items():
        a = row.get("adopted") or {}
        for r in a.get("adopted", []):
            adopted.setdefault(r["hash"], []).append(dict(r, instance=inst))
        for r in (a.get("flow_table") or {}).get("flows", []):
            tracked.setdefault(r["hash"], []).append(dict(r, instance=inst))
        if row.get("table"):
            tables[inst] = row["table"]
    return redirected, adopted, tracked, tables


def layers_of(flow_backend, key, h, redirected, adopted, tracked, tables, slot_of):
    """Every layer that shows the flow (in LAYERS order), with what showed it."""
    out = []
    if key in redirected:
        out.append(("second_chance", ", ".join(f"{r['by']} sent {r['packets']} packets to "
                                               f"{r['hop']}" for r in redirected[key])))
    for origin in ORIGINS:
        rows = [r for r in adopted.get(h, []) if r.get("origin") == origin and
                r.get("backend") == flow_backend]
        if rows:
            out.append((origin, ", ".join(f"{r['instance']} adopted it" for r in rows)))
    rows = [r for r in tracked.get(h, []) if r.get("backend") == flow_backend]
    if rows:
        out.append(("flow_table", ", ".join(f"tracked by {r['instance']}" for r in rows)))
    if tables and all(t[slot_of(h, len(t))] == flow_backend for t in tables.values()):
        out.append(("table", "every running instance's table gives it"))
    return out


def attribute(flows, ev, key_of, hash_of, slot_of):
    """Attributes each flow of `flows` (the surviving ones, each with "id" and
    "backend") to a layer. key_of(flow): its (src, sport, dst, dport);
    hash_of(flow): its flow hash; slot_of(hash, table_size): its table slot.
    Returns the report's "attribution" measurements."""
    redirected, adopted, tracked, tables = index(ev)
    counts = {layer: 0 for layer in LAYERS}
    listed = {layer: [] for layer in LAYERS}
    kept = []
    for f in flows:
        h = hash_of(f)
        key = tuple_key(*key_of(f))
        found = layers_of(f.get("backend"), key, h, redirected, adopted, tracked, tables,
                          slot_of)
        layer = found[0][0] if found else "unknown"
        counts[layer] += 1
        if layer == "second_chance":
            kept.append(second_chance_row(f, redirected[key], [x for x, _ in found[1:]]))
        if len(listed[layer]) < LISTED:
            listed[layer].append({"id": f.get("id"), "backend": f.get("backend"), "hash": h,
                                  "layers": [x for x, _ in found],
                                  "why": "; ".join(w for _, w in found) or "no layer shows it"})
    moved = sum(n for layer, n in counts.items() if layer != "table")
    return {"flows": len(flows), "moved": moved, "by_layer": counts,
            "listed": {k: v for k, v in listed.items() if v},
            "sources": {"instances": {n: {"adopted": len(((r.get("adopted") or {})
                                                           .get("adopted")) or []),
                                          "flow_table": ((r.get("adopted") or {})
                                                         .get("flow_table") or {}).get("total"),
                                          "table": bool(r.get("table"))}
                                      for n, r in ev.get("instances", {}).items()},
                        "backends": {n: r.get("flows", 0)
                                     for n, r in ev.get("backends", {}).items()}},
            "errors": ev.get("errors", []),
            "second_chance_flows": kept}


def second_chance_row(f, rows, other_layers):
    """A flow the second chance kept: every backend that sent it on, its
    packets, and the unix times of the first and last redirect any of them
    saw (None where a listing's read time is unknown). decap_sc_flows keeps
    only those two per backend: a flow sent on in two episodes spans the gap
    between them. other_layers: the layers that show it too (an instance
    that adopted or tracks it now)."""
    timed = [r for r in rows if "first" in r]
    return {"id": f.get("id"), "backend": f.get("backend"),
            "by": sorted({r["by"] for r in rows}), "hops": sorted({str(r["hop"]) for r in rows}),
            "packets": sum(r.get("packets") or 0 for r in rows),
            "first": round(min(r["first"] for r in timed), 3) if timed else None,
            "last": round(max(r["last"] for r in timed), 3) if timed else None,
            "read_at": max(r["read_at"] for r in timed) if timed else None,
            # Each backend's own: as a slot steps on, the backend that sends
            # the flow on changes (an on-prem one, then a cloud one).
            "legs": sorted(({"by": r["by"], "hop": str(r["hop"]),
                             "packets": r.get("packets") or 0, "first": round(r["first"], 3),
                             "last": round(r["last"], 3), "read_at": r["read_at"]}
                            for r in timed), key=lambda x: (x["first"], x["by"])),
            "other_layers": other_layers}


def judge(d, surviving, check, flow_hash, slot_of, client, vip, port):
    """The drill's attribution of its surviving long-lived flows (None when
    the scenario does not ask for it or nothing was collected). With
    invariants.layers_unknown_max, a verdict on the unknown count."""
    ev = getattr(d, "attribution_evidence", None)
    if ev is None or not wanted(d.sc):
        return None
    flows = [f for f in surviving if f.get("backend") and f.get("local_port")]
    out = attribute(flows, ev, lambda f: (client, f["local_port"], vip, port),
                    lambda f: flow_hash(client, f["local_port"], vip, port), slot_of)
    limit = d.sc["invariants"].get("layers_unknown_max")
    if limit is not None:
        check("layers_known", out["by_layer"]["unknown"] <= limit and not out["errors"],
              f"{out['by_layer']['unknown']} surviving flows kept by no layer the drill can see "
              f"(at most {limit}); by layer {summary_counts(out)}" +
              (f"; evidence not read: {'; '.join(out['errors'])}" if out["errors"] else ""))
    return out


def summary_counts(att):
    return ", ".join(f"{k} {v}" for k, v in att["by_layer"].items() if v) or "none"


def report_lines(att):
    """The summary's lines for the report's "attribution"."""
    if not att:
        return []
    lines = [f"  which layer kept the {att['flows']} surviving flows: {summary_counts(att)} "
             f"({att['moved']} moved; unknown {att['by_layer']['unknown']})"]
    for layer, rows in att["listed"].items():
        if layer == "table":
            continue
        more = att["by_layer"][layer] - len(rows)
        lines.append(f"    {layer}: " + "; ".join(
            f"flow {r['id']} on {r['backend']} ({r['why']})" for r in rows) +
            (f" and {more} more" if more > 0 else ""))
    for e in att["errors"]:
        lines.append(f"    (not read: {e})")
    return lines
