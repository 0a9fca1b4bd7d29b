#!/usr/bin/env bash
# The main job: build onionlab and run the default experiment.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p onionlab
exec ./target/release/onionlab demo "$@"
