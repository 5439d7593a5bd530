#!/usr/bin/env bash
# Install what building and testing Cairn needs on a fresh Debian (or Ubuntu) machine.
# Idempotent: installs only what is missing, so running it again does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The minimum Rust version of the workspace (Cargo.toml: rust-version).
RUST_MIN="1.88"

log() { echo "setup: $*"; }

# A Rust installed by rustup lives in ~/.cargo/bin, which a non-login shell may lack.
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

# ---- Debian packages --------------------------------------------------------------
apt_missing=()
command -v cc >/dev/null 2>&1 || apt_missing+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || apt_missing+=(pkg-config)
# The FUSE mount (crates/fuse) mounts through fusermount3; libfuse is not linked.
command -v fusermount3 >/dev/null 2>&1 || apt_missing+=(fuse3)
# Real programs the system tests run on the mount (crates/tests/tests/fuse.rs), some
# also used by `cairn bench apps`.
command -v sqlite3 >/dev/null 2>&1 || apt_missing+=(sqlite3)
command -v git >/dev/null 2>&1 || apt_missing+=(git)
command -v python3 >/dev/null 2>&1 || apt_missing+=(python3)
command -v fio >/dev/null 2>&1 || apt_missing+=(fio)
# `cairn bench apps`: RocksDB's db_bench and Redis.
command -v db_bench >/dev/null 2>&1 || apt_missing+=(rocksdb-tools)
command -v redis-server >/dev/null 2>&1 || apt_missing+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || apt_missing+=(redis-tools)
# A web server serving files from the store through the shim (`sendfile`):
# crates/tests/tests/calls.rs.
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || apt_missing+=(nginx-light)
if ! command -v cargo >/dev/null 2>&1 || ! command -v rustc >/dev/null 2>&1; then
    # No rustup toolchain: fall back to Debian's Rust (new enough on Debian 13 and later).
    apt_missing+=(cargo rustc)
fi

# `cairn bench spacejmp` compares segments with PMDK and Boost.Interprocess (and LMDB's
# headers come with them for the crash comparison): compiled with g++ at the start.
command -v g++ >/dev/null 2>&1 || apt_missing+=(g++)
[ -f /usr/include/libpmemobj.h ] || apt_missing+=(libpmemobj-dev)
[ -f /usr/include/boost/interprocess/offset_ptr.hpp ] || apt_missing+=(libboost-dev)
[ -f /usr/include/lmdb.h ] || apt_missing+=(liblmdb-dev)

# `cairn bench spacejmp sam` and the genomics tests compare with the real samtools.
command -v samtools >/dev/null 2>&1 || apt_missing+=(samtools)

# The remote tier on Ceph RADOS (docs/REMOTE.md): librados to build against, and the
# daemons of the one-machine cluster its tests start (scripts/ceph-dev-cluster.sh).
command -v ceph-osd >/dev/null 2>&1 || apt_missing+=(ceph-mon ceph-osd ceph-common)
# The manager: `cairn bench remote` asks it for the placement groups' states.
command -v ceph-mgr >/dev/null 2>&1 || apt_missing+=(ceph-mgr)
[ -f /usr/include/rados/librados.h ] || apt_missing+=(librados-dev)

if ((${#apt_missing[@]})); then
    if ! command -v apt-get >/dev/null 2>&1; then
        log "missing ${apt_missing[*]} and there is no apt-get: install them by hand" >&2
        exit 1
    fi
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    log "installing ${apt_missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${apt_missing[@]}"
else
    log "system packages: nothing to install"
fi

# ---- Rust toolchain ----------------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1; then
    log "cargo not found; install Rust >= $RUST_MIN (rustup or your distribution)" >&2
    exit 1
fi
rust_version="$(rustc --version | awk '{print $2}')"
if [ "$(printf '%s\n%s\n' "$RUST_MIN" "$rust_version" | sort -V | head -n1)" != "$RUST_MIN" ]; then
    log "rustc $rust_version is older than the required $RUST_MIN" >&2
    exit 1
fi
log "rustc $rust_version, $(cargo --version)"

# rustfmt and clippy are needed by scripts/test.sh.
for comp in fmt clippy; do
    if ! cargo "$comp" --version >/dev/null 2>&1; then
        if command -v rustup >/dev/null 2>&1; then
            log "adding rustup component for cargo $comp"
            rustup component add "$([ "$comp" = fmt ] && echo rustfmt || echo clippy)"
        else
            pkg="$([ "$comp" = fmt ] && echo rustfmt || echo rust-clippy)"
            log "installing $pkg"
            SUDO=""
            if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
            DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$pkg"
        fi
    fi
done

# ---- Python packages --------------------------------------------------------------
# LMDB (crates/tests/tests/mapping.rs: two writer processes and a reader on a mapped
# database through the shim).
if ! python3 -c 'import lmdb' >/dev/null 2>&1; then
    log "installing the Python package lmdb"
    python3 -m pip install -q lmdb || python3 -m pip install -q --break-system-packages lmdb
fi
# The redis client (crates/tests/tests/kv_server.rs: against `cairn kv serve`).
if ! python3 -c 'import redis' >/dev/null 2>&1; then
    log "installing the Python package redis"
    python3 -m pip install -q redis || python3 -m pip install -q --break-system-packages redis
fi

# ---- Tools from crates.io ---------------------------------------------------------
# The POSIX conformance suite pjdfstest (crates/tests/tests/pjdfstest.rs), into
# ~/.cargo/bin (about 90 s to build on two cores, once).
if ! command -v pjdfstest >/dev/null 2>&1 && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/pjdfstest" ]; then
    log "installing pjdfstest (cargo install)"
    cargo install --quiet --locked pjdfstest --version 0.2.2
fi

# ---- Runtime ---------------------------------------------------------------------
# The NVM tier file lives on /dev/shm by default (tmpfs).
if [ ! -d /dev/shm ] || [ ! -w /dev/shm ]; then
    log "warning: /dev/shm is missing or not writable; give stores --nvm-path elsewhere" >&2
fi

# Fetch the crates now so that later steps need no network.
cargo fetch --locked >/dev/null 2>&1 || cargo fetch >/dev/null
log "done"
