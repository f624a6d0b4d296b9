#!/bin/sh
# spillway-decap's cost per frame, second chance included: the XDP program
# run once per sample under BPF_PROG_TEST_RUN on frames from the LB's own
# encap writer (no hop; a hop from an unknown LB; a hop with a local socket;
# a hop redirected), median of 20,001 samples each. Root (a private network
# namespace, BPF). The kernel's timer is in every row alike: compare rows.
#   tests/bench/decap_xdp_bench.sh [BUILD_DIR]     (default: build)
build=${1:-build}
exec "$build/tests/e2e/decap_bpf_test" --bench
