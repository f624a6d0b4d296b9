#!/usr/bin/python3
"""grpc_stream.py: long-lived bidirectional gRPC streams for the failover drills.

The gRPC sibling of spillway-flowcheck: where flowcheck checks raw TCP flows,
this checks HTTP/2 streams through the load balancer's VIP, with no generated
stubs (a generic handler for /spillway.Drill/Echo and identity byte
serializers, so only python3-grpcio is needed).

  grpc_stream.py serve  --name NAME --port 50051 [--bind ADDR]
  grpc_stream.py client --target ADDR:PORT --streams N [--interval-ms 100]
                        [--stall-ms 1000] [--duration-s S] [--report PATH]
                        [--ready PATH]

Protocol: the client sends the decimal sequence numbers 0, 1, 2, ... as
messages; the server answers each with b"NAME|" + the message. The first
echo names the stream's backend; an echo out of order, with other bytes or
from another name is a broken stream (state "error", error "corrupt: ...").

Each client stream has its own channel with a local subchannel pool, so each
is its own TCP connection (channels to the same target otherwise share one);
keepalive pings, retries and HTTP proxies are off, so what the report shows
is the path, not the library's recovery. The server sets so_reuseport 0, so a
second server on a taken port fails instead of sharing it.

Stall: like flowcheck, a stream is waiting while it has messages not yet
echoed (or has not had its first echo); the stall is the time since the later
of its last echo and the moment it began waiting. Episodes over --stall-ms are
kept as [start_unix, duration_ms] (at most 256 a stream, the rest counted).

SIGTERM, SIGINT or --duration-s: every live stream half-closes, waits up to
3 s for the rest of its echoes and the server's OK (state "open_at_end"), the
report is written and the client exits 0. Times are CLOCK_REALTIME seconds.
One asyncio thread; exit 2 on bad arguments.

Commands on stdin, one a line (the drill's close-flows): `close NAME`
half-closes every live stream on backend NAME; a stream whose every echo and
the server's OK arrive ends "closed" (not broken), otherwise "error".
"""

import argparse
import asyncio
import json
import os
import signal
import sys
import time

import grpc

SERVICE = "spillway.Drill"
METHOD = f"/{SERVICE}/Echo"
MAX_STALL_EPISODES = 256
MAX_OUTSTANDING = 1000
FINISH_TIMEOUT_S = 3.0
NEVER_MS = 2**31 - 1

CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.enable_http_proxy", 0),
    ("grpc.enable_retries", 0),
    ("grpc.keepalive_time_ms", NEVER_MS),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
]
SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_time_ms", NEVER_MS),
    ("grpc.http2.max_ping_strikes", 0),
]


class Clock:
    """CLOCK_REALTIME for monotonic instants, from one pair of readings."""

    def __init__(self):
        self.mono0 = time.monotonic()
        self.real0 = time.time()

    def unix(self, mono):
        return round(self.real0 + (mono - self.mono0), 6)


class Corrupt(Exception):
    pass


class Stream:
    def __init__(self, ident, clock, stall_s, now):
        self.id = ident
        self.clock = clock
        self.stall_s = stall_s
        self.backend = None
        self.sent = 0
        self.echoed = 0
        self.state = "live"
        self.error = None
        self.opened = now
        self.ended = None
        self.closing = False  # `close NAME` asked this stream to end
        self.waiting = True
        self.wait_since = now
        self.max_stall = 0.0
        self.stalls = []
        self.stalls_dropped = 0

    def _close_episode(self, now):
        if not self.waiting:
            return
        stall = now - self.wait_since
        self.max_stall = max(self.max_stall, stall)
        if stall > self.stall_s:
            if len(self.stalls) < MAX_STALL_EPISODES:
                self.stalls.append([self.clock.unix(self.wait_since), round(stall * 1e3, 3)])
            else:
                self.stalls_dropped += 1

    def _update_waiting(self, now):
        waiting = self.state == "live" and (self.backend is None or self.sent > self.echoed)
        if waiting and not self.waiting:
            self.wait_since = now
        self.waiting = waiting

    def note_sent(self, now):
        self.sent += 1
        self._update_waiting(now)

    def note_echo(self, message, now):
        self._close_episode(now)
        self.wait_since = now
        name, bar, payload = message.partition(b"|")
        if not bar:
            raise Corrupt(f"echo without a NAME| prefix: {message[:40]!r}")
        backend = name.decode("utf-8", "replace")
        if self.backend is None:
            self.backend = backend
        elif backend != self.backend:
            raise Corrupt(f"backend changed from {self.backend} to {backend}")
        if payload != b"%d" % self.echoed:
            raise Corrupt(f"echo {payload[:40]!r} where {self.echoed} was due")
        self.echoed += 1
        self._update_waiting(now)

    def end(self, state, now, error=None):
        if self.state != "live":
            return
        self._close_episode(now)
        self.waiting = False
        self.state = state
        self.error = error
        self.ended = now

    def report(self):
        entry = {
            "id": self.id,
            "backend": self.backend,
            "messages": self.echoed,
            "sent": self.sent,
            "opened": self.clock.unix(self.opened),
            "ended": (self.clock.unix(self.ended) if self.state in ("error", "closed")
                      else None),
            "max_stall_ms": round(self.max_stall * 1e3, 3),
            "stalls": self.stalls,
            "state": self.state,
            "error": self.error,
        }
        if self.stalls_dropped:
            entry["stalls_dropped"] = self.stalls_dropped
        return entry


def rpc_error(err):
    return f"{err.code().name}: {err.details()}"


class Client:
    def __init__(self, args):
        self.args = args
        self.clock = Clock()
        self.interval_s = args.interval_ms / 1e3
        self.finishing = asyncio.Event()
        self.streams = []
        self.settled = 0
        self.pending_input = b""

    def settle(self):
        """One more stream has its first echo or has failed."""
        self.settled += 1
        if self.settled == self.args.streams and self.args.ready:
            with open(self.args.ready, "w") as ready:
                ready.write("ready\n")

    def command(self, line):
        verb, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        if verb == "close" and arg:
            n = 0
            for s in self.streams:
                if s.state == "live" and s.backend == arg and not s.closing:
                    s.closing = True
                    n += 1
            print(f"grpc_stream: close {arg}: closing {n} live stream(s)", file=sys.stderr)
        elif verb:
            print(f"grpc_stream: unknown command {line.strip()!r} (want: close BACKEND)",
                  file=sys.stderr)

    def on_stdin(self):
        try:
            data = os.read(0, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(0)
            return
        self.pending_input += data
        while b"\n" in self.pending_input:
            line, _, self.pending_input = self.pending_input.partition(b"\n")
            self.command(line.decode("utf-8", "replace"))

    async def write_loop(self, stream, call):
        next_send = time.monotonic()
        try:
            while (not self.finishing.is_set() and stream.state == "live" and
                   not stream.closing):
                if stream.sent - stream.echoed < MAX_OUTSTANDING:
                    message = b"%d" % stream.sent
                    stream.note_sent(time.monotonic())
                    await call.write(message)
                next_send += self.interval_s
                delay = next_send - time.monotonic()
                if delay < 0:
                    next_send = time.monotonic() + self.interval_s
                    delay = self.interval_s
                try:
                    await asyncio.wait_for(self.finishing.wait(), delay)
                except asyncio.TimeoutError:
                    pass
            if stream.state == "live":
                await call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            pass  # the read side reports how the stream broke

    async def run_stream(self, stream):
        settled = False
        async with grpc.aio.insecure_channel(self.args.target, options=CHANNEL_OPTIONS) as channel:
            call = channel.stream_stream(METHOD)()
            writer = asyncio.create_task(self.write_loop(stream, call))
            try:
                while True:
                    message = await call.read()
                    now = time.monotonic()
                    if message is grpc.aio.EOF:
                        code = await call.code()
                        if stream.closing:
                            if stream.echoed == stream.sent and code == grpc.StatusCode.OK:
                                stream.end("closed", now)
                            else:
                                stream.end("error", now, f"{code.name} after {stream.echoed} "
                                           f"of {stream.sent} echoes (closing)")
                        elif not self.finishing.is_set():
                            stream.end("error", now, f"{code.name}: the server ended the stream")
                        elif stream.echoed != stream.sent:
                            stream.end("error", now, f"{code.name} after {stream.echoed} of "
                                       f"{stream.sent} echoes")
                        else:
                            stream.end("open_at_end", now)
                        break
                    stream.note_echo(message, now)
                    if not settled:
                        settled = True
                        self.settle()
            except grpc.aio.AioRpcError as err:
                stream.end("error", time.monotonic(), rpc_error(err))
            except Corrupt as err:
                stream.end("error", time.monotonic(), f"corrupt: {err}")
                call.cancel()
            except asyncio.CancelledError:
                stream.end("open_at_end", time.monotonic(),
                           f"no end of stream within {FINISH_TIMEOUT_S:g} s of our half-close")
                call.cancel()
            finally:
                writer.cancel()
                if not settled:
                    self.settle()

    async def run(self):
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.finishing.set)
        try:
            os.set_blocking(0, False)
            loop.add_reader(0, self.on_stdin)
        except (OSError, ValueError, PermissionError):
            pass  # no usable stdin: no commands
        started = time.monotonic()
        if self.args.streams == 0:
            self.settled = -1
            self.settle()
        tasks = []
        for ident in range(self.args.streams):
            stream = Stream(ident, self.clock, self.args.stall_ms / 1e3, time.monotonic())
            self.streams.append(stream)
            tasks.append(asyncio.create_task(self.run_stream(stream)))
        try:
            await asyncio.wait_for(self.finishing.wait(), self.args.duration_s or None)
        except asyncio.TimeoutError:
            self.finishing.set()
        live = sum(s.state == "live" for s in self.streams)
        print(f"grpc_stream: finishing {live} live stream(s)", file=sys.stderr)
        _, pending = await asyncio.wait(tasks, timeout=FINISH_TIMEOUT_S) if tasks else (None, [])
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        self.write_report(started, time.monotonic())

    def write_report(self, started, ended):
        by_state, by_backend = {}, {}
        for s in self.streams:
            by_state[s.state] = by_state.get(s.state, 0) + 1
            if s.backend is not None:
                by_backend[s.backend] = by_backend.get(s.backend, 0) + 1
        print(f"grpc_stream: {len(self.streams)} stream(s): {by_state}", file=sys.stderr)
        if not self.args.report:
            return
        report = {
            "target": self.args.target,
            "started": self.clock.unix(started),
            "ended": self.clock.unix(ended),
            "stall_ms": self.args.stall_ms,
            "interval_ms": self.args.interval_ms,
            "streams": [s.report() for s in self.streams],
            "summary": {"streams": len(self.streams), "by_state": by_state,
                        "by_backend": by_backend},
        }
        temporary = self.args.report + ".tmp"
        with open(temporary, "w") as out:
            json.dump(report, out, indent=1)
            out.write("\n")
        os.replace(temporary, self.args.report)


async def serve(args):
    prefix = args.name.encode() + b"|"

    async def echo(requests, context):
        async for message in requests:
            yield prefix + message

    handler = grpc.method_handlers_generic_handler(
        SERVICE, {"Echo": grpc.stream_stream_rpc_method_handler(echo)})
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    host = f"[{args.bind}]" if ":" in args.bind else args.bind
    try:
        bound = server.add_insecure_port(f"{host}:{args.port}")
    except RuntimeError:
        bound = 0
    if bound == 0:
        print(f"grpc_stream serve: cannot listen on {host}:{args.port}", file=sys.stderr)
        return 1
    await server.start()
    print(f"grpc_stream serve: {args.name} listening on {host}:{args.port}", file=sys.stderr)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(None)
    return 0


def parse_args(argv):
    parser = argparse.ArgumentParser(description="bidirectional gRPC streams for failover drills")
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve", help="echo server: b'NAME|' + each message")
    s.add_argument("--name", required=True)
    s.add_argument("--port", type=int, default=50051)
    s.add_argument("--bind", default="0.0.0.0")
    c = sub.add_parser("client", help="N long-lived streams to a target")
    c.add_argument("--target", required=True, help="ADDR:PORT")
    c.add_argument("--streams", type=int, required=True)
    c.add_argument("--interval-ms", type=int, default=100)
    c.add_argument("--stall-ms", type=int, default=1000)
    c.add_argument("--duration-s", type=float, default=0)
    c.add_argument("--report")
    c.add_argument("--ready")
    args = parser.parse_args(argv)
    if args.mode == "serve":
        if not args.name or "|" in args.name or any(ch.isspace() for ch in args.name):
            s.error("--name must be non-empty, without '|' or whitespace")
        if not 1 <= args.port <= 65535:
            s.error("--port must be 1..65535")
    else:
        host, colon, port = args.target.rpartition(":")
        if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            c.error(f"--target {args.target!r} is not ADDR:PORT")
        if args.streams < 0:
            c.error("--streams must be 0 or more")
        if args.interval_ms < 1 or args.stall_ms < 1:
            c.error("--interval-ms and --stall-ms must be at least 1")
        if args.duration_s < 0:
            c.error("--duration-s must not be negative")
    return args


def main(argv):
    args = parse_args(argv)
    if args.mode == "serve":
        return asyncio.run(serve(args))

    async def client():
        await Client(args).run()

    asyncio.run(client())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
