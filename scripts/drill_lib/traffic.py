"""The drill's traffic: long-lived sequence-numbered TCP flows and new-flow
probes (spillway-flowcheck), bidirectional gRPC streams (grpc_stream.py),
and iperf3 elephants, each judged per flow at the end.

A flow is broken when it was reset, its echo was corrupt, it never connected,
it ended in error (a gRPC stream's RPC error), or it stalled (data
outstanding, nothing received) longer than the scenario's stall threshold.
Each broken flow is "theirs" when its backend is one the scenario's actions
take down (a victim), else "others".

iperf3 runs a control and a data connection to the same server port; an L4
balancer hashes them independently, so they may land on different backends,
which iperf3 cannot survive. The drill therefore places each elephant: the
bulk client's namespace has one ephemeral port (IPERF_CONTROL_PORT) for the
control connections, and for each elephant the drill searches a data port
(iperf3 --cport) whose flow the Maglev model (scripts/estate_harness/maglev_model.py, an
independent SipHash + Maglev implementation) puts on the same backend as the
control connection. The server port is chosen the same way, so that the
control connection lands on the backend the scenario names.
"""
import json
import os
import re
import time

from estate import (BULK, CLIENT, DATA_PORT, GRPC_PORT, GRPC_STREAM, IPERF_BASE_PORT,
                    IPERF_CONTROL_PORT, PY, SEED, VIP_FLOWS, VIP_GRPC, DrillError,
                    wait_until)
from estate_harness import maglev_model


class FlowCheck:
    def __init__(self, estate, traffic, stall_ms):
        self.e = estate
        self.timeline = os.path.join(estate.work, "flows-timeline.jsonl")
        self.report_path = os.path.join(estate.work, "flows.json")
        ready = os.path.join(estate.work, "flows.ready")
        args = [estate.tools.flowcheck, "client", "--target", f"{VIP_FLOWS}:{DATA_PORT}",
                "--flows", str(traffic.get("flows", 60)), "--bind", CLIENT,
                "--interval-ms", str(traffic.get("interval_ms", 50)),
                "--chunk", str(traffic.get("chunk", 256)),
                "--stall-ms", str(stall_ms),
                "--probe-rate", str(traffic.get("probe_rate", 20)),
                "--timeline", self.timeline, "--timeline-ms", "100",
                # Echo round trips, one median per flow per interval
                # (flows.json "rtt"; hop_cost.py).
                "--rtt-ms", str(traffic.get("rtt_ms", 250)),
                "--report", self.report_path, "--ready", ready]
        self.proc = estate.spawn(args, ns=estate.ns("client"), log_name="flowcheck-client.log",
                                 stdin=-1)
        wait_until("the flow checker's flows", lambda: os.path.exists(ready) or
                   self.proc.poll() is not None, 60)
        if self.proc.poll() is not None:
            raise DrillError(f"spillway-flowcheck client exited {self.proc.returncode}")

    def command(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self):
        self.e.stop(self.proc, timeout=20)
        with open(self.report_path) as f:
            return json.load(f)

    def read_timeline(self):
        out = []
        try:
            with open(self.timeline) as f:
                for line in f:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass  # a line being written
        except OSError:
            pass
        return out


class GrpcStreams:
    def __init__(self, estate, count, stall_ms):
        self.e = estate
        self.count = count
        self.report_path = os.path.join(estate.work, "grpc.json")
        self.proc = None
        if count:
            ready = os.path.join(estate.work, "grpc.ready")
            self.proc = estate.spawn(
                [PY, GRPC_STREAM, "client", "--target", f"{VIP_GRPC}:{GRPC_PORT}", "--streams",
                 str(count), "--interval-ms", "100", "--stall-ms", str(stall_ms),
                 "--report", self.report_path, "--ready", ready],
                ns=estate.ns("client"), log_name="grpc-client.log", stdin=-1)
            wait_until("the gRPC streams", lambda: os.path.exists(ready) or
                       self.proc.poll() is not None, 30)
            if self.proc.poll() is not None:
                raise DrillError(f"grpc_stream.py client exited {self.proc.returncode}")

    def command(self, line):
        if self.proc and self.proc.poll() is None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def finish(self):
        if not self.proc:
            return None
        self.e.stop(self.proc, timeout=20)
        with open(self.report_path) as f:
            return json.load(f)


class LiveTable:
    """Where spillwayd's CURRENT table of VIP `vip` sends a new TCP flow: the
    table rebuilt from `backend list` (each backend's id, index and applied
    Maglev weight per VIP) and `vip list` (table size) with the reference
    arithmetic (scripts/estate_harness/maglev_reference.py), since the tables are a pure
    function of (ids, weights, seed). Used to place elephants that start
    after the starting configuration has changed (a backend added, a spill
    to a pool that had no entries at the start)."""

    def __init__(self, ctl, vip="nccl"):
        backends = ctl.call("backend.list")
        size = next(v["table_size"] for v in ctl.call("vip.list") if v["name"] == vip)
        self.inputs = sorted((b["id"], b.get("weight", {}).get(vip, 0), b["index"])
                             for b in backends if vip in (b.get("weight") or {}))
        self.by_index = {b["index"]: b["name"] for b in backends}
        self.hasher = maglev_model.ref.FlowHasher(maglev_model.parse_u64(SEED))
        self.size = size
        self.table = maglev_model.ref.build(self.hasher, self.inputs, size)

    def backend(self, src, sport, dst, dport):
        h = maglev_model.flow_hash(self.hasher, src, dst, sport, dport, 6)
        return self.by_index.get(self.table[maglev_model.slot_of(h, self.size)])


ACCEPTED = re.compile(r"Accepted connection from [0-9.]+, port (\d+)")
CONNECTED = re.compile(r"connected to [0-9.]+ port (\d+)")


class Elephants:
    """iperf3 elephants. An elephant without `at` starts with the traffic and
    is placed from the starting configuration (the Maglev model); one with
    `at` (drill seconds) starts then and is placed from the live table
    (LiveTable), so it can run on a backend that had no entries at the start
    (added later, or a pool that only takes spilled flows). Its control
    connection's source port is then chosen too: the bulk client's one
    ephemeral port is switched to it for the moment the client connects.
    `ends` gives, per backend, the drill time of the first close-flows on it:
    an elephant on that backend runs until then (iperf3 ends its test
    normally, as a finished transfer would) instead of to the drill's end.

    plan() picks server ports before the backends' servers start (they listen
    on every planned port)."""

    def __init__(self, estate, specs, ends=None):
        self.e = estate
        self.plans = []
        self.runs = []
        self.ends = ends or {}
        if not specs:
            return
        model = maglev_model.Model(estate.config)
        used_ports, used_cports = set(), set()
        late_port = IPERF_BASE_PORT + 400
        for k, spec in enumerate(specs):
            want = spec["backend"]
            at = spec.get("at", 0)
            if at:
                # A server port of its own, on every backend; the source
                # ports are chosen at `at` from the live table.
                while late_port in used_ports:
                    late_port += 1
                used_ports.add(late_port)
                self.plans.append({"id": k, "backend": want, "port": late_port, "cport": None,
                                   "control_port": None, "at": at,
                                   "mbps": spec.get("mbps", 20)})
                continue
            # The server port whose control connection (from the fixed
            # source port) lands on the backend asked for ...
            port = next((p for p in range(IPERF_BASE_PORT, IPERF_BASE_PORT + 400)
                         if p not in used_ports and
                         model.backend(BULK, IPERF_CONTROL_PORT, VIP_FLOWS, p) == want), None)
            # ... and a data port that lands there too.
            cport = port and next((c for c in range(43000, 60000) if c not in used_cports and
                                   model.backend(BULK, c, VIP_FLOWS, port) == want), None)
            if not port or not cport:
                raise DrillError(f"no port pair puts elephant {k} on {want} (is it in the "
                                 f"starting configuration? If not, give the elephant an `at`)")
            used_ports.add(port)
            used_cports.add(cport)
            self.plans.append({"id": k, "backend": want, "port": port, "cport": cport,
                               "control_port": IPERF_CONTROL_PORT, "at": 0,
                               "mbps": spec.get("mbps", 20)})

    def ports(self):
        return [p["port"] for p in self.plans]

    def late(self):
        return [p for p in self.plans if p["at"]]

    def _length(self, plan, t0, duration):
        """Whole seconds to run from now: to the first close-flows on its
        backend after it starts, else to a second before the drill ends."""
        now = time.time() - t0
        ends = [t for t in self.ends.get(plan["backend"], []) if t > now]
        end = min(ends) if ends else duration - 1
        return max(1, int(end - now))

    def _spawn(self, plan, t0, duration):
        out = os.path.join(self.e.work, f"iperf3-{plan['id']}.json")
        length = self._length(plan, t0, duration)
        p = self.e.spawn(["iperf3", "-c", VIP_FLOWS, "-p", str(plan["port"]), "--cport",
                          str(plan["cport"]), "-t", str(length),
                          "-b", f"{plan['mbps']}M", "-i", "0.5", "-J",
                          "--connect-timeout", "3000"],
                         ns=self.e.ns("bulk"), log_name=f"iperf3-client-{plan['id']}.log",
                         stdout=out)
        self.runs.append(dict(plan, proc=p, out=out, started=round(time.time() - t0, 3),
                              planned_s=length))

    def start(self, t0, duration):
        for plan in self.plans:
            if not plan["at"]:
                self._spawn(plan, t0, duration)

    def start_late(self, plan, t0, duration):
        """Places the elephant on its backend in the table live now, then
        starts it. Returns a note for the drill's log."""
        want, port = plan["backend"], plan["port"]
        used = {r["cport"] for r in self.runs} | {r["control_port"] for r in self.runs}
        for _ in range(3):
            live = LiveTable(self.e.ctl)
            control = next((c for c in range(IPERF_CONTROL_PORT + 1, IPERF_CONTROL_PORT + 1000)
                            if c not in used and
                            live.backend(BULK, c, VIP_FLOWS, port) == want), None)
            cport = control and next((c for c in range(43000, 60000) if c not in used and
                                      live.backend(BULK, c, VIP_FLOWS, port) == want), None)
            # The table must not have moved while we searched.
            if control and cport and LiveTable(self.e.ctl).inputs == live.inputs:
                break
        else:
            raise DrillError(f"elephant {plan['id']}: no port pair puts it on {want} in the "
                             f"live table (does {want} own entries at {plan['at']} s?)")
        plan["control_port"], plan["cport"] = control, cport
        bulk = self.e.ns("bulk")
        self.e.run(["sysctl", "-qw", f"net.ipv4.ip_local_port_range={control} {control}"],
                   ns=bulk)
        try:
            self._spawn(plan, t0, duration)
            proc = self.runs[-1]["proc"]
            wait_until(f"elephant {plan['id']}'s control connection", lambda: proc.poll()
                       is not None or self.e.run(["ss", "-Htn", f"sport = :{control}"],
                                                 ns=bulk).stdout.strip(), 5)
        finally:
            self.e.run(["sysctl", "-qw", "net.ipv4.ip_local_port_range="
                        f"{IPERF_CONTROL_PORT} {IPERF_CONTROL_PORT}"], ns=bulk)
        return f"elephant {plan['id']} on {want}: ports {control}/{cport} -> :{port}"

    def served_by(self, plan):
        """Which backends' iperf3 servers saw the elephant's control and data
        connections (from their logs)."""
        control, data = [], []
        for name in self.e.backends:
            try:
                with open(os.path.join(self.e.work, f"iperf3-{name}-{plan['port']}.log")) as f:
                    text = f.read()
            except OSError:
                continue
            if str(plan["control_port"]) in ACCEPTED.findall(text):
                control.append(name)
            if str(plan["cport"]) in CONNECTED.findall(text):
                data.append(name)
        return {"control": control, "data": data}

    def finish(self, stall_ms, timeout=30):
        results = []
        for r in self.runs:
            try:
                r["proc"].wait(timeout)
            except Exception:  # noqa: BLE001 - a hung client is a broken one
                self.e.stop(r["proc"], timeout=5)
            rc = r["proc"].returncode
            if r["proc"] in self.e.procs:
                self.e.procs.remove(r["proc"])
            try:
                with open(r["out"]) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                doc = {}
            intervals = [i["sum"] for i in doc.get("intervals", [])]
            # The longest run of intervals that moved no byte.
            longest, run = 0.0, 0.0
            for i in intervals:
                run = run + i["seconds"] if i["bytes"] == 0 else 0.0
                longest = max(longest, run)
            sent = doc.get("end", {}).get("sum_sent", {})
            error = doc.get("error")
            broken = rc != 0 or bool(error) or longest * 1000 > stall_ms
            results.append({"id": r["id"], "backend": r["backend"], "port": r["port"],
                            "cport": r["cport"], "control_port": r["control_port"],
                            "started": r["started"], "planned_s": r["planned_s"],
                            "exit": rc, "error": error,
                            "bytes": sent.get("bytes", 0),
                            "mbps": round(sent.get("bits_per_second", 0) / 1e6, 1),
                            "longest_silence_ms": round(longest * 1000), "broken": broken,
                            "served_by": self.served_by(r)})
        return results
