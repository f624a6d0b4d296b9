#!/usr/bin/python3
"""One golden pcap case through spillwayd over DPDK's net_pcap (meson suite
'golden').

  run_golden.py SPILLWAYD CASE

Builds the case with make_inputs.py and checks that the committed
cases/CASE/config.toml and in.pcap are still what it builds; replays in.pcap
through spillwayd (rx_pcap) in a private directory, with a file prefix of its
own so cases run in parallel; then checks

  1. the transmitted pcap (tx_pcap) against cases/CASE/expected.pcap, packet
     for packet and byte for byte (the first difference is printed decoded by
     scapy, field by field);
  2. spillwayd's final JSON statistics against cases/CASE/expected_stats.json
     (every listed key exactly);
  3. the independent model and scapy checks of golden_check.py on the same
     output (backend of every flow from SipHash-1-3 + Maglev, headers,
     checksums, counters).

With SPILLWAY_REGENERATE_GOLDEN=1 it rewrites config.toml and in.pcap from
make_inputs.py, runs spillwayd, and writes expected.pcap and
expected_stats.json only when the output passes the checks of step 3: a
golden file is never just whatever the code printed.

Exit 0 pass, 1 fail, 77 (meson: skipped) when /usr/bin/python3 has no scapy.
The suite needs no root: --no-huge and net_pcap work as any user.
"""

import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
CASES_DIR = os.path.join(HERE, "cases")
IDLE_MS = 1000          # spillwayd stops this long after the last packet
RUN_LIMIT_MS = 60000    # and in any case after this long

try:
    import logging

    logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    from scapy.utils import RawPcapReader
except ImportError as error:  # pragma: no cover - depends on the host
    print("golden: SKIP: /usr/bin/python3 cannot import scapy (%s); install Debian's "
          "python3-scapy" % error)
    sys.exit(77)

sys.path.insert(0, HERE)
import golden_check  # noqa: E402
import make_inputs  # noqa: E402


def read_pcap(path):
    reader = RawPcapReader(path)
    try:
        return [bytes(data) for data, _ in reader]
    finally:
        reader.close()


def dpdk_runtime_dirs(prefix):
    base = ["/var/run/dpdk"] if os.geteuid() == 0 else [
        os.path.join(os.environ.get("XDG_RUNTIME_DIR", "/tmp"), "dpdk")]
    return [os.path.join(b, prefix) for b in base]


def run_spillwayd(spillwayd, case_dir, work):
    os.symlink(os.path.join(case_dir, "in.pcap"), os.path.join(work, "in.pcap"))
    shutil.copy(os.path.join(case_dir, "config.toml"), os.path.join(work, "config.toml"))
    prefix = "golden-%s-%d" % (os.path.basename(case_dir), os.getpid())
    command = [spillwayd, "--no-huge", "-m", "256", "--file-prefix", prefix, "--",
               "--config", "config.toml", "--exit-after-idle-ms", str(IDLE_MS),
               "--run-for-ms", str(RUN_LIMIT_MS), "--stats-file", "stats.json",
               "--control-socket", os.path.join(work, "spillway.sock"), "--metrics-listen", "",
               "--state-dir", os.path.join(work, "state")]
    print("golden: in %s: %s" % (work, " ".join(command)))
    try:
        proc = subprocess.run(command, cwd=work, capture_output=True, text=True,
                              timeout=RUN_LIMIT_MS / 1000 + 30)
    finally:
        for d in dpdk_runtime_dirs(prefix):
            shutil.rmtree(d, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError("spillwayd exited %d\n--- stderr ---\n%s--- stdout ---\n%s" % (
            proc.returncode, proc.stderr, proc.stdout))
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise RuntimeError("spillwayd printed no JSON statistics\n%s" % proc.stderr)
    stats = json.loads(lines[-1])
    return read_pcap(os.path.join(work, "out.pcap")), stats


def decoded(data):
    """scapy's field-by-field dump; a GUE payload (scapy has no GUE layer) is
    decoded by hand and its inner packet dumped too."""
    pkt = Ether(data)
    lines = pkt.show2(dump=True).splitlines()
    if UDP in pkt and Raw in pkt[UDP]:
        load = bytes(pkt[UDP][Raw].load)
        if len(load) > 4 and load[0] == 0 and load[1] in (4, 41):
            lines.append("###[ GUE (decoded by hand) ]### version 0, proto %d, flags 0x%04x"
                         % (load[1], int.from_bytes(load[2:4], "big")))
            inner = IP(load[4:]) if load[1] == 4 else IPv6(load[4:])
            lines += inner.show2(dump=True).splitlines()
    return lines


def describe_pcap_difference(actual, expected):
    """None when equal; else a readable account of the first difference."""
    if actual == expected:
        return None
    lines = []
    if len(actual) != len(expected):
        lines.append("tx pcap has %d packets, expected.pcap %d" % (len(actual), len(expected)))
    for i, (a, e) in enumerate(zip(actual, expected)):
        if a == e:
            continue
        at = next((j for j in range(min(len(a), len(e))) if a[j] != e[j]), min(len(a), len(e)))
        lines.append("packet %d differs: %d bytes vs %d expected, first difference at byte %d"
                     % (i, len(a), len(e), at))
        lines.append("  expected: %s" % e[max(0, at - 8):at + 8].hex())
        lines.append("  actual:   %s" % a[max(0, at - 8):at + 8].hex())
        lines.append("scapy decode, expected (-) vs actual (+):")
        lines += ["  " + l for l in difflib.unified_diff(decoded(e), decoded(a), "expected",
                                                         "actual", lineterm="", n=2)]
        break
    else:
        extra = actual[len(expected):] or expected[len(actual):]
        which = "unexpected" if len(actual) > len(expected) else "missing"
        lines.append("first %s packet (#%d):" % (which, min(len(actual), len(expected))))
        lines += ["  " + l for l in decoded(extra[0])]
    return "\n".join(lines)


def inputs_match(case, case_dir):
    """Problems when the committed inputs are not what make_inputs.py builds."""
    problems = []
    try:
        with open(os.path.join(case_dir, "config.toml")) as f:
            if f.read() != case.config:
                problems.append("config.toml differs from make_inputs.py's")
        if read_pcap(os.path.join(case_dir, "in.pcap")) != [d for d, _, _ in case.frames]:
            problems.append("in.pcap differs from make_inputs.py's")
    except OSError as e:
        problems.append(str(e))
    return problems


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: run_golden.py SPILLWAYD CASE (cases: %s)" % ", ".join(make_inputs.CASES))
    spillwayd, name = os.path.abspath(sys.argv[1]), sys.argv[2]
    if name not in make_inputs.CASES:
        sys.exit("golden: unknown case %r" % name)
    regenerate = os.environ.get("SPILLWAY_REGENERATE_GOLDEN") == "1"
    case = make_inputs.build(name)
    case_dir = os.path.join(CASES_DIR, name)
    print("golden-%s: %s (%d input frames)" % (name, case.doc, len(case.frames)))

    if regenerate:
        case.write(CASES_DIR)
    else:
        stale = inputs_match(case, case_dir)
        if stale:
            print("golden-%s: FAIL: committed inputs are stale: %s\n  regenerate: "
                  "SPILLWAY_REGENERATE_GOLDEN=1 meson test --suite golden (see README.md)"
                  % (name, "; ".join(stale)))
            return 1

    work = tempfile.mkdtemp(prefix="spillway-golden-%s-" % name)
    try:
        outputs, stats = run_spillwayd(spillwayd, case_dir, work)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print("golden-%s: FAIL: %s\n  (work directory kept: %s)" % (name, e, work))
        return 1

    problems = []
    if stats["rx_packets"] != len(case.frames):
        problems.append("spillwayd received %d of the %d input frames" % (
            stats["rx_packets"], len(case.frames)))
    problems += golden_check.validate(os.path.join(case_dir, "config.toml"), case.frames,
                                      outputs, stats, case.cover, case.spread)
    if regenerate:
        if problems:
            print("golden-%s: FAIL: spillwayd's output does not pass the independent checks; "
                  "expected files NOT written:" % name)
            for p in problems:
                print("  " + p)
            print("  (work directory kept: %s)" % work)
            return 1
        make_inputs.write_pcap(os.path.join(case_dir, "expected.pcap"), outputs)
        with open(os.path.join(case_dir, "expected_stats.json"), "w") as f:
            json.dump(golden_check.stats_view(stats), f, indent=2, sort_keys=True)
            f.write("\n")
        print("golden-%s: regenerated: %d packets out, stats %s" % (
            name, len(outputs), json.dumps({k: stats[k] for k in (
                "forwarded", "replies", "to_kernel", "dropped")})))
        shutil.rmtree(work, ignore_errors=True)
        return 0

    try:
        expected = read_pcap(os.path.join(case_dir, "expected.pcap"))
        with open(os.path.join(case_dir, "expected_stats.json")) as f:
            expected_stats = json.load(f)
    except OSError as e:
        print("golden-%s: FAIL: %s (regenerate: see README.md)" % (name, e))
        return 1
    difference = describe_pcap_difference(outputs, expected)
    if difference:
        problems.insert(0, "tx pcap != expected.pcap\n" + difference)
    problems += golden_check.compare_stats(golden_check.stats_view(stats), expected_stats,
                                           "expected_stats.json has")
    if problems:
        print("golden-%s: FAIL" % name)
        for p in problems:
            print("  " + p.replace("\n", "\n  "))
        print("  (work directory kept: %s)" % work)
        return 1
    print("golden-%s: PASS: %d packets transmitted as expected; stats match; independent "
          "checks pass" % (name, len(outputs)))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
