"""Backends that a drill pool discovers from a watched file or from a DNS
name (spillwayd's `[[pool]] discovery = { kind = "file" | "dns", ... }`,
README "Discovery: backends that come and go by themselves"), and what the
drill does and judges about them.

`discovery = { kind = "dns", ttl = S, hold = S, listed = [...] }`: the
estate runs dnsmasq in spillwayd's namespace (127.0.0.1:5353) answering
POOL.drill.test with the listed backends' addresses from a hosts file
(work/discovery/POOL.hosts), TTL `ttl` (default 1 s); spillwayd resolves the
name (min_ttl = ttl). spillwayd names such a backend after its address
(d-10-2-0-5): the monitor maps it back to the estate's name (aliases).
discovery-write then rewrites the hosts file and SIGHUPs dnsmasq, and waits
until spillwayd's `discovery` answer lists exactly the new set (within
READ_WITHIN_S). A torn write is a file's matter: refused for dns.

A scenario's pool with `discovery = { hold = S, listed = [...] }` takes its
backends from a file_sd file the estate writes (work/discovery/POOL.json,
one target group per backend, its `name` label the estate's backend name):
they are left out of spillwayd's [[backend]] list, and the file lists
`listed` (default every backend of the pool) at start. Actions:

  discovery-write (`targets`: the backends the file lists from now on;
    `pool` when several pools discover): the file replaced atomically (write
    aside, rename over it), as a controller should; the action waits until
    spillwayd has read it (its `discovery` refresh count moved) and fails if
    it does not within READ_WITHIN_S;
  discovery-torn-write (`for` s, `pool`): the same list written in place in
    two halves, the first closed on its own (a torn file, as a writer that
    does not rename leaves it), the rest appended `for` s later. The record
    keeps the source's status before, after the torn half and after the
    completed file plus a hold (so an absence the torn file caused would have
    ended its hold by then); the judge requires the torn half refused with
    an error and nothing joined, left or damped because of it.
"""
import json
import os
import signal
import time

from estate_harness import maglev_model
from estate_harness.estate import Fail as DrillError

# How long an action waits for spillwayd to read the file it wrote.
READ_WITHIN_S = 5.0
TORN_FOR_DEFAULT_S = 1.0
TORN_FOR_MAX_S = 60.0
HOLD_MAX_S = 3600
POOL_KEYS = ("kind", "ttl", "hold", "listed")
KINDS = ("file", "dns")
TTL_MAX_S = 30
DNS_LISTEN = "127.0.0.1"
DNS_PORT = 5353
DNSMASQ = "/usr/sbin/dnsmasq"


# -- the scenario ----------------------------------------------------------------------
def pools(sc):
    """Pool names whose backends the drill's spillwayd discovers."""
    return [p for p, conf in sc.get("pools", {}).items() if "discovery" in conf]


def kind(sc, pool):
    return sc["pools"][pool]["discovery"].get("kind", "file")


def dns_name(pool):
    return f"{pool}.drill.test"


def listed_at_start(sc, pool, members):
    conf = sc["pools"][pool]["discovery"]
    return list(conf["listed"]) if "listed" in conf else list(members)


def validate(sc, names_by_pool, bad):
    """The pools' discovery tables and the discovery actions. names_by_pool:
    pool -> the estate's backend names in it. `bad(msg)` raises."""
    found = pools(sc)
    for p in found:
        conf = sc["pools"][p]["discovery"]
        if not isinstance(conf, dict):
            bad(f"pools.{p}.discovery must be a table ({', '.join(POOL_KEYS)})")
        for k in conf:
            if k not in POOL_KEYS:
                bad(f"pools.{p}.discovery.{k} is not a key the drill knows "
                    f"({', '.join(POOL_KEYS)})")
        k = conf.get("kind", "file")
        if k not in KINDS:
            bad(f"pools.{p}.discovery.kind = {k!r} must be one of {', '.join(KINDS)}")
        if "ttl" in conf:
            ttl = conf["ttl"]
            if k != "dns":
                bad(f"pools.{p}.discovery.ttl is the DNS answer's TTL: only with kind = \"dns\"")
            if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= TTL_MAX_S:
                bad(f"pools.{p}.discovery.ttl = {ttl!r} must be a whole number of seconds, "
                    f"1..{TTL_MAX_S}")
        if k == "dns" and sc.get("estate", {}).get("instances"):
            bad(f"pools.{p}.discovery: kind = \"dns\" runs its server in the one gateway's "
                f"namespace: not in a tier (estate.instances)")
        hold = conf.get("hold", 5)
        if not isinstance(hold, (int, float)) or isinstance(hold, bool) or \
                not 0 <= hold <= HOLD_MAX_S:
            bad(f"pools.{p}.discovery.hold = {hold!r} must be 0..{HOLD_MAX_S} seconds")
        listed = conf.get("listed", names_by_pool.get(p, []))
        if not isinstance(listed, list) or not all(n in names_by_pool.get(p, [])
                                                   for n in listed):
            bad(f"pools.{p}.discovery.listed = {listed!r} must be a list of the pool's "
                f"backends ({', '.join(sorted(names_by_pool.get(p, [])))})")
    for k in ("discovered_reached_max_s", "unlisted_avoid_after_s"):
        v = sc.get("invariants", {}).get(k)
        if v is None:
            continue
        if not found:
            bad(f"invariants.{k} judges discovery-write actions: it needs a pool with "
                f"`discovery`")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 60:
            bad(f"invariants.{k} = {v!r} must be 0..60 seconds")
    for i, a in enumerate(sc.get("action", [])):
        if a.get("do") not in ("discovery-write", "discovery-torn-write"):
            continue
        where = f"action {i + 1}"
        if not found:
            bad(f"{where}: {a['do']} needs a pool with `discovery` (pools.NAME.discovery)")
        pool = a.get("pool")
        if pool is None and len(found) > 1:
            bad(f"{where}: several pools discover ({', '.join(found)}): name the `pool`")
        pool = pool if pool is not None else found[0]
        if pool not in found:
            bad(f"{where}: pool = {pool!r} has no discovery (pools with it: "
                f"{', '.join(found)})")
        if a["do"] == "discovery-write":
            targets = a.get("targets")
            if not isinstance(targets, list):
                bad(f"{where}: discovery-write needs targets = [backend names] (the file's "
                    f"whole list; [] for none)")
            for t in targets:
                if t not in names_by_pool.get(pool, []):
                    bad(f"{where}: targets has {t!r}, not a backend of pool {pool} "
                        f"({', '.join(sorted(names_by_pool.get(pool, [])))})")
            if len(set(targets)) != len(targets):
                bad(f"{where}: targets lists a backend twice: {targets}")
        else:
            if kind(sc, pool) == "dns":
                bad(f"{where}: discovery-torn-write tears a file: pool {pool} discovers "
                    f"from DNS")
            if "targets" in a:
                bad(f"{where}: discovery-torn-write rewrites the list the file has "
                    f"(no targets)")
            f = a.get("for", TORN_FOR_DEFAULT_S)
            if not isinstance(f, (int, float)) or isinstance(f, bool) or \
                    not 0 < f <= TORN_FOR_MAX_S:
                bad(f"{where}: for = {f!r} must be 0..{TORN_FOR_MAX_S:g} seconds (how long "
                    f"the torn half stays)")


# -- the estate --------------------------------------------------------------------------
def folder(work):
    return os.path.join(work, "discovery")


def path(work, pool):
    return os.path.join(folder(work), f"{pool}.json")


def hosts_path(work, pool):
    return os.path.join(folder(work), f"{pool}.hosts")


def spillwayd_keys(work, pool, conf):
    """The pool's `discovery` table in spillwayd's configuration."""
    hold = conf.get("hold", 5)
    if conf.get("kind", "file") == "dns":
        ttl = conf.get("ttl", 1)
        return {"kind": "dns", "name": dns_name(pool), "server": f"{DNS_LISTEN}:{DNS_PORT}",
                "min_ttl": ttl, "max_ttl": TTL_MAX_S, "timeout": 0.5, "hold": hold}
    return {"kind": "file", "path": path(work, pool), "hold": hold}


def write_hosts(estate, pool, names):
    """dnsmasq's hosts file: the pool's name resolves to `names`' addresses."""
    os.makedirs(folder(estate.work), exist_ok=True)
    target = hosts_path(estate.work, pool)
    with open(target + ".tmp", "w") as f:
        f.writelines(f"{estate.backends[n]['address']} {dns_name(pool)}\n" for n in names)
    os.replace(target + ".tmp", target)


def start_dns(drill, pool, ttl):
    """dnsmasq in spillwayd's namespace, authoritative for the pool's name
    (--local: never forwarded), answering from its hosts file with TTL
    `ttl`; SIGHUP reads the file again."""
    e = drill.e
    if not os.access(DNSMASQ, os.X_OK):
        raise DrillError(f"{DNSMASQ} is not installed (scripts/bootstrap installs "
                         "dnsmasq-base)")
    log_name = f"dnsmasq-{pool}.log"
    hosts = hosts_path(e.work, pool)
    proc = e.spawn([DNSMASQ, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv",
                    "--no-hosts", f"--addn-hosts={hosts}", "--local=/drill.test/",
                    f"--listen-address={DNS_LISTEN}", "--bind-interfaces", f"--port={DNS_PORT}",
                    f"--local-ttl={ttl}", "--pid-file=", "--user=root", "--log-facility=-"],
                   ns=e.instances[e.primary].ns, log_name=log_name)
    log_path = os.path.join(e.work, log_name)
    end = time.time() + 10
    while "read " + hosts not in open(log_path).read():
        if proc.poll() is not None or time.time() > end:
            raise DrillError(f"dnsmasq did not read {hosts} within 10 s: "
                             f"{open(log_path).read()[-600:]}")
        time.sleep(0.05)
    return proc


def aliases(estate, sc):
    """spillwayd's names of the DNS pools' backends (d-ADDRESS, dashes for
    dots) -> the estate's names."""
    out = {}
    for p in pools(sc):
        if kind(sc, p) == "dns":
            for n, b in estate.backends.items():
                if b["pool"] == p:
                    out["d-" + b["address"].replace(".", "-").replace(":", "-")] = n
    return out


def render(estate, names):
    """The file_sd text listing `names` (one group each, with its name label),
    a line per group so a parse error has a line to name."""
    weights = estate.sc.get("weights", {})
    groups = [{"targets": [estate.backends[n]["address"]],
               "labels": dict({"name": n}, **({"weight": str(weights[n])} if n in weights
                                             else {}))}
              for n in names]
    return "[\n" + ",\n".join(json.dumps(g) for g in groups) + "\n]\n"


def write_atomic(estate, pool, names):
    os.makedirs(folder(estate.work), exist_ok=True)
    os.chmod(folder(estate.work), 0o755)
    target = path(estate.work, pool)
    tmp = target + ".tmp"
    with open(tmp, "w") as f:
        f.write(render(estate, names))
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)


def setup(drill):
    """The starting files, before spillwayd starts: each discovery pool's
    listed backends."""
    sc, e = drill.sc, drill.e
    drill.discovery_listed = {}
    drill.dns_servers = {}
    for p in pools(sc):
        members = [n for n, b in e.backends.items() if b["pool"] == p]
        names = listed_at_start(sc, p, [n for n in members if n in sc["start_members"]])
        drill.discovery_listed[p] = list(names)
        if kind(sc, p) == "dns":
            write_hosts(e, p, names)
            drill.dns_servers[p] = start_dns(drill, p, sc["pools"][p]["discovery"].get("ttl", 1))
        else:
            write_atomic(e, p, names)


def backend_id(address):
    """spillwayd's discoveredBackendId: FNV-1a 64 of "discovered " and the
    address (control/discovery/file_sd.hpp)."""
    return maglev_model.fnv1a64("discovered " + address)


def add_to_model_config(drill, config):
    """The placement model's configuration (maglev_model reads [[backend]]):
    the starting file plus the backends the discovery files list at start,
    with the ids spillwayd gives them. spillwayd reads the files before its
    first tables, so they are numbered with the file's backends."""
    e = drill.e
    with open(config, "a") as f:
        for pool, names in drill.discovery_listed.items():
            for n in names:
                addr = e.backends[n]["address"]
                f.write(f"\n[[backend]]  # discovered\nname = \"{n}\"\naddress = \"{addr}\"\n"
                        f"pool = \"{pool}\"\nweight = {drill.sc['weights'].get(n, 100)}\n"
                        f"id = \"{backend_id(addr):#x}\"\n")


def source_status(estate, pool):
    """The pool's source in spillwayd's `discovery` answer, or None."""
    try:
        answer = estate.ctl.call("discovery")
    except (OSError, ValueError, DrillError):
        return None
    for s in answer.get("sources", []):
        if s.get("pool") == pool:
            alias = aliases(estate, estate.sc)
            listed = sorted(alias.get(x["name"], x["name"]) for x in s.get("entries", [])
                            if x.get("listed"))
            return {k: s.get(k) for k in ("refreshes", "errors", "joined", "left", "damped",
                                          "last_error")} | {"listed": listed}
    return None


def wait_status(estate, pool, pred, within=READ_WITHIN_S):
    end = time.time() + within
    while True:
        st = source_status(estate, pool)
        if st is not None and pred(st):
            return st
        if time.time() > end:
            return None
        time.sleep(0.02)


def pool_of_action(sc, a):
    return a.get("pool") or pools(sc)[0]


def act(drill, a, rec):
    """discovery-write and discovery-torn-write (see the module's doc);
    returns the action's result."""
    e, sc = drill.e, drill.sc
    pool = pool_of_action(sc, a)
    rec["pool"] = pool
    members = [n for n, b in e.backends.items() if b["pool"] == pool]
    before = source_status(e, pool)
    if before is None:
        return f"error: spillwayd shows no discovery source for pool {pool}"
    if a["do"] == "discovery-write":
        old = drill.discovery_listed[pool]
        names = list(a["targets"])
        t = time.time()
        rec["listed"] = names
        rec["unlisted"] = [n for n in members if n not in names]
        rec["changed"] = sorted(set(old) ^ set(names))
        rec["joined"] = [n for n in names if n not in old]
        rec["left"] = [n for n in old if n not in names]
        drill.discovery_listed[pool] = names
        if kind(sc, pool) == "dns":
            write_hosts(e, pool, names)
            drill.dns_servers[pool].send_signal(signal.SIGHUP)
            # Read once spillwayd's answer lists exactly the new set (the
            # query after the TTL).
            got = wait_status(e, pool, lambda s: s["listed"] == sorted(names))
            if got is None:
                return (f"error: spillwayd's answer did not list {sorted(names)} within "
                        f"{READ_WITHIN_S:g} s (now {(source_status(e, pool) or {}).get('listed')})")
            rec["read_s"] = round(time.time() - t, 3)
            return "ok"
        write_atomic(e, pool, names)
        got = wait_status(e, pool, lambda s: s["refreshes"] > before["refreshes"])
        if got is None:
            return (f"error: spillwayd did not read the file within {READ_WITHIN_S:g} s "
                    f"(refreshes still {before['refreshes']})")
        rec["read_s"] = round(time.time() - t, 3)
        return "ok"
    # discovery-torn-write
    names = drill.discovery_listed[pool]
    text = render(e, names)
    half = text[:len(text) // 2]
    hold = float(sc["pools"][pool]["discovery"].get("hold", 5))
    torn_for = a.get("for", TORN_FOR_DEFAULT_S)
    rec["for"] = torn_for
    src = rec["source"] = {"before": before}  # the source's status, as it went
    target = path(e.work, pool)
    t_torn = time.time()
    with open(target, "w") as f:  # in place: truncated, half written, closed
        f.write(half)
    src["t_torn"] = t_torn
    mid = wait_status(e, pool, lambda s: s["errors"] > before["errors"])
    src["torn"] = mid  # None: no error reported within READ_WITHIN_S
    delay = t_torn + torn_for - time.time()
    if delay > 0:
        time.sleep(delay)
    seen = mid or source_status(e, pool) or before
    t_done = time.time()
    with open(target, "a") as f:  # completed in place
        f.write(text[len(half):])
    src["t_completed"] = t_done
    src["completed"] = wait_status(e, pool, lambda s: s["refreshes"] > seen["refreshes"] and
                                   s["last_error"] is None)
    # A hold after the torn file: an absence it had caused would have
    # drained its backends by now.
    delay = t_torn + hold + 0.3 - time.time()
    if delay > 0:
        time.sleep(delay)
    src["after"] = source_status(e, pool)
    src["t_after"] = time.time()
    return "ok"


# -- the judge ---------------------------------------------------------------------------
def leaving(s, name):
    """In a control sample: the backend is gone, removed or draining (out of
    new flows for good), rather than in (active, failed, disabled)."""
    row = s["backends"].get(name)
    return row is None or row.get("state") in ("removed", "draining", None)


def judge_answers(d, check, rel):
    """Per discovery-write, by the new flows (probes, served by the
    estate's names): `discovered_reached_max_s` (each backend the write
    listed anew is reached by a new flow within that many seconds of the
    write: TTL plus readiness) and `unlisted_avoid_after_s` (no new flow
    reaches a backend the write dropped from that many seconds after it, until
    a later write lists it again). Returns the report's rows."""
    inv = d.sc["invariants"]
    reach, avoid = inv.get("discovered_reached_max_s"), inv.get("unlisted_avoid_after_s")
    if reach is None and avoid is None:
        return []
    probes = [p for p in d.flow_report["probes"] if p.get("ok") and p.get("backend")]
    writes = [a for a in d.actions if a["do"] == "discovery-write" and a["result"] == "ok"]
    rows = []
    for i, a in enumerate(writes):
        label = f"{a['pool']} {a['at']} s"
        row = {"at": a["at"], "pool": a["pool"], "joined": {}, "left": {}}
        if reach is not None:
            for n in a.get("joined", []):
                first = next((p["t"] for p in sorted(probes, key=lambda p: p["t"])
                              if p["t"] >= a["t"] and p["backend"] == n), None)
                v = round(first - a["t"], 3) if first is not None else None
                row["joined"][n] = v
                check(f"discovered_reached[{n} {label}]", v is not None and v <= reach,
                      f"listed at {rel(a['t'])} s: first new flow on {n} " +
                      (f"{v} s after (at most {reach})" if v is not None else "never"))
        if avoid is not None:
            for n in a.get("left", []):
                back = [b["t"] for b in writes[i + 1:] if n in b.get("listed", [])]
                lo, hi = a["t"] + avoid, min(back) if back else float("inf")
                hit = [p for p in probes if lo <= p["t"] < hi and p["backend"] == n]
                row["left"][n] = len(hit)
                check(f"unlisted_avoid[{n} {label}]", not hit,
                      f"dropped at {rel(a['t'])} s: {len(hit)} new flows reached {n} from "
                      f"{avoid} s after" + ("" if not hit else "; at " + ", ".join(
                          f"{rel(p['t'])} s" for p in hit[:6])))
        rows.append(row)
    return rows


def judge(d, check, rel):
    """Per discovery-torn-write: the torn half refused (an error, the last good
    set kept) and nothing joined, left or damped because of it, by the
    source's counters and by every control sample from the torn write to a
    hold after it. Returns the report's rows."""
    rows = []
    for a in d.actions:
        if a["do"] != "discovery-torn-write" or a["result"] != "ok":
            continue
        pool, at = a["pool"], a["at"]
        src = a.get("source") or {}
        before, torn = src.get("before") or {}, src.get("torn")
        done, after = src.get("completed"), src.get("after")
        row = {"at": at, "pool": pool, "for": a.get("for"),
               "error": (torn or {}).get("last_error"),
               "completed_read": done is not None}
        label = f"{pool} {at} s"
        error = (torn or {}).get("last_error")
        check(f"torn_write_refused[{label}]",
              torn is not None and bool(error) and done is not None,
              (f"the torn half was refused: {error!r}" if torn is not None and error else
               f"no error reported for the torn half within {READ_WITHIN_S:g} s "
               f"(errors still {before.get('errors')})") +
              ("; the completed file was read without error" if done is not None else
               "; the completed file was not read without error within "
               f"{READ_WITHIN_S:g} s"))
        moved = []
        if after is None:
            moved.append("no discovery status after the write")
        else:
            for k in ("joined", "left", "damped"):
                if after.get(k) != before.get(k):
                    moved.append(f"{k} {before.get(k)} -> {after.get(k)}")
            if after.get("listed") != before.get("listed"):
                moved.append(f"listed {before.get('listed')} -> {after.get('listed')}")
        if torn is not None and torn.get("listed") != before.get("listed"):
            moved.append(f"while torn, listed {torn.get('listed')} (before "
                         f"{before.get('listed')})")
        # The samples: no backend of the pool came or went from the torn
        # write to the status after it.
        names = [n for n, b in d.e.backends.items() if b["pool"] == pool]
        lo, hi = src["t_torn"], src.get("t_after", src["t_torn"])
        window = [s for s in d.monitor.samples if lo <= s["t"] <= hi and not s.get("down")]
        first = {}
        for s in window:
            for n in names:
                now = leaving(s, n)
                if n not in first:
                    first[n] = now
                elif now != first[n]:
                    moved.append(f"{n} {'left' if now else 'came back'} at {rel(s['t'])} s")
                    first[n] = now
        if not window:
            moved.append("no control sample from the torn write to a hold after it")
        row["samples"] = len(window)
        row["changes"] = moved
        check(f"torn_write_kept[{label}]", not moved,
              f"from {rel(lo)} s to {rel(hi)} s ({len(window)} control samples, source "
              f"counters joined {before.get('joined')}, left {before.get('left')}, damped "
              f"{before.get('damped')}): " + ("; ".join(moved[:8]) if moved else
                                              "no backend joined, left or was damped"))
        rows.append(row)
    return rows + judge_answers(d, check, rel)
