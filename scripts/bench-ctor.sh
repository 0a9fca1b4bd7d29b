#!/usr/bin/env bash
# Side-by-side benchmark: C tor and onionlab on this machine, same workload.
#
#   bash scripts/bench-ctor.sh [--runs N] [--size-mib M] [--small-downloads K]
#                              [--workdir DIR] [--keep] [--serve]
#
# For each run, starts a fresh private C tor network on 127.0.0.1 with
# `onionlab bench ctor-network` (the lab's C tor set-up, docs/ctor.md: one
# directory authority, three relays, a client whose path is pinned to
# relay0 -> relay1 -> relay2), waits for the client to bootstrap, and runs
# `onionlab bench socks` against the client's SocksPort, watching the three
# relays, the client and the authority. Then runs `onionlab bench chain`
# with the same parameters, and prints a comparison table. See docs/bench.md.
#
# --serve only starts one tor network, prints the `onionlab bench socks`
# command that measures it, and waits for Ctrl-C.
#
# Installs tor with apt-get if it is missing. Every process it starts is
# stopped on exit; the work directory (a new temp directory unless --workdir
# is given) is removed unless --keep or --workdir is given.

set -euo pipefail

RUNS=5
SIZE_MIB=1024
SMALL=20
WORKDIR=""
KEEP=0
SERVE=0

usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

while [ $# -gt 0 ]; do
    case "$1" in
    --runs) RUNS="$2"; shift 2 ;;
    --size-mib) SIZE_MIB="$2"; shift 2 ;;
    --small-downloads) SMALL="$2"; shift 2 ;;
    --workdir) WORKDIR="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --serve) SERVE=1; shift ;;
    -h | --help) usage 0 ;;
    *) echo "bench-ctor: unknown argument $1" >&2; usage 2 ;;
    esac
done
for v in "$RUNS" "$SIZE_MIB" "$SMALL"; do
    case "$v" in '' | *[!0-9]*) echo "bench-ctor: not a number: $v" >&2; exit 2 ;; esac
done
[ "$RUNS" -ge 1 ] || { echo "bench-ctor: --runs must be at least 1" >&2; exit 2; }

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

log() { printf '[bench-ctor %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# --- what we need ---------------------------------------------------------

if ! command -v tor >/dev/null || ! command -v tor-gencert >/dev/null; then
    log "installing tor (apt-get)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get install -y tor >/dev/null 2>&1 ||
        { $SUDO apt-get update >/dev/null && $SUDO apt-get install -y tor >/dev/null; }
fi
TOR_VERSION="$(tor --version | head -n 1 | sed 's/\.$//')"
log "using $TOR_VERSION"

log "building onionlab (release)"
cargo build --release -p onionlab >&2
ONIONLAB="$ROOT/target/release/onionlab"

if [ -z "$WORKDIR" ]; then
    WORKDIR="$(mktemp -d "${TMPDIR:-/tmp}/bench-ctor.XXXXXX")"
else
    # A directory given by the user is never removed.
    mkdir -p "$WORKDIR"
    KEEP=1
fi
WORKDIR="$(cd "$WORKDIR" && pwd)"
log "work directory $WORKDIR"

# --- the C tor network ----------------------------------------------------

# `onionlab bench ctor-network` sets up and runs the network with the lab's
# C tor code (crates/lab/src/ctor.rs, docs/ctor.md): an authority, relay0
# (guard) -> relay1 -> relay2 (exit), a client pinned to that path. It
# prints one `ready socks=... relay0=PID ...` line once the client
# bootstrapped, and stops every tor on SIGTERM.
NET_PID="" # the running `onionlab bench ctor-network`

stop_network() {
    [ -n "$NET_PID" ] || return 0
    kill -TERM "$NET_PID" 2>/dev/null || true
    wait "$NET_PID" 2>/dev/null || true
    NET_PID=""
}

# Run an onionlab benchmark in the background and wait for it, so that a
# signal reaches our traps at once; cleanup() stops it (it stops its own
# relays and client on SIGTERM).
BENCH_PID=""
run_bench() {
    local rc=0
    "$@" &
    BENCH_PID=$!
    wait "$BENCH_PID" || rc=$?
    BENCH_PID=""
    return "$rc"
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$BENCH_PID" ]; then
        kill -TERM "$BENCH_PID" 2>/dev/null || true
        wait "$BENCH_PID" 2>/dev/null || true
    fi
    stop_network
    if [ "$KEEP" -eq 0 ]; then
        rm -rf "$WORKDIR"
    else
        log "kept $WORKDIR"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The value of KEY in the ready line of network $1.
net_value() {
    tr ' ' '\n' <"$1/ready" | awk -F= -v k="$2" '$1 == k { print $2 }'
}

# Start a network in $1 and wait (up to 300 s) until its client
# bootstrapped; sets NET_SOCKS, NET_CONTROL, NET_COOKIE, NET_PID_*.
start_and_bootstrap() {
    local net="$1" start=$SECONDS
    mkdir -p "$net"
    "$ONIONLAB" --log warn bench ctor-network --dir "$net" --circuit-cc vegas \
        >"$net/ready" 2>"$net/network.log" &
    NET_PID=$!
    # The whole line: it ends with the authority's PID.
    while ! grep -Eq '^ready .* auth=[0-9]+$' "$net/ready" 2>/dev/null; do
        if ! kill -0 "$NET_PID" 2>/dev/null; then
            log "the C tor network did not start:"
            tail -n 30 "$net/network.log" >&2 || true
            NET_PID=""
            return 1
        fi
        if [ $((SECONDS - start)) -ge 300 ]; then
            log "the C tor network was not ready in 300 s"
            return 1
        fi
        sleep 0.5
    done
    NET_SOCKS="$(net_value "$net" socks)"
    NET_CONTROL="$(net_value "$net" control)"
    NET_COOKIE="$(net_value "$net" cookie)"
    NET_PID_AUTH="$(net_value "$net" auth)"
    NET_PID_RELAY=("$(net_value "$net" relay0)" "$(net_value "$net" relay1)" "$(net_value "$net" relay2)")
    NET_PID_CLIENT="$(net_value "$net" client)"
    log "tor client bootstrapped in $((SECONDS - start))s"
}

# One command on the client's ControlPort (cookie authentication).
control() {
    local cmd="$1" cookie
    cookie="$(od -An -tx1 -v "$NET_COOKIE" | tr -d ' \n')"
    exec 7<>"/dev/tcp/${NET_CONTROL%:*}/${NET_CONTROL##*:}"
    printf 'AUTHENTICATE %s\r\n%s\r\nQUIT\r\n' "$cookie" "$cmd" >&7
    tr -d '\r' <&7
    exec 7<&-
}

# Print the client's built general-purpose circuits as nickname paths.
circuit_paths() {
    control "GETINFO circuit-status" |
        awk '/ BUILT / && /PURPOSE=GENERAL/ {
            n = split($3, hops, ",")
            path = ""
            for (i = 1; i <= n; i++) { sub(/^\$[0-9A-F]+[~=]/, "", hops[i]); path = path (i > 1 ? " -> " : "") hops[i] }
            print path (n == 1 ? " (directory, 1 hop)" : "")
        }' | sort | uniq -c
}

# --- the runs -------------------------------------------------------------

if [ "$SERVE" -eq 1 ]; then
    net="$WORKDIR/tor-serve"
    start_and_bootstrap "$net" || { KEEP=1; exit 1; }
    echo "tor network up in $net (Ctrl-C stops it); measure it with:"
    echo "  $ONIONLAB bench socks --socks $NET_SOCKS" \
        "--process relay0=${NET_PID_RELAY[0]} --process relay1=${NET_PID_RELAY[1]}" \
        "--process relay2=${NET_PID_RELAY[2]} --process client=$NET_PID_CLIENT" \
        "--process auth=$NET_PID_AUTH --size-mib $SIZE_MIB --small-downloads $SMALL"
    wait "$NET_PID" || true
    exit 0
fi

TOR_JSON="$WORKDIR/tor.jsonl"
ONIONLAB_JSON="$WORKDIR/onionlab.jsonl"
: >"$TOR_JSON"
: >"$ONIONLAB_JSON"

echo "== C tor ($TOR_VERSION): $RUNS run(s), fresh network each, $SIZE_MIB MiB bulk, $SMALL x 5 MiB"
echo "   load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for run in $(seq 0 $((RUNS - 1))); do
    net="$WORKDIR/tor-run-$run"
    start_and_bootstrap "$net" || { KEEP=1; exit 1; }
    if ! run_bench "$ONIONLAB" --log warn bench socks --socks "$NET_SOCKS" \
        --process "relay0=${NET_PID_RELAY[0]}" --process "relay1=${NET_PID_RELAY[1]}" \
        --process "relay2=${NET_PID_RELAY[2]}" --process "client=$NET_PID_CLIENT" \
        --process "auth=$NET_PID_AUTH" \
        --size-mib "$SIZE_MIB" --small-downloads "$SMALL" \
        --label tor --run "$run" --json "$TOR_JSON" >"$net/bench.out"; then
        cat "$net/bench.out"
        log "bench socks failed against tor; last lines of the client's log:"
        tail -n 15 "$net/ctor/client-client/notice.log" >&2 || true
        KEEP=1
        exit 1
    fi
    sed -n 2p "$net/bench.out" | sed "s/^tor:/run $run:/"
    # The client's circuits (directory circuits have one hop).
    paths="$(circuit_paths || true)"
    echo "$paths" | sed 's/^ */    circuits built: /'
    if echo "$paths" | grep -- '->' | grep -v -q 'r0relay0 -> r1relay1 -> r2relay2$'; then
        log "WARNING: the tor client built a circuit off the pinned path (see above)"
    fi
    stop_network
done
echo "   load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$ONIONLAB" bench report "$TOR_JSON" | sed 1d

echo
echo "== onionlab: bench chain, $RUNS run(s), $SIZE_MIB MiB bulk, $SMALL x 5 MiB"
echo "   load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
run_bench "$ONIONLAB" --log warn bench chain --runs "$RUNS" --size-mib "$SIZE_MIB" \
    --small-downloads "$SMALL" --workdir "$WORKDIR/onionlab" --json "$ONIONLAB_JSON" ||
    { KEEP=1; exit 1; }
echo "   load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
echo "== comparison ($TOR_VERSION vs onionlab $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%Y-%m-%d))"
"$ONIONLAB" bench report "$TOR_JSON" "$ONIONLAB_JSON" | sed -n '/^comparison/,$p'
if [ "$KEEP" -eq 1 ]; then
    echo "(JSON lines: $TOR_JSON, $ONIONLAB_JSON)"
fi
