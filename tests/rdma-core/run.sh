#!/usr/bin/env bash
# rdma-core's own regression suite (tests/, Python over Debian's python3-pyverbs 44.0) over
# softrdma's drop-in libraries, as a provider's CI runs it against its device.
#
#   tests/rdma-core/run.sh
#
# The suite is used as it is, never copied into this project: from
# $SOFTRDMA_RDMA_CORE_TESTS (a directory holding rdma-core's tests/), else the shared
# reference copy beside this checkout (../shared/conformance/rdma-core-v44.0), else the
# release downloaded (Debian's source tarball, or rdma-core's tag on GitHub) into a
# temporary directory; with none of them it says SKIP.
#
# The device: softrdma over one end of a veth pair in a network namespace this script makes
# (10.77.0.1/24), as kernel rxe runs over an Ethernet interface; softrdma_lo's 127.0.0.1 is
# a loopback address, where rdma_bind_addr gives no device (as the kernel's). The suite reads
# /sys/class/infiniband, so it runs under scripts/softrdma-sysfs-ns. Needs root (the
# namespace, the mounts); says SKIP otherwise.
#
# Prints one summary line (ok / FAIL / ERROR / skipped), then every skip reason with its
# count, then each failure's name. Exits 1 if any test failed or erred. With
# SOFTRDMA_RDMA_CORE_LOG=FILE the suite's whole output (each test's name and result) is
# kept in FILE.
set -uo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=tests/lib.sh
. tests/lib.sh

if [ "$(id -u)" != 0 ]; then
    line "rdma-core suite" "SKIP needs root (a network namespace and scripts/softrdma-sysfs-ns)"
    exit 0
fi
install_packages /usr/lib/python3/dist-packages/pyverbs:python3-pyverbs ibv_devices:ibverbs-utils \
    ip:iproute2
if [ ! -d /usr/lib/python3/dist-packages/pyverbs ]; then
    line "rdma-core suite" "SKIP python3-pyverbs is not installed and could not be"
    exit 0
fi

work=$(mktemp -d)
ns=softrdma-rdmacore-$$
# The suite's huge-page tests (registrations on 2 MiB pages, IBV_ACCESS_HUGETLB) need some
# allocated: 16 for the run where the host has none, given back after.
hugepages=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo)
trap 'ip netns del "$ns" 2>/dev/null; rm -rf "$work"; [ "$hugepages" = 0 ] && echo 0 >/proc/sys/vm/nr_hugepages' EXIT
[ "$hugepages" = 0 ] && echo 16 >/proc/sys/vm/nr_hugepages 2>/dev/null

suite=${SOFTRDMA_RDMA_CORE_TESTS:-}
if [ -z "$suite" ] && [ -d ../shared/conformance/rdma-core-v44.0/tests ]; then
    suite=$(cd ../shared/conformance/rdma-core-v44.0 && pwd)
fi
if [ -z "$suite" ]; then
    # Debian's source of the release python3-pyverbs was built from, else rdma-core's tag.
    for url in http://deb.debian.org/debian/pool/main/r/rdma-core/rdma-core_44.0.orig.tar.gz \
        https://github.com/linux-rdma/rdma-core/archive/refs/tags/v44.0.tar.gz; do
        if curl -fsSL --max-time 120 "$url" 2>/dev/null | tar -xz -C "$work" rdma-core-44.0/tests 2>/dev/null; then
            suite=$work/rdma-core-44.0
            break
        fi
    done
    if [ -z "$suite" ]; then
        line "rdma-core suite" "SKIP no copy of rdma-core 44.0's tests/ (none beside the checkout, no download)"
        exit 0
    fi
fi
# Run from a copy: the suite writes .pyc files beside itself.
mkdir -p "$work/suite" && cp -r "$suite/tests" "$work/suite/"

use_libs

ip netns add "$ns" &&
    ip -n "$ns" link set lo up &&
    ip -n "$ns" link add veth0 type veth peer name veth1 &&
    ip -n "$ns" addr add 10.77.0.1/24 dev veth0 &&
    ip -n "$ns" link set veth0 up &&
    ip -n "$ns" link set veth1 up || {
    line "rdma-core suite" "SKIP could not make network namespace $ns with a veth pair"
    exit 0
}

log=$work/suite.log
ip netns exec "$ns" env LD_LIBRARY_PATH="$lib" PYTHONPATH="$work/suite" \
    timeout 900 scripts/softrdma-sysfs-ns /usr/bin/python3 "$work/suite/tests/run_tests.py" -v \
    --dev softrdma_veth0 >"$log" 2>&1
rc=$?
[ -n "${SOFTRDMA_RDMA_CORE_LOG:-}" ] && cp "$log" "$SOFTRDMA_RDMA_CORE_LOG"

ok=$(grep -cE '\.\.\. ok$' "$log")
failed=$(grep -cE '^FAIL: ' "$log")
erred=$(grep -cE '^ERROR: ' "$log")
skipped=$(grep -cE "\.\.\. skipped " "$log")
ran=$(grep -E '^Ran [0-9]+ tests' "$log" | awk '{print $2}')
line "rdma-core suite" "${ran:-0} tests: $ok ok, $failed FAIL, $erred ERROR, $skipped skipped"
echo "skipped, by reason:"
grep -oE "\.\.\. skipped ['\"].*['\"]$" "$log" | sed -E "s/^\.\.\. skipped ['\"](.*)['\"]$/\1/" | sort | uniq -c | sort -rn |
    sed 's/^/  /'
if [ "$failed" -gt 0 ] || [ "$erred" -gt 0 ] || [ "$rc" -ne 0 ] || [ -z "$ran" ]; then
    echo "failed:"
    grep -E '^(FAIL|ERROR): ' "$log" | sed 's/^/  /'
    echo "--- the suite's output ---"
    tail -80 "$log"
    exit 1
fi
