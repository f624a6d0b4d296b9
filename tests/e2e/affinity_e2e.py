#!/usr/bin/python3
"""End-to-end tests of flow affinity across a restart and a crash (meson
suite 'e2e').

    affinity_e2e.py TEST SPILLWAYD SPILLWAY_DECAP SPILLWAYCTL
    TEST: restart | crash

Both build a scripts/topology estate (spillwayd_e2e.Estate), hold 60 echoing
TCP connections through spillwayd, then move table entries under them
(`config reload` of a file that gives onprem1 four times the weight): the
held flows whose entries moved are now exceptions, tracked by spillwayd but
not what its tables give. spillwayd writes a checkpoint; the test checks that
it counts exactly those flows (from the independent Maglev model of both
files). Then:

  restart  SIGTERM (the daemon writes a last checkpoint) and a new spillwayd;
  crash    SIGKILL after the checkpoint, and a new spillwayd.

The new spillwayd starts from the second file. Every held connection must
complete without a reset or a bad echo on the backend it began on (the first
file's model), the client's wire must show one backend MAC per flow, and the
new instance must have sent exactly the moved flows by its restored
exceptions (exception_hits) and tracked every held flow.

Prints one line per check and "e2e-affinity-<test>: N passed, M failed".
Exit 0 when all passed, 1 when any failed, 77 without root, namespaces or veth.
"""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import maglev_model  # noqa: E402
import spillwayd_e2e as swe  # noqa: E402
from control_e2e import Ctl  # noqa: E402
from spillwayd_e2e import CLIENT, VIP_NCCL, Fail, Skip, log, wait_until  # noqa: E402

HELD = 60
HOLD = 20.0
ECHO_TIMEOUT = 10.0


def run(e, ctl_exe, kill):
    e.topology_up(onprem=3, cloud=2)
    e.start_servers(ports=(8000,))
    first_conf = e.write_config()
    model1 = maglev_model.Model(first_conf)
    lb = e.start_lb("first")
    e.wait_ready(lb)
    ctl = Ctl(ctl_exe, os.path.join(e.work, "spillway.sock"))
    tap = e.start_tap("affinity", vips=(VIP_NCCL,))
    client, out = e.fanout(VIP_NCCL, 8000, HELD, "held", hold=HOLD, timeout=ECHO_TIMEOUT,
                           background=True)
    wait_until(f"{HELD} connections through the first instance",
               lambda: (lb.read_stats() or {}).get("new_flows", 0) >= HELD, 20)

    # Move entries under the held flows.
    weights = dict(swe.WEIGHTS, onprem1=4 * swe.WEIGHTS["onprem1"])
    second_conf = e.write_config(weights=weights, path=os.path.join(e.work, "second.toml"))
    model2 = maglev_model.Model(second_conf)
    sports = [int(line.split()[2].rsplit(":", 1)[1]) for line in e.run(
        ["ss", "-Htn", "state", "established", "dst", VIP_NCCL], ns=e.ns("client")).stdout
        .splitlines() if line.strip()]
    e.check("held connections established", len(sports) == HELD, f"{len(sports)}")
    moved = [p for p in sports if model1.backend(CLIENT, p, VIP_NCCL, 8000) !=
             model2.backend(CLIENT, p, VIP_NCCL, 8000)]
    e.check("the second file moves some held flows' entries (the test is not vacuous)",
            len(moved) >= 5, f"{len(moved)} of {len(sports)}")
    reply = ctl("config", "reload", second_conf)
    e.config = second_conf
    generation = ctl("status")["generation"]

    def checkpointed():
        c = ctl("status")["checkpoint"]
        return c if c.get("generation", 0) >= generation and c.get("exceptions", 0) > 0 else None
    c = wait_until("a checkpoint of the moved tables", checkpointed, 10)
    e.check("the checkpoint holds exactly the moved held flows",
            c["exceptions"] == len(moved),
            f"{c['exceptions']} exceptions, {len(moved)} moved; reload said {json.dumps(reply)[:200]}")

    t_stop = time.monotonic()
    if kill:
        lb.proc.kill()
        lb.proc.wait()
        e.procs.remove(lb.proc)
        e.check("spillwayd killed (SIGKILL)", lb.proc.returncode == -signal.SIGKILL,
                f"exit {lb.proc.returncode}")
    else:
        rc, took, _ = e.stop_lb(lb)
        e.check("SIGTERM stops spillwayd cleanly", rc == 0, f"exit {rc} after {took:.2f} s")
    lb2 = e.start_lb("second")
    e.wait_ready(lb2)
    gap = time.monotonic() - t_stop
    status = ctl("status")
    e.check("the new instance restored the moved flows",
            status["checkpoint"].get("restored_at_start") == len(moved),
            f"restored {status['checkpoint'].get('restored_at_start')}, moved {len(moved)}")

    try:
        client.wait(HOLD + 3 * ECHO_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise Fail("fanout_client did not finish") from None
    e.procs.remove(client)
    with open(out) as f:
        result = json.load(f)
    e.quiesce(lb2)
    wire = e.stop_tap(tap)
    rc2, _, final2 = e.stop_lb(lb2)
    if final2 is None:
        raise Fail(f"the second spillwayd printed no statistics (exit {rc2})")

    conns = result["connections"]
    bad = [c for c in conns if not c.get("ok")]
    for c in bad[:10]:
        log(f"FAIL held connection {c.get('sport')}: {c.get('error')} after "
            f"{c.get('messages')} echoes (backend {c.get('backend')})")
    e.check("every held connection completed without reset or bad echo",
            len(conns) == HELD and not bad, f"{len(conns) - len(bad)}/{HELD} ok")
    wrong = [c for c in conns if c.get("backend") and
             model1.backend(CLIENT, c["sport"], VIP_NCCL, 8000) != c["backend"]]
    e.check("every held connection stayed on the backend it began on", not wrong,
            f"{len(wrong)} elsewhere")
    moved_wire = {k: v for k, v in wire["flows"].items() if len(v["macs"]) != 1}
    e.check("one backend MAC per held flow on the client's wire, across the "
            + ("crash" if kill else "restart"), not moved_wire and len(wire["flows"]) == HELD,
            f"{len(wire['flows'])} flows, {len(moved_wire)} saw two backends")
    e.check("the new instance placed exactly the moved flows by restored exceptions",
            final2.get("exception_hits") == len(moved),
            f"exception_hits {final2.get('exception_hits')}, moved {len(moved)}")
    e.check("the new instance tracked every held flow", final2["new_flows"] == HELD,
            f"new_flows {final2['new_flows']}")
    return f"{HELD - len(bad)} of {HELD} held flows kept ({len(moved)} moved); outage {gap:.2f} s"


TESTS = {"restart": ("e2e-affinity-restart", False), "crash": ("e2e-affinity-crash", True)}


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in TESTS:
        print(f"usage: affinity_e2e.py {'|'.join(TESTS)} SPILLWAYD SPILLWAY_DECAP SPILLWAYCTL",
              file=sys.stderr)
        return 2
    name, kill = TESTS[sys.argv[1]]
    spillwayd, decap, ctl_exe = (os.path.abspath(p) for p in sys.argv[2:5])
    try:
        swe.preflight()
    except Skip as s:
        log(f"{name}: SKIP: {s}")
        return 77
    e = swe.Estate("aff-" + sys.argv[1], spillwayd, decap)

    def on_signal(signum, _):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    summary = None
    try:
        summary = run(e, ctl_exe, kill)
    except Fail as f:
        e.check("harness", False, str(f))
    except KeyboardInterrupt:
        e.check("harness", False, "interrupted")
    finally:
        e.cleanup()
    log(f"{name}: {e.passed} passed, {e.failed} failed" + (f" ({summary})" if summary else ""))
    return 0 if e.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
