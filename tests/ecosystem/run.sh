#!/usr/bin/env bash
# The RDMA ecosystem on softrdma: Debian's unmodified middleware over softrdma's drop-in
# libraries, as a user runs it (LD_LIBRARY_PATH first, two processes on 127.0.0.1).
#
#   tests/ecosystem/run.sh            # installs what is missing, builds, runs everything
#
# - the provider stand-ins: every Debian program and library on this machine that links
#   libmlx5.so.1 or libefa.so.1 loads with our directory first and every symbol bound now;
# - libfabric: `fi_info -p verbs`, `fi_pingpong` over verbs MSG and verbs;ofi_rxm RDM, and
#   the tcp provider beside them;
# - UCX: `ucx_info -d` lists rc_verbs and ud_verbs on softrdma devices, `ucx_perftest`
#   server and client over each;
# - rsockets: rstream, riostream, rcopy, and iperf3 through librspreload.so.
#
# One line per case: "pass", "FAIL <reason>" or "SKIP <reason>"; exits 1 if any is FAIL.
# Environment as tests/conformance/run.sh: SOFTRDMA_CONFORMANCE_NO_INSTALL=1 skips
# apt-get, SOFTRDMA_LIB_DIR=<dir> uses built libraries, SOFTRDMA_CONFORMANCE_TIMEOUT
# bounds each program (seconds).
set -uo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=tests/lib.sh
. tests/lib.sh
LINE_WIDTH=48

install_packages fi_info:libfabric-bin ucx_perftest:ucx-utils rstream:rdmacm-utils iperf3:iperf3 ibv_devices:ibverbs-utils
use_libs
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
port=$((19600 + $$ % 1000))

# expect_pair NAME SERVER CLIENT SERVER_SAYS CLIENT_SAYS: serve (the client retried while
# its connection is refused), then both must exit 0 and print their line (regexes).
refused() { [ "$1" -ne 0 ] && grep -Eqi "refused|Connection refused|rejected|-111|ECONNREFUSED" "$2"; }
# rxm_teardown_crash NAME FILE SAYS: whether an RDM side that printed SAYS then died of
# Debian's libfabric 1.17.0 rxm teardown bug, and of nothing else: rxm_close_conn closes a
# connection's MSG endpoint before it drains the MSG CQ, and a receive completed in
# between is reposted on the freed endpoint (SIGSEGV with the call through ep->msg in
# rxm_post_recv, libfabric.so.1+0xb7882, on top). Fixed upstream by 697688386 ("prov/rxm:
# fix the msg_ep use-after-free at connection teardown"). crates/ibverbs/tests/libfabric.rs
# says more.
rxm_teardown_crash() {
    case $1 in *"-e rdm"*) ;; *) return 1 ;; esac
    grep -Eq "$3" "$2" && grep -q 'terminated with signal 11' "$2" &&
        grep -A1 'Backtrace:' "$2" | tail -n 1 | grep -qF 'libfabric.so.1(+0xb7882)'
}
expect_pair() {
    local name=$1 server_says=$4 client_says=$5 tag
    tag=$(echo "$name" | tr -c 'a-zA-Z0-9_\n' '_')
    out=$work/$tag
    serve "$out" refused "$2" "$3"
    local forgiven=
    if [ $src -ne 0 ] && rxm_teardown_crash "$name" "$out.server" "$server_says"; then src=0 forgiven=server; fi
    if [ $crc -ne 0 ] && rxm_teardown_crash "$name" "$out.client" "$client_says"; then crc=0 forgiven=client; fi
    if [ $src -ne 0 ] || [ $crc -ne 0 ]; then
        local why="server exit $src, client exit $crc"
        if [ $src -eq 124 ] || [ $crc -eq 124 ]; then why="$why (timed out after ${TIMEOUT}s)"; fi
        fail "$name" "$why: $(last_words "$out.client")"
    elif ! grep -Eq "$server_says" "$out.server"; then
        fail "$name" "the server's output lacks /$server_says/: $(last_words "$out.server")"
    elif ! grep -Eq "$client_says" "$out.client"; then
        fail "$name" "the client's output lacks /$client_says/: $(last_words "$out.client")"
    elif [ -n "$forgiven" ]; then
        line "$name" "pass (then the $forgiven died in libfabric 1.17's rxm teardown, a libfabric bug)"
    else
        line "$name" pass
    fi
}

# --- the provider stand-ins ------------------------------------------------------------
# Every ELF file of the installed packages that names libmlx5.so.1 or libefa.so.1, loaded
# by `ldd -r` (every relocation done now, as LD_BIND_NOW does) with our directory first: no
# library, version or rdma-core symbol may be missing. (Python modules leave the
# interpreter's symbols undefined: those are not ours to provide.)
stand_ins() {
    local files=() f bad=
    while IFS= read -r f; do
        readelf -d "$f" 2>/dev/null | grep -Eq 'NEEDED.*\[lib(mlx5|efa)\.so\.1\]' && files+=("$f")
    done < <(find /usr/bin /usr/sbin /usr/lib/x86_64-linux-gnu /usr/lib/python3/dist-packages \
        -type f \( -perm -u+x -o -name '*.so*' \) 2>/dev/null)
    if [ ${#files[@]} -eq 0 ]; then
        line "provider stand-ins load" "SKIP no installed program links libmlx5.so.1 or libefa.so.1"
        return
    fi
    for f in "${files[@]}"; do
        ldd -r "$f" 2>&1 | grep -E "not found|undefined symbol: (mlx5dv|efadv|ibv|rdma|verbs)" |
            sed "s|^|$f: |" >>"$work/stand-ins"
    done
    if [ -s "$work/stand-ins" ]; then
        fail "provider stand-ins load" "$(wc -l <"$work/stand-ins") errors, the first: $(head -n 1 "$work/stand-ins")"
    else
        line "provider stand-ins load" "pass (${#files[@]} files)"
    fi
}
stand_ins

# --- libfabric -------------------------------------------------------------------------
# libfabric's verbs provider never uses a loopback interface (it skips IFF_LOOPBACK), so its
# cases run in a network namespace of their own with a veth pair (10.78.1.1 on srdma-f0,
# root): both processes there, as two processes of a host with a real interface.
fab_ns=srdma-eco$$-fab
fab_down() { ip netns del "$fab_ns" 2>/dev/null; }
trap 'fab_down; rm -rf "$work"' EXIT
if installed "libfabric" fi_info libfabric-bin; then
    if [ "$(id -u)" -ne 0 ]; then
        line "libfabric" "SKIP needs root (a network namespace with a veth: libfabric's verbs provider skips loopback)"
    elif ! why=$(ip netns add "$fab_ns" 2>&1 &&
        ip -n "$fab_ns" link set lo up 2>&1 &&
        ip -n "$fab_ns" link add srdma-f0 type veth peer name srdma-f1 2>&1 &&
        ip -n "$fab_ns" addr add 10.78.1.1/24 dev srdma-f0 2>&1 &&
        ip -n "$fab_ns" link set srdma-f0 up 2>&1 && ip -n "$fab_ns" link set srdma-f1 up 2>&1); then
        fail "libfabric" "building a network namespace with a veth pair: $why"
    else
        inns="ip netns exec $fab_ns"
        expect_one "fi_info -p verbs (MSG)" "domain: softrdma_srdma-f0" $inns fi_info -p verbs -t FI_EP_MSG
        expect_one "fi_info -p 'verbs;ofi_rxm' (RDM)" "provider: verbs;ofi_rxm" $inns fi_info -p 'verbs;ofi_rxm' -t FI_EP_RDM
        expect_one "fi_info -p tcp, udp, shm" "provider: shm" \
            $inns sh -c 'fi_info -p tcp >/dev/null && fi_info -p udp >/dev/null && fi_info -p shm'
        # fi_pingpong prints a row "<size> 1k =1k ..." (1000 sent, 1000 acknowledged) on both sides.
        for prov in "verbs msg" "verbs;ofi_rxm rdm" "tcp msg"; do
            p=${prov% *} e=${prov##* }
            for size in 64 64k; do
                port=$((port + 1))
                bytes=$size
                [ "$size" = 64k ] && bytes=65536
                expect_pair "fi_pingpong -p '$p' -e $e -S $size" \
                    "$inns fi_pingpong -p $p -e $e -S $bytes -I 1000 -B $port" \
                    "$inns fi_pingpong -p $p -e $e -S $bytes -I 1000 -P $port 10.78.1.1" \
                    "^$size +1k +=1k " "^$size +1k +=1k "
            done
        done
    fi
fi
fab_down

# --- UCX -------------------------------------------------------------------------------
# UCX 1.13 lists an IB device only if /dev/infiniband/<dev> is a character device it may open,
# and reads GID types from /sys/class/infiniband: scripts/softrdma-sysfs-ns gives it both in
# a mount namespace of its own (root). ucx_perftest's peer-to-peer wireup needs an auxiliary
# transport beside rc_verbs (on any device: "no auxiliary transport" otherwise), so its RC
# cases run rc_verbs with ud_verbs as that (UCX's "rc_v"); io_demo connects through UCX's
# rdmacm connection manager over rc_verbs alone.
ucx_ns=scripts/softrdma-sysfs-ns
if installed "UCX" ucx_perftest ucx-utils; then
    if [ "$(id -u)" -ne 0 ]; then
        line "UCX" "SKIP needs root (scripts/softrdma-sysfs-ns: /dev/infiniband and /sys/class/infiniband for UCX)"
    else
        ibv_devices >/dev/null 2>&1 # writes the device tree the namespace shows
        expect_one "ucx_info -d: rc_verbs, ud_verbs" "Transport: ud_verbs" \
            $ucx_ns sh -c 'ucx_info -d | grep -A20 "Memory domain: softrdma_lo" | grep -q "Transport: rc_verbs" && ucx_info -d'
        for tls in rc_verbs,ud_verbs:aux ud_verbs; do
            for t in ucp_put_bw ucp_get tag_lat tag_bw stream_bw; do
                for size in 8 65536; do
                    port=$((port + 1))
                    env="env UCX_TLS=$tls UCX_NET_DEVICES=softrdma_lo:1"
                    expect_pair "ucx_perftest $t -s $size (${tls%%,*})" \
                        "$ucx_ns $env ucx_perftest -p $port" \
                        "$ucx_ns $env ucx_perftest 127.0.0.1 -p $port -t $t -s $size -n 1000 -w 100" \
                        "." "^Final: +1000 "
                done
            done
        done
        # io_demo: its server never exits by itself and its client exits 0 whatever happens:
        # the client's status line is the verdict.
        port=$((port + 1))
        env="env UCX_TLS=rc_verbs UCX_SOCKADDR_TLS_PRIORITY=rdmacm UCX_NET_DEVICES=softrdma_lo:1"
        # The server runs under its own bound inside the namespace wrapper (ending the wrapper
        # does not end it), and is ended by its port once the client is done.
        # shellcheck disable=SC2086
        $ucx_ns $env timeout -s KILL $((TIMEOUT + 10)) io_demo -q -p $port -i 200 -d 8:65536 \
            >"$work/io_demo.server" 2>&1 &
        iod=$!
        # shellcheck disable=SC2086 # (its own retries: -c connection attempts, -y seconds apart)
        $ucx_ns $env timeout "$TIMEOUT" io_demo -q -p $port -i 200 -d 8:65536 -c 10 -y 1 127.0.0.1 \
            >"$work/io_demo.client" 2>&1
        pkill -KILL -f "^io_demo -q -p $port " 2>/dev/null
        wait $iod 2>/dev/null
        if grep -q "Client exit with status 'OK'" "$work/io_demo.client"; then
            line "io_demo (UCX's rdmacm CM, rc_verbs)" pass
        else
            fail "io_demo (UCX's rdmacm CM, rc_verbs)" "$(last_words "$work/io_demo.client")"
        fi
    fi
fi

# --- rsockets --------------------------------------------------------------------------
# librdmacm's rsocket calls over our librdmacm.so.1 (rdma-core's rsocket protocol), through
# rdma-core's own programs, and an unmodified TCP program through its librspreload.so.
if installed "rsockets" rstream rdmacm-utils; then
    # rstream: blocking (-T b), non-blocking (-T n), async (-T a) and verified (-T v)
    # transfers; the client prints a result row "<size> <xfers> ...".
    for mode in "-S 4096 -C 1000" "-T b -S 1048576 -C 50" "-T n -S 65536 -C 200" "-T a -S 1000000 -C 20" \
        "-T v -S 100000 -C 50"; do
        port=$((port + 1))
        expect_pair "rstream $mode" "rstream -p $port $mode" "rstream -s 127.0.0.1 -p $port $mode" "." \
            "^[a-z0-9_]+ +[0-9.]+[kmg]? +[0-9.]+[kmg]? "
    done
    port=$((port + 1))
    expect_pair "riostream -T v -S 1048576 (iomap)" "riostream -p $port -T v -S 1048576 -C 20" \
        "riostream -s 127.0.0.1 -p $port -T v -S 1048576 -C 20" "." "^[a-z0-9_]+ +[0-9.]+[kmg]? +[0-9.]+[kmg]? "
    # rcopy: a 3 MB file of random bytes, compared with what arrived. The server serves
    # until it is ended.
    port=$((port + 1))
    head -c 3000017 /dev/urandom >"$work/rcopy.src"
    rcopy -p $port >"$work/rcopy.server" 2>&1 &
    rcs=$!
    for _ in $(seq 50); do
        timeout "$TIMEOUT" rcopy "$work/rcopy.src" "127.0.0.1:$work/rcopy.dst" -p $port >"$work/rcopy.client" 2>&1 &&
            break
        sleep 0.1
    done
    kill $rcs 2>/dev/null
    wait $rcs 2>/dev/null
    if cmp -s "$work/rcopy.src" "$work/rcopy.dst"; then
        line "rcopy (3 MB file, compared)" pass
    else
        fail "rcopy (3 MB file, compared)" "$(last_words "$work/rcopy.client")"
    fi
fi
preload=$(find /usr/lib -name librspreload.so.1 -path '*rsocket*' 2>/dev/null | head -n 1)
if installed "iperf3 through librspreload.so" iperf3 iperf3; then
    if [ -z "$preload" ]; then
        line "iperf3 through librspreload.so" "SKIP no librspreload.so.1 (apt-get install librdmacm1)"
    else
        port=$((port + 1))
        expect_pair "iperf3 -n 64M through librspreload.so" "env LD_PRELOAD=$preload iperf3 -s -1 -p $port" \
            "env LD_PRELOAD=$preload iperf3 -c 127.0.0.1 -p $port -n 64M" "receiver" "receiver"
    fi
fi

exit $failed
