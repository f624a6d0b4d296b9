#!/usr/bin/env bash
# Fails when a DPDK header leaks into the DPDK-free core, or TBB / CLI11 leak
# out of the control plane and tool mains (see STYLE.md, Layering).
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
[ $status -eq 0 ] && echo "layering OK"
exit $status
