#!/usr/bin/env python3
"""A stand-in for a GPU backend's metrics endpoint, for e2e tests and drills.

Serves, on GET /metrics, Prometheus text in the format of NVIDIA's DCGM
exporter (DCGM_FI_DEV_GPU_UTIL and a few neighbours, one sample per GPU) and,
optionally, vLLM's queue gauge vllm:num_requests_waiting. Python stdlib only.

Values change at run time, without a restart:
  POST /set?gpu=90&queue=12       all GPUs at 90 %, queue depth 12
  POST /set?gpu1=20               one GPU (index 1)
  POST /set?queue=none            stop serving the queue metric
  POST /set?gpus=4                number of GPUs
  POST /set?status=503            answer /metrics with this status (200: normal)
  POST /set?delay_ms=800          answer /metrics this late (scrape timeouts)
  POST /set?garbage=1             answer /metrics with text that is not Prometheus
  GET  /state                     the current settings as JSON
  GET  /health                    200 "ok" (a target for HTTP health checks)
or with --control-file FILE: `key=value` lines with the same keys, re-read
whenever the file changes (for shell drills: `echo gpu=95 > FILE`).

  fake_exporter.py --port 0 --gpus 8 --gpu-util 37 --queue 3
prints "listening on 127.0.0.1:PORT" once it serves (and writes PORT to
--port-file if given), so a test can start it with port 0.
"""

import argparse
import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit


class State:
    def __init__(self, gpus, gpu_util, queue, model_name, hostname):
        self.lock = threading.Lock()
        self.gpus = gpus
        self.util = [gpu_util] * gpus
        self.queue = queue  # None: not served
        self.model_name = model_name
        self.hostname = hostname
        self.status = 200
        self.delay_ms = 0
        self.garbage = False
        self.scrapes = 0

    def apply(self, pairs):
        """Applies key=value settings, all or none; returns an error text or None."""
        with self.lock:
            gpus, util, queue = self.gpus, list(self.util), self.queue
            status, delay_ms, garbage, model_name = self.status, self.delay_ms, self.garbage, self.model_name
            for key, value in pairs:
                try:
                    if key == "gpus":
                        n = int(value)
                        if not 0 <= n <= 64:
                            return "gpus must be 0..64"
                        last = util[-1] if util else 0.0
                        util = (util + [last] * n)[:n]
                        gpus = n
                    elif key == "gpu":
                        util = [float(value)] * gpus
                    elif key.startswith("gpu") and key[3:].isdigit():
                        i = int(key[3:])
                        if i >= gpus:
                            return f"no GPU {i} (gpus={gpus})"
                        util[i] = float(value)
                    elif key == "queue":
                        queue = None if value in ("", "none") else float(value)
                    elif key == "status":
                        status = int(value)
                        if not 100 <= status <= 599:
                            return "status must be 100..599"
                    elif key == "delay_ms":
                        delay_ms = max(0, int(value))
                    elif key == "garbage":
                        garbage = value not in ("0", "false", "")
                    elif key == "model_name":
                        model_name = value
                    else:
                        return f"unknown key {key!r}"
                except ValueError:
                    return f"bad value {value!r} for {key}"
            self.gpus, self.util, self.queue = gpus, util, queue
            self.status, self.delay_ms, self.garbage, self.model_name = status, delay_ms, garbage, model_name
        return None

    def snapshot(self):
        with self.lock:
            return {
                "gpus": self.gpus,
                "gpu_util": list(self.util),
                "queue": self.queue,
                "model_name": self.model_name,
                "status": self.status,
                "delay_ms": self.delay_ms,
                "garbage": self.garbage,
                "scrapes": self.scrapes,
            }


def fmt(value):
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if value != int(value) else str(int(value))


def escape_label(value):
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(s):
    """DCGM exporter text (and vLLM's queue gauge) for a state snapshot."""
    host = s["hostname"]
    lines = []

    def gpu_metric(name, help_text, values):
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for i, v in enumerate(values):
            uuid = hashlib.sha1(f"{host}/{i}".encode()).hexdigest()
            uuid = f"GPU-{uuid[0:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:32]}"
            labels = (
                f'gpu="{i}",UUID="{uuid}",pci_bus_id="00000000:{0x10 + i:02X}:00.0",'
                f'device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3",'
                f'Hostname="{escape_label(host)}",DCGM_FI_DRIVER_VERSION="535.129.03"'
            )
            lines.append(f"{name}{{{labels}}} {fmt(v)}")

    util = s["gpu_util"]
    gpu_metric("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", [1980] * len(util))
    gpu_metric("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", [40 + u / 4 for u in util])
    gpu_metric("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", [90 + 6 * u for u in util])
    gpu_metric("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", util)
    gpu_metric("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", [int(800 * u) for u in util])
    if s["queue"] is not None:
        model = escape_label(s["model_name"])
        lines.append("# HELP vllm:num_requests_running Number of requests currently running on GPU.")
        lines.append("# TYPE vllm:num_requests_running gauge")
        lines.append(f'vllm:num_requests_running{{model_name="{model}"}} {fmt(min(s["queue"], 256.0))}')
        lines.append("# HELP vllm:num_requests_waiting Number of requests waiting to be processed.")
        lines.append("# TYPE vllm:num_requests_waiting gauge")
        lines.append(f'vllm:num_requests_waiting{{model_name="{model}"}} {fmt(s["queue"])}')
    return "\n".join(lines) + "\n"


class ControlFile:
    """Re-applies key=value lines from a file whenever its mtime changes."""

    def __init__(self, path, state):
        self.path = path
        self.state = state
        self.mtime = None

    def refresh(self):
        if not self.path:
            return
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            return
        if mtime == self.mtime:
            return
        self.mtime = mtime
        pairs = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                for word in line.split("#", 1)[0].replace("&", " ").split():
                    if "=" in word:
                        pairs.append(tuple(word.split("=", 1)))
        error = self.state.apply(pairs)
        if error:
            print(f"fake_exporter: {self.path}: {error}", file=sys.stderr, flush=True)


def make_handler(state, control):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "fake-dcgm-exporter/1.0"

        def log_message(self, fmt_, *args):  # quiet: tests read stdout
            pass

        def reply(self, code, body, content_type="text/plain; charset=utf-8"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            control.refresh()
            path = urlsplit(self.path).path
            if path == "/metrics":
                snap = state.snapshot()
                snap["hostname"] = state.hostname
                with state.lock:
                    state.scrapes += 1
                if snap["delay_ms"]:
                    time.sleep(snap["delay_ms"] / 1000.0)
                if snap["status"] != 200:
                    self.reply(snap["status"], f"status {snap['status']} (set by /set)\n")
                elif snap["garbage"]:
                    self.reply(200, "<html><body>not prometheus {\n")
                else:
                    self.reply(200, exposition(snap), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/state":
                self.reply(200, json.dumps(state.snapshot()) + "\n", "application/json")
            elif path in ("/health", "/healthz"):
                self.reply(200, "ok\n")
            else:
                self.reply(404, "not found\n")

        def do_POST(self):
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode(errors="replace") if length else ""
            if url.path != "/set":
                self.reply(404, "not found\n")
                return
            pairs = parse_qsl(url.query, keep_blank_values=True) + parse_qsl(body, keep_blank_values=True)
            error = state.apply(pairs)
            if error:
                self.reply(400, error + "\n")
            else:
                self.reply(200, json.dumps(state.snapshot()) + "\n", "application/json")

    return Handler


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9400, help="TCP port; 0 picks a free one (default 9400)")
    p.add_argument("--port-file", help="write the bound port here once listening")
    p.add_argument("--gpus", type=int, default=8, help="number of GPUs (default 8)")
    p.add_argument("--gpu-util", type=float, default=0.0, help="initial utilisation of every GPU, %%")
    p.add_argument("--queue", type=float, default=None, help="serve vllm:num_requests_waiting with this value")
    p.add_argument("--model-name", default="meta-llama/Meta-Llama-3-8B-Instruct")
    p.add_argument("--hostname", default=os.uname().nodename, help="Hostname label")
    p.add_argument("--control-file", help="key=value settings re-read whenever the file changes")
    args = p.parse_args(argv)

    state = State(args.gpus, args.gpu_util, args.queue, args.model_name, args.hostname)
    control = ControlFile(args.control_file, state)
    control.refresh()
    family = __import__("socket").AF_INET6 if ":" in args.listen else __import__("socket").AF_INET

    class Server(ThreadingHTTPServer):
        address_family = family
        daemon_threads = True
        allow_reuse_address = True

    server = Server((args.listen, args.port), make_handler(state, control))
    port = server.server_address[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{port}\n")
        os.replace(tmp, args.port_file)
    host = f"[{args.listen}]" if ":" in args.listen else args.listen
    print(f"listening on {host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
