#!/usr/bin/python3
"""gpu_sim.py: a simulated GPU inference backend for scripts/outcome_bench.

A backend that behaves like a GPU server as far as a load balancer can tell:
  * gRPC on --grpc-port (generic handlers, no generated stubs, so only
    Debian's python3-grpcio is needed): unary /spillway.Gpu/Infer and
    bidirectional /spillway.Gpu/Generate (each message a request, answered
    in turn). A request's message is its work, ASCII "WORK_MS" or
    "WORK_MS,REPLY_BYTES": milliseconds of a reference GPU (speed 1.0).
  * --slots execution slots (GPUs) and one FIFO queue: a request waits for a
    free slot, then holds it for WORK_MS / speed (asyncio.sleep: the process
    sleeps, it burns no CPU, so a 2-core machine hosts the whole estate). A
    request whose caller goes away while queued leaves the queue. The answer
    is b"NAME|WORK_MS" padded to REPLY_BYTES.
  * --speed: older GPUs are slower (0.5 = twice the service time); a control
    file (--control-file, `speed=0.33` lines, re-read when it changes) lets a
    benchmark slow a backend down at run time. Nothing else is scripted.
  * A DCGM-style exporter on --exporter-port (GET /metrics): one
    DCGM_FI_DEV_GPU_UTIL sample per slot, the slot's real busy fraction over
    the last --window seconds (an integer percent, as DCGM reports it);
    vllm:num_requests_waiting, the real queue's depth now, and
    vllm:num_requests_running; plus the counters gpu_sim_busy_seconds_total,
    gpu_sim_requests_total, gpu_sim_failed_total (requests given up while
    queued), gpu_sim_slots and gpu_sim_speed. Spillway's scraper reads the
    first two (README "Health checks, load feedback and spillover").
  * A TCP port for health checks (--health-port): accepts and closes.
  * Bulk mode on --bulk-port (0: off), for NCCL-like training flows: each
    step, the peer sends a 12-byte header (payload bytes N, big-endian u64;
    compute ms C, u32) and N bytes; once all have arrived the backend holds
    a slot for C / speed (the reduction on the GPU, queued with inference)
    and answers b"NAME\n". N is at most 1 GiB and C at most 60 s; anything
    else closes the connection.
  * --stats-file: the counters as JSON, rewritten every 0.25 s (the benchmark
    reads them from outside the backend's namespace).

  gpu_sim.py serve --name onprem1 --slots 4 --speed 1.0 [--grpc-port 50051]
                   [--exporter-port 9400] [--health-port 8000] [--bulk-port 0]
                   [--window 1.0]
                   [--control-file PATH] [--stats-file PATH]

One asyncio thread. SIGTERM or SIGINT: stops. Exit 2 on bad arguments, 1 when
a port cannot be bound.
"""

import argparse
import asyncio
import collections
import json
import os
import signal
import struct
import sys
import time

import grpc

SERVICE = "spillway.Gpu"
MAX_WORK_MS = 60_000.0
MAX_REPLY_BYTES = 1 << 20
SERVER_OPTIONS = [("grpc.so_reuseport", 0)]


class BadRequest(Exception):
    pass


def parse_work(message):
    """(work_ms, reply_bytes) of a request message."""
    try:
        text = message.decode("ascii")
        parts = text.split(",")
        if len(parts) > 2:
            raise ValueError
        work = float(parts[0])
        reply = int(parts[1]) if len(parts) == 2 else 0
    except (UnicodeDecodeError, ValueError):
        raise BadRequest(f"want WORK_MS[,REPLY_BYTES], got {message[:40]!r}") from None
    if not 0.0 <= work <= MAX_WORK_MS or work != work:
        raise BadRequest(f"work {work} ms outside 0..{MAX_WORK_MS:g}")
    if not 0 <= reply <= MAX_REPLY_BYTES:
        raise BadRequest(f"reply {reply} bytes outside 0..{MAX_REPLY_BYTES}")
    return work, reply


class Gpu:
    """N slots, a FIFO queue, and each slot's busy time."""

    def __init__(self, slots, speed, window):
        self.slots = slots
        self.speed = speed
        self.window = window
        self.free = list(range(slots))
        self.waiters = collections.deque()  # futures, first come first served
        self.busy_since = [None] * slots
        self.busy_total = [0.0] * slots  # seconds, closed intervals
        self.util = [0] * slots  # percent over the last window
        self.mark = (time.monotonic(), [0.0] * slots)
        self.requests = 0
        self.given_up = 0

    def busy_until(self, i, now):
        start = self.busy_since[i]
        return self.busy_total[i] + (now - start if start is not None else 0.0)

    def tick(self):
        """Closes a utilisation window: each slot's busy fraction since the last."""
        now = time.monotonic()
        t0, b0 = self.mark
        b1 = [self.busy_until(i, now) for i in range(self.slots)]
        span = now - t0
        if span > 0:
            self.util = [max(0, min(100, round(100.0 * (b1[i] - b0[i]) / span)))
                         for i in range(self.slots)]
        self.mark = (now, b1)

    async def acquire(self):
        if self.free and not self.waiters:
            slot = self.free.pop()
        else:
            fut = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            try:
                slot = await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self.release(fut.result())  # handed a slot as it was cancelled
                else:
                    self.waiters.remove(fut)
                self.given_up += 1
                raise
        self.busy_since[slot] = time.monotonic()
        return slot

    def release(self, slot):
        start = self.busy_since[slot]
        if start is not None:
            self.busy_total[slot] += time.monotonic() - start
            self.busy_since[slot] = None
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(slot)
                return
        self.free.append(slot)

    async def serve(self, work_ms):
        slot = await self.acquire()
        try:
            await asyncio.sleep(work_ms / 1000.0 / self.speed)
        finally:
            self.release(slot)
        self.requests += 1

    def counters(self):
        now = time.monotonic()
        return {"busy_seconds_total": sum(self.busy_until(i, now) for i in range(self.slots)),
                "requests_total": self.requests, "failed_total": self.given_up,
                "queue": len(self.waiters), "running": self.slots - len(self.free),
                "slots": self.slots, "speed": self.speed, "util": list(self.util)}


def exposition(name, gpu):
    c = gpu.counters()
    lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
             "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for i, u in enumerate(c["util"]):
        lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="GPU-sim-{name}-{i}",'
                     f'device="nvidia{i}",Hostname="{name}"}} {u}')
    lines += ["# HELP vllm:num_requests_running Number of requests currently running on GPU.",
              "# TYPE vllm:num_requests_running gauge",
              f'vllm:num_requests_running{{model_name="sim"}} {c["running"]}',
              "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
              "# TYPE vllm:num_requests_waiting gauge",
              f'vllm:num_requests_waiting{{model_name="sim"}} {c["queue"]}',
              "# TYPE gpu_sim_busy_seconds_total counter",
              f'gpu_sim_busy_seconds_total {c["busy_seconds_total"]:.6f}',
              "# TYPE gpu_sim_requests_total counter",
              f'gpu_sim_requests_total {c["requests_total"]}',
              "# TYPE gpu_sim_failed_total counter",
              f'gpu_sim_failed_total {c["failed_total"]}',
              "# TYPE gpu_sim_slots gauge", f'gpu_sim_slots {c["slots"]}',
              "# TYPE gpu_sim_speed gauge", f'gpu_sim_speed {c["speed"]:g}']
    return "\n".join(lines) + "\n"


async def http_exporter(reader, writer, name, gpu):
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        line = head.split(b"\r\n", 1)[0].split()
        if len(line) >= 2 and line[0] == b"GET" and line[1].split(b"?")[0] == b"/metrics":
            status, body = "200 OK", exposition(name, gpu).encode()
        elif len(line) >= 2 and line[0] == b"GET" and line[1] == b"/health":
            status, body = "200 OK", b"ok\n"
        else:
            status, body = "404 Not Found", b"not found\n"
        writer.write(f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
            ConnectionError):
        pass
    finally:
        writer.close()


async def health(reader, writer):
    writer.close()


MAX_BULK_BYTES = 1 << 30
BULK_HEADER = struct.Struct("!QI")


async def bulk(reader, writer, name, gpu):
    """One training flow: steps of (header, payload) answered after the
    reduction's slot time."""
    try:
        while True:
            try:
                head = await reader.readexactly(BULK_HEADER.size)
            except asyncio.IncompleteReadError:
                return  # the peer closed between steps
            size, compute_ms = BULK_HEADER.unpack(head)
            if size > MAX_BULK_BYTES or compute_ms > MAX_WORK_MS:
                return
            left = size
            while left:
                chunk = await reader.read(min(left, 1 << 18))
                if not chunk:
                    return
                left -= len(chunk)
            await gpu.serve(compute_ms)
            writer.write(name.encode() + b"\n")
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


class Control:
    """`speed=X` lines of a file, re-applied whenever its mtime changes."""

    def __init__(self, path, gpu):
        self.path, self.gpu, self.mtime = path, gpu, None

    def refresh(self):
        if not self.path:
            return
        try:
            mtime = os.stat(self.path).st_mtime_ns
            if mtime == self.mtime:
                return
            self.mtime = mtime
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            return
        for word in text.split():
            key, _, value = word.partition("=")
            try:
                if key == "speed" and 0.001 <= float(value) <= 1000:
                    self.gpu.speed = float(value)
                    continue
            except ValueError:
                pass
            print(f"gpu_sim: {self.path}: ignored {word!r} (want speed=0.001..1000)",
                  file=sys.stderr, flush=True)


def write_stats(path, gpu):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(gpu.counters(), unix=time.time()), f)
    os.replace(tmp, path)


async def serve(args):
    gpu = Gpu(args.slots, args.speed, args.window)
    name = args.name.encode()

    async def infer(request, context):
        try:
            work, reply = parse_work(request)
        except BadRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        await gpu.serve(work)
        body = name + b"|" + request.split(b",")[0]
        return body + b"." * max(0, reply - len(body))

    async def generate(requests, context):
        async for request in requests:
            yield await infer(request, context)

    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Infer": grpc.unary_unary_rpc_method_handler(infer),
        "Generate": grpc.stream_stream_rpc_method_handler(generate)})
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    try:
        bound = server.add_insecure_port(f"{args.bind}:{args.grpc_port}")
    except RuntimeError:
        bound = 0
    if bound == 0:
        print(f"gpu_sim: cannot listen on {args.bind}:{args.grpc_port}", file=sys.stderr)
        return 1
    await server.start()
    servers = []
    try:
        servers.append(await asyncio.start_server(
            lambda r, w: http_exporter(r, w, args.name, gpu), args.bind, args.exporter_port))
        if args.health_port:
            servers.append(await asyncio.start_server(health, args.bind, args.health_port))
        if args.bulk_port:
            servers.append(await asyncio.start_server(
                lambda r, w: bulk(r, w, args.name, gpu), args.bind, args.bulk_port))
    except OSError as e:
        print(f"gpu_sim: {e}", file=sys.stderr)
        return 1
    control = Control(args.control_file, gpu)
    print(f"gpu_sim: {args.name} serving: {args.slots} slots at speed {args.speed:g}, gRPC "
          f":{args.grpc_port}, exporter :{args.exporter_port}, health :{args.health_port}, "
          f"bulk :{args.bulk_port}",
          file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    next_tick = time.monotonic() + args.window
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except asyncio.TimeoutError:
            pass
        control.refresh()
        if time.monotonic() >= next_tick:
            gpu.tick()
            next_tick += args.window
        if args.stats_file:
            write_stats(args.stats_file, gpu)
    for s in servers:
        s.close()
    await server.stop(None)
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description="a simulated GPU inference backend")
    sub = ap.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--name", required=True)
    s.add_argument("--slots", type=int, default=4)
    s.add_argument("--speed", type=float, default=1.0)
    s.add_argument("--bind", default="0.0.0.0")
    s.add_argument("--grpc-port", type=int, default=50051)
    s.add_argument("--exporter-port", type=int, default=9400)
    s.add_argument("--health-port", type=int, default=8000)
    s.add_argument("--bulk-port", type=int, default=0)
    s.add_argument("--window", type=float, default=1.0)
    s.add_argument("--control-file")
    s.add_argument("--stats-file")
    args = ap.parse_args(argv)
    if not 1 <= args.slots <= 64:
        ap.error("--slots must be 1..64")
    if not 0.001 <= args.speed <= 1000:
        ap.error("--speed must be 0.001..1000")
    if not 0.05 <= args.window <= 60:
        ap.error("--window must be 0.05..60 s")
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
