#!/usr/bin/env bash
# Side-by-side benchmark: C tor and onionlab on this machine, same workload.
#
#   bash scripts/bench-ctor.sh [--runs N] [--size-mib M] [--small-downloads K]
#                              [--workdir DIR] [--keep] [--serve]
#
# For each run, starts a fresh private C tor network on 127.0.0.1 (one
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

# --- process bookkeeping --------------------------------------------------

STARTED=() # PIDs of the tor processes of the current network

stop_network() {
    local pid i
    [ "${#STARTED[@]}" -gt 0 ] || return 0
    for pid in "${STARTED[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${STARTED[@]}"; do
        for i in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    STARTED=()
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

# --- a private tor network ------------------------------------------------

# Print N free TCP ports on 127.0.0.1 (nothing accepts connections there).
free_ports() {
    local n="$1" got=() p
    while [ "${#got[@]}" -lt "$n" ]; do
        p=$((20000 + RANDOM % 30000))
        case " ${got[*]} " in *" $p "*) continue ;; esac
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null &&
            ! ss -Htan "( sport = :$p )" 2>/dev/null | grep -q .; then
            got+=("$p")
        fi
    done
    echo "${got[@]}"
}

# tor's relay fingerprint for a data directory (creates the keys).
fingerprint() {
    local dir="$1" port="$2" nick="$3"
    printf 'DataDirectory %s\nORPort 127.0.0.1:%s\nAddress 127.0.0.1\nNickname %s\nSocksPort 0\nLog err stderr\n' \
        "$dir" "$port" "$nick" >"$dir/fpr.torrc"
    tor --defaults-torrc /dev/null -f "$dir/fpr.torrc" --list-fingerprint 2>/dev/null |
        awk -v n="$nick" '$1 == n { $1 = ""; gsub(/ /, ""); print; exit }'
}

# Start tor with a torrc in the background; records its PID.
start_tor() {
    local dir="$1"
    tor --defaults-torrc /dev/null -f "$dir/torrc" >"$dir/stdout.log" 2>&1 &
    STARTED+=("$!")
    echo "$!" >"$dir/pid"
}

# Sets up and starts the network of one run in $1; sets NET_* variables.
start_network() {
    local net="$1"
    mkdir -p "$net"
    local ports
    read -r -a ports <<<"$(free_ports 7)"
    local auth_or="${ports[0]}" auth_dir="${ports[1]}"
    local relay_or=("${ports[2]}" "${ports[3]}" "${ports[4]}")
    NET_SOCKS="${ports[5]}"
    NET_CONTROL="${ports[6]}"

    # Authority: identity/signing keys and certificate, relay identity.
    local a="$net/auth"
    mkdir -p "$a/keys"
    chmod 700 "$a"
    (cd "$a/keys" && echo "" | tor-gencert --create-identity-key -m 12 \
        -a "127.0.0.1:$auth_dir" --passphrase-fd 0 >/dev/null 2>&1)
    local v3ident auth_fp
    v3ident="$(awk '$1 == "fingerprint" { print $2 }' "$a/keys/authority_certificate")"
    auth_fp="$(fingerprint "$a" "$auth_or" auth)"
    [ -n "$v3ident" ] && [ -n "$auth_fp" ] || { log "authority key setup failed"; return 1; }
    local dirauth="DirAuthority auth orport=$auth_or v3ident=$v3ident 127.0.0.1:$auth_dir $auth_fp"

    local i r
    NET_FP=()
    for i in 0 1 2; do
        r="$net/relay$i"
        mkdir -p "$r"
        chmod 700 "$r"
        NET_FP+=("$(fingerprint "$r" "${relay_or[$i]}" "relay$i")")
        [ -n "${NET_FP[$i]}" ] || { log "relay$i key setup failed"; return 1; }
    done

    # Settings every node shares. Relays and the authority build no
    # circuits of their own (__DisablePredictedCircuits): otherwise they try
    # once a second to build exit circuits, which costs CPU during the
    # measurement (and fails on relay2, the only exit).
    common() {
        cat <<EOF
TestingTorNetwork 1
$dirauth
DataDirectory $1
Log notice file $1/notice.log
SafeLogging 0
RunAsDaemon 0
ShutdownWaitLength 0
ContactInfo onionlab-bench@localhost
EOF
    }

    # The authority votes quickly, and hands out the flags our path needs:
    # Guard to relay0 only, Exit to relay2 only, Stable to all (a client
    # only takes a Stable relay as its guard, and by default only relays
    # with at least the median uptime are Stable: a coin toss here).
    {
        common "$a"
        cat <<EOF
Nickname auth
Address 127.0.0.1
ORPort 127.0.0.1:$auth_or
DirPort 127.0.0.1:$auth_dir
SocksPort 0
AuthoritativeDirectory 1
V3AuthoritativeDirectory 1
AssumeReachable 1
__DisablePredictedCircuits 1
ExitRelay 0
ExitPolicy reject *:*
TestingV3AuthInitialVotingInterval 5
TestingV3AuthInitialVoteDelay 2
TestingV3AuthInitialDistDelay 2
V3AuthVotingInterval 20
V3AuthVoteDelay 2
V3AuthDistDelay 2
TestingDirAuthVoteGuard ${NET_FP[0]}
TestingDirAuthVoteGuardIsStrict 1
TestingDirAuthVoteExit ${NET_FP[2]}
TestingDirAuthVoteExitIsStrict 1
AuthDirVoteStableGuaranteeMinUptime 0
AuthDirVoteStableGuaranteeMTBF 0
EOF
    } >"$a/torrc"

    for i in 0 1 2; do
        r="$net/relay$i"
        {
            common "$r"
            cat <<EOF
Nickname relay$i
Address 127.0.0.1
ORPort 127.0.0.1:${relay_or[$i]}
SocksPort 0
AssumeReachable 1
__DisablePredictedCircuits 1
EOF
            if [ "$i" -eq 2 ]; then
                # The workload server listens on 127.0.0.1.
                cat <<EOF
ExitRelay 1
ExitPolicyRejectPrivate 0
ExitPolicyRejectLocalInterfaces 0
ExitPolicy accept 127.0.0.1:*
ExitPolicy reject *:*
EOF
            else
                printf 'ExitRelay 0\nExitPolicy reject *:*\n'
            fi
        } >"$r/torrc"
    done

    # The client: path pinned to relay0 -> relay1 -> relay2, one circuit
    # (no conflux). Full descriptors instead of microdescriptors: a
    # microdescriptor's exit policy summary cannot express "127.0.0.1 only",
    # so with microdescriptors the client would see no usable exit.
    local c="$net/client"
    mkdir -p "$c"
    chmod 700 "$c"
    {
        common "$c"
        cat <<EOF
SocksPort 127.0.0.1:$NET_SOCKS
ControlPort 127.0.0.1:$NET_CONTROL
CookieAuthentication 1
ClientOnly 1
EntryNodes ${NET_FP[0]}
MiddleNodes ${NET_FP[1]}
ExitNodes ${NET_FP[2]}
StrictNodes 1
UseEntryGuards 1
ConfluxEnabled 0
UseMicrodescriptors 0
EOF
    } >"$c/torrc"

    start_tor "$a"
    for i in 0 1 2; do
        start_tor "$net/relay$i"
    done
    start_tor "$c"
    NET_PID_AUTH="$(cat "$a/pid")"
    NET_PID_RELAY=("$(cat "$net/relay0/pid")" "$(cat "$net/relay1/pid")" "$(cat "$net/relay2/pid")")
    NET_PID_CLIENT="$(cat "$c/pid")"
}

# Wait until the client of network $1 logs "Bootstrapped 100%".
wait_bootstrap() {
    local net="$1" limit="${2:-300}" start=$SECONDS pid name
    while ! grep -q 'Bootstrapped 100%' "$net/client/notice.log" 2>/dev/null; do
        for name in auth relay0 relay1 relay2 client; do
            pid="$(cat "$net/$name/pid")"
            if ! kill -0 "$pid" 2>/dev/null; then
                log "tor $name exited; its log:"
                tail -n 20 "$net/$name/notice.log" "$net/$name/stdout.log" >&2 || true
                return 1
            fi
        done
        if [ $((SECONDS - start)) -ge "$limit" ]; then
            log "the tor client did not bootstrap in ${limit}s; last lines of its log:"
            tail -n 20 "$net/client/notice.log" >&2 || true
            return 1
        fi
        sleep 0.5
    done
    log "tor client bootstrapped in $((SECONDS - start))s"
}

# Start a network in $1 and wait for its client; one retry with a fresh
# network if it does not bootstrap.
start_and_bootstrap() {
    local net="$1"
    start_network "$net"
    wait_bootstrap "$net" && return 0
    stop_network
    mv "$net" "$net.failed"
    log "retrying with a fresh network (the failed one is in $net.failed)"
    KEEP=1
    start_network "$net"
    wait_bootstrap "$net"
}

# One command on the client's ControlPort (cookie authentication).
control() {
    local net="$1" cmd="$2" cookie
    cookie="$(od -An -tx1 -v "$net/client/control_auth_cookie" | tr -d ' \n')"
    exec 7<>"/dev/tcp/127.0.0.1/$NET_CONTROL"
    printf 'AUTHENTICATE %s\r\n%s\r\nQUIT\r\n' "$cookie" "$cmd" >&7
    tr -d '\r' <&7
    exec 7<&-
}

# Print the client's built general-purpose circuits as nickname paths.
circuit_paths() {
    control "$1" "GETINFO circuit-status" |
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
    echo "  $ONIONLAB bench socks --socks 127.0.0.1:$NET_SOCKS" \
        "--process relay0=${NET_PID_RELAY[0]} --process relay1=${NET_PID_RELAY[1]}" \
        "--process relay2=${NET_PID_RELAY[2]} --process client=$NET_PID_CLIENT" \
        "--process auth=$NET_PID_AUTH --size-mib $SIZE_MIB --small-downloads $SMALL"
    while kill -0 "$NET_PID_CLIENT" 2>/dev/null; do sleep 1; done
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
    if ! run_bench "$ONIONLAB" --log warn bench socks --socks "127.0.0.1:$NET_SOCKS" \
        --process "relay0=${NET_PID_RELAY[0]}" --process "relay1=${NET_PID_RELAY[1]}" \
        --process "relay2=${NET_PID_RELAY[2]}" --process "client=$NET_PID_CLIENT" \
        --process "auth=$NET_PID_AUTH" \
        --size-mib "$SIZE_MIB" --small-downloads "$SMALL" \
        --label tor --run "$run" --json "$TOR_JSON" >"$net/bench.out"; then
        cat "$net/bench.out"
        log "bench socks failed against tor; last lines of the client's log:"
        tail -n 15 "$net/client/notice.log" >&2 || true
        KEEP=1
        exit 1
    fi
    sed -n 2p "$net/bench.out" | sed "s/^tor:/run $run:/"
    # The client's circuits (directory circuits have one hop).
    paths="$(circuit_paths "$net" || true)"
    echo "$paths" | sed 's/^ */    circuits built: /'
    if echo "$paths" | grep -- '->' | grep -v -q 'relay0 -> relay1 -> relay2$'; then
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
