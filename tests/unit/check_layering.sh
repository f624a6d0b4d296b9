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
rte_up=$(grep -rlE '#\s*include\s*[<"]rte_' src/control src/spillwayd 2>/dev/null)
if [ -n "$rte_up" ]; then
  echo "DPDK headers above the adapter (control, composition root):"; echo "$rte_up"; status=1
fi
[ $status -eq 0 ] && echo "layering OK"
exit $status
