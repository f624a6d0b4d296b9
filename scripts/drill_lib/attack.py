"""Attacks on the drill's estate (issue #13):

  syn-flood   spillway-synflood (tests/tools/syn_flood.cpp) in the client's
              namespace: SYNs from random sources of 198.18.0.0/15 to the
              flows' VIP and port, as fast as the estate can carry them (or
              at `rate`), for `for` seconds. The backends route 198.18.0.0/15
              back towards the client's side (DSR: their SYN-ACKs go where a
              real client's would, and the client's kernel drops them), so
              their SYN queues fill as a real flood's would.
  forge-rst   one forged RST (or FIN, `flags`) per long-lived flow of the
              flow checker, from the client's namespace through the gateway,
              each with a random sequence number, as an attacker who knows
              the 4-tuples would send them (scapy, one sendp).

Ledger: where a flood's packets were dropped, counted before and after the
flood at every place the estate can count them: spillwayd's own counters
(drop reasons, flow-table insert failures, the flow tables' SYN-flood
counters, the port driver's missed frames), the af_packet ring's losses
(frames the gateway's eth0 received that spillwayd never read: a full ring
drops them and the kernel counts them only in the socket's PACKET_STATISTICS
tp_drops, which DPDK 22.11's af_packet PMD never reads and nobody else can;
sk_drops, `ss -0 -m`, is reported too and stays 0 for a ring), the interfaces' counters
(ip -s link: the client's eth0, the fabric's ports to the client and the
gateway, the gateway's eth0) and each backend's listen queue (TcpExt of
/proc/net/netstat: SYN-queue drops, cookies).
"""
import json
import os
import random
import re
import threading
import time

from estate import CLIENT, DATA_PORT, VIP_FLOWS, DrillError

FLOOD_NET = "198.18.0.0/15"
TCP_EXT = ("ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPReqQFullDoCookies",
           "SyncookiesSent", "SyncookiesRecv", "SyncookiesFailed")


class SynFlood:
    def __init__(self, estate, action, index):
        self.e = estate
        self.seconds = float(action.get("for", 5))
        self.rate = int(action.get("rate", 0))
        self.port = int(action.get("port", DATA_PORT))
        self.result_path = os.path.join(estate.work, f"synflood-{index}.json")
        for name, b in estate.backends.items():
            estate.run(["ip", "route", "replace", FLOOD_NET, "via", CLIENT], ns=b["ns"])
        self.before = ledger(estate)
        self.t_start = time.time()
        self.proc = estate.spawn(
            [estate.tools.synflood, "--iface", "eth0", "--dst-mac", estate.mac("lb"),
             "--vip", VIP_FLOWS, "--port", str(self.port), "--src-net", FLOOD_NET,
             "--seconds", str(self.seconds), "--rate", str(self.rate), "--seed", str(index + 1),
             "--result", self.result_path],
            ns=estate.ns("client"), log_name=f"synflood-{index}.log")
        self.report = None
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self):
        """When the flood ends and the counters have settled: the generator's
        result and the ledger's differences over the flood."""
        try:
            self.proc.wait(self.seconds + 10)
        except Exception:  # noqa: BLE001 - a stuck generator is stopped and reported
            self.e.stop(self.proc, timeout=2)
        t_end = time.time()
        time.sleep(0.5)  # the stats file's period, and the rings drained
        after = ledger(self.e)
        try:
            with open(self.result_path) as f:
                result = json.load(f)
        except (OSError, ValueError):
            result = {"error": f"spillway-synflood exited {self.proc.returncode}, no result"}
        drops = diff(self.before, after)
        # The ring's losses, by difference: frames the gateway's eth0 took in
        # that spillwayd never read (its packet socket sees every one).
        drops["af_packet_ring"] = {"lost": max(0, drops["links"].get("gateway eth0", {}).get(
            "rx_packets", 0) - drops["spillwayd"].get("rx_packets", 0))}
        self.report = {"t_start": self.t_start, "t_end": t_end, "for": self.seconds,
                       "rate": self.rate, "port": self.port, "generator": result,
                       "drops": drops}

    def finish(self):
        self.thread.join(self.seconds + 20)
        return self.report or {"t_start": self.t_start, "t_end": time.time(),
                               "for": self.seconds, "error": "the flood did not finish"}


def forge(estate, flags=("R",)):
    """One forged segment per established flow of the flow checker (its
    4-tuples read from the client's sockets), flags cycling through `flags`
    (scapy notation: "R" RST, "F" FIN, "FA" FIN+ACK), random sequence
    numbers. Returns how many were sent of each kind."""
    out = estate.run(["ss", "-Htn", "state", "established", "dst", f"{VIP_FLOWS}:{DATA_PORT}"],
                     ns=estate.ns("client")).stdout
    ports = sorted({int(m.group(1)) for m in re.finditer(rf"{re.escape(CLIENT)}:(\d+)", out)})
    if not ports:
        raise DrillError("forge-rst: no established flow in the client's namespace")
    rng = random.Random(len(ports))
    plan = [(p, flags[i % len(flags)], rng.getrandbits(32)) for i, p in enumerate(ports)]
    script = ("import sys, json\n"
              "from scapy.all import Ether, IP, TCP, sendp, conf\n"
              "conf.verb = 0\n"
              "mac, src, vip, dport, plan = sys.argv[1], sys.argv[2], sys.argv[3], "
              "int(sys.argv[4]), json.loads(sys.argv[5])\n"
              "sendp([Ether(dst=mac) / IP(src=src, dst=vip) / TCP(sport=p, dport=dport, "
              "flags=f, seq=s, window=0) for p, f, s in plan], iface='eth0')\n")
    estate.run(["/usr/bin/python3", "-c", script, estate.mac("lb"), CLIENT, VIP_FLOWS,
                str(DATA_PORT), json.dumps(plan)], ns=estate.ns("client"))
    sent = {}
    for _, f, _ in plan:
        sent[f] = sent.get(f, 0) + 1
    return sent


# -- the ledger ---------------------------------------------------------------------------
def ledger(e):
    """Every drop counter of the estate the flood's packets pass, now."""
    out = {"spillwayd": spillwayd_counts(e), "af_packet_socket": packet_socket_drops(e),
           "links": {}, "backends": {}}
    for where, ns, dev in (("client eth0", e.ns("client"), "eth0"),
                           ("fabric f-client", e.ns("fabric"), "f-client"),
                           ("fabric f-lb", e.ns("fabric"), "f-lb"),
                           ("gateway eth0", e.ns("lb"), "eth0")):
        out["links"][where] = link_counts(e, ns, dev)
    for name, b in e.backends.items():
        out["backends"][name] = tcp_ext(e, b["ns"])
    return out


def spillwayd_counts(e):
    try:
        with open(e.lb_stats) as f:
            s = json.load(f)
    except (OSError, ValueError, TypeError):
        return {}
    out = {"rx_packets": s.get("rx_packets", 0), "forwarded": s.get("forwarded", 0),
           "new_flows": s.get("new_flows", 0),
           "flow_insert_failed": s.get("flow_insert_failed", 0)}
    for reason, n in s.get("drops", {}).items():
        out[f"drop {reason}"] = n
    for w in s.get("workers", []):
        for k in ("flow_embryonic_rejected", "flow_syn_flood_inserts", "flow_evictions"):
            out[k] = out.get(k, 0) + w.get(k, 0)
    for p in s.get("ports", []):
        for k in ("rx_missed", "rx_errors", "rx_no_mbuf"):
            out[f"port {p['name']} {k}"] = p.get(k, 0)
    return out


def packet_socket_drops(e):
    """The drops of every packet socket in the gateway's namespace (sk_drops:
    the kernel adds a frame it could not put in a full ring; spillwayd's
    af_packet port holds one socket per queue). `ss -0 -m` shows them as d<N>
    in skmem."""
    out = e.run(["ss", "-0", "-H", "-m", "-a"], ns=e.ns("lb"), check=False).stdout
    total, sockets = 0, 0
    for m in re.finditer(r"skmem:\([^)]*\bd(\d+)\)", out):
        total += int(m.group(1))
        sockets += 1
    return {"drops": total, "sockets": sockets}


def link_counts(e, ns, dev):
    r = e.run(["ip", "-j", "-s", "link", "show", dev], ns=ns, check=False)
    try:
        st = json.loads(r.stdout)[0]["stats64"]
    except (ValueError, IndexError, KeyError):
        return {}
    return {"rx_packets": st["rx"]["packets"], "rx_dropped": st["rx"]["dropped"],
            "tx_packets": st["tx"]["packets"], "tx_dropped": st["tx"]["dropped"]}


def tcp_ext(e, ns):
    text = e.run(["cat", "/proc/net/netstat"], ns=ns, check=False).stdout.splitlines()
    for names, values in zip(text, text[1:]):
        if names.startswith("TcpExt:") and values.startswith("TcpExt:"):
            kv = dict(zip(names.split()[1:], values.split()[1:]))
            return {k: int(kv.get(k, 0)) for k in TCP_EXT}
    return {}


def diff(before, after):
    def sub(a, b):
        if isinstance(b, dict):
            return {k: sub(a.get(k, 0) if isinstance(a, dict) else 0, v) for k, v in b.items()}
        return b - (a or 0) if isinstance(b, (int, float)) else b
    return sub(before, after)
