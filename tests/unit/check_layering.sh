#!/usr/bin/env bash
# Fails when a DPDK header leaks into the DPDK-free core or above the DPDK
# adapter, the adapter includes the control plane or the composition root, or
# TBB / CLI11 leak out of the control plane and tool mains (STYLE.md,
# Layering).
set -u
root=${1:?usage: check_layering.sh SOURCE_ROOT}
cd "$root" || exit 1
status=0
core_rte=$(grep -rlE '#\s*include\s*[<"]rte_' include src/dataplane/core 2>/dev/null)
if [ -n "$core_rte" ]; then
  echo "DPDK headers in the DPDK-free core:"; echo "$core_rte"; status=1
fi
tbb_cli=$(grep -rlE --exclude='*_main.cpp' '#\s*include\s*[<"](tbb/|oneapi/tbb|CLI/)' include src/dataplane 2>/dev/null)
if [ -n "$tbb_cli" ]; then
  echo "TBB or CLI11 outside src/control and tool mains:"; echo "$tbb_cli"; status=1
fi
mbuf=$(grep -rlE 'rte_mbuf' include src/dataplane/core 2>/dev/null)
if [ -n "$mbuf" ]; then
  echo "rte_mbuf named in the core (core functions take std::span<std::byte>):"; echo "$mbuf"; status=1
fi
# The DPDK adapter sits below the control plane and the composition root
# (src/spillwayd/): both talk to it through spillway/dataplane.hpp, and it
# includes neither back.
adapter_up=$(grep -rlE '#\s*include\s*"(control/|daemon\.hpp)' src/dataplane 2>/dev/null)
if [ -n "$adapter_up" ]; then
  echo "the DPDK adapter includes control or the composition root:"; echo "$adapter_up"; status=1
fi
rte_up=$(grep -rlE '#\s*include\s*[<"]rte_' src/control src/spillwayd src/spillwayctl 2>/dev/null)
if [ -n "$rte_up" ]; then
  echo "DPDK headers above the adapter (control, composition root):"; echo "$rte_up"; status=1
fi
# The control plane's rooms (ARCHITECTURE.md, "Rooms of the control plane"):
# a room includes only itself and the rooms below it, in this order.
rooms=(sys config host api health policy discovery backends intent tier announce plane)
rank_of() {
  local i
  for i in "${!rooms[@]}"; do
    [ "${rooms[$i]}" = "$1" ] && { echo "$i"; return; }
  done
  echo -1
}
for dir in src/control/*/; do
  room=$(basename "$dir")
  rank=$(rank_of "$room")
  if [ "$rank" -lt 0 ]; then
    echo "src/control/$room/ is not a room of check_layering.sh's order"; status=1
    continue
  fi
  while IFS=: read -r file inc; do
    other=$(sed -E 's|.*"control/([a-z_]+)/.*|\1|' <<<"$inc")
    orank=$(rank_of "$other")
    if [ "$orank" -lt 0 ] || [ "$orank" -gt "$rank" ]; then
      echo "an arrow up: $file includes control/$other/ (room $room may include only rooms below it)"
      status=1
    fi
  done < <(grep -HoE '#\s*include\s*"control/[a-z_]+/' "$dir"* 2>/dev/null)
done
stray=$(find src/control -maxdepth 1 -name '*.[ch]pp')
if [ -n "$stray" ]; then
  echo "sources outside a room of src/control:"; echo "$stray"; status=1
fi
# spillwayctl links the client libraries only: the API's wire (the command
# table, the codec, the client), the tier client and table digests; of the
# configuration it reads the defaults of ControlConfig (a header's inline
# values, nothing linked).
ctl_up=$(grep -HoE '#\s*include\s*"control/[a-z_/]+\.hpp"' src/spillwayctl/* |
  grep -vE '"control/(api/(commands|protocol|cli_client|control_api)|tier/(tier_client|tier_file)|backends/table_digest|config/config)\.hpp"')
if [ -n "$ctl_up" ]; then
  echo "spillwayctl includes the daemon's rooms:"; echo "$ctl_up"; status=1
fi
# The libraries that guard a port or a privilege have one home each:
# libsodium the peer channel's wire (tier/), libcap-ng the privilege drop
# (host/).
for pair in 'sodium\.h:src/control/tier/' 'cap-ng\.h:src/control/host/'; do
  header=${pair%%:*}
  home=${pair#*:}
  strays=$(grep -rlE "#\s*include\s*<${header}>" src include 2>/dev/null | grep -v "^${home}")
  if [ -n "$strays" ]; then
    echo "<${header//\\/}> outside ${home}:"; echo "$strays"; status=1
  fi
done
[ $status -eq 0 ] && echo "layering OK"
exit $status
