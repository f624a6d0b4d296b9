"""The drill's estate: a scripts/topology estate with the cloud behind the WAN
delay line, spillwayd on the gateway, and every backend's servers.

Each backend runs:
  * spillway-flowcheck serve on the data port (9000) and the health port
    (8000): the flow checker's flows and spillwayd's TCP health checks;
  * grpc_stream.py serve on 50051 (the bidirectional gRPC streams);
  * one `iperf3 -s` per elephant, on the port traffic.Elephants planned;
  * fake_exporter.py on 9400 (DCGM GPU utilisation and vLLM's queue gauge)
    for pools with load feedback, driven through a control file.

Everything runs under `ip netns exec`, so a process's pid is the command's
own, and everything is torn down by cleanup(), also after a signal.
"""
import json
import os
import shutil
import subprocess
import tempfile
import time

# The shared estate harness (scripts/estate_harness): log, polling against a
# deadline, and its failure type, which here means "the drill could not run"
# (not an invariant verdict).
from estate_harness import estate as harness
from estate_harness.ctl import CliSocket
from estate_harness.estate import Fail as DrillError, log, wait_until  # noqa: F401
from estate_harness.estate_toml import write_estate_toml

import discovery

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PY = "/usr/bin/python3"
TOPOLOGY = os.path.join(ROOT, "scripts", "topology")
GRPC_STREAM = os.path.join(ROOT, "tests", "tools", "grpc_stream.py")
FAKE_EXPORTER = os.path.join(ROOT, "tests", "tools", "fake_exporter.py")

VIP_FLOWS = "192.0.2.10"   # VIP "nccl": every TCP port (flow checker, iperf3)
VIP_GRPC = "192.0.2.11"    # VIP "grpc": port 50051
CLIENT = "10.99.0.100"
BULK = "10.99.0.101"
LB_ADDR = "10.99.0.2"
DATA_PORT = 9000
HEALTH_PORT = 8000
GRPC_PORT = 50051
EXPORTER_PORT = 9400
# spillway-decap's connection agent on backends whose pool has `connections`
# (the backend's own count of its connections per VIP, for drains).
AGENT_PORT = 9411
IPERF_BASE_PORT = 5201  # elephants' server ports are chosen from here up
# The bulk client's one source port for iperf3's control connections (its
# namespace's ip_local_port_range), so the drill can place each elephant's
# control and data connections on one backend (see traffic.Elephants).
IPERF_CONTROL_PORT = 42000
SEED = "0x0d7111d7111d7111"
# A tier estate: the router and the instances lb1..lbN (scripts/topology --tier).
ROUTER_ADDR = "10.99.0.1"
TIER_PORT = 7900
# Actions that stop a tier instance (the primary is one they spare).
# Drills run spillwayd as production does: started as root, then the user
# scripts/bootstrap creates (README "Privileges"). SPILLWAY_DRILL_USER=""
# keeps it root.
RUN_AS_USER = os.environ.get("SPILLWAY_DRILL_USER", "spillway")
INSTANCE_STOPS = ("kill-instance", "stop-instance", "lb-drain", "freeze-instance")


def tier_address(i):
    """lb<i>'s fabric address: 10.99.0.2, .3, ..."""
    return f"10.99.0.{1 + i}"

class Tools:
    """The built binaries the drill runs. What must be built is the build's
    own list, the alias target drill-tools (tests/drill/meson.build, the list
    the drill suite depends on and scripts/demo builds): every file it names
    must be there."""

    TARGET = "drill-tools"

    def __init__(self, build):
        self.spillwayd = os.path.join(build, "src", "spillwayd", "spillwayd")
        self.decap = os.path.join(build, "src", "dataplane", "xdp", "spillway-decap")
        self.spillwayctl = os.path.join(build, "src", "spillwayctl", "spillwayctl")
        self.delayline = os.path.join(build, "tests", "tools", "spillway-delayline")
        self.flowcheck = os.path.join(build, "tests", "tools", "spillway-flowcheck")
        self.synflood = os.path.join(build, "tests", "tools", "spillway-synflood")
        needed = self.needed(build)
        used = {self.spillwayd, self.decap, self.spillwayctl, self.delayline, self.flowcheck,
                self.synflood}
        unlisted = sorted(used - set(needed))
        if unlisted:
            raise DrillError(f"{self.TARGET} does not list {', '.join(unlisted)} "
                             "(tests/drill/meson.build: drill_deps)")
        missing = [p for p in needed if not os.path.exists(p)]
        if missing:
            raise DrillError(f"not built: {', '.join(missing)} "
                             f"(build them with: ninja -C {build} {self.TARGET})")

    @classmethod
    def needed(cls, build):
        """The files the alias target names, from the build's ninja file."""
        if not os.path.exists(os.path.join(build, "build.ninja")):
            raise DrillError(f"no meson build in {build} (meson setup {build}, then "
                             f"ninja -C {build} {cls.TARGET})")
        r = subprocess.run(["ninja", "-C", build, "-t", "query", cls.TARGET],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise DrillError(f"ninja -t query {cls.TARGET}: {r.stdout.strip()} "
                             f"{r.stderr.strip()}")
        return query_inputs(build, r.stdout)


def query_inputs(build, text):
    """The input paths of `ninja -t query TARGET`'s output, followed through
    phony edges (meson's alias_target names an internal phony target)."""
    inputs, section = [], None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("input:"):
            section = "in"
        elif stripped.startswith("outputs:"):
            section = "out"
        elif section == "in" and stripped and line.startswith("    "):
            inputs.append(stripped.removeprefix("| ").removeprefix("|| "))
    files = []
    for path in inputs:
        full = os.path.join(build, path)
        if os.path.exists(full) or "/" in path:
            files.append(full)
            continue
        r = subprocess.run(["ninja", "-C", build, "-t", "query", path], capture_output=True,
                           text=True)
        if r.returncode == 0 and "input: phony" in r.stdout:
            files += query_inputs(build, r.stdout)
        else:
            files.append(full)
    return files


class Instance:
    """One spillwayd of the estate: the single gateway "lb", or in a tier
    estate ([estate] instances = N) one of lb1..lbN behind the router. Each
    has its own namespace, address, configuration file, control socket, state
    directory, DPDK file prefix, and log/stats files numbered by start."""

    def __init__(self, estate, name, address, tag=""):
        self.name, self.address = name, address
        work = estate.work
        self.ns = estate.ns(name)
        self.file_prefix = estate.prefix + tag
        self.sock = os.path.join(work, f"spillway{tag and '-' + name}.sock")
        self.ctl = CliSocket(self.sock)
        self.config = os.path.join(work, f"spillway{tag and '-' + name}.toml")
        # What spillwayd writes while running (its statistics and its state
        # directory) lives in a folder of the user it runs as.
        self.run_dir = os.path.join(work, f"run{tag and '-' + name}")
        self.state = os.path.join(self.run_dir, "state")
        self.files = f"{tag and name + '-'}"  # prefix of its numbered log/stats files
        self.proc = None
        self.starts = 0
        self.stats = None
        self.started_at = None  # time.time() of the last start

    def log_path(self, work):
        return os.path.join(work, f"spillwayd-{self.files}{self.starts}.log")


class Estate:
    def __init__(self, tools, scenario, work):
        self.tools = tools
        self.sc = scenario
        self.work = work
        self.prefix = f"swd{os.getpid() % 100000}"
        self.run_as = None  # (uid, gid) of RUN_AS_USER
        if RUN_AS_USER and os.geteuid() == 0:
            import pwd
            try:
                pw = pwd.getpwnam(RUN_AS_USER)
            except KeyError:
                raise DrillError(f"no user {RUN_AS_USER!r} for spillwayd to run as: run "
                                 "scripts/bootstrap (or SPILLWAY_DRILL_USER=\"\" to keep root)")
            self.run_as = (pw.pw_uid, pw.pw_gid)
        self.procs = []
        self.up = False
        self.backends = {}  # name -> {"ns", "address", "pool", "servers": [Popen]}
        # The gateways: "lb" alone, or lb1..lbN of a tier (instance_names()).
        self.tier = scenario["estate"].get("instances", 0)
        self.instances = {}
        if self.tier:
            for i in range(1, self.tier + 1):
                name = f"lb{i}"
                self.instances[name] = Instance(self, name, tier_address(i), str(i))
        else:
            self.instances["lb"] = Instance(self, "lb", LB_ADDR)
        # The instance the monitor and single-gateway actions talk to: in a
        # tier, the first one no action of the scenario stops.
        stopped = {a.get("target") for a in scenario.get("action", [])
                   if a["do"] in INSTANCE_STOPS}
        self.primary = next((n for n in self.instances if n not in stopped),
                            next(iter(self.instances)))
        self.tier_file = os.path.join(work, "tier.conf")
        self.tier_key = os.path.join(work, "tier.key")
        # Backends whose servers this run started already: logs are appended
        # and exporter settings kept only across restarts within one run,
        # never taken over from an earlier run in the same --out folder.
        self.servers_started = set()
        self.delayline = None
        self.wan_sock = os.path.join(work, "wan.sock")
        self.lines = {}  # delay lines of their own (regions, backends): name -> control socket
        self.iperf_ports = []  # the elephants' server ports (traffic.Elephants plans them)

    # The primary instance's, for the single-gateway code paths.
    @property
    def lb(self):
        return self.instances[self.primary].proc

    @property
    def sock(self):
        return self.instances[self.primary].sock

    @property
    def ctl(self):
        return self.instances[self.primary].ctl

    @property
    def config(self):
        return self.instances[self.primary].config

    @property
    def lb_stats(self):
        return self.instances[self.primary].stats

    def running(self):
        """The instances whose spillwayd runs now (a frozen one does not:
        freeze-instance)."""
        return [i for i in self.instances.values() if i.proc is not None and
                i.proc.poll() is None and not getattr(i, "frozen", False)]

    # -- processes -------------------------------------------------------------
    def ns(self, host):
        return f"{self.prefix}-{host}"

    # Commands in a namespace (DrillError on failure) and SIGTERM-then-kill
    # stops: the e2e tests' own, which keep self.procs the same way.
    run = harness.Estate.run
    stop = harness.Estate.stop
    stop_all = harness.Estate.stop_all

    def spawn(self, args, ns=None, log_name=None, stdin=None, stdout=None, append=False):
        if ns is not None:
            args = ["ip", "netns", "exec", ns] + args
        err = (open(os.path.join(self.work, log_name), "a" if append else "w") if log_name
               else subprocess.DEVNULL)
        out = open(stdout, "w") if stdout else err
        p = subprocess.Popen(args, stdout=out, stderr=err,
                             stdin=stdin if stdin is not None else subprocess.DEVNULL,
                             text=stdin is not None)
        self.procs.append(p)
        return p

    def cleanup(self):
        self.stop_all(reversed(list(self.procs)))
        for inst in self.instances.values():
            shutil.rmtree(f"/var/run/dpdk/{inst.file_prefix}", ignore_errors=True)

    def mac(self, host):
        """eth0's MAC address in a host's namespace."""
        info = json.loads(self.run(["ip", "-j", "link", "show", "eth0"], ns=self.ns(host)).stdout)
        return info[0]["address"]

    # -- topology ----------------------------------------------------------------
    def topology_up(self):
        est = self.sc["estate"]
        opts = ["--prefix", self.prefix, "--onprem", str(est["onprem"]), "--cloud",
                str(est["cloud"]), "--bulk-client"]
        if est.get("wan"):
            opts.append("--wan")
        if est.get("regions"):
            opts += ["--regions", ",".join(str(r["cloud"]) for r in est["regions"])]
        for name in est.get("delay_lines", {}):
            opts += ["--delay-host", name]
        if self.tier:
            opts += ["--tier", str(self.tier)]
        if self.second_chance():
            opts.append("--second-chance")
        self.up = True
        self.run([TOPOLOGY, "up"] + opts, env=dict(os.environ, SW_DECAP=self.tools.decap))
        text = self.run([TOPOLOGY, "env"] + opts).stdout
        region_of = region_pools(est)
        line_ends = {}
        for line in text.splitlines():
            if line.startswith("backend "):
                _, name, ns, addr = line.split()
                self.backends[name] = {"ns": ns, "address": addr,
                                       "pool": region_of.get(name, name.rstrip("0123456789")),
                                       "servers": []}
            elif line.startswith("line "):
                _, label, _, end_a, end_b = line.split()
                line_ends[label] = (end_a, end_b)
        self.run(["sysctl", "-qw", "net.ipv4.ip_local_port_range="
                  f"{IPERF_CONTROL_PORT} {IPERF_CONTROL_PORT}"], ns=self.ns("bulk"))
        if est.get("wan"):
            wan = est["wan"]
            ready = os.path.join(self.work, "wan.ready")
            self.delayline = self.spawn(
                [self.tools.delayline, "run", "--a", "wan0b", "--b", "wan1b",
                 "--delay-ms", str(wan.get("delay_ms", 0)), "--jitter-ms",
                 str(wan.get("jitter_ms", 0)), "--loss", str(wan.get("loss", 0)),
                 "--control", self.wan_sock, "--ready", ready],
                ns=self.ns("fabric"), log_name="delayline.log",
                stdout=os.path.join(self.work, "delayline.json"))
            wait_until("the WAN delay line", lambda: os.path.exists(ready) or
                       self.delayline.poll() is not None, 10)
            if self.delayline.poll() is not None:
                raise DrillError(f"spillway-delayline exited {self.delayline.returncode}")
        # Delay lines of their own: one per region, one per backend named in
        # delay_lines (scripts/topology --regions, --delay-host).
        lines = {r["name"]: (f"region{k}", r.get("wan", {}))
                 for k, r in enumerate(est.get("regions", []), 1)}
        lines.update({n: (n, wan) for n, wan in est.get("delay_lines", {}).items()})
        for name, (label, wan) in lines.items():
            end_a, end_b = line_ends[label]
            sock = os.path.join(self.work, f"wan-{name}.sock")
            ready = os.path.join(self.work, f"wan-{name}.ready")
            proc = self.spawn(
                [self.tools.delayline, "run", "--a", end_a, "--b", end_b,
                 "--delay-ms", str(wan.get("delay_ms", 0)), "--jitter-ms",
                 str(wan.get("jitter_ms", 0)), "--loss", str(wan.get("loss", 0)),
                 "--control", sock, "--ready", ready],
                ns=self.ns("fabric"), log_name=f"delayline-{name}.log",
                stdout=os.path.join(self.work, f"delayline-{name}.json"))
            wait_until(f"the delay line of {name}", lambda: os.path.exists(ready) or
                       proc.poll() is not None, 10)
            if proc.poll() is not None:
                raise DrillError(f"spillway-delayline of {name} exited {proc.returncode}")
            self.lines[name] = sock

    def second_chance(self):
        """The scenario sets [dataplane] second_chance_hold_ms (0 too: an
        "off" run on the same estate): the backends' spillway-decap know the
        load balancers (--lb) and the LB hosts forward the packets they send
        on (scripts/topology --second-chance)."""
        return "second_chance_hold_ms" in self.sc.get("dataplane", {})

    def decap_stats(self):
        """Every backend's spillway-decap counters (`stats --json`), by
        backend; a backend whose counters cannot be read is left out."""
        out = {}
        for name, b in self.backends.items():
            r = self.run([self.tools.decap, "stats", "--dev", "eth0", "--json", "--pin-root",
                          f"/sys/fs/bpf/{b['ns']}"], ns=b["ns"], check=False)
            try:
                out[name] = json.loads(r.stdout)
            except ValueError:
                pass
        return out

    def wan_set(self, line=None, **settings):
        """Changes a delay line: the cloud WAN (line None), a region's or a
        backend's own."""
        sock = self.wan_sock if line is None else self.lines[line]
        args = [self.tools.delayline, "set", "--control", sock]
        for key, value in settings.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        return self.run(args, ns=self.ns("fabric"))

    def wan_show(self):
        return json.loads(self.run([self.tools.delayline, "show", "--control", self.wan_sock],
                                   ns=self.ns("fabric")).stdout)

    # -- backends' servers ------------------------------------------------------------
    def loaded_pools(self):
        return [p for p, conf in self.sc["pools"].items() if conf.get("load")]

    def exporter_file(self, name):
        return os.path.join(self.work, f"exporter-{name}.ctl")

    def start_servers(self, name):
        b = self.backends[name]
        ns = b["ns"]
        servers = [
            self.spawn([self.tools.flowcheck, "serve", "--name", name, "--port", str(DATA_PORT),
                        "--port", str(HEALTH_PORT)], ns=ns, log_name=f"flowcheck-{name}.log"),
            self.spawn([PY, GRPC_STREAM, "serve", "--name", name, "--port", str(GRPC_PORT)],
                       ns=ns, log_name=f"grpc-{name}.log"),
        ]
        again = name in self.servers_started
        self.servers_started.add(name)
        for port in self.iperf_ports:
            # Appended across restarts of the servers: the judge reads which
            # backend served each elephant from these logs.
            servers.append(self.spawn(["iperf3", "-s", "-p", str(port), "--forceflush"], ns=ns,
                                      log_name=f"iperf3-{name}-{port}.log", append=again))
        if b["pool"] in self.loaded_pools():
            ctl = self.exporter_file(name)
            if not again or not os.path.exists(ctl):
                load = self.sc["pools"][b["pool"]]["load"]
                self.write_exporter(name, load.get("gpu", 10), load.get("queue", 0))
            servers.append(self.spawn(
                [PY, FAKE_EXPORTER, "--listen", "0.0.0.0", "--port", str(EXPORTER_PORT),
                 "--gpus", "4", "--control-file", ctl], ns=ns, log_name=f"exporter-{name}.log"))
        agent = self.sc["pools"][b["pool"]].get("connections") is not None
        if agent:
            # `list = true`: the agent lists its connections to the pool's
            # token (the instances rebuild their exceptions from it at start).
            token = (["--token-file", self.agent_token()]
                     if self.sc["pools"][b["pool"]]["connections"].get("list") else [])
            servers.append(self.spawn(
                [self.tools.decap, "agent", "--listen", f"0.0.0.0:{AGENT_PORT}",
                 "--vip", VIP_FLOWS, "--vip", VIP_GRPC] + token, ns=ns,
                log_name=f"agent-{name}.log"))
        b["servers"] = servers
        ports = [DATA_PORT, HEALTH_PORT, GRPC_PORT] + list(self.iperf_ports) + \
            ([AGENT_PORT] if agent else [])
        for port in ports:
            wait_until(f"{name} listening on :{port}", lambda port=port: self.run(
                ["ss", "-Hltn", f"sport = :{port}"], ns=ns).stdout.strip() or any(
                    p.poll() is not None for p in servers), 20)
        dead = [p.args for p in servers if p.poll() is not None]
        if dead:
            raise DrillError(f"{name}: a server exited at start: {dead}")

    def kill_servers(self, name):
        """Every server process of the backend dies (SIGKILL): the kernel
        resets the connections they held, as when a host's workload dies."""
        for p in self.backends[name]["servers"]:
            p.kill()
            self.stop(p, timeout=2)
        self.backends[name]["servers"] = []

    def write_exporter(self, name, gpu, queue):
        tmp = self.exporter_file(name) + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"gpu={gpu}\nqueue={queue}\n")
        os.replace(tmp, self.exporter_file(name))

    # -- the gateway -----------------------------------------------------------------
    def write_config(self, only=None, weights=None):
        """spillwayd's configuration, one file per instance: the scenario's
        pools, both VIPs, the backends named in `only` (default all) with
        `weights` (default the scenario's). A reload rewrites it with the
        edited members/weights. A tier's instances differ only in their own
        address, [announce] and [tier]."""
        for inst in self.instances.values():
            self._write_config(inst, only, weights)

    def _write_config(self, inst, only, weights):
        sc = self.sc
        weights = dict(sc["weights"], **(weights or {}))
        dataplane = {"lcores": [1], "hash_seed": SEED, "flow_capacity": 65536}
        if self.tier:
            dataplane["idle_sleep_us"] = 100  # several instances share the 2 cores
        # Closed flows leave the tables 2 s after their FIN (default 10), so a
        # drain completes soon after its last flow ends.
        dataplane["timeouts"] = {"closing": 2}
        dataplane.update(sc.get("dataplane", {}))
        pools = []
        for pool, conf in sc["pools"].items():
            site = pool_site(pool)
            keys = {"name": pool, "site": site, "priority": conf.get("priority", 0),
                    "encap": conf.get("encap", "ipip" if site == "onprem" else "gue")}
            if conf.get("health"):
                keys["health"] = dict(conf["health"])
            if conf.get("load"):
                keys["load"] = dict({"enabled": True, "port": EXPORTER_PORT,
                                     "queue_metric": "vllm:num_requests_waiting"},
                                    **{k: v for k, v in conf["load"].items()
                                       if k not in ("gpu", "queue")})
            if conf.get("connections") is not None:
                keys["connections"] = dict({"enabled": True, "port": AGENT_PORT},
                                           **{k: v for k, v in conf["connections"].items()
                                              if k != "list"})
                if conf["connections"].get("list"):
                    keys["connections"]["token_file"] = self.agent_token()
            if conf.get("discovery") is not None:
                # Its backends come from the watched file the drill writes,
                # or from the DNS server it runs (discovery.py), not from
                # [[backend]].
                keys["discovery"] = discovery.spillwayd_keys(self.work, pool, conf["discovery"])
            pools.append(keys)
        # [estate] nccl_placement = "bytes": the flows' VIP places new
        # connections by bytes (spillway/placement.hpp); [placement] tunes it.
        placing = sc["estate"].get("nccl_placement")
        nccl = {"name": "nccl", "address": VIP_FLOWS, "protocol": "tcp", "port": 0,
                "pools": list(sc["pools"])}
        if placing:
            nccl["placement"] = placing
        vips = [nccl, {"name": "grpc", "address": VIP_GRPC, "protocol": "tcp",
                       "port": GRPC_PORT, "table_size": 4099, "pools": list(sc["pools"])}]
        sections = {name: sc[name] for name in ("placement", "policy") if sc.get(name)}
        if self.tier:
            sections.update(self.tier_sections(inst))
        backends = [{"name": name, "address": b["address"], "pool": b["pool"],
                     "weight": weights.get(name, 100)}
                    for name, b in self.backends.items() if (only is None or name in only)
                    and sc["pools"].get(b["pool"], {}).get("discovery") is None]
        write_estate_toml(inst.config,
                          comment="Generated by scripts/drill for scenario " + sc["name"] + ".",
                          dataplane=dataplane,
                          ports=[{"name": "fabric", "devargs": "net_af_packet0,iface=eth0",
                                  "address": inst.address, "mtu": 1600,
                                  "kernel_interface": "eth0"}],
                          pools=pools, vips=vips, sections=sections, backends=backends)
        # In the instance's namespace: the host checks look for its interfaces.
        self.run([self.tools.spillwayd, "--check-config", inst.config], ns=inst.ns)

    def tier_sections(self, inst):
        """A tier instance's own sections: it announces its VIPs to the
        router (FRR in its namespace redistributes the routes spillwayd owns)
        and shares its flow exceptions with every other instance."""
        if not os.path.exists(self.tier_key):
            fd = os.open(self.tier_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(os.urandom(32).hex() + "\n")
        if self.run_as:
            # The user spillwayd runs as owns it (0600): a reload reads it.
            os.chown(self.tier_key, self.run_as[0], self.run_as[1])
            with open(self.tier_file, "w") as f:
                f.write("# The drill's tier: NAME SOCKET\n")
                for i in self.instances.values():
                    f.write(f"{i.name} {i.sock}\n")
        peers = [{"name": i.name, "address": f"{i.address}:{TIER_PORT}"}
                 for i in self.instances.values() if i is not inst]
        return {"announce": {"enabled": True},
                "tier": {"node": inst.name, "listen": f"{inst.address}:{TIER_PORT}",
                         "peers": peers, "secret_file": self.tier_key}}

    @property
    def lb_starts(self):
        return self.instances[self.primary].starts

    def agent_token(self):
        """The connection agents' bearer token (one per estate), in a file
        only its owner reads (spillwayd and the agent both require that)."""
        path = os.path.join(self.work, "agent.token")
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(os.urandom(24).hex() + "\n")
            if self.run_as:
                os.chown(path, self.run_as[0], self.run_as[1])
        return path

    def start_lb(self, name=None):
        inst = self.instances[name or self.primary]
        inst.starts += 1
        tag = inst.starts
        if tag == 1:
            # A drill's first daemon starts fresh: the journal and checkpoint
            # of an earlier run in the same --out folder are not this estate's.
            shutil.rmtree(inst.state, ignore_errors=True)
        os.makedirs(inst.run_dir, exist_ok=True)
        if self.run_as:
            os.chown(inst.run_dir, self.run_as[0], self.run_as[1])
            # The user reaches its folder and reads the configuration.
            os.chmod(self.work, os.stat(self.work).st_mode | 0o005)
        inst.stats = os.path.join(inst.run_dir, f"stats-{inst.files}{tag}.json")
        inst.started_at = time.time()
        user = ["--user", RUN_AS_USER] if self.run_as else []
        inst.proc = self.spawn(
            [self.tools.spillwayd, "--no-huge", "-m", "512", "--file-prefix", inst.file_prefix,
             "--", "--config", inst.config, "--stats-file", inst.stats] + user + [
             "--stats-interval-ms", "100", "--control-socket", inst.sock,
             "--metrics-listen", "", "--quiet", "--state-dir", inst.state],
            ns=inst.ns, log_name=f"spillwayd-{inst.files}{tag}.log",
            stdout=os.path.join(self.work, f"spillwayd-{inst.files}{tag}.json"))

    def wait_ready(self, timeout=30, settle_s=0.0, name=None):
        inst = self.instances[name or self.primary]

        def ready():
            if inst.proc.poll() is not None:
                raise DrillError(f"spillwayd {inst.name} exited {inst.proc.returncode}: " +
                                 tail(inst.log_path(self.work)))
            try:
                with open(inst.stats) as f:
                    s = json.load(f)
            except (OSError, ValueError):
                return None
            return all(b["next_hop_resolved"] for b in s["backends"]) and all(
                w["snapshot_generation"] == s["generation"] for w in s["workers"])
        wait_until(f"spillwayd {inst.name} ready (next hops resolved)", ready, timeout)
        wait_until("the control socket", lambda: self._ctl_ok(inst), 10)
        if settle_s:
            # "Resolved" is the control plane's view; the snapshot that carries
            # the MACs may be published a tick later. Before the first traffic,
            # wait until the generation has held still for settle_s with every
            # worker on it.
            seen = {"gen": None, "since": 0.0}

            def settled():
                try:
                    with open(inst.stats) as f:
                        st = json.load(f)
                except (OSError, ValueError):
                    return False
                now = time.monotonic()
                if st["generation"] != seen["gen"]:
                    seen.update(gen=st["generation"], since=now)
                    return False
                return now - seen["since"] >= settle_s and all(
                    w["snapshot_generation"] == st["generation"] for w in st["workers"])
            wait_until("spillwayd's snapshot generation settled", settled, timeout)

    def _ctl_ok(self, inst):
        try:
            inst.ctl.call("status")
            return True
        except (OSError, DrillError, ValueError):
            return False

    def stop_lb(self, signal_name="TERM", name=None):
        """TERM: spillwayd's orderly stop (up to 10 s, then SIGKILL). KILL: a
        crash, nothing flushed."""
        proc = self.instances[name or self.primary].proc
        if signal_name == "KILL":
            proc.kill()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            if proc in self.procs:
                self.procs.remove(proc)
            return proc.returncode
        return self.stop(proc, timeout=12)

    def spillwayctl(self, *args, name=None):
        """An operator command: to the named instance, to the single gateway,
        or in a tier to every running instance (spillwayctl --tier, which
        reports per instance and fails if any instance failed)."""
        args = [str(a) for a in args]
        if self.tier and name is None:
            running = [i.name for i in self.running()]
            with open(self.tier_file + ".running", "w") as f:
                for i in self.running():
                    f.write(f"{i.name} {i.sock}\n")
            r = self.run([self.tools.spillwayctl, "--tier", self.tier_file + ".running"] + args,
                         check=False)
            r.instances = running
            return r
        sock = self.instances[name].sock if name else self.sock
        return self.run([self.tools.spillwayctl, "--socket", sock] + args, check=False)


def region_pools(estate):
    """cloud<i> -> its region's pool name under [estate] regions (the cloud
    backends split in order); empty without regions."""
    out, i = {}, 0
    for r in estate.get("regions", []):
        for _ in range(r["cloud"]):
            i += 1
            out[f"cloud{i}"] = r["name"]
    return out


def pool_site(pool):
    """A drill pool's site: "onprem" is on premises; "cloud" and every
    region are in the cloud."""
    return "onprem" if pool == "onprem" else "cloud"


def tail(path, lines=15):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def make_work(keep_dir=None):
    if keep_dir:
        os.makedirs(keep_dir, exist_ok=True)
        return keep_dir
    return tempfile.mkdtemp(prefix="spillway-drill-")
