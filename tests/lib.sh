# Shared by tests/conformance/run.sh and tests/ecosystem/run.sh (sourced, not run): the
# one-line-per-case report, the package installer, the library directory and a
# server/client runner. The sourcing script sets `set -uo pipefail` and cds to the
# repository's root first.

TIMEOUT=${SOFTRDMA_CONFORMANCE_TIMEOUT:-20}
failed=0
line() { printf "%-${LINE_WIDTH:-28}s %s\n" "$1" "$2"; }
fail() {
    line "$1" "FAIL $2"
    failed=1
}
# last_words FILE: what a failed program said last (its last non-empty line), after the
# last line softrdma's libraries wrote ("softrdma: ...", the reason a C program's own
# message leaves out, such as why the device did not open), if there is one.
last_words() {
    local ours last
    ours=$(grep '^softrdma: ' "$1" | grep -v 'injecting faults' | tail -n 1)
    # The program's last three lines: its last is mostly a summary ("Unable to init the
    # socket connection"), the cause a line or two before it (which CM event came).
    last=$(grep -v '^[[:space:]]*$' "$1" | tail -n 3 | sed 's/^[[:space:]]*//' | paste -sd '|' | sed 's/|/ | /g')
    if [ -n "$ours" ] && [[ "$last" != *"$ours"* ]]; then echo "$ours; then: $last"; else echo "$last"; fi
}
# installed NAME PROGRAM PACKAGE: whether PROGRAM is there; if not, NAME's line says SKIP.
installed() {
    command -v "$2" >/dev/null 2>&1 && return
    line "$1" "SKIP $2 is not installed (apt-get install $3)"
    return 1
}

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }
# install_packages PROGRAM:PACKAGE...: apt-get installs the packages whose program is
# missing, unless SOFTRDMA_CONFORMANCE_NO_INSTALL is set; best effort (the cases that need
# a missing program say SKIP).
install_packages() {
    local need=() pair
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || [ -e "${pair%%:*}" ] || need+=("${pair#*:}")
    done
    [ ${#need[@]} -eq 0 ] || [ -n "${SOFTRDMA_CONFORMANCE_NO_INSTALL:-}" ] && return
    export DEBIAN_FRONTEND=noninteractive
    { sudo_if_needed apt-get update -qq &&
        sudo_if_needed apt-get install -y -qq --no-install-recommends "${need[@]}"; } \
        >/dev/null 2>&1 || echo "note: could not install ${need[*]} (not Debian, or no root)" >&2
}

# use_libs: builds the libraries (scripts/build-libs) into $CARGO_TARGET_DIR/softrdma-lib,
# or takes SOFTRDMA_LIB_DIR, sets $lib and puts it first on LD_LIBRARY_PATH. Exits 1 if
# the build fails.
use_libs() {
    if [ -n "${SOFTRDMA_LIB_DIR:-}" ]; then
        lib=$SOFTRDMA_LIB_DIR
    else
        lib=${CARGO_TARGET_DIR:-target}/softrdma-lib
        if ! scripts/build-libs "$lib" >/dev/null; then
            echo "FAIL: scripts/build-libs (cargo build -p softrdma-ibverbs -p softrdma-rdmacm -p softrdma-dv)" >&2
            exit 1
        fi
    fi
    lib=$(cd "$lib" && pwd)
    export LD_LIBRARY_PATH=$lib
}

# serve OUT RETRY SERVER CLIENT: the SERVER command line (split into words) in the
# background, then CLIENT, run again for a bounded time while `RETRY STATUS OUTFILE` says
# the server was not listening yet and the server still runs; output in OUT.server and
# OUT.client, exit statuses in $src and $crc. A server still running once the client is
# done gets 5 s to finish, then is ended.
serve() {
    local out=$1 retry=$2 server_cmd=$3 client_cmd=$4
    # shellcheck disable=SC2086 # the command lines are split into words on purpose
    timeout "$TIMEOUT" $server_cmd >"$out.server" 2>&1 &
    local server=$! tries=0
    crc=1
    while [ $tries -lt 50 ]; do
        tries=$((tries + 1))
        # shellcheck disable=SC2086
        timeout "$TIMEOUT" $client_cmd >"$out.client" 2>&1
        crc=$?
        "$retry" "$crc" "$out.client" || break
        kill -0 "$server" 2>/dev/null || break
        sleep 0.1
    done
    wait "$server"
    src=$?
}

# expect_one NAME REGEX CMD...: CMD (bounded) exits 0 and its output matches REGEX; the
# output is in $work (the sourcing script makes it).
expect_one() {
    local name=$1 expect=$2 tag
    shift 2
    tag=$(echo "$name" | tr -c 'a-zA-Z0-9_\n' '_')
    timeout "$TIMEOUT" "$@" >"$work/$tag.out" 2>&1
    local rc=$?
    if [ $rc -ne 0 ]; then
        fail "$name" "exit $rc: $(last_words "$work/$tag.out")"
    elif ! grep -Eq "$expect" "$work/$tag.out"; then
        fail "$name" "output lacks /$expect/"
    else
        line "$name" pass
    fi
}
