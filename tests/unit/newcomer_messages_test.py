#!/usr/bin/python3
"""The messages a newcomer meets first (issue #14), without root or EAL:

  newcomer_messages_test.py SPILLWAYD SPILLWAYCTL EXAMPLE_TOML

- spillwayd given EAL options without "--" says they go before "--" (and
  lists them in the order given), exit 2;
- --check-config runs the host checks: the example's socket_group when the
  group does not exist is FAILED with the next step (exit 1), an existing
  group is ok, and what cannot be checked says why;
- spillwayctl's help does not promise a version from `status`;
- spillwayctl on a socket nobody listens on names --socket and SPILLWAY_SOCKET.
"""
import os
import re
import subprocess
import sys
import tempfile

failed = 0


def check(name, ok, detail=""):
    global failed
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + ("" if ok else f": {detail}"))
    failed += 0 if ok else 1


def run(args, env=None):
    return subprocess.run(args, capture_output=True, text=True, timeout=30, env=env)


def main():
    spillwayd, ctl, example = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as work:
        r = run([spillwayd, "--no-huge", "-m", "512", "--config", example])
        check("spillwayd: EAL options without '--' are named in order, with the fix",
              r.returncode == 2 and "--no-huge -m 512" in r.stderr and
              'go before "--"' in r.stderr and "-- --config FILE" in r.stderr,
              f"exit {r.returncode}: {r.stderr}")

        text = open(example).read()
        missing = os.path.join(work, "missing-group.toml")
        with open(missing, "w") as f:
            f.write(re.sub(r'(?m)^socket_group = ".*"$',
                           'socket_group = "spillway-no-such-group-4d1"', text))
        r = run([spillwayd, "--check-config", missing])
        check("--check-config: a socket_group that does not exist fails with the next step",
              r.returncode == 1 and "configuration OK" in r.stdout and re.search(
                  r'FAILED\s+\[control\] socket_group "spillway-no-such-group-4d1": no such group'
                  r'\s+next: create it \(groupadd --system spillway-no-such-group-4d1\)',
                  r.stdout) is not None and "start-up would fail" in r.stdout,
              f"exit {r.returncode}: {r.stdout}{r.stderr}")
        check("--check-config: says what it could not check, and why",
              re.search(r"not checked\s+.*\n\s+because: ", r.stdout) is not None, r.stdout)

        existing = os.path.join(work, "root-group.toml")
        with open(existing, "w") as f:
            f.write(re.sub(r'(?m)^socket_group = ".*"$', 'socket_group = "root"', text))
        r = run([spillwayd, "--check-config", existing])
        check("--check-config: an existing socket_group is ok",
              re.search(r'ok\s+\[control\] socket_group "root": the group exists', r.stdout)
              is not None, r.stdout)

        r = run([ctl, "--help"])
        status = [line for line in r.stdout.splitlines() if line.strip().startswith("status")]
        check("spillwayctl --help: status does not promise a version",
              r.returncode == 0 and status and "version" not in status[0], str(status))
        check("spillwayctl --help: lists top", "top" in r.stdout, r.stdout)

        env = dict(os.environ)
        env.pop("SPILLWAY_SOCKET", None)
        r = run([ctl, "--socket", os.path.join(work, "none.sock"), "status"], env=env)
        check("spillwayctl without a daemon: exit 3, names --socket and SPILLWAY_SOCKET",
              r.returncode == 3 and "--socket" in r.stderr and "SPILLWAY_SOCKET" in r.stderr,
              f"exit {r.returncode}: {r.stderr}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
