#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run): formatting, lints, build, then every
# test of the workspace in the `ci` profile: optimised like release (so the crash and
# model tests run fast), with debug assertions and overflow checks on
# (`CAIRN_TEST_PROFILE=release` runs them in release instead).
# Exits non-zero if any step fails; the last line sums up the tests run.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
PROFILE="${CAIRN_TEST_PROFILE:-ci}"
# The binary LibFS starts daemons from (cairn daemon --background) during the tests.
export CAIRN_BIN="$TARGET_DIR/$PROFILE/cairn"
# Keep tests away from the user's default store: a test that falls back to the default
# store gets a private one, removed (daemon stopped, NVM file deleted) at the end.
XDG_DATA_HOME="$(mktemp -d "${TMPDIR:-/tmp}/cairn-test-home.XXXXXX")"
export XDG_DATA_HOME
unset CAIRN_STORE

cleanup() {
    local store="$XDG_DATA_HOME/cairn/default"
    if [ -f "$store/cairn.toml" ]; then
        if [ -x "$CAIRN_BIN" ]; then
            timeout 60 "$CAIRN_BIN" stop --store "$store" >/dev/null 2>&1 || true
        fi
        local nvm
        nvm="$(sed -n 's/^nvm_path = "\(.*\)"$/\1/p' "$store/cairn.toml" | head -n1)"
        if [ -n "$nvm" ] && [ -f "$nvm" ]; then rm -f -- "$nvm"; fi
    fi
    rm -rf -- "$XDG_DATA_HOME"
    rm -f -- "$TEST_LOG"
}
TEST_LOG="$(mktemp "${TMPDIR:-/tmp}/cairn-test-log.XXXXXX")"
trap cleanup EXIT

results=()
failed=0
step() {
    local name="$1"
    shift
    echo
    echo "==> $name: $*"
    local start=$SECONDS rc=0
    "$@" || rc=$?
    local took=$((SECONDS - start))
    if [ "$rc" -eq 0 ]; then
        results+=("ok    $name (${took}s)")
    else
        results+=("FAIL  $name (exit $rc, ${took}s)")
        failed=$((failed + 1))
    fi
    return "$rc"
}

step "format" cargo fmt --all -- --check || true
step "clippy" cargo clippy --workspace --all-targets -- -D warnings || true
built=1
step "build cairn" cargo build --profile "$PROFILE" -p cairn-cli || built=0
if [ "$built" -eq 1 ]; then
    step "build workspace" cargo build --profile "$PROFILE" --workspace || true
    # The examples the tests run (the SpaceJMP worked example).
    step "build examples" cargo build --profile "$PROFILE" --workspace --examples || true
    # 25 minutes at most, so that a hung test cannot stall CI.
    step "test" bash -o pipefail -c \
        "timeout --kill-after=30s 25m cargo test --workspace --profile '$PROFILE' --no-fail-fast 2>&1 | tee '$TEST_LOG'" || true
else
    results+=("skip  build workspace, test (cairn did not build)")
fi

# Sum the per-binary "test result:" lines of cargo test.
passed=0
tfailed=0
ignored=0
while read -r p f i; do
    passed=$((passed + p))
    tfailed=$((tfailed + f))
    ignored=$((ignored + i))
done < <(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed; \([0-9]*\) ignored.*/\1 \2 \3/p' "$TEST_LOG")

echo
echo "==> summary"
for r in "${results[@]}"; do echo "    $r"; done
if [ "$failed" -ne 0 ]; then
    echo "test.sh: $failed step(s) failed"
fi
echo "tests: $passed passed, $tfailed failed, $ignored skipped"
[ "$failed" -eq 0 ]
