#!/usr/bin/python3
"""One TCP connection from a chosen source port to an identity_server behind
a VIP: reads the `backend=NAME` line, then streams BYTES through the echo
and checks every byte that comes back. Full-size segments this way test the
encapsulated path near the fabric MTU. Prints one JSON object:
{"backend", "sport", "sent", "echoed", "ok", "error"}.

    bulk_echo.py VIP PORT --sport N [--bytes N] [--timeout S]
"""
import argparse
import json
import os
import socket
import sys
import threading


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vip")
    ap.add_argument("port", type=int)
    ap.add_argument("--sport", type=int, required=True)
    ap.add_argument("--bytes", type=int, default=1 << 20)
    ap.add_argument("--timeout", type=float, default=10.0)
    a = ap.parse_args()
    family = socket.AF_INET6 if ":" in a.vip else socket.AF_INET
    result = {"backend": None, "sport": a.sport, "sent": 0, "echoed": 0, "ok": False,
              "error": None}
    payload = os.urandom(a.bytes)
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", a.sport))
        s.settimeout(a.timeout)
        s.connect((a.vip, a.port))
        f = s.makefile("rb")
        line = f.readline().decode().strip()
        result["backend"] = line.split("=", 1)[1] if line.startswith("backend=") else line
        received = bytearray()

        def reader():
            try:
                while len(received) < len(payload):
                    chunk = f.read1(65536)
                    if not chunk:
                        break
                    received.extend(chunk)
            except OSError as e:
                result["error"] = f"read: {type(e).__name__}"
        t = threading.Thread(target=reader)
        t.start()
        s.sendall(payload)
        result["sent"] = len(payload)
        t.join(a.timeout)
        result["echoed"] = len(received)
        result["ok"] = bytes(received) == payload and result["error"] is None
        if not result["ok"] and result["error"] is None:
            result["error"] = "short or corrupted echo"
        s.close()
    except OSError as e:
        result["error"] = type(e).__name__
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
