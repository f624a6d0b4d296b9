#!/usr/bin/env python3
"""Opens many TCP connections to a VIP, learns from each which backend served
it (the server's first line), optionally keeps them open exchanging data, and
prints a JSON summary: connections per backend, failures, and per connection
(source port, backend) so a test can check the placement against Maglev.

    fanout_client.py VIP PORT COUNT [--hold SECONDS] [--parallel N] [--json FILE]
"""
import argparse
import asyncio
import json
import sys
import time


async def one(vip, port, hold, results, sem, timeout):
    async with sem:
        t0 = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(vip, port), timeout)
            line = await asyncio.wait_for(reader.readline(), timeout)
            backend = line.decode().strip().split("=", 1)[1]
            sport = writer.get_extra_info("sockname")[1]
        except Exception as e:  # noqa: BLE001 - every failure is a result
            results.append({"ok": False, "error": type(e).__name__})
            return
    # Held connections exchange a numbered message every 100 ms and check
    # the echo, so a connection moved to another backend (reset) shows up.
    ok = True
    error = None
    seq = 0
    deadline = time.monotonic() + hold
    try:
        while time.monotonic() < deadline:
            msg = f"{sport}:{seq}\n".encode()
            writer.write(msg)
            await writer.drain()
            echo = await asyncio.wait_for(reader.readexactly(len(msg)), timeout)
            if echo != msg:
                ok, error = False, "bad-echo"
                break
            seq += 1
            await asyncio.sleep(0.1)
        writer.close()
    except Exception as e:  # noqa: BLE001
        ok, error = False, type(e).__name__
    results.append({"ok": ok, "error": error, "backend": backend, "sport": sport,
                    "messages": seq, "connect_ms": round((time.monotonic() - t0) * 1000, 2)})


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vip")
    ap.add_argument("port", type=int)
    ap.add_argument("count", type=int)
    ap.add_argument("--hold", type=float, default=0.0)
    ap.add_argument("--parallel", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    results = []
    sem = asyncio.Semaphore(a.parallel)
    await asyncio.gather(*(one(a.vip, a.port, a.hold, results, sem, a.timeout)
                           for _ in range(a.count)))
    per = {}
    for r in results:
        if r["ok"]:
            per[r["backend"]] = per.get(r["backend"], 0) + 1
    summary = {"vip": a.vip, "port": a.port, "requested": a.count,
               "ok": sum(1 for r in results if r["ok"]),
               "failed": sum(1 for r in results if not r["ok"]),
               "per_backend": dict(sorted(per.items())), "connections": results}
    text = json.dumps(summary)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
