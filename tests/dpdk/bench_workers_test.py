#!/usr/bin/python3
"""Suite dpdk: scripts/bench --workers 1,2 runs end to end (behaviour only).

One quick round of case est-1k with one and with two workers: testpmd and
spillwayd each get as many memif queue pairs as workers, the generator
spreads flows over them by a 5-tuple hash. Asserts, never a rate beyond
"frames came back":
  - the bench exits 0 and reports a row per worker count, with the lcores
    it gave each process;
  - neither spillwayd nor testpmd failed a run (a rate of -1), and frames
    came back from spillwayd (sampled ones);
  - every sampled frame went to the backend Maglev predicts (0 wrong);
  - with two workers, both of spillwayd's workers received frames;
  - a scaling figure is computed against the one-worker row.
On the two CPUs of the development machine the two-worker row is
oversubscribed (the report says "shared": four pinned busy loops on two
CPUs), so its throughput window can even come out at 0 Mpps; its rate is not
the point, and no rate is asserted.

  bench_workers_test.py REPO_ROOT BUILD_DIR
"""
import json
import os
import subprocess
import sys

SKIP = 77


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    root, build = sys.argv[1], sys.argv[2]
    if os.geteuid() != 0:
        print("SKIP: needs root (DPDK EAL and memif sockets)")
        return SKIP
    cmd = [os.path.join(root, "scripts/bench"), "--quick", "--no-build",
           "--build-dir", build, "--workers", "1,2", "--gen-lcores", "1", "--cases", "est-1k",
           "--rounds", "1", "--json"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=280)
    print(p.stderr[-3000:])
    if p.returncode != 0:
        print("FAIL: scripts/bench exited %d\n%s" % (p.returncode, p.stdout[-3000:]))
        return 1
    doc = json.loads(p.stdout)
    rows = {r["workers"]: r for r in doc["cases"]}
    problems = []
    if sorted(rows) != [1, 2]:
        problems.append("rows for worker counts %s, want [1, 2]" % sorted(rows))
    for w, r in sorted(rows.items()):
        print("workers %d: %s" % (w, json.dumps({k: r[k] for k in (
            "spillway_mpps", "reference_mpps", "ratio", "sampled", "mismatched", "cpus",
            "shared", "spillway_worker_rx", "scaling")})))
        if r["spillway_mpps"] < 0 or r["reference_mpps"] < 0:
            problems.append("%d worker(s): a run failed: spillwayd %s Mpps, testpmd %s Mpps" % (
                w, r["spillway_mpps"], r["reference_mpps"]))
        if r["sampled"] == 0 or r["mismatched"] != 0:
            problems.append("%d worker(s): %d sampled, %d wrong" % (w, r["sampled"],
                                                                     r["mismatched"]))
        if len(r["cpus"]["dut"]) != w or len(r["spillway_worker_rx"]) != w:
            problems.append("%d worker(s): lcores %s, worker rx %s" % (
                w, r["cpus"], r["spillway_worker_rx"]))
        if min(r["spillway_worker_rx"] or [0]) == 0:
            problems.append("%d worker(s): a worker received nothing: %s" % (
                w, r["spillway_worker_rx"]))
        if "scaling" not in r:
            problems.append("%d worker(s): no scaling figure" % w)
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
