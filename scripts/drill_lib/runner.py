"""Runs one drill: estate up, spillwayd ready, traffic started, the
scenario's actions at their times, traffic finished, then the invariants
judged and the report written (report.py). Times in the report are seconds
from the start of traffic ("drill time").
"""
import os
import subprocess
import threading
import time

from estate import (HEALTH_PORT, DrillError, Estate, log)
from monitor import Monitor
from traffic import Elephants, FlowCheck, GrpcStreams

NFT_TABLE = "spillway_drill"


class Flapper(threading.Thread):
    """Flaps a backend every period_ms, for `seconds`:
      what = "health": blocks and opens its health port (an nftables drop
        rule in its namespace); data flows on other ports are untouched;
      what = "load": its exporter reports gpu_high and gpu_low in turn."""

    def __init__(self, estate, target, what, period_ms, seconds, gpu_high=98, gpu_low=20):
        super().__init__(daemon=True)
        self.e, self.target, self.ns = estate, target, estate.backends[target]["ns"]
        self.what, self.period, self.seconds = what, period_ms / 1000.0, seconds
        self.gpu_high, self.gpu_low = gpu_high, gpu_low
        self.toggles = 0
        if what == "health":
            self.e.run(["nft", "add", "table", "inet", NFT_TABLE], ns=self.ns)
            self.e.run(["nft", "add", "chain", "inet", NFT_TABLE, "input",
                        "{ type filter hook input priority 0 ; }"], ns=self.ns)

    def set(self, bad):
        if self.what == "load":
            self.e.write_exporter(self.target, self.gpu_high if bad else self.gpu_low, 0)
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
        self.restarts = []   # {"at", "outage_s"}
        self.t0 = None

    # -- set-up ------------------------------------------------------------------
    def setup(self):
        e, sc = self.e, self.sc
        log(f"== drill {sc['name']}: {sc.get('description', '').strip()}")
        e.topology_up()
        added_later = {a["target"] for a in sc["action"] if a["do"] == "add"}
        e.write_config(only=[n for n in e.backends if n not in added_later])
        traffic = sc["traffic"]
        self.elephants = Elephants(e, traffic.get("elephants", []))
        e.iperf_ports = self.elephants.ports()
        for name in e.backends:
            e.start_servers(name)
        e.start_lb()
        e.wait_ready()
        self.monitor = Monitor(e.ctl, ["nccl", "grpc"], period=0.1)
        self.monitor.start()
        self.t0 = time.time()
        self.flows = FlowCheck(e, traffic, sc["stall_ms"])
        self.grpc = GrpcStreams(e, traffic.get("grpc_streams", 0), sc["stall_ms"])
        self.elephants.start(sc["duration"] - (time.time() - self.t0) - 1)
        log(f"   estate up: {len(e.backends)} backends, traffic running "
            f"({traffic.get('flows', 60)} flows, {traffic.get('grpc_streams', 0)} gRPC streams, "
            f"{len(traffic.get('elephants', []))} iperf3 elephants, "
            f"{traffic.get('probe_rate', 20)} new flows/s)")

    # -- actions ---------------------------------------------------------------------
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
            r = e.spillwayctl("backend", "add", target, "--address", b["address"], "--pool",
                              b["pool"], "--weight", self.sc["weights"].get(target, 100))
            result = "ok" if r.returncode == 0 else f"error: {r.stderr.strip()}"
        elif do == "close-flows":
            self.flows.command(f"close {target}")
        elif do == "open-flows":
            self.flows.command(f"open {a.get('n', 10)}")
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
            e.wan_set(**settings)
            rec.update(settings)
        elif do == "restart-lb":
            t_stop = time.time()
            e.stop_lb()
            e.start_lb()
            e.wait_ready()
            outage = time.time() - t_stop
            self.restarts.append({"at": rec["at"], "outage_s": round(outage, 3)})
            rec["outage_s"] = round(outage, 3)
        elif do == "flap":
            what = a.get("what", "health")
            f = Flapper(e, target, what, a.get("period_ms", 300), a.get("for", 5),
                        a.get("gpu_high", 98), a.get("gpu_low", 20))
            f.start()
            self.flappers.append(f)
            rec.update({"what": what, "period_ms": a.get("period_ms", 300),
                        "for": a.get("for", 5)})
        rec["result"] = result
        detail = " ".join(f"{k}={v}" for k, v in rec.items()
                          if k not in ("at", "t", "do", "target", "result", "targets"))
        log(f"   t={rec['at']:6.2f}s {do} {target or rec.get('pool', '')} {detail} "
            f"{'' if result == 'ok' else result}")
        self.actions.append(rec)

    def run(self):
        for a in sorted(self.sc["action"], key=lambda a: a["at"]):
            delay = self.t0 + a["at"] - time.time()
            if delay > 0:
                time.sleep(delay)
            self.act(a)
        delay = self.t0 + self.sc["duration"] - time.time()
        if delay > 0:
            time.sleep(delay)
        for f in self.flappers:
            f.join(10)

    def finish(self):
        try:
            self.health_end = {h["backend"]: h for h in self.e.ctl.call("health")}
        except (OSError, ValueError, DrillError):
            self.health_end = {}
        self.flow_report = self.flows.finish()
        self.grpc_report = self.grpc.finish()
        self.elephant_results = self.elephants.finish(self.sc["stall_ms"])
        self.monitor.stop()
        self.monitor.write(os.path.join(self.work, "control-samples.jsonl"))
        self.timeline = self.flows.read_timeline()
        try:
            self.wan_counters = self.e.wan_show() if self.e.delayline else None
        except (DrillError, ValueError, subprocess.SubprocessError):
            self.wan_counters = None
