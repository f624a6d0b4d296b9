"""Runs one drill: estate up, spillwayd ready, traffic started, the
scenario's actions at their times, traffic finished, then the invariants
judged and the report written (report.py). Times in the report are seconds
from the start of traffic ("drill time").
"""
import json
import math
import os
import shutil
import signal
import subprocess
import threading
import time

import attack
import attribution
import discovery
import scenario
from estate import (HEALTH_PORT, VIP_FLOWS, VIP_GRPC, DrillError, Estate, log, wait_until)
from monitor import Monitor
from tier import TierMonitor
from traffic import Elephants, FlowCheck, GrpcStreams

NFT_TABLE = "spillway_drill"


class Flapper(threading.Thread):
    """Flaps a backend every period_ms, for `seconds`:
      what = "health": blocks and opens its health port (an nftables drop
        rule in its namespace); data flows on other ports are untouched;
      what = "load": the exporters of `targets` report gpu_high and gpu_low
        in turn (load oscillation: table entries move within the churn
        budget, so live flows end up on entries that have moved)."""

    def __init__(self, estate, targets, what, period_ms, seconds, gpu_high=98, gpu_low=20):
        super().__init__(daemon=True)
        self.e, self.targets = estate, list(targets)
        self.target = self.targets[0]
        self.ns = estate.backends[self.target]["ns"]
        self.what, self.period, self.seconds = what, period_ms / 1000.0, seconds
        self.gpu_high, self.gpu_low = gpu_high, gpu_low
        self.toggles = 0
        if what == "health":
            self.e.run(["nft", "add", "table", "inet", NFT_TABLE], ns=self.ns)
            self.e.run(["nft", "add", "chain", "inet", NFT_TABLE, "input",
                        "{ type filter hook input priority 0 ; }"], ns=self.ns)

    def set(self, bad):
        if self.what == "load":
            for t in self.targets:
                self.e.write_exporter(t, self.gpu_high if bad else self.gpu_low, 0)
        elif bad:
            self.e.run(["nft", "add", "rule", "inet", NFT_TABLE, "input", "tcp", "dport",
                        str(HEALTH_PORT), "drop"], ns=self.ns, check=False)
        else:
            self.e.run(["nft", "flush", "chain", "inet", NFT_TABLE, "input"], ns=self.ns,
                       check=False)

    def run(self):
        end = time.monotonic() + self.seconds
        bad = True
        while time.monotonic() < end:
            self.set(bad)
            bad = not bad
            self.toggles += 1
            time.sleep(self.period)
        self.set(False)


class Drill:
    def __init__(self, scenario, tools, work):
        self.sc = scenario
        self.e = Estate(tools, scenario, work)
        self.work = work
        self.actions = []    # what was done: {"at", "t", "do", "target", "result", ...}
        self.victims = set(scenario["invariants"].get("victims", []))
        self.flappers = []
        self.restarts = []   # {"at", "signal", "t_stop", "t_ready", "outage_s", "before"}
        self.floods = []     # attack.SynFlood, running or finished
        self.flood_reports = []
        self.t0 = None

    # -- set-up ------------------------------------------------------------------
    def setup(self):
        e, sc = self.e, self.sc
        log(f"== drill {sc['name']}: {sc.get('description', '').strip()}")
        log(f"   namespaces {e.prefix}-*, work files {self.work}")
        e.topology_up()
        # The configuration file as the drill's reload actions edit it.
        self.file_members = list(sc["start_members"])
        # The discovery pools' watched files, before spillwayd reads them.
        discovery.setup(self)
        self.file_weights = dict(sc["weights"])
        e.write_config(only=self.file_members)
        # The starting file, for the placement model (reloads edit e.config).
        e.config_at_start = os.path.join(self.work, "spillway-start.toml")
        shutil.copyfile(e.config, e.config_at_start)
        discovery.add_to_model_config(self, e.config_at_start)
        traffic = sc["traffic"]
        ends = {}
        for a in sc["action"]:
            if a["do"] == "close-flows":
                ends.setdefault(a["target"], []).append(a["at"])
        self.elephants = Elephants(e, traffic.get("elephants", []), ends)
        e.iperf_ports = self.elephants.ports()
        for name in e.backends:
            e.start_servers(name)
        self.tier_monitor = None
        if e.tier:
            self.start_tier()
        else:
            e.start_lb()
            e.wait_ready(settle_s=0.5)
        self.monitor = Monitor(e.ctl, ["nccl", "grpc"], period=0.1,
                               aliases=discovery.aliases(e, sc))
        self.monitor.start()
        self.t0 = time.time()
        self.flows = FlowCheck(e, traffic, sc["stall_ms"])
        self.grpc = GrpcStreams(e, traffic.get("grpc_streams", 0), sc["stall_ms"])
        # The first flows are up: the estate's start-up is over (new flows
        # before this are reported, not judged).
        self.traffic_ready = time.time()
        self.elephants.start(self.t0, sc["duration"])
        log(f"   estate up: {len(e.backends)} backends, traffic running "
            f"({traffic.get('flows', 60)} flows, {traffic.get('grpc_streams', 0)} gRPC streams, "
            f"{len(traffic.get('elephants', []))} iperf3 elephants, "
            f"{traffic.get('probe_rate', 20)} new flows/s)")

    def start_tier(self):
        """Every instance no start-instance action starts later, each ready
        and announced: the router's route to the flows' VIP has them all as
        next hops before traffic begins."""
        e = self.e
        late = scenario.late_instances(self.sc["action"])
        first = [n for n in e.instances if n not in late]
        for name in first:
            e.start_lb(name)
        for name in first:
            e.wait_ready(settle_s=0.5, name=name)
        self.tier_monitor = TierMonitor(
            e, with_backends=bool(self.sc["invariants"].get("joins_with_intent")))
        want = sorted(e.instances[n].address for n in first)
        wait_until("the router's ECMP routes over " + ", ".join(first),
                   lambda: all(self.tier_monitor.routes(v) == want
                               for v in (VIP_FLOWS, VIP_GRPC)), 40)
        self.tier_monitor.start()

    # -- actions ---------------------------------------------------------------------
    def own_tables_quiet(self, name):
        """How long instance `name`'s own tables had not changed, from its
        status just before it is killed, stopped or frozen (a step it made
        right before is what its peers may not have heard of); None when it
        does not answer."""
        try:
            st = self.e.instances[name].ctl.call("status")
            return round((st["now_ms"] - st["tables_changed_ms"]) / 1000.0, 3)
        except (OSError, ValueError, KeyError, DrillError):
            return None

    def last_step(self, inst, since):
        """One status answer of `inst`: (the time.time() its last table step
        was made at, its tables_changed_ms, the answer's round trip in s),
        or None when it does not answer. The step's time is the instance's
        tables_changed_unix_ms: the wall clock of this host, the drill's
        own. (An instance without it gives an upper bound instead: the
        moment the answer arrived less the step's age by the control loop's
        clock.) Steps before `since` (time.time()) are reported as None in
        the first field."""
        t_ask = time.time()
        try:
            st = inst.ctl.call("status")
            changed, now_ms = st["tables_changed_ms"], st["now_ms"]
            unix_ms = st.get("tables_changed_unix_ms")
        except (OSError, ValueError, KeyError, TypeError, AttributeError, DrillError):
            return None
        t_got = time.time()
        if isinstance(unix_ms, (int, float)) and unix_ms > 0:
            at = unix_ms / 1000.0
        else:
            at = t_got - (now_ms - changed) / 1000.0
        return (at if at >= since else None), changed, t_got - t_ask

    def kill_after_own_step(self, name, a, rec):
        """kill-instance with after_own_step_ms: SIGKILLs instance `name`
        after_own_step_ms after a table step it makes once this action
        begins. Its status (tables_changed_ms) shows the step, but an answer
        arrives only after the control loop's round, which a step makes
        long (the table build, the export): a step is often seen later than
        the kill is due. Then the kill aims at its next step, which in a
        tier falls on the wall clock's next multiple of churn_interval
        (ControlPlane::tick) while the tables still move, and the survivors'
        steps, on the same grid, confirm afterwards that it came. Records
        the measured delay between that step and the kill; an error result
        (and no kill) when the instance makes no step within step_within s,
        or an error after the kill when no survivor stepped when predicted."""
        inst = self.e.instances[name]
        after = a["after_own_step_ms"] / 1000.0
        within = a.get("step_within", scenario.STEP_WITHIN_DEFAULT_S)
        interval = float(self.sc.get("policy", {}).get("churn_interval", 1.0))
        t_begin = time.time()
        seen = None      # [earliest bound on the step's time, its tables_changed_ms]
        rtts = []
        while seen is None:
            got = self.last_step(inst, t_begin - 0.005)
            if got is not None:
                rtts.append(got[2])
                if got[0] is not None:
                    seen = [got[0], got[1]]
                    break
            if time.time() > t_begin + within:
                return (f"error: {name} made no table step within {within} s "
                        f"({len(rtts)} status answers); not killed")
            time.sleep(0.005)
        def refine():
            got = self.last_step(inst, t_begin - 0.005)
            if got is None:
                return
            rtts.append(got[2])
            if got[0] is not None and got[1] == seen[1]:
                seen[0] = min(seen[0], got[0])
            elif got[0] is not None:
                seen[:] = [got[0], got[1]]
        while True:
            now = time.time()
            if now >= seen[0] + after - 0.001:
                break
            if now < seen[0] + after - 0.02:
                refine()
            else:
                time.sleep(seen[0] + after - now - 0.001)
        aim, how = seen[0], "seen"
        if time.time() > seen[0] + after + 0.02:
            # Seen too late for this step: aim at the next one on the grid
            # (the refined bound's offset from its multiple is the round's
            # own delay), refining the bound while there is time.
            # A step falls after its slot's start (the round that notices
            # the new slot, the build, the export): its slot is the floor.
            step_slot = math.floor(seen[0] / interval)
            while time.time() + 2 * max(rtts) < (step_slot + 1) * interval + after - 0.05:
                refine()
                time.sleep(0.01)
            step_slot = math.floor(seen[0] / interval)  # a newer step may have been seen
            offset = max(0.0, seen[0] - step_slot * interval)
            aim, how = (step_slot + 1) * interval + offset, "grid"
            rec["grid_offset_ms"] = round(offset * 1000.0, 1)
            while time.time() < aim + after - 0.001:
                time.sleep(max(0.0, min(0.005, aim + after - time.time() - 0.001)))
        # The kill's moment is the signal's: the process runs no more from
        # then, though the kernel takes a while to tear it down (reaped_ms).
        t_kill = rec["t"] = time.time()
        rc = self.e.stop_lb("KILL", name=name)
        rec["reaped_ms"] = round((time.time() - t_kill) * 1000.0, 1)
        rec["at"] = round(t_kill - self.t0, 3)
        rec["after_own_step_ms"] = a["after_own_step_ms"]
        rec["own_step_to_kill_ms"] = round((t_kill - aim) * 1000.0, 1)
        rec["own_step"] = how
        rec["last_seen_own_step_to_kill_ms"] = round((t_kill - seen[0]) * 1000.0, 1)
        rec["waited_for_step_s"] = round(seen[0] - t_begin, 3)
        # How fast the instance answered: a step is seen one answer late.
        rec["status_answers"] = len(rtts)
        rec["status_ms_max"] = round(max(rtts) * 1000.0, 1) if rtts else None
        rec["own_tables_quiet_s"] = round(t_kill - aim, 3)
        rec["signal"], rec["exit"] = "KILL", rc
        if how == "grid":
            # The survivors step on the same grid: each one's last step,
            # against the predicted one. The answer comes after the kill
            # (and its reaping), so a survivor may have stepped again since:
            # a step on the predicted phase of a later slot confirms it too,
            # as the tables still moved then; one before the predicted slot
            # does not.
            offsets, phases = {}, {}
            for other in self.e.running():
                got = self.last_step(other, t_begin)
                if got is not None and got[0] is not None:
                    d = got[0] - aim
                    offsets[other.name] = round(d * 1000.0, 1)
                    phases[other.name] = round(
                        (((d + interval / 2) % interval) - interval / 2) * 1000.0, 1)
            rec["survivors_step_vs_predicted_ms"] = offsets
            rec["survivors_phase_vs_predicted_ms"] = phases
            if not any(abs(phases[n]) <= 50 and offsets[n] >= -50 for n in offsets):
                return (f"error: {name} was killed {rec['own_step_to_kill_ms']} ms after the "
                        f"step predicted for it on the churn grid, but no survivor stepped "
                        f"then ({offsets or 'none answered'}): its last step was "
                        f"{rec['last_seen_own_step_to_kill_ms']} ms before the kill")
        return "ok"

    def act(self, a):
        e, do, target = self.e, a["do"], a.get("target")
        rec = {"at": round(time.time() - self.t0, 3), "t": time.time(), "do": do}
        if target:
            rec["target"] = target
        result = "ok"
        if do == "kill":
            e.kill_servers(target)
            self.victims.add(target)
        elif do == "link-down":
            e.run(["ip", "link", "set", "eth0", "down"], ns=e.backends[target]["ns"])
            self.victims.add(target)
        elif do == "link-up":
            e.run(["ip", "link", "set", "eth0", "up"], ns=e.backends[target]["ns"])
        elif do == "start-servers":
            e.start_servers(target)
        elif do in ("drain", "undrain", "remove", "disable", "enable"):
            r = e.spillwayctl("backend", do, target)
            result = "ok" if r.returncode == 0 else f"error: {r.stderr.strip()}"
        elif do == "add":
            b = e.backends[target]
            weight = a.get("weight", self.sc["weights"].get(target, 100))
            r = e.spillwayctl("backend", "add", target, "--address", b["address"], "--pool",
                              b["pool"], "--weight", weight)
            rec["weight"] = weight
            result = "ok" if r.returncode == 0 else f"error: {r.stderr.strip()}"
        elif do == "weight":
            r = e.spillwayctl("backend", "weight", target, a["weight"])
            rec["weight"] = a["weight"]
            result = "ok" if r.returncode == 0 else f"error: {r.stderr.strip()}"
        elif do == "reload":
            for n in a.get("add", []):
                if n not in self.file_members:
                    self.file_members.append(n)
            self.file_members = [n for n in self.file_members if n not in a.get("remove", [])]
            self.file_weights.update(a.get("weights", {}))
            e.write_config(only=self.file_members, weights=self.file_weights)
            r = e.spillwayctl("--json", "config", "reload")
            rec.update({k: a[k] for k in ("add", "remove", "weights") if k in a})
            rec["reply"] = r.stdout.strip() if r.returncode == 0 else r.stderr.strip()
            result = "ok" if r.returncode == 0 else f"error: {r.stderr.strip()}"
        elif do == "close-flows":
            # Its flows end: the flow checker's (graceful close), its gRPC
            # streams (half-close), and its elephants (planned to end now).
            self.flows.command(f"close {target}")
            self.grpc.command(f"close {target}")
        elif do == "open-flows":
            self.flows.command(f"open {a.get('n', 10)}")
        elif do == "syn-flood":
            if self.e.tier:
                raise DrillError("syn-flood is for one gateway (not a tier)")
            f = attack.SynFlood(self.e, a, len(self.floods))
            self.floods.append(f)
            rec.update({"for": f.seconds, "rate": f.rate, "port": f.port})
        elif do == "forge-rst":
            if self.e.tier:
                raise DrillError("forge-rst is for one gateway (not a tier)")
            sent = attack.forge(self.e, tuple(a.get("flags", ["R"])))
            rec["sent"] = sent
        elif do in ("discovery-write", "discovery-torn-write"):
            result = discovery.act(self, a, rec)
        elif do == "pause-flows":
            self.flows.command(f"pause {a['for']}")
            rec["for"] = a["for"]
        elif do == "probe-rate":
            self.flows.command(f"probe-rate {a['rate']}")
        elif do == "set-load":
            names = a.get("targets") or [n for n, b in e.backends.items()
                                         if b["pool"] == a.get("pool")]
            for n in names:
                e.write_exporter(n, a.get("gpu", 10), a.get("queue", 0))
            rec["targets"] = names
            rec["pool"] = a.get("pool", "")
            rec["gpu"], rec["queue"] = a.get("gpu", 10), a.get("queue", 0)
        elif do == "wan":
            settings = {k: a[k] for k in ("delay_ms", "jitter_ms", "loss") if k in a}
            e.wan_set(a.get("line"), **settings)
            rec.update(settings)
            if a.get("line"):
                rec["line"] = a["line"]
        elif do == "restart-lb":
            sig = a.get("signal", "TERM")
            # What the daemon last said about its checkpoint, just before the
            # stop (a crash's loss window is measured from it).
            before = self.checkpoint_probe()
            t_stop = time.time()
            e.stop_lb(sig)
            e.start_lb()
            e.wait_ready()
            t_ready = time.time()
            outage = t_ready - t_stop
            self.restarts.append({"at": rec["at"], "signal": sig, "t_stop": t_stop,
                                  "t_ready": t_ready, "outage_s": round(outage, 3),
                                  "before": before})
            rec["signal"] = sig
            rec["outage_s"] = round(outage, 3)
        elif do == "kill-instance" and "after_own_step_ms" in a:
            result = self.kill_after_own_step(target, a, rec)
        elif do in ("kill-instance", "stop-instance"):
            rec["own_tables_quiet_s"] = self.own_tables_quiet(target)
            sig = "KILL" if do == "kill-instance" else "TERM"
            rc = e.stop_lb(sig, name=target)
            rec["signal"], rec["exit"] = sig, rc
        elif do in ("lb-drain", "lb-undrain"):
            r = e.spillwayctl("lb", do[3:], name=target)
            result = "ok" if r.returncode == 0 else f"error: {r.stderr.strip()}"
        elif do == "start-instance":
            e.start_lb(target)
            e.wait_ready(name=target)
            rec["ready_s"] = round(time.time() - rec["t"], 3)
        elif do == "crash-tier":
            self.crash_tier(a, rec)
        elif do in ("freeze-instance", "thaw-instance"):
            if do == "freeze-instance":
                rec["own_tables_quiet_s"] = self.own_tables_quiet(target)
            sig = signal.SIGSTOP if do == "freeze-instance" else signal.SIGCONT
            e.instances[target].frozen = do == "freeze-instance"
            e.instances[target].proc.send_signal(sig)
            rec["signal"] = sig.name
        elif do == "flap":
            what = a.get("what", "health")
            targets = ([target] if target else a.get("targets") or
                       [n for n, b in e.backends.items() if b["pool"] == a.get("pool")])
            f = Flapper(e, targets, what, a.get("period_ms", 300), a.get("for", 5),
                        a.get("gpu_high", 98), a.get("gpu_low", 20))
            f.start()
            self.flappers.append(f)
            rec.update({"what": what, "period_ms": a.get("period_ms", 300),
                        "for": a.get("for", 5), "targets": targets})
            if what == "load":
                rec.update({"gpu_high": a.get("gpu_high", 98), "gpu_low": a.get("gpu_low", 20)})
        rec["result"] = result
        detail = " ".join(f"{k}={v}" for k, v in rec.items()
                          if k not in ("at", "t", "do", "target", "result", "targets", "reply",
                                       "source"))
        log(f"   t={rec['at']:6.2f}s {do} {target or rec.get('pool', '')} {detail} "
            f"{'' if result == 'ok' else result}")
        self.actions.append(rec)

    def crash_tier(self, a, rec):
        """Every running instance SIGKILLed at once (their memory lost with
        `wipe_state`: the journal, tier intent, checkpoint and tables go),
        started again, each ready; then what each instance rebuilt, restored
        and received from peers, as its status says."""
        e = self.e
        names = [i.name for i in e.running()]
        rec["targets"] = names
        for name in names:
            inst = e.instances[name]
            if inst.proc is not None and inst.proc.poll() is None:
                inst.proc.kill()
        for name in names:
            e.instances[name].proc.wait(10)
        if a.get("wipe_state"):
            for name in names:
                shutil.rmtree(e.instances[name].state, ignore_errors=True)
            rec["wiped"] = True
        if a.get("pool"):
            for n, b in e.backends.items():
                if b["pool"] == a["pool"]:
                    e.write_exporter(n, a.get("gpu", 10), a.get("queue", 0))
            rec["pool"], rec["gpu"] = a["pool"], a.get("gpu", 10)
        t_stop = time.time()
        for name in names:
            e.start_lb(name)
        for name in names:
            e.wait_ready(name=name)
        # Back once the router's ECMP group has every instance again.
        want = sorted(e.instances[n].address for n in names)
        wait_until("the router's ECMP routes over " + ", ".join(names),
                   lambda: all(self.tier_monitor.routes(v) == want
                               for v in (VIP_FLOWS, VIP_GRPC)), 40)
        rec["outage_s"] = round(time.time() - t_stop, 3)
        layers = {}
        for name in names:
            try:
                st = e.instances[name].ctl.call("status")
            except (OSError, ValueError, DrillError):
                continue
            rb, cp, tier = st.get("rebuild", {}), st.get("checkpoint", {}), st.get("tier", {})
            layers[name] = {"rebuilt_flows": rb.get("flows"),
                            "rebuilt_in_table": rb.get("in_table"),
                            "rebuild_backends_failed": rb.get("failed"),
                            "restored_from_checkpoint": cp.get("restored_at_start"),
                            "peer_exceptions_in_table": tier.get("peer_exceptions_in_table"),
                            "peer_exceptions_held": sum(p.get("held_exceptions", 0)
                                                        for p in tier.get("peers", []))}
        rec["layers"] = layers

    def checkpoint_probe(self):
        """The daemon's own word on its flow-exception checkpoint: `status`'s
        "checkpoint" object and the last event of kind "checkpoint", with the
        times they were read (None where the daemon has neither)."""
        out = {"t": time.time(), "mono": time.monotonic()}
        try:
            st = self.e.ctl.call("status")
            out["status"] = st.get("checkpoint")
            out["uptime_ms"] = st.get("uptime_ms")
        except (OSError, ValueError, DrillError):
            out["status"] = None
        try:
            page = self.e.ctl.call("events", after=0, limit=1000)
            cps = [ev for ev in page.get("events", []) if ev.get("kind") == "checkpoint"]
            out["event"] = cps[-1] if cps else None
        except (OSError, ValueError, DrillError):
            out["event"] = None
        return out

    def start_elephant(self, plan):
        note = self.elephants.start_late(plan, self.t0, self.sc["duration"])
        log(f"   t={time.time() - self.t0:6.2f}s {note}")

    def run(self):
        steps = [(a["at"], 0, a) for a in self.sc["action"]]
        steps += [(p["at"], 1, p) for p in self.elephants.late()]
        for at, kind, x in sorted(steps, key=lambda s: (s[0], s[1])):
            delay = self.t0 + at - time.time()
            if delay > 0:
                time.sleep(delay)
            if kind == 0:
                self.act(x)
            else:
                self.start_elephant(x)
        delay = self.t0 + self.sc["duration"] - time.time()
        if delay > 0:
            time.sleep(delay)
        for f in self.flappers:
            f.join(10)
        for f in self.floods:
            self.flood_reports.append(f.finish())

    def second_chance_counters(self):
        """With [dataplane] second_chance_hold_ms: each instance's
        second_chance_sent / unsent (summed over its starts' stats files:
        each start counts from zero) and each backend's spillway-decap
        second-chance counters; None without."""
        if not self.e.second_chance():
            return None
        out = {"hold_ms": self.sc["dataplane"]["second_chance_hold_ms"], "instances": {},
               "backends": {}}
        for name, inst in self.e.instances.items():
            sums = {"second_chance_sent": 0, "second_chance_unsent": 0}
            for tag in range(1, inst.starts + 1):
                path = os.path.join(inst.run_dir, f"stats-{inst.files}{tag}.json")
                try:
                    with open(path) as f:
                        st = json.load(f)
                except (OSError, ValueError):
                    continue
                for k in sums:
                    sums[k] += st.get(k, 0)
            out["instances"][name] = sums
        for name, st in self.e.decap_stats().items():
            c = st.get("counters", {})
            out["backends"][name] = {k: c.get(k, {}).get("packets", 0) for k in
                                     ("sc_redirected", "sc_arrived", "sc_kept", "sc_unknown_lb")}
        return out

    def finish(self):
        self.second_chance = self.second_chance_counters()
        if attribution.wanted(self.sc):
            # Before the traffic stops: the instances' adoptions and tracked
            # exceptions, their tables, the backends' second chances.
            self.attribution_evidence = attribution.collect(self, log=log)
        try:
            self.health_end = {h["backend"]: h for h in self.e.ctl.call("health")}
        except (OSError, ValueError, DrillError):
            self.health_end = {}
        try:
            # The daemon's own account (states, weights, spillover, latency),
            # the last thousand events, beside the report.
            page = self.e.ctl.call("events", after=0, limit=1000)
            with open(os.path.join(self.work, "events.json"), "w") as f:
                json.dump(page.get("events", []), f, indent=1)
        except (OSError, ValueError, DrillError):
            pass
        self.flow_report = self.flows.finish()
        self.grpc_report = self.grpc.finish()
        self.elephant_results = self.elephants.finish(self.sc["stall_ms"])
        self.monitor.stop()
        self.monitor.write(os.path.join(self.work, "control-samples.jsonl"))
        if self.tier_monitor:
            self.tier_monitor.stop()
            self.tier_monitor.write(os.path.join(self.work, "tier-samples.jsonl"))
        self.timeline = self.flows.read_timeline()
        try:
            self.wan_counters = self.e.wan_show() if self.e.delayline else None
        except (DrillError, ValueError, subprocess.SubprocessError):
            self.wan_counters = None
