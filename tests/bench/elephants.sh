#!/bin/bash
# Elephant balance, placement by load against the Maglev table alone:
# ROUNDS rounds, each the reference (tests/bench/nccl-elephants-table.toml:
# placement = "table") then conf/drills/nccl-elephants.toml --short
# (placement = "bytes"), 16 bulk flows over 8 backends in the drill estate.
# Prints per round max/mean bytes per backend (the flow checker's own byte
# counts by the backend each flow's hello named) and the medians.
#   tests/bench/elephants.sh [ROUNDS] [BUILD_DIR]      (root; default 5, build)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
build=${2:-build}
out=$(mktemp -d /tmp/spillway-elephants.XXXXXX)
table=()
bytes=()
balance() {  # report.json -> max/mean bytes per backend as placed
  /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["byte_balance"]["placed"])' "$1"
}
for ((r = 1; r <= rounds; r++)); do
  scripts/drill tests/bench/nccl-elephants-table.toml --build "$build" --out "$out/table-$r" >/dev/null
  scripts/drill nccl-elephants --short --build "$build" --out "$out/bytes-$r" >/dev/null
  t=$(balance "$out/table-$r/report.json")
  b=$(balance "$out/bytes-$r/report.json")
  table+=("$t")
  bytes+=("$b")
  echo "round $r: table $t  bytes $b"
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
echo "median max/mean bytes per backend over $rounds rounds: table $(median "${table[@]}"), bytes $(median "${bytes[@]}")"
echo "reports: $out"
