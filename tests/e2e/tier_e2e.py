#!/usr/bin/env python3
"""The LB tier's BGP announcement end to end (issue 11, item 1): scripts/
topology --tier 2 (a router and instances lb1, lb2, FRR 8.4 in each), one
spillwayd per instance on af_packet with [announce] enabled. Checks, on the
router's kernel routing table (what ECMP forwards by):

  - no VIP route while the instances warm up (health not known: the backend
    servers are not started yet, and fall = 50 keeps the verdicts open);
  - after warm-up an ECMP route with both instances as next hops, and TCP
    connections through the router and the tier complete;
  - `spillwayctl lb drain` on lb1 takes lb1's next hop out (polled every
    10 ms against a deadline, the measured time printed, never a bound),
    `lb undrain` brings it back;
  - disabling every backend of one VIP withdraws that VIP only, and enabling
    one brings it back (the hold-down's length is announce_test's, on
    injected time);
  - a cut link takes lb1's next hop out through BFD (time printed);
  - SIGSTOP of lb2 (a frozen process, bfdd still answering): the freeze
    guard takes its next hop out (time printed); after SIGCONT it comes
    back and lb status counts the freeze;
  - SIGKILL of lb2 takes its next hop out (the kernel destroys its announce
    device, and the routes with it; time printed);
  - SIGTERM of lb1 withdraws before the process exits (withdraw_grace_ms);
  - an IPv6 VIP goes out over each instance's IPv6 BGP session (the IPv4
    sessions carry no IPv6 routes): an ECMP /128 via both instances' IPv6
    addresses, connections through it complete, lb drain withdraws it too;
  - no packet went through an announce device (its counters stay at 0
    through the traffic).

usage: tier_e2e.py announce SPILLWAYD SPILLWAY_DECAP SPILLWAYCTL
Exit 0 all passed, 1 any failed, 77 skipped (not root, no namespaces, no FRR).
"""
import json
import os
import re
import shutil
import signal
import sys
import time

from estate_harness import estate as swe
from estate_harness.ctl import Ctl
from estate_harness.estate import VIP6, VIP_GRPC, VIP_NCCL, Skip, checks, log, wait_until

VIP_SOLO = "192.0.2.12"  # only the cloud pool: disabling cloud1 empties it
HEALTH = ["[pool.health]", 'kind = "tcp"', "port = 8000", "interval = 0.2", "timeout = 0.15",
          "rise = 2", "fall = 50", ""]
ANNOUNCE = ["[announce]", "enabled = true", 'device = "spillway0"', "hold_down_ms = 500",
            "withdraw_grace_ms = 1500", "freeze_ms = 300"]
SOLO = ['name = "solo"', f'address = "{VIP_SOLO}"', 'protocol = "tcp"', "port = 8000",
        "table_size = 4099", 'pools = ["cloud"]']
NCCL6 = ['name = "nccl6"', f'address = "{VIP6}"', 'protocol = "tcp"', "port = 0",
         'pools = ["onprem", "cloud"]']


def next_hops(e, vip):
    """The router's kernel next hops for vip/32 (empty: no route)."""
    text = e.run(["ip", "-n", e.ns("router"), "route", "show", f"{vip}/32"]).stdout
    return set(re.findall(r"via (\S+)", text))


def v6_of(addr):
    """An instance's IPv6 fabric address (scripts/topology: the same host
    number in fd00:99::/64)."""
    return "fd00:99::" + addr.rsplit(".", 1)[1]


def next_hops6(e, vip):
    """The router's kernel next hops for vip/128, as the instances' IPv6
    fabric addresses (FRR installs the link-local next hop an IPv6 session
    carries: mapped back through the instances' eth0 link-local addresses)."""
    text = e.run(["ip", "-6", "-n", e.ns("router"), "route", "show", f"{vip}/128"]).stdout
    hops = set(re.findall(r"via (\S+)", text))
    local = {}
    for name, _, addr in e.instances:
        info = json.loads(e.run(["ip", "-j", "-6", "-n", e.ns(name), "addr", "show", "dev",
                                 "eth0"]).stdout)[0]["addr_info"]
        for a in info:
            local[a["local"]] = v6_of(addr)
    return {local.get(h, h) for h in hops}


def measure(e, what, action, vip, predicate, timeout=5):
    """Runs action(), then polls the router's route to vip every 10 ms until
    predicate(next hops) holds; returns (seconds from before the action,
    the action's result)."""
    t0 = time.monotonic()
    result = action()
    wait_until(what, lambda: predicate(next_hops(e, vip)), timeout, interval=0.01)
    return time.monotonic() - t0, result


def tap_packets(e, host):
    info = json.loads(e.run(["ip", "-j", "-s", "-n", e.ns(host), "link", "show", "spillway0"])
                      .stdout)[0]["stats64"]
    return info["rx"]["packets"] + info["tx"]["packets"]


@checks(21)
def test_announce(e, ctl_exe):
    e.topology_up(onprem=1, cloud=1, tier=2, ipv6=True)
    (lb1, _, addr1), (lb2, _, addr2) = e.instances
    both6 = {v6_of(addr1), v6_of(addr2)}
    lbs, ctls = {}, {}
    for name, _, addr in e.instances:
        path = e.write_config(path=os.path.join(e.work, f"{name}.toml"), lb_addr=addr, host=name,
                              lb_addr6=v6_of(addr), extra_vips=[SOLO, NCCL6], pool_tables={"onprem": HEALTH, "cloud": HEALTH},
                              extra=ANNOUNCE)
        lbs[name] = e.start_lb(name, host=name, config=path)
        ctls[name] = Ctl(ctl_exe, e.socket(name))
    for name in lbs:
        e.wait_ready(lbs[name])
        wait_until(f"{name}'s CLI socket", lambda: ctls[name].raw("status").returncode == 0, 10)

    # Warm-up: health cannot settle while the servers are down.
    states = {n: ctls[n]("lb", "status")["state"] for n in ctls}
    routes = [next_hops(e, v) for v in (VIP_NCCL, VIP_GRPC, VIP_SOLO)]
    e.check("warming up: no VIP route on the router", all(s == "warming" for s in
            states.values()) and not any(routes), f"states {states}, routes {routes}")
    took, _ = measure(e, "an ECMP route over both instances",
                      lambda: e.start_servers(ports=(8000,)), VIP_NCCL,
                      lambda hops: hops == {addr1, addr2}, 20)
    e.check("after warm-up: ECMP route via both instances", True,
            f"{took:.2f} s after starting the backends' servers")
    for v in (VIP_GRPC, VIP_SOLO):
        wait_until(f"{v} via both", lambda: next_hops(e, v) == {addr1, addr2}, 5)
    wait_until(f"{VIP6} via both instances' IPv6 sessions",
               lambda: next_hops6(e, VIP6) == both6, 10)
    summary = e.run(["vtysh", "--vty_socket", f"/run/spillway-frr/{e.prefix}/router",
                     "-c", "show bgp ipv6 unicast summary json"], check=False).stdout
    e.check("IPv6 VIP: an ECMP /128 via both instances over their IPv6 sessions",
            next_hops6(e, VIP6) == both6 and all(v6_of(a) in summary for a in (addr1, addr2)),
            f"next hops {sorted(next_hops6(e, VIP6))}; IPv6 peers in the router's summary: "
            f"{[v6_of(a) for a in (addr1, addr2) if v6_of(a) in summary]}")
    r6 = e.fanout(VIP6, 8000, 20, "tier6")
    e.check("connections to the IPv6 VIP through the router and the tier", r6["ok"] == 20,
            f"{r6['ok']}/20 ok")
    status = ctls[lb1]("status")["announce"]
    e.check("status announce object", status["state"] == "announced" and
            status["device"] == "spillway0" and
            all(v["announced"] for v in status["vips"]), json.dumps(status))

    before = {n: tap_packets(e, n) for n in lbs}
    r = e.fanout(VIP_NCCL, 8000, 40, "tier")
    after = {n: tap_packets(e, n) for n in lbs}
    served = {n: lbs[n].read_stats()["rx_packets"] for n in lbs}
    e.check("connections through the router and the tier", r["ok"] == 40,
            f"{r['ok']}/40 ok; packets received by each instance {served}")
    e.check("nothing through the announce devices", before == after and
            sum(after.values()) == 0, f"{before} -> {after}")

    timings = {}
    took, reply = measure(e, "lb1's next hop withdrawn", lambda: ctls[lb1]("lb", "drain"),
                          VIP_NCCL, lambda hops: hops == {addr2})
    timings["drain"] = took
    e.check("lb drain: lb1's next hop out", True,
            f"{took * 1000:.0f} ms; the reply withdrew {reply.get('withdrawn')}")
    wait_until("lb1's IPv6 next hop withdrawn", lambda: next_hops6(e, VIP6) == {v6_of(addr2)}, 5)
    e.check("lb drain withdraws the IPv6 VIP too (its own session)", True,
            f"IPv6 next hops {sorted(next_hops6(e, VIP6))}")
    e.check("drained: lb status and config dump --effective say so",
            ctls[lb1]("lb", "status")["state"] == "drained" and
            ctls[lb1]("config", "dump", "--effective")["lb"]["drained"] is True)
    took, _ = measure(e, "lb1's next hop back", lambda: ctls[lb1]("lb", "undrain"), VIP_NCCL,
                      lambda hops: hops == {addr1, addr2})
    timings["undrain"] = took
    e.check("lb undrain: lb1's next hop back", True, f"{took * 1000:.0f} ms")
    causes = [ev["cause"] for ev in ctls[lb1].events() if ev["kind"] == "announce"]
    e.check("events: each announcement and withdrawal with its reason",
            any("withdrawn: drained" in c for c in causes) and
            sum("announced" in c for c in causes) >= 6, "; ".join(causes[-6:]))

    # Every backend of the solo VIP disabled (on every instance): that VIP
    # alone is withdrawn.
    took, _ = measure(e, "the solo VIP withdrawn",
                      lambda: [ctls[n]("backend", "disable", "cloud1") for n in ctls],
                      VIP_SOLO, lambda hops: not hops)
    e.check("no active backend: that VIP alone withdrawn",
            next_hops(e, VIP_NCCL) == {addr1, addr2} and
            next_hops(e, VIP_GRPC) == {addr1, addr2},
            f"{took * 1000:.0f} ms; reasons " + json.dumps(
                {v["vip"]: v["reason"] for v in ctls[lb1]("lb", "status")["vips"]}))
    took, _ = measure(e, "the solo VIP back",
                      lambda: [ctls[n]("backend", "enable", "cloud1") for n in ctls],
                      VIP_SOLO, lambda hops: hops == {addr1, addr2})
    e.check("backend enabled: the VIP back after the hold-down", True,
            f"{took * 1000:.0f} ms (hold_down_ms = 500)")

    # A failure the process cannot report (the instance's link cut): BFD.
    link = ["ip", "-n", e.ns("fabric"), "link", "set", f"f-{lb1}"]
    took, _ = measure(e, "lb1's next hop out by BFD", lambda: e.run(link + ["down"]), VIP_NCCL,
                      lambda hops: hops == {addr2})
    timings["bfd"] = took
    e.check("link cut: BFD takes lb1's next hop out", True, f"{took * 1000:.0f} ms")
    e.run(link + ["up"])
    wait_until("lb1's next hop back after the link returns",
               lambda: next_hops(e, VIP_NCCL) == {addr1, addr2}, 20)

    # A process that stops running while its host and bfdd go on: only the
    # freeze guard, a process of its own, can withdraw.
    took, _ = measure(e, "lb2's next hop withdrawn by the freeze guard",
                      lambda: lbs[lb2].proc.send_signal(signal.SIGSTOP), VIP_NCCL,
                      lambda hops: hops == {addr1})
    timings["sigstop"] = took
    e.check("SIGSTOP of lb2: the freeze guard takes its next hop out", True,
            f"{took * 1000:.0f} ms (freeze_ms = 300)")
    took, _ = measure(e, "lb2's next hop back after SIGCONT",
                      lambda: lbs[lb2].proc.send_signal(signal.SIGCONT), VIP_NCCL,
                      lambda hops: hops == {addr1, addr2}, 20)
    status = ctls[lb2]("lb", "status")
    e.check("SIGCONT: lb2 announces again, the freeze counted",
            status["freezes"] == 1 and status["state"] == "announced",
            f"{took * 1000:.0f} ms (hold_down_ms = 500); freezes {status['freezes']}")
    r = e.fanout(VIP_NCCL, 8000, 20, "tier")
    e.check("connections through the tier after the freeze", r["ok"] == 20, f"{r['ok']}/20 ok")

    took, _ = measure(e, "lb2's next hop withdrawn", lambda: lbs[lb2].proc.kill(), VIP_NCCL,
                      lambda hops: hops == {addr1})
    timings["sigkill"] = took
    e.check("SIGKILL of lb2: its next hop out", True, f"{took * 1000:.0f} ms")
    lbs[lb2].proc.wait()

    took, _ = measure(e, "lb1 withdrawn on SIGTERM",
                      lambda: lbs[lb1].proc.send_signal(signal.SIGTERM), VIP_NCCL,
                      lambda hops: not hops)
    alive = lbs[lb1].proc.poll() is None
    timings["sigterm"] = took
    e.check("SIGTERM: withdrawn first, forwarding goes on for the grace period",
            alive, f"{took * 1000:.0f} ms, still running: {alive}")
    rc, _, _ = e.stop_lb(lbs[lb1])
    e.check("lb1 exits 0 after the grace period", rc == 0, f"exit {rc}")
    return ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in timings.items())


def main():
    if len(sys.argv) != 5 or sys.argv[1] != "announce":
        print("usage: tier_e2e.py announce SPILLWAYD SPILLWAY_DECAP SPILLWAYCTL", file=sys.stderr)
        return 2
    spillwayd, decap, ctl_exe = (os.path.abspath(p) for p in sys.argv[2:5])
    try:
        swe.preflight()
        if not os.access("/usr/lib/frr/bgpd", os.X_OK) or shutil.which("vtysh") is None:
            raise Skip("FRR is not installed (scripts/bootstrap installs it)")
    except Skip as s:
        log(f"e2e-tier-announce: SKIP: {s}")
        return 77
    return swe.run_test(swe.Estate("tier", spillwayd, decap), "e2e-tier-announce",
                        test_announce, ctl_exe)


if __name__ == "__main__":
    sys.exit(main())
