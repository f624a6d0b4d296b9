#!/usr/bin/python3
"""Counts what crosses one interface to and from the VIPs, for the spillwayd
end-to-end tests: run it in the client's namespace, and the summary shows
whether replies came straight from the backends (DSR: their MACs) or through
the load balancer (its MAC).

    wire_tap.py --iface eth0 --vip 192.0.2.10 [--vip ...] --ready FILE --out FILE

Opens an AF_PACKET socket (both directions), writes FILE given by --ready once
it listens, and on SIGTERM or SIGINT writes a JSON summary to --out:
  out:       frames sent to a VIP, per "vip:port" (tcp/udp) or "vip:icmp", with
             SYN and pure-ACK counts
  in:        frames from a VIP, per source MAC
  flows:     per "vip:vport:cport" (the client's port) of TCP, the source MACs
             of the frames from the VIP and when (time.time()) each SYN left
  drops:     frames the socket lost (PACKET_STATISTICS), which makes counts lower
                bounds
"""
import argparse
import ipaddress
import json
import os
import signal
import socket
import struct
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
SOL_PACKET = 263
PACKET_STATISTICS = 6
SO_RCVBUFFORCE = 33


def mac_text(b):
    return ":".join(f"{x:02x}" for x in b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iface", required=True)
    ap.add_argument("--vip", action="append", required=True)
    ap.add_argument("--ready", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    vips = {ipaddress.ip_address(v).packed: v for v in a.vip}

    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    sock.bind((a.iface, 0))
    sock.settimeout(0.2)
    stop = False

    def on_signal(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with open(a.ready, "w") as f:
        f.write("listening\n")

    out, inn, flows = {}, {}, {}
    frames = 0
    drops = 0
    while not stop:
        try:
            frame, addr = sock.recvfrom(65535)
        except socket.timeout:
            continue
        except InterruptedError:
            continue
        frames += 1
        outgoing = addr[2] == PACKET_OUTGOING
        off = 14
        ethertype = struct.unpack_from("!H", frame, 12)[0]
        if ethertype == 0x8100:
            ethertype = struct.unpack_from("!H", frame, 16)[0]
            off = 18
        if ethertype == 0x0800 and len(frame) >= off + 20:
            ihl = (frame[off] & 0x0F) * 4
            proto = frame[off + 9]
            src, dst = frame[off + 12:off + 16], frame[off + 16:off + 20]
            l4 = off + ihl
        elif ethertype == 0x86DD and len(frame) >= off + 40:
            proto = frame[off + 6]
            src, dst = frame[off + 8:off + 24], frame[off + 24:off + 40]
            l4 = off + 40
        else:
            continue
        sport = dport = None
        flags = 0
        if proto in (6, 17) and len(frame) >= l4 + 4:
            sport, dport = struct.unpack_from("!HH", frame, l4)
            if proto == 6 and len(frame) >= l4 + 14:
                flags = frame[l4 + 13]
        if outgoing and dst in vips:
            key = f"{vips[dst]}:{dport}" if sport is not None else f"{vips[dst]}:{proto}"
            o = out.setdefault(key, {"frames": 0, "syn": 0})
            o["frames"] += 1
            if proto == 6 and flags & 0x02:
                o["syn"] += 1
                fl = flows.setdefault(f"{vips[dst]}:{dport}:{sport}", {"macs": {}, "syn": []})
                fl["syn"].append(round(time.time(), 3))
        elif not outgoing and src in vips:
            mac = mac_text(frame[6:12])
            inn[mac] = inn.get(mac, 0) + 1
            if proto == 6 and sport is not None:
                fl = flows.setdefault(f"{vips[src]}:{sport}:{dport}", {"macs": {}, "syn": []})
                fl["macs"][mac] = fl["macs"].get(mac, 0) + 1
    try:
        raw = sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
        drops = struct.unpack("II", raw)[1]
    except OSError:
        drops = -1
    with open(a.out + ".tmp", "w") as f:
        json.dump({"frames": frames, "out": out, "in": inn, "flows": flows, "drops": drops,
                   "stopped": time.time()}, f)
    os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
