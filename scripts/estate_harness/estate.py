"""The estate every end-to-end test and drill stands on: a scripts/topology
estate in network namespaces (a client, the gateway "lb" running spillwayd,
on-prem backends behind IP-in-IP and cloud backends behind GUE, each
decapsulating with spillway-decap), its processes, its configuration
(estate_toml.py), spillwayd's start, readiness and stop, the wire tap and
the fanout client; the checks' bookkeeping and their floor; log() and
wait_until(), the polling against a deadline every wait uses.

Used by tests/e2e (spillwayd_e2e.py, control_e2e.py, tier_e2e.py) and the
drills (scripts/drill_lib). Thread contract: one thread drives an Estate;
its processes are its own, stopped by cleanup().
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

from estate_harness.estate_toml import write_estate_toml

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
E2E = os.path.join(ROOT, "tests", "e2e")

PY = "/usr/bin/python3"
TOPOLOGY = os.path.join(ROOT, "scripts", "topology")
IDENTITY_SERVER = os.path.join(ROOT, "tests", "tools", "identity_server.py")
FANOUT = os.path.join(ROOT, "tests", "tools", "fanout_client.py")
WIRE_TAP = os.path.join(E2E, "wire_tap.py")
BULK_ECHO = os.path.join(E2E, "bulk_echo.py")

VIP_NCCL = "192.0.2.10"
VIP_GRPC = "192.0.2.11"
CLIENT = "10.99.0.100"
CLIENT2 = "10.99.0.101"
LB_ADDR = "10.99.0.2"
CLIENT6 = "fd00:99::100"
LB_ADDR6 = "fd00:99::2"
VIP6 = "2001:db8:ffff::10"
SEED = "0x0e2e5eed1b4d5eed"
# Unequal weights, so the check sees the weighted fill, not an even split.
WEIGHTS = {"onprem1": 100, "onprem2": 200, "onprem3": 100, "cloud1": 50, "cloud2": 100}


class Skip(Exception):
    pass


class Fail(Exception):
    pass


def log(msg):
    print(msg, flush=True)


def wait_until(what, predicate, timeout, interval=0.05):
    """Polls predicate() until it returns a true value (returned) or the
    deadline passes (Fail)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Lb:
    """One spillwayd process in the gateway's namespace."""

    def __init__(self, proc, stats, stdout, stderr):
        self.proc, self.stats, self.stdout, self.stderr = proc, stats, stdout, stderr

    def read_stats(self):
        try:
            with open(self.stats) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def log_tail(self):
        try:
            with open(self.stderr) as f:
                return "".join(f.readlines()[-20:])
        except OSError:
            return ""


class Estate:
    def __init__(self, test, spillwayd, decap):
        self.test = test
        self.spillwayd = spillwayd
        self.decap = decap
        self.prefix = f"swe{os.getpid()}"
        self.work = tempfile.mkdtemp(prefix=f"swe-{test}-")
        self.procs = []
        self.up = False
        self.backends = []  # (name, namespace, address)
        self.backends6 = {}  # name -> IPv6 fabric address, with --ipv6
        self.pmd = "af_packet"  # the gateway port's PMD: af_packet or af_xdp
        self.passed = 0
        self.failed = 0

    # -- checks ---------------------------------------------------------------
    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        log(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
        return ok

    # -- processes ------------------------------------------------------------
    def ns(self, host):
        return f"{self.prefix}-{host}"

    def run(self, args, ns=None, check=True, timeout=60, env=None):
        if ns is not None:
            args = ["ip", "netns", "exec", ns] + args
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
        if check and r.returncode != 0:
            raise Fail(f"{' '.join(args)} exited {r.returncode}: {r.stderr.strip()[-500:]}")
        return r

    def spawn(self, args, ns=None, stdout=None, stderr=None):
        """A background process; `ip netns exec` execs the command, so the
        Popen's pid is the command's own."""
        if ns is not None:
            args = ["ip", "netns", "exec", ns] + args
        out = open(stdout, "w") if stdout else subprocess.DEVNULL
        err = open(stderr, "w") if stderr else subprocess.DEVNULL
        p = subprocess.Popen(args, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def stop(self, p, timeout=10):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p in self.procs:
            self.procs.remove(p)
        return p.returncode

    def stop_all(self, procs):
        """Stops `procs` (best effort, in the order given), then takes the
        topology down if it is up: the first part of every cleanup."""
        for p in procs:
            try:
                self.stop(p, timeout=5)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        if self.up:
            subprocess.run([TOPOLOGY, "down", "--prefix", self.prefix], capture_output=True)

    def cleanup(self):
        self.stop_all(list(self.procs))
        # The EAL's runtime directories of our --file-prefix(es).
        for d in glob.glob(f"/var/run/dpdk/{self.prefix}*"):
            shutil.rmtree(d, ignore_errors=True)
        if os.environ.get("SWE_KEEP_WORK"):
            log(f"work files kept in {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)

    # -- the estate -----------------------------------------------------------
    def topology_up(self, onprem, cloud, ipv6=False, tier=0):
        """tier: N instances lb1..lbN behind a router with FRR (self.instances
        lists (name, namespace, address))."""
        env = dict(os.environ, SW_DECAP=self.decap)
        opts = ["--prefix", self.prefix, "--onprem", str(onprem), "--cloud", str(cloud)]
        opts += ["--ipv6"] if ipv6 else []
        opts += ["--tier", str(tier)] if tier else []
        self.up = True
        self.run([TOPOLOGY, "up"] + opts, env=env)
        text = self.run([TOPOLOGY, "env"] + opts).stdout
        self.backends = [tuple(line.split()[1:4]) for line in text.splitlines()
                         if line.startswith("backend ")]
        self.backends6 = {line.split()[1]: line.split()[3] for line in text.splitlines()
                          if line.startswith("backend6 ")}
        self.instances = [tuple(line.split()[1:4]) for line in text.splitlines()
                          if line.startswith("instance ")]
        for name, ns, _ in self.backends:
            if "prog/xdp" not in self.run(["ip", "-n", ns, "link", "show", "eth0"]).stdout:
                raise Fail(f"spillway-decap is not attached on {name}'s eth0")

    def mac(self, host):
        info = json.loads(self.run(["ip", "-j", "-n", self.ns(host), "link", "show", "eth0"])
                          .stdout)
        return info[0]["address"]

    def start_servers(self, ports=(8000, 50051)):
        for name, ns, _ in self.backends:
            self.spawn([PY, IDENTITY_SERVER, name] + [str(p) for p in ports], ns=ns,
                       stderr=os.path.join(self.work, f"{name}.log"))
        for name, ns, _ in self.backends:
            for port in ports:
                wait_until(f"{name} listening on :{port}", lambda: self.run(
                    ["ss", "-Hltn", f"sport = :{port}"], ns=ns).stdout.strip(), 20)

    def write_config(self, answer_ping=True, addresses=None, extra_vips=(), mtu=1600,
                     priorities=None, pool_tables=None, extra=(), only=None, weights=None,
                     path=None, check=True, lb_addr=LB_ADDR, host="lb", lb_addr6=LB_ADDR6):
        """The gateway's configuration. addresses: backend name -> tunnel
        address (default: its IPv4 fabric address); extra_vips: [[vip]]
        tables as lists of lines. For the control-plane tests
        (control_e2e.py): priorities: pool -> priority (default 0 each);
        pool_tables: pool -> lines after its [[pool]] keys ([pool.health],
        [pool.load]); extra: top-level lines ([policy], [control]); only: the
        backend names to configure (default all); weights: name -> weight
        (default WEIGHTS); path: write there instead of spillway.toml (and
        leave self.config alone); check: run --check-config; lb_addr: the
        gateway port's address (a tier instance's own); lb_addr6: its IPv6
        address (with --ipv6)."""
        addresses = addresses or {}
        priorities = priorities or {}
        pool_tables = pool_tables or {}
        weights = WEIGHTS if weights is None else weights
        port = {"name": "fabric", "devargs": f"net_{self.pmd}0,iface=eth0", "address": lb_addr}
        if self.backends6:
            port["address6"] = lb_addr6
        port.update(mtu=mtu, kernel_interface="eth0")
        # Both pools at one priority level, so new flows spread over every
        # backend by weight and every encapsulation carries traffic
        # (spillover between levels has its own test).
        pools = [{"name": p, "site": p, "priority": priorities.get(p, 0), "encap": encap,
                  "_lines": pool_tables.get(p, ())}
                 for p, encap in (("onprem", "ipip"), ("cloud", "gue"))]
        vips = [{"name": "nccl", "address": VIP_NCCL, "protocol": "tcp", "port": 0,
                 "pools": ["onprem", "cloud"], "answer_ping": answer_ping},
                {"name": "grpc", "address": VIP_GRPC, "protocol": "tcp", "port": 50051,
                 "table_size": 4099, "pools": ["onprem", "cloud"]}]
        vips += [{"_lines": list(vip)} for vip in extra_vips]
        backends = [{"name": name, "address": addresses.get(name, addr),
                     "pool": name.rstrip("0123456789"), "weight": weights.get(name, 100)}
                    for name, _, addr in self.backends if only is None or name in only]
        main = path is None
        path = path or os.path.join(self.work, "spillway.toml")
        write_estate_toml(path, comment="Generated by the e2e estate (scripts/estate_harness).",
                          dataplane={"lcores": [1], "hash_seed": SEED, "flow_capacity": 65536},
                          ports=[port], pools=pools, vips=vips, backends=backends,
                          raw=extra)
        if check:
            # In the gateway's namespace: the host checks look for its interface.
            # In the gateway's namespace: the host checks look for its interfaces.
            self.run([self.spillwayd, "--check-config", path], ns=self.ns(host))
        if main:
            self.config = path
        return path

    def start_lb(self, tag, metrics_listen="", host="lb", config=None, user=None,
                 run_dir=None):
        """spillwayd in `host`'s namespace; another host than "lb" (a tier
        instance) gets its own EAL file prefix, socket (self.socket(host))
        and state directory. With `user` it runs as that user after start-up
        (--user), writing its statistics and state under `run_dir`."""
        own = "" if host == "lb" else f"-{host}"
        run_dir = run_dir or self.work
        stats = os.path.join(run_dir, f"stats-{tag}.json")
        stdout = os.path.join(self.work, f"final-{tag}.json")
        stderr = os.path.join(self.work, f"spillwayd-{tag}.log")
        p = self.spawn([self.spillwayd, "--no-huge", "-m", "512", "--file-prefix",
                        self.prefix + own,
                        "--", "--config", config or self.config, "--stats-file", stats,
                        "--stats-interval-ms", "100",
                        "--control-socket", self.socket(host),
                        "--state-dir", os.path.join(run_dir, "state" + own),
                        ] + (["--metrics-listen", metrics_listen] if metrics_listen is not None
                             else []) + (["--user", user] if user is not None else []),
                       ns=self.ns(host), stdout=stdout,
                       stderr=stderr)
        return Lb(p, stats, stdout, stderr)

    def socket(self, host="lb"):
        return os.path.join(self.work, "spillway.sock" if host == "lb" else f"{host}.sock")

    def wait_ready(self, lb, timeout=30):
        """Ready: every backend's next hop resolved (so the tables hold every
        backend) and every worker running the latest snapshot."""
        def ready():
            if lb.proc.poll() is not None:
                raise Fail(f"spillwayd exited {lb.proc.returncode}:\n{lb.log_tail()}")
            s = lb.read_stats()
            return s if s and all(b["next_hop_resolved"] for b in s["backends"]) and all(
                w["snapshot_generation"] == s["generation"] for w in s["workers"]) else None
        try:
            return wait_until("spillwayd ready (next hops resolved)", ready, timeout)
        except Fail as e:
            raise Fail(f"{e}\n{lb.log_tail()}") from None

    def stop_lb(self, lb, timeout=10):
        """SIGTERM; returns (exit code, seconds to exit, final stats from stdout)."""
        t0 = time.monotonic()
        rc = self.stop(lb.proc, timeout)
        took = time.monotonic() - t0
        try:
            with open(lb.stdout) as f:
                final = json.loads(f.read().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError):
            final = None
        return rc, took, final

    def quiesce(self, lb, timeout=10):
        """Waits until spillwayd's rx count holds still over three stats
        periods (the last ACKs and FINs have gone through)."""
        seen = []

        def still():
            s = lb.read_stats()
            if s:
                seen.append(s["rx_packets"])
            return len(seen) >= 4 and len(set(seen[-4:])) == 1
        wait_until("spillwayd to go quiet", still, timeout, interval=0.1)

    def start_tap(self, tag, vips=(VIP_NCCL, VIP_GRPC)):
        ready = os.path.join(self.work, f"tap-{tag}.ready")
        out = os.path.join(self.work, f"tap-{tag}.json")
        args = [PY, WIRE_TAP, "--iface", "eth0", "--ready", ready, "--out", out]
        for v in vips:
            args += ["--vip", v]
        p = self.spawn(args, ns=self.ns("client"),
                       stderr=os.path.join(self.work, f"tap-{tag}.log"))
        wait_until("wire tap listening", lambda: os.path.exists(ready) or p.poll() is not None,
                   10)
        if p.poll() is not None:
            raise Fail(f"wire tap exited {p.returncode}")
        return p, out

    def stop_tap(self, tap):
        p, out = tap
        self.stop(p)
        with open(out) as f:
            return json.load(f)

    def finish_held(self, client, out, lb, tap, wait):
        """The end of a held-connections test: waits for the fanout client,
        lets spillwayd go quiet, stops the wire tap and spillwayd. Returns
        (the client's result, the tap's flows, spillwayd's final stats)."""
        result = self.fanout_result(client, out, wait)
        self.quiesce(lb)
        wire = self.stop_tap(tap)
        rc, _, final = self.stop_lb(lb)
        if final is None:
            raise Fail(f"spillwayd printed no final statistics (exit {rc})")
        return result, wire, final

    def fanout_result(self, client, out, wait):
        """A background fanout client's result, once it has finished (within
        `wait` seconds, or Fail)."""
        try:
            client.wait(wait)
        except subprocess.TimeoutExpired:
            raise Fail("fanout_client did not finish") from None
        self.procs.remove(client)
        with open(out) as f:
            return json.load(f)

    def fanout(self, vip, port, count, tag, hold=0.0, timeout=5.0, background=False):
        out = os.path.join(self.work, f"fanout-{tag}.json")
        args = [PY, FANOUT, vip, str(port), str(count), "--parallel", "64", "--timeout",
                str(timeout), "--json", out]
        if hold:
            args += ["--hold", str(hold)]
        if background:
            return self.spawn(args, ns=self.ns("client"),
                              stderr=os.path.join(self.work, f"fanout-{tag}.log")), out
        self.run(args, ns=self.ns("client"), check=False, timeout=120)
        with open(out) as f:
            return json.load(f)


def preflight():
    if os.geteuid() != 0:
        raise Skip("needs root (network namespaces, XDP, af_packet)")
    for tool in ("ip", "ss", "ping"):
        if shutil.which(tool) is None:
            raise Skip(f"'{tool}' not found")
    probe = f"swe{os.getpid()}-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip(f"cannot create network namespaces: {r.stderr.strip()}")
    try:
        r = subprocess.run(["ip", "-n", probe, "link", "add", "name", "a", "type", "veth", "peer",
                            "name", "b"], capture_output=True, text=True)
        if r.returncode != 0:
            raise Skip(f"cannot create veth pairs: {r.stderr.strip()}")
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def checks(at_least):
    """A test's declared floor: a run of the decorated test that executed
    fewer checks than `at_least` fails (run_test), so a test that returns
    early, or whose checks a change skipped, cannot pass by checking nothing.
    A test without the decorator declares one."""
    def declare(fn):
        fn.min_checks = at_least
        return fn
    return declare


def run_test(e, name, fn, *args):
    """Runs fn(e, *args) on the estate, cleans up, prints the summary line;
    returns the exit code: 1 when a check failed or fewer checks ran than fn
    declares (checks(); at least one)."""
    def on_signal(signum, _):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    summary = None
    try:
        summary = fn(e, *args)
    except Fail as f:
        e.check("harness", False, str(f))
    except KeyboardInterrupt:
        e.check("harness", False, "interrupted")
    finally:
        e.cleanup()
    floor = getattr(fn, "min_checks", 1)
    if e.passed + e.failed < floor:
        e.check("floor", False, f"{e.passed + e.failed} checks ran, fewer than the {floor} "
                f"this test declares: it proved nothing")
    log(f"{name}: {e.passed} passed, {e.failed} failed" + (f" ({summary})" if summary else ""))
    return 0 if e.failed == 0 else 1
