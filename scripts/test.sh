#!/usr/bin/env bash
# Run every check CI runs: formatting, lints, and all tests.
#
# Installs what it needs (cargo-nextest from crates.io if missing; iproute2
# from Debian if `ip` is missing, for the emulated-network tests; curl from
# Debian if missing, for the end-to-end SOCKS test; tor from Debian if
# missing, for the lab's C tor variant; chromium from Debian if missing,
# for the test that renders the HTML report; Shadow from the vendored
# source in ../shared if missing, for the Shadow engine's tests).
# The emulated-network fidelity tests need root, TUN and network namespaces;
# they run in their own serial step because they measure timing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-nextest >/dev/null 2>&1; then
    echo "== installing cargo-nextest"
    cargo install --locked cargo-nextest
fi
if ! command -v ip >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "== installing iproute2"
    apt-get update -qq && apt-get install -y -qq iproute2
fi

if ! command -v curl >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "== installing curl"
        apt-get update -qq && apt-get install -y -qq curl
    else
        echo "curl is missing and we are not root: install curl (the SOCKS end-to-end test uses it)" >&2
        exit 1
    fi
fi

if ! command -v tor >/dev/null 2>&1 || ! command -v tor-gencert >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing tor (the lab's C tor variant is tested)"
        apt-get update -qq && apt-get install -y -qq tor >/dev/null
        # Debian may start tor as a system service: not during our tests.
        if command -v service >/dev/null 2>&1; then
            service tor stop >/dev/null 2>&1 || true
        fi
    else
        echo "tor is missing and cannot be installed here: the lab's C tor test will be skipped" >&2
    fi
fi

if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing chromium (renders the HTML report in a test)"
        # Not fatal: without it the browser test says why it is skipped.
        if apt-get update -qq && apt-get install -y -qq chromium >/dev/null; then
            export ONIONLAB_REQUIRE_BROWSER=1
        else
            echo "could not install chromium: the report's browser test will be skipped" >&2
        fi
    else
        echo "chromium is missing and cannot be installed here: the report's browser test will be skipped" >&2
    fi
else
    export ONIONLAB_REQUIRE_BROWSER=1
fi

# Shadow (the lab's second engine, docs/shadow.md), if missing: built from
# the vendored source into ~/.local/bin (kept there for the next run on
# this machine), in the background while the Rust code compiles, and
# waited for before any test runs (some tests measure timing).
shadow_installed() {
    command -v shadow >/dev/null 2>&1 || [ -x "$HOME/.local/bin/shadow" ]
}
shadow_source="${ONIONLAB_SHADOW_SOURCE:-../shared/vendor/shadow}/build.sh"
shadow_log="${TMPDIR:-/tmp}/onionlab-shadow-build-$$.log"
shadow_build=""
if ! shadow_installed; then
    if [ "$(id -u)" = 0 ] && [ -f "$shadow_source" ]; then
        echo "== building Shadow with $shadow_source in the background (log: $shadow_log)"
        # In a session of its own, so that the whole build stops when this
        # script exits early; its 3 GB build folder goes afterwards.
        # Shadow's build runs cargo for its own tree: not into ours.
        setsid bash -c 'rc=0
            env -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET_DIR -u CARGO_INCREMENTAL \
                SHADOW_BUILD_DIR="$1" bash "$2" >"$3" 2>&1 || rc=$?
            rm -rf "$1"
            exit $rc' _ "/var/tmp/onionlab-shadow-build-$$" "$shadow_source" "$shadow_log" &
        shadow_build=$!
        trap 'kill -- -"$shadow_build" 2>/dev/null || true; rm -rf "/var/tmp/onionlab-shadow-build-$$"' EXIT
    else
        echo "Shadow is missing and cannot be built here (not root, or no $shadow_source): the Shadow engine's end-to-end tests will be skipped" >&2
    fi
fi

echo "== cargo fmt --check"
cargo fmt --all --check

echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

# The fuzz targets are a workspace of their own that nothing else builds:
# check that they still compile against the crates they fuzz (running them
# needs nightly: cargo +nightly fuzz run TARGET).
echo "== fuzz targets compile"
cargo check --manifest-path fuzz/Cargo.toml --bins --locked

# As root (CI), a missing TUN or namespace support is a failure, not a skip
# (the lab's end-to-end test and the emulated-network tests need them).
if [ "$(id -u)" = 0 ]; then
    export ONIONLAB_REQUIRE_NETNS=1
fi

echo "== building the tests"
cargo nextest run --workspace --exclude onionlab-netem --locked --no-run

if [ -n "$shadow_build" ]; then
    echo "== waiting for Shadow's build"
    if wait "$shadow_build"; then
        trap - EXIT
        tail -n 1 "$shadow_log"
    else
        tail -n 40 "$shadow_log" >&2
        echo "building Shadow failed (log: $shadow_log)" >&2
        exit 1
    fi
fi
# Where Shadow is installed, its end-to-end tests must run, not skip.
if shadow_installed; then
    export ONIONLAB_REQUIRE_SHADOW=1
fi

# --no-tests=fail: a step that finds no tests is an error, not a pass.
echo "== unit and integration tests (all crates but the emulated network)"
cargo nextest run --workspace --exclude onionlab-netem --locked --no-tests=fail

echo "== emulated-network tests (serial: they measure timing)"
cargo nextest run -p onionlab-netem --locked --no-tests=fail --test-threads 1

echo "== doc tests"
cargo test --workspace --doc --locked

echo "== cargo doc -D warnings (no broken links in the API docs)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

echo "== all checks passed"
