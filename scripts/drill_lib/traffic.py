"""The drill's traffic: long-lived sequence-numbered TCP flows and new-flow
probes (spillway-flowcheck), bidirectional gRPC streams (grpc_stream.py),
and iperf3 elephants, each judged per flow at the end.

A flow is broken when it was reset, its echo was corrupt, it never connected,
or it stalled (data outstanding, nothing received) longer than the
scenario's stall threshold. Each broken flow is "theirs" when its backend is
one the scenario's actions take down (a victim), else "others".

iperf3 runs a control and a data connection to the same server port; an L4
balancer hashes them independently, so they may land on different backends,
which iperf3 cannot survive. The drill therefore places each elephant: the
bulk client's namespace has one ephemeral port (IPERF_CONTROL_PORT) for the
control connections, and for each elephant the drill searches a data port
(iperf3 --cport) whose flow the Maglev model (tests/e2e/maglev_model.py, an
independent SipHash + Maglev implementation) puts on the same backend as the
control connection. The server port is chosen the same way, so that the
control connection lands on the backend the scenario names.
"""
import json
import os
import sys

from estate import (BULK, CLIENT, DATA_PORT, GRPC_PORT, GRPC_STREAM, IPERF_BASE_PORT,
                    IPERF_CONTROL_PORT, PY, ROOT, VIP_FLOWS, VIP_GRPC, DrillError, wait_until)

sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import maglev_model  # noqa: E402


class FlowCheck:
    def __init__(self, estate, traffic, stall_ms):
        self.e = estate
        self.timeline = os.path.join(estate.work, "flows-timeline.jsonl")
        self.report_path = os.path.join(estate.work, "flows.json")
        ready = os.path.join(estate.work, "flows.ready")
        args = [estate.tools.flowcheck, "client", "--target", f"{VIP_FLOWS}:{DATA_PORT}",
                "--flows", str(traffic.get("flows", 60)), "--bind", CLIENT,
                "--interval-ms", str(traffic.get("interval_ms", 50)),
                "--stall-ms", str(stall_ms),
                "--probe-rate", str(traffic.get("probe_rate", 20)),
                "--timeline", self.timeline, "--timeline-ms", "100",
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
                ns=estate.ns("client"), log_name="grpc-client.log")
            wait_until("the gRPC streams", lambda: os.path.exists(ready) or
                       self.proc.poll() is not None, 30)
            if self.proc.poll() is not None:
                raise DrillError(f"grpc_stream.py client exited {self.proc.returncode}")

    def finish(self):
        if not self.proc:
            return None
        self.e.stop(self.proc, timeout=20)
        with open(self.report_path) as f:
            return json.load(f)


class Elephants:
    """plan() picks each elephant's server port and data port from the
    configuration (before the backends' servers start: they listen on the
    planned ports); start() runs the clients."""

    def __init__(self, estate, specs):
        self.e = estate
        self.plans = []
        self.runs = []
        if not specs:
            return
        model = maglev_model.Model(estate.config)
        used_ports, used_cports = set(), set()
        for k, spec in enumerate(specs):
            want = spec["backend"]
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
                                 f"starting configuration?)")
            used_ports.add(port)
            used_cports.add(cport)
            self.plans.append({"id": k, "backend": want, "port": port, "cport": cport,
                               "mbps": spec.get("mbps", 20)})

    def ports(self):
        return [p["port"] for p in self.plans]

    def start(self, duration_s):
        for plan in self.plans:
            out = os.path.join(self.e.work, f"iperf3-{plan['id']}.json")
            p = self.e.spawn(["iperf3", "-c", VIP_FLOWS, "-p", str(plan["port"]), "--cport",
                              str(plan["cport"]), "-t", str(max(2, int(duration_s))),
                              "-b", f"{plan['mbps']}M", "-i", "0.5", "-J",
                              "--connect-timeout", "3000"],
                             ns=self.e.ns("bulk"), log_name=f"iperf3-client-{plan['id']}.log",
                             stdout=out)
            self.runs.append(dict(plan, proc=p, out=out))

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
                            "cport": r["cport"], "exit": rc, "error": error,
                            "bytes": sent.get("bytes", 0),
                            "mbps": round(sent.get("bits_per_second", 0) / 1e6, 1),
                            "longest_silence_ms": round(longest * 1000), "broken": broken})
        return results
