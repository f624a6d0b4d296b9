#!/usr/bin/python3
"""gpu_load.py: Poisson inference load on gpu_sim.py backends through a VIP.

  gpu_load.py --target ADDR:PORT --schedule 0:40,10:70 --duration-s S
              [--work-ms 200] [--reply-bytes 512] [--new-fraction 0.3]
              [--channels 8] [--deadline-s 10] [--seed 1] --report PATH
              [--ready PATH]

Requests arrive as a Poisson process whose rate (requests a second) follows
--schedule, "T:RATE" steps at T seconds from the start. Each asks for an
exponentially distributed amount of work (mean --work-ms of a reference GPU,
clipped to 0.1x..10x the mean) with a --reply-bytes answer
(/spillway.Gpu/Infer, gpu_sim.py). A fraction --new-fraction of requests
opens a channel of its own (a new TCP connection, closed after the answer);
the rest go over --channels long-lived channels (each its own TCP
connection, HTTP/2-multiplexed, chosen in turn), as serving front ends keep
theirs. Keepalive pings, retries and proxies are off: what the report shows
is the path, not the library's recovery.

A long-lived channel that had answered and then fails a request with
UNAVAILABLE or CANCELLED (its connection reset or lost) counts as a broken
flow, and is replaced by a new channel.

Latency is measured from the request's scheduled arrival (a late client does
not hide queueing). The report (JSON): {"started": unix, "ended": unix,
"requests": [[t, latency_ms|null, status, backend, kind, done_ms]],
"broken": [[t, backend]]}; t is seconds after "started", status "OK" or a
gRPC status name, kind "new" or "channel", done_ms the time from the
scheduled arrival to the answer or the failure. Exit 0 once every request has finished.
"""

import argparse
import asyncio
import json
import os
import random
import sys
import time

import grpc

METHOD = "/spillway.Gpu/Infer"
NEVER_MS = 2**31 - 1
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.enable_http_proxy", 0),
    ("grpc.enable_retries", 0),
    ("grpc.keepalive_time_ms", NEVER_MS),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]
BROKEN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL)


def parse_schedule(text):
    steps = []
    for part in text.split(","):
        t, _, rate = part.partition(":")
        steps.append((float(t), float(rate)))
    steps.sort()
    if not steps or steps[0][0] != 0 or any(r < 0 for _, r in steps):
        raise ValueError("want T:RATE steps from 0 (rates >= 0)")
    return steps


def rate_at(steps, t):
    rate = steps[0][1]
    for t0, r in steps:
        if t >= t0:
            rate = r
    return rate


class Channel:
    def __init__(self, target):
        self.target = target
        self.channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self.call = self.channel.unary_unary(METHOD)
        self.backend = None


class Load:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.steps = parse_schedule(args.schedule)
        self.records = []
        self.broken = []
        self.channels = []
        self.next_channel = 0

    def work(self):
        mean = self.args.work_ms
        w = self.rng.expovariate(1.0 / mean)
        return min(max(w, 0.1 * mean), 10 * mean)

    async def one(self, t_sched, work, use_new):
        message = f"{work:.3f},{self.args.reply_bytes}".encode()
        backend, status = "", "OK"
        if use_new:
            ch = Channel(self.args.target)
        else:
            ch = self.channels[self.next_channel]
            self.next_channel = (self.next_channel + 1) % len(self.channels)
        try:
            answer = await ch.call(message, timeout=self.args.deadline_s)
            backend = answer.split(b"|", 1)[0].decode("utf-8", "replace")
            if not use_new:
                ch.backend = backend
        except grpc.aio.AioRpcError as err:
            status = err.code().name
            if not use_new and ch.backend is not None and err.code() in BROKEN:
                backend = ch.backend
                # A broken flow: the connection this channel had is gone.
                if ch in self.channels:
                    self.broken.append([round(time.monotonic() - self.t0, 4), ch.backend])
                    i = self.channels.index(ch)
                    self.channels[i] = Channel(self.args.target)
                    asyncio.get_running_loop().create_task(ch.channel.close())
        finally:
            if use_new:
                await ch.channel.close()
        latency = (time.monotonic() - self.t0 - t_sched) * 1e3
        self.records.append([round(t_sched, 4), round(latency, 3) if status == "OK" else None,
                             status, backend, "new" if use_new else "channel",
                             round(latency, 3)])

    async def run(self):
        a = self.args
        self.channels = [Channel(a.target) for _ in range(a.channels)]
        self.started = time.time()
        self.t0 = time.monotonic()
        if a.ready:
            open(a.ready, "w").close()
        tasks = set()
        t = 0.0
        while True:
            rate = rate_at(self.steps, t)
            if rate <= 0:
                nxt = [s for s, _ in self.steps if s > t]
                if not nxt:
                    break
                t = nxt[0]
                continue
            t += self.rng.expovariate(rate)
            if t >= a.duration_s:
                break
            work = self.work()
            use_new = a.channels == 0 or self.rng.random() < a.new_fraction
            delay = t - (time.monotonic() - self.t0)
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.get_running_loop().create_task(self.one(t, work, use_new))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(list(tasks))
        self.ended = time.time()
        for ch in self.channels:
            await ch.channel.close()

    def write(self):
        self.records.sort(key=lambda r: r[0])
        doc = {"started": self.started, "ended": self.ended, "target": self.args.target,
               "schedule": self.steps, "requests": self.records, "broken": self.broken}
        tmp = self.args.report + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self.args.report)


def main(argv):
    ap = argparse.ArgumentParser(description="Poisson inference load through a VIP")
    ap.add_argument("--target", required=True)
    ap.add_argument("--schedule", required=True)
    ap.add_argument("--duration-s", type=float, required=True)
    ap.add_argument("--work-ms", type=float, default=200.0)
    ap.add_argument("--reply-bytes", type=int, default=512)
    ap.add_argument("--new-fraction", type=float, default=0.3)
    ap.add_argument("--channels", type=int, default=8)
    ap.add_argument("--deadline-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--report", required=True)
    ap.add_argument("--ready", help="a file created when the arrivals begin")
    args = ap.parse_args(argv)
    try:
        parse_schedule(args.schedule)
    except ValueError as e:
        ap.error(f"--schedule: {e}")
    if not 0 <= args.new_fraction <= 1 or args.channels < 0 or args.work_ms <= 0:
        ap.error("--new-fraction 0..1, --channels >= 0, --work-ms > 0")
    load = Load(args)
    asyncio.run(load.run())
    load.write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
