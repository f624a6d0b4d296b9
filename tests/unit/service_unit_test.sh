#!/usr/bin/env bash
# conf/spillwayd.service as systemd reads it: `systemd-analyze verify` with
# the binaries pointed at this build must print nothing (an unknown key or
# syscall group is only a warning to systemd, so any output fails here), the
# offline security score must stay at or under 5.0 ("OK"), the hardening lines
# the README promises must be there, and every key of the hardening block
# must be explained in README "Privileges".
#
#   service_unit_test.sh SPILLWAYD
set -euo pipefail
spillwayd=$(readlink -f "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
unit="$root/conf/spillwayd.service"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed -e "s|/usr/local/bin/spillwayd|$spillwayd|g" "$unit" > "$work/spillwayd.service"

fail=0
out=$(systemd-analyze verify "$work/spillwayd.service" 2>&1) || fail=1
if [ -n "$out" ] || [ "$fail" = 1 ]; then
  echo "FAIL systemd-analyze verify:"; echo "$out"; exit 1
fi
echo "ok   systemd-analyze verify: no warning"

score=$(systemd-analyze security --offline=yes "$work/spillwayd.service" 2>&1 |
  sed -n 's/.*Overall exposure level for spillwayd.service: \([0-9.]*\).*/\1/p')
if ! systemd-analyze security --offline=yes --threshold=50 "$work/spillwayd.service" >/dev/null 2>&1; then
  echo "FAIL exposure level $score is above 5.0"; exit 1
fi
echo "ok   systemd-analyze security --offline: exposure $score (at most 5.0)"

for line in NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes \
            CapabilityBoundingSet= RestrictAddressFamilies= SystemCallFilter=; do
  grep -q "^$line" "$unit" || { echo "FAIL $unit has no $line line"; exit 1; }
done
echo "ok   the hardening lines the issue and README name are there"

readme=$(sed -n '/^### Privileges/,/^### /p' "$root/README.md")
missing=()
for key in $(sed -n '/^# --- Hardening/,/^\[Install\]/p' "$unit" | grep -o '^[A-Za-z]*=' | tr -d '=' | sort -u); do
  grep -q "\`$key" <<< "$readme" || missing+=("$key")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "FAIL README \"Privileges\" does not explain: ${missing[*]}"; exit 1
fi
echo "ok   README \"Privileges\" explains every hardening key"
