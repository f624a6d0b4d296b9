#!/usr/bin/python3
"""gpu_train.py: a training job's NCCL-like flows to gpu_sim.py's bulk port.

  gpu_train.py --target ADDR:PORT --flows 4 --step-kib 256 --compute-ms 40
               --duration-s S [--timeout-s 10] --report PATH [--ready PATH]

A data-parallel job as an all-reduce ring sees it: --flows long-lived TCP
connections (each placed by the balancer on its own), and in every step each
flow sends --step-kib KiB and waits for its backend to reduce them
(--compute-ms of GPU time there, queued with inference); the step ends when
the slowest flow's answer is in, so the step time is set by the slowest
member. Steps follow each other back to back for --duration-s.

A flow whose connection fails (reset or closed: "reset"; no answer in
--timeout-s: "timeout", as a collective's watchdog would give up) after it
had answered once is a broken flow; it connects again and the step is sent
again on the new connection (the step's time includes all of that).

The report (JSON): {"started": unix, "ended": unix, "steps": [[t, step_ms,
[backend per flow]]], "broken": [[t, backend, "reset"|"timeout"]], "failed_connects": n, "unfinished": t|null};
t is seconds after "started"; "unfinished": the step that could not finish
(no connection) by --duration-s + --timeout-s. Exit 0 at the end of the run.
"""

import argparse
import asyncio
import json
import os
import struct
import sys
import time

HEADER = struct.Struct("!QI")


class JobOver(Exception):
    """The run's time (and a timeout's grace) is over with a step unfinished."""


class Flow:
    def __init__(self, job, index):
        self.job = job
        self.index = index
        self.reader = self.writer = None
        self.backend = None

    async def connect(self):
        host, _, port = self.job.args.target.rpartition(":")
        while True:
            if self.job.over():
                raise JobOver()
            try:
                self.reader, self.writer = await asyncio.wait_for(
                    asyncio.open_connection(host, int(port)), self.job.args.timeout_s)
                self.backend = None
                return
            except (OSError, asyncio.TimeoutError):
                self.job.failed_connects += 1
                await asyncio.sleep(0.1)

    def drop(self):
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def step(self, payload, compute_ms):
        """Sends one step and returns the backend that answered; reconnects
        (counting a broken flow) until one does."""
        while True:
            if self.writer is None:
                await self.connect()
            try:
                self.writer.write(HEADER.pack(len(payload), compute_ms) + payload)
                await asyncio.wait_for(self.writer.drain(), self.job.args.timeout_s)
                line = await asyncio.wait_for(self.reader.readline(), self.job.args.timeout_s)
                if not line.endswith(b"\n"):
                    raise ConnectionError("closed")
                self.backend = line.strip().decode("utf-8", "replace")
                return self.backend
            except (OSError, ConnectionError, asyncio.TimeoutError) as e:
                if self.backend is not None:
                    why = "timeout" if isinstance(e, asyncio.TimeoutError) else "reset"
                    self.job.broken.append([round(time.monotonic() - self.job.t0, 4),
                                            self.backend, why])
                self.drop()


class Job:
    def __init__(self, args):
        self.args = args
        self.steps = []
        self.broken = []
        self.failed_connects = 0
        self.unfinished = None  # t of a step that could not finish

    def over(self):
        return time.monotonic() - self.t0 > self.args.duration_s + self.args.timeout_s

    async def run(self):
        a = self.args
        self.started = time.time()
        self.t0 = time.monotonic()
        if a.ready:
            open(a.ready, "w").close()
        flows = [Flow(self, i) for i in range(a.flows)]
        payload = b"\0" * (a.step_kib * 1024)
        while time.monotonic() - self.t0 < a.duration_s:
            t = time.monotonic()
            try:
                backends = await asyncio.gather(*(f.step(payload, a.compute_ms)
                                                  for f in flows))
            except JobOver:
                self.unfinished = round(t - self.t0, 4)
                break
            self.steps.append([round(t - self.t0, 4), round((time.monotonic() - t) * 1e3, 3),
                               list(backends)])
        for f in flows:
            f.drop()
        self.ended = time.time()

    def write(self):
        doc = {"started": self.started, "ended": self.ended, "target": self.args.target,
               "flows": self.args.flows, "step_kib": self.args.step_kib,
               "compute_ms": self.args.compute_ms, "steps": self.steps,
               "broken": self.broken, "failed_connects": self.failed_connects,
               "unfinished": self.unfinished}
        tmp = self.args.report + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self.args.report)


def main(argv):
    ap = argparse.ArgumentParser(description="NCCL-like training flows to gpu_sim.py")
    ap.add_argument("--target", required=True)
    ap.add_argument("--flows", type=int, default=4)
    ap.add_argument("--step-kib", type=int, default=256)
    ap.add_argument("--compute-ms", type=int, default=40)
    ap.add_argument("--duration-s", type=float, required=True)
    ap.add_argument("--timeout-s", type=float, default=10.0)
    ap.add_argument("--report", required=True)
    ap.add_argument("--ready", help="a file created when the first step begins")
    args = ap.parse_args(argv)
    if not (1 <= args.flows <= 64 and 0 <= args.step_kib <= 1 << 20 and
            0 <= args.compute_ms <= 60000 and args.duration_s > 0 and args.timeout_s > 0):
        ap.error("--flows 1..64, --step-kib 0..1048576, --compute-ms 0..60000, "
                 "--duration-s and --timeout-s > 0")
    job = Job(args)
    asyncio.run(job.run())
    job.write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
