"""Drill scenario files (conf/drills/*.toml): loading, validation and the
short version. The schema is in README.md, "Failover drills".

A scenario is data: an estate, pools, traffic, timed actions and the
invariants that must hold. --short applies the file's [short] table: its
`time_scale` multiplies every time (duration, action times, flap lengths,
invariant windows and stable_until) and its other keys replace the
top-level ones (tables merged key by key).
"""
import copy
import os
import tomllib

import discovery

ACTIONS = {
    # name: (needs target, breaks the target's flows)
    "kill": (True, True),            # every server process of the backend SIGKILLed
    "link-down": (True, True),       # the backend's link cut
    "link-up": (True, False),
    "start-servers": (True, False),  # servers of a killed backend started again
    "drain": (True, False),          # spillwayctl backend drain
    "undrain": (True, False),
    "remove": (True, False),         # spillwayctl backend remove (drains first)
    "disable": (True, False),
    "enable": (True, False),
    "add": (True, False),            # spillwayctl backend add (left out of the starting
                                     # configuration, or removed earlier: a re-add)
    "weight": (True, False),         # spillwayctl backend weight TARGET `weight`
    "close-flows": (True, False),    # the target's flows end: flow checker flows, gRPC
                                     # streams (half-close) and elephants (planned end)
    "open-flows": (False, False),    # n more long-lived flows
    "set-load": (False, False),      # exporters of `targets` (or `pool`) report gpu / queue
    "wan": (False, False),           # delay line: delay_ms, jitter_ms, loss; `line`: a region's
                                     # or a backend's own line (default the cloud WAN)
    "restart-lb": (False, False),    # stop spillwayd (`signal` TERM, or KILL: a crash), start
                                     # it again with the same configuration file
    "reload": (False, False),        # edit the configuration file (`add`, `remove`: backend
                                     # names; `weights`: a table), then spillwayctl config reload
    "flap": (False, False),          # health port blocked / open (`target`), or GPU load high /
                                     # low (`target`, `targets` or `pool`), every period_ms
    "probe-rate": (False, False),
    # A tier estate's instances ([estate] instances = N; target lb1..lbN):
    "kill-instance": (False, False),   # SIGKILL: a crash, the router must notice; with
                                       # after_own_step_ms, that many ms after a table step
                                       # the instance itself makes once the action begins
                                       # (waiting up to step_within s for it)
    "stop-instance": (False, False),   # SIGTERM: withdraw, then stop
    "lb-drain": (False, False),        # spillwayctl lb drain: withdraw, keep forwarding
    "lb-undrain": (False, False),
    "start-instance": (False, False),  # an instance joins (its first action: not started
                                       # with the others) or comes back after a stop or kill
    "freeze-instance": (False, False),  # SIGSTOP: the process stops running, its host and
                                        # FRR go on (the freeze guard must withdraw it)
    "thaw-instance": (False, False),    # SIGCONT
    "crash-tier": (False, False),  # SIGKILL every instance at once; `wipe_state`: delete their
                                   # state directories; `pool` + `gpu`: that load meanwhile;
                                   # then start them all again and wait until each is ready
    # Attacks (attack.py), from the client's namespace through the gateway:
    "syn-flood": (False, False),   # spillway-synflood for `for` s at `rate` (0: full speed)
                                   # to the flows' VIP, `port` (default the flows' 9000)
    "forge-rst": (False, False),   # one forged segment per long-lived flow, `flags`
                                   # cycling (["R"] default; "F", "FA"), random sequence
    "pause-flows": (False, False),  # the long-lived flows send nothing for `for` s
    # A pool's watched file_sd file (pools.NAME.discovery; discovery.py):
    "discovery-write": (False, False),       # the file lists `targets` from now on
                                             # (replaced atomically)
    "discovery-torn-write": (False, False),  # a torn write in place: half, then the
                                             # rest `for` s later
}
INSTANCE_ACTIONS = ("kill-instance", "stop-instance", "lb-drain", "lb-undrain",
                    "start-instance", "freeze-instance", "thaw-instance")


def late_instances(actions):
    """Instances that join during the drill: those whose first action is
    start-instance. An instance stopped or killed and then started again is
    a restart: it starts with the others."""
    first = {}
    for a in sorted(actions, key=lambda a: a["at"]):
        if a["do"] in INSTANCE_ACTIONS:
            first.setdefault(a.get("target"), a["do"])
    return {n for n, do in first.items() if do == "start-instance"}

INVARIANTS = {"others_broken_max", "victims_broken_min", "victims", "detection_max_s",
              "table_removal_max_s", "new_flows_avoid", "drain_complete_max_s",
              "receives_new_flows", "state_changes_max", "stable_until", "share",
              "share_tolerance", "churn_within_budget", "all_flows_keep_backend",
              "restart_outage_max_s", "new_flows_failed_max", "intent_kept",
              "flows_before_checkpoint_keep_backend", "reload_reply_names_changes",
              "elephants_placed", "router_withdraw_max_s", "joins_after_warmup",
              "joins_with_intent",
              "instances_carry_flows", "freeze_withdraw_max_s",
              # A drain judged on every instance of a tier (tier.py).
              "drain_complete_every_instance_max_s",
              # Latency (issue #12): the preferred region and degraded marks in
              # the control samples, the measured share of one backend.
              "region", "region_switches_max", "latency_mark", "backend_share",
              # Placement by load: max/mean bytes per backend.
              "bytes_balance_max",
              # Which layer kept each surviving flow (attribution.py): at
              # most this many kept by no layer the drill can see.
              "layers_unknown_max",
              # An operator's drain of these backends holds ("draining" in
              # every control sample) until the drill undoes it.
              "stays_draining",
              # Discovery (discovery.py): a backend a discovery-write lists
              # anew gets new flows within this; one it drops gets none from
              # this after it.
              "discovered_reached_max_s", "unlisted_avoid_after_s"}

# A new flow (probe or long-lived flow) whose connect + hello takes longer
# than this is slow: a lost SYN costs TCP's 1 s initial retransmission
# timeout, so anything near a second means the first SYN was dropped.
DEFAULT_CONNECT_SLOW_MS = 800
# After an action that takes a backend out of new flows, how long the judge
# gives the control plane before a new flow that still reaches it (or fails)
# counts against new_flows_avoid, unless table_removal_max_s names a bound.
DEFAULT_AVOID_GRACE_S = 0.5
SIGNALS = ("TERM", "KILL")
# Pools' encapsulation (spillwayd's [[pool]] encap): the drill's default is
# IPIP on premises and GUE in the cloud; second chance needs GUE.
ENCAPS = ("ipip", "gue")
# The scenario's [dataplane] keys, passed to spillwayd's [dataplane]. With
# second_chance_hold_ms (0 included, for an "off" run on the same estate)
# the backends' spillway-decap take the load balancers' addresses with --lb
# and the LB hosts forward what a backend sends on (scripts/topology
# --second-chance).
DATAPLANE_KEYS = {"second_chance_hold_ms": (0, 86400000)}
# kill-instance after_own_step_ms: how long after the instance's own step,
# and how long the action waits for that step.
AFTER_STEP_MAX_MS = 5000
STEP_WITHIN_DEFAULT_S = 10

TIME_KEYS_ACTION = ("at", "for")


class ScenarioError(Exception):
    pass


def find(name_or_path, root):
    if os.path.exists(name_or_path):
        return name_or_path
    path = os.path.join(root, "conf", "drills", name_or_path + ".toml")
    if os.path.exists(path):
        return path
    raise ScenarioError(f"no scenario {name_or_path!r} (not a file, not conf/drills/"
                        f"{name_or_path}.toml)")


def merge(base, over):
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load(path, short=False):
    try:
        with open(path, "rb") as f:
            sc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ScenarioError(f"{path}: {e}") from None
    short_table = sc.pop("short", {})
    if short:
        scale = float(short_table.get("time_scale", 1.0))
        sc = merge(sc, {k: v for k, v in short_table.items() if k != "time_scale"})
        if "duration" not in short_table:
            sc["duration"] = round(sc.get("duration", 30) * scale, 3)
        for a in sc.get("action", []) if "action" not in short_table else []:
            for k in TIME_KEYS_ACTION:
                if k in a:
                    a[k] = round(a[k] * scale, 3)
        traffic = sc.get("traffic", {})
        if "traffic" not in short_table or "elephants" not in short_table["traffic"]:
            for el in traffic.get("elephants", []):
                if "at" in el:
                    el["at"] = round(el["at"] * scale, 3)
        inv = sc.get("invariants", {})
        if "invariants" not in short_table or "stable_until" not in short_table["invariants"]:
            if "stable_until" in inv:
                inv["stable_until"] = round(inv["stable_until"] * scale, 3)
        for key in ("share", "region", "latency_mark", "backend_share"):
            if "invariants" not in short_table or key not in short_table["invariants"]:
                for w in inv.get(key, []):
                    w["from"] = round(w["from"] * scale, 3)
                    w["to"] = round(w["to"] * scale, 3)
    sc.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    validate(sc, path)
    return sc


def validate(sc, path):
    def bad(msg):
        raise ScenarioError(f"{path}: {msg}")
    est = sc.setdefault("estate", {})
    est.setdefault("onprem", 3)
    est.setdefault("cloud", 2)
    for k in ("onprem", "cloud"):
        if not isinstance(est[k], int) or not 0 <= est[k] <= 8:
            bad(f"estate.{k} must be an integer 0..8, not {est[k]!r}")
    regions = est.get("regions", [])
    if regions:
        if est.get("wan"):
            bad("estate.regions gives each region its own WAN: leave out estate.wan")
        if not isinstance(regions, list) or not all(
                isinstance(r, dict) and isinstance(r.get("name"), str) and
                isinstance(r.get("cloud"), int) and r["cloud"] >= 1 for r in regions):
            bad("estate.regions must be a list of { name = \"...\", cloud = N, wan = {...} }")
        names_ = [r["name"] for r in regions]
        if len(set(names_)) != len(names_) or {"onprem", "cloud"} & set(names_):
            bad(f"estate.regions: names must be distinct and not onprem or cloud: {names_}")
        if sum(r["cloud"] for r in regions) != est["cloud"]:
            bad(f"estate.regions: {sum(r['cloud'] for r in regions)} cloud backends in the "
                f"regions, estate.cloud is {est['cloud']}")
    pool_names = {"onprem"} | ({r["name"] for r in regions} if regions else {"cloud"})
    pools = sc.setdefault("pools", {"onprem": {"priority": 0}, "cloud": {"priority": 1}})
    for p in pools:
        if p not in pool_names:
            bad(f"pools.{p}: the estate has pools {', '.join(sorted(pool_names))} only")
        if "encap" in pools[p] and pools[p]["encap"] not in ENCAPS:
            bad(f"pools.{p}.encap = {pools[p]['encap']!r} is not one of "
                f"{', '.join(repr(e) for e in ENCAPS)}")
    dataplane = sc.get("dataplane", {})
    if not isinstance(dataplane, dict):
        bad("dataplane must be a table")
    for k, v in dataplane.items():
        if k not in DATAPLANE_KEYS:
            bad(f"dataplane.{k} is not a key the drill passes on "
                f"({', '.join(sorted(DATAPLANE_KEYS))})")
        lo, hi = DATAPLANE_KEYS[k]
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            bad(f"dataplane.{k} = {v!r} must be an integer {lo}..{hi}")
    sc.setdefault("weights", {})
    sc.setdefault("traffic", {})
    if not isinstance(sc.get("duration", 30), (int, float)) or sc.get("duration", 30) <= 0:
        bad("duration must be a positive number of seconds")
    sc.setdefault("duration", 30)
    sc.setdefault("stall_ms", 2000)
    sc.setdefault("connect_slow_ms", DEFAULT_CONNECT_SLOW_MS)
    if not isinstance(sc["connect_slow_ms"], (int, float)) or sc["connect_slow_ms"] <= 0:
        bad("connect_slow_ms must be a positive number of milliseconds")
    if est.get("nccl_placement", "table") not in ("table", "bytes"):
        bad(f"estate.nccl_placement must be \"table\" or \"bytes\", not "
            f"{est['nccl_placement']!r}")
    tier = est.setdefault("instances", 0)
    if not isinstance(tier, int) or tier not in (0, 2, 3, 4):
        bad(f"estate.instances must be 0 (one gateway) or 2..4 (a tier), not {tier!r}")
    instances = {f"lb{i}" for i in range(1, tier + 1)}
    names = {f"onprem{i}" for i in range(1, est["onprem"] + 1)} | \
        {f"cloud{i}" for i in range(1, est["cloud"] + 1)}
    for n in est.get("delay_lines", {}):
        if n not in names:
            bad(f"estate.delay_lines.{n}: not a backend of the estate")
        if regions and n.startswith("cloud"):
            bad(f"estate.delay_lines.{n}: a cloud backend of a region is behind its region's line")
    lines = {r["name"] for r in regions} | set(est.get("delay_lines", {}))
    for i, a in enumerate(sc.setdefault("action", [])):
        where = f"action {i + 1}"
        if a.get("do") not in ACTIONS:
            bad(f"{where}: do = {a.get('do')!r} is not one of {', '.join(sorted(ACTIONS))}")
        if not isinstance(a.get("at"), (int, float)) or not 0 <= a["at"] < sc["duration"]:
            bad(f"{where}: at = {a.get('at')!r} must be a time within the drill's duration "
                f"({sc['duration']} s)")
        if a["do"] in INSTANCE_ACTIONS and a.get("target") not in instances:
            bad(f"{where}: target = {a.get('target')!r} is not an instance of the tier "
                f"({', '.join(sorted(instances)) or 'estate.instances is 0'})")
        if ("after_own_step_ms" in a or "step_within" in a) and a["do"] != "kill-instance":
            bad(f"{where}: after_own_step_ms and step_within are for kill-instance only")
        if "after_own_step_ms" in a:
            ms = a["after_own_step_ms"]
            if not isinstance(ms, (int, float)) or isinstance(ms, bool) or \
                    not 0 <= ms <= AFTER_STEP_MAX_MS:
                bad(f"{where}: after_own_step_ms = {ms!r} must be a number of milliseconds "
                    f"0..{AFTER_STEP_MAX_MS}")
        if "step_within" in a:
            if "after_own_step_ms" not in a:
                bad(f"{where}: step_within needs after_own_step_ms")
            w = a["step_within"]
            if not isinstance(w, (int, float)) or isinstance(w, bool) or not 0 < w <= 120:
                bad(f"{where}: step_within = {w!r} must be 0..120 seconds")
        if a["do"] == "restart-lb" and tier:
            bad(f"{where}: restart-lb is for one gateway; a tier uses kill-instance, "
                f"stop-instance and start-instance")
        needs_target, _ = ACTIONS[a["do"]]
        if needs_target and a.get("target") not in names:
            bad(f"{where}: target = {a.get('target')!r} is not a backend of the estate "
                f"({', '.join(sorted(names))})")
        for t in a.get("targets", []):
            if t not in names:
                bad(f"{where}: targets has {t!r}, not a backend of the estate")
        if a["do"] == "weight" and not (isinstance(a.get("weight"), int) and
                                        1 <= a["weight"] <= 1000000):
            bad(f"{where}: weight = {a.get('weight')!r} must be an integer 1..1000000")
        if a["do"] == "wan":
            if a.get("line") is not None and a["line"] not in lines:
                bad(f"{where}: line = {a['line']!r} is not a delay line of the estate "
                    f"({', '.join(sorted(lines)) or 'none: set estate.regions or delay_lines'})")
            if a.get("line") is None and not est.get("wan"):
                bad(f"{where}: the estate has no cloud WAN (estate.wan); name a line")
        if a["do"] == "syn-flood":
            if not isinstance(a.get("for", 5), (int, float)) or not 0 < a.get("for", 5) <= 600:
                bad(f"{where}: for = {a.get('for')!r} must be 0..600 seconds")
            if not isinstance(a.get("rate", 0), int) or not 0 <= a.get("rate", 0) <= 10**8:
                bad(f"{where}: rate = {a.get('rate')!r} must be an integer packets/s "
                    f"(0: as fast as possible)")
            if not isinstance(a.get("port", 9000), int) or not 1 <= a.get("port", 9000) <= 65535:
                bad(f"{where}: port = {a.get('port')!r} must be a TCP port")
        if a["do"] == "forge-rst":
            flags = a.get("flags", ["R"])
            if not isinstance(flags, list) or not flags or not all(
                    isinstance(f, str) and f and set(f) <= set("RFA") and set(f) & set("RF")
                    for f in flags):
                bad(f"{where}: flags = {flags!r} must be a list of \"R\", \"F\", \"FA\", "
                    f"\"RA\"")
        if a["do"] == "pause-flows" and not (isinstance(a.get("for"), (int, float)) and
                                             0 < a["for"] <= 3600):
            bad(f"{where}: pause-flows needs for = seconds (0..3600)")
        if a["do"] == "restart-lb" and a.get("signal", "TERM") not in SIGNALS:
            bad(f"{where}: signal = {a.get('signal')!r} is not one of {', '.join(SIGNALS)}")
        if a["do"] == "reload":
            for k in ("add", "remove"):
                for t in a.get(k, []):
                    if t not in names:
                        bad(f"{where}: {k} has {t!r}, not a backend of the estate")
            for t, w in a.get("weights", {}).items():
                if t not in names or not isinstance(w, int) or not 1 <= w <= 1000000:
                    bad(f"{where}: weights.{t} = {w!r}: want a backend of the estate and an "
                        f"integer weight 1..1000000")
            if not (a.get("add") or a.get("remove") or a.get("weights")):
                bad(f"{where}: a reload needs an edit (add, remove or weights)")
        if a["do"] == "flap":
            what = a.get("what", "health")
            if what not in ("health", "load"):
                bad(f"{where}: what = {what!r} is not health or load")
            if what == "health" and a.get("target") not in names:
                bad(f"{where}: target = {a.get('target')!r} is not a backend of the estate")
            if what == "load" and not (a.get("target") or a.get("targets") or a.get("pool")):
                bad(f"{where}: a load flap needs target, targets or pool")
            if a.get("target") is not None and a["target"] not in names:
                bad(f"{where}: target = {a.get('target')!r} is not a backend of the estate")
    for i, el in enumerate(sc["traffic"].get("elephants", [])):
        if el.get("backend") not in names:
            bad(f"traffic.elephants[{i}]: backend = {el.get('backend')!r} is not a backend of "
                f"the estate")
        if not isinstance(el.get("at", 0), (int, float)) or not 0 <= el.get("at", 0) < \
                sc["duration"] - 2:
            bad(f"traffic.elephants[{i}]: at = {el.get('at')!r} must leave at least 2 s of "
                f"the drill's duration")
    names_by_pool = {}
    region_of = {}
    i = 0
    for r in regions:
        for _ in range(r["cloud"]):
            i += 1
            region_of[f"cloud{i}"] = r["name"]
    for n in names:
        names_by_pool.setdefault(region_of.get(n, n.rstrip("0123456789")), []).append(n)
    discovery.validate(sc, names_by_pool, bad)
    for n in sc.get("invariants", {}).get("stays_draining", []):
        if n not in names:
            bad(f"invariants.stays_draining has {n!r}, not a backend of the estate")
    if "new_flows_failed_max" in sc.get("invariants", {}) and not isinstance(
            sc["invariants"]["new_flows_failed_max"], int):
        bad("invariants.new_flows_failed_max must be an integer")
    for k in sc.setdefault("invariants", {}):
        if k not in INVARIANTS:
            bad(f"invariants.{k} is not a known invariant ({', '.join(sorted(INVARIANTS))})")
    sc["backend_names"] = sorted(names)
    sc["start_members"] = start_members(sc, names)
    # A discovery pool's backends are in at start when its file lists them.
    for p in discovery.pools(sc):
        members = [n for n in names_by_pool.get(p, []) if n in sc["start_members"]]
        listed = discovery.listed_at_start(sc, p, members)
        sc["start_members"] = sorted(n for n in sc["start_members"]
                                     if n not in names_by_pool.get(p, []) or n in listed)


def start_members(sc, names):
    """The backends in the starting configuration: all but those whose first
    add/remove action is an `add` (a backend left out, to be added later). A
    backend removed first and added later is in it (a re-add)."""
    first = {}
    for a in sorted(sc["action"], key=lambda a: a["at"]):
        if a["do"] in ("add", "remove"):
            first.setdefault(a["target"], a["do"])
        elif a["do"] == "reload":
            for n in a.get("add", []):
                first.setdefault(n, "add")
            for n in a.get("remove", []):
                first.setdefault(n, "remove")
    return sorted(n for n in names if first.get(n) != "add")
