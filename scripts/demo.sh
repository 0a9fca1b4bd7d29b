#!/usr/bin/env bash
# The main job: build onionlab and run the default experiment (after the
# build, about 6 minutes on a 2-core machine).
#
# 1. A local network of real processes on loopback (three relays, one an
#    exit, and a SOCKS client, over the TLS transport) moving data through
#    a pinned 3-hop circuit: throughput, time to first byte, CPU per relay.
# 2. The lab (scenarios/demo.toml, about 5 minutes): seed 000's scenario 3
#    cut down, a light and a bulk client sharing the whole path over the
#    emulated network, 0% and 1% loss on the guard-middle hop, TLS against
#    QUIC with a stream and with a connection per circuit, Cubic on both.
#    It ends with a findings table (each QUIC transport against TLS under
#    the same loss) and the path of the report it wrote (tables, CDFs and
#    box plots). The lab needs network namespaces and TUN: root, or
#    unprivileged user namespaces (see docs/netem.md).
#
# Extra arguments go to `onionlab lab run` (e.g. `--reps 10`).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v ip >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq iproute2
fi
cargo build --release --locked -p onionlab
./target/release/onionlab bench chain --runs 1 --size-mib 256 --small-downloads 10
echo
exec ./target/release/onionlab --log warn demo "$@"
