#!/usr/bin/env bash
# The main job: build onionlab and run the default experiment.
#
# For now: a local network of real processes on loopback (three relays, one
# of them an exit, and a SOCKS client, over the TLS transport) moving data
# through a pinned 3-hop circuit, printing throughput, time to first byte
# and CPU per relay; then the in-memory scheduler demo (bulk and light
# circuits sharing a path, per circuit scheduler). Extra arguments go to
# `onionlab bench chain`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p onionlab
./target/release/onionlab bench chain --runs 1 --size-mib 256 --small-downloads 10 "$@"
echo
exec ./target/release/onionlab demo
