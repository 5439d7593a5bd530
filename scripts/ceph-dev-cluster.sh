#!/usr/bin/env bash
# A Ceph cluster on this machine, for Cairn's remote-tier tests and for trying the remote
# tier: one monitor and N OSDs on 127.0.0.1, no systemd, no containers, everything
# (configuration, keys, data, logs, pid files) under one directory.
#
#   scripts/ceph-dev-cluster.sh start [--dir DIR] [--osds N] [--objectstore memstore|bluestore]
#                                     [--port P] [--pool NAME] [--size N] [--min-size N]
#                                     [--mgr] [--osd-gb G]
#   scripts/ceph-dev-cluster.sh stop [--dir DIR] [--keep]
#   scripts/ceph-dev-cluster.sh status [--dir DIR]
#   scripts/ceph-dev-cluster.sh kill-osd ID [--dir DIR]     (SIGKILL, for fault tests)
#   scripts/ceph-dev-cluster.sh start-osd ID [--dir DIR]    (start a stopped OSD again)
#   scripts/ceph-dev-cluster.sh pause|resume [--dir DIR]    (SIGSTOP/SIGCONT every daemon:
#                                                            the cluster stops answering)
#
# `start` prints `CEPH_CONF=DIR/ceph.conf` last; `rados -c DIR/ceph.conf -p POOL ...` and
# librados clients use that file (it names the admin keyring). Defaults: DIR
# /tmp/cairn-ceph, 1 OSD, memstore (RAM, --osd-gb GiB per OSD, default 1; bluestore uses a
# sparse file of --osd-gb GiB, default 20, per OSD), monitor ports P (v1) and P+1 (v2) with P = 16789,
# pool `cairn` with as many replicas as OSDs (at most 3) and min_size 1 for one replica,
# 2 otherwise. `stop` sends SIGTERM to exactly the daemons whose pid files are in DIR/run,
# SIGKILL after 10 s, and removes DIR unless --keep. The packages come from
# scripts/setup.sh (ceph-mon, ceph-osd, ceph-common; ceph-mgr for --mgr).
set -euo pipefail

cmd="${1:-}"
[ $# -gt 0 ] && shift
DIR=/tmp/cairn-ceph
OSDS=1
STORE=memstore
# Below Linux's ephemeral port range (32768-60999), where an outgoing connection may
# hold the port.
PORT=16789
POOL=cairn
SIZE=""
MIN_SIZE=""
MGR=0
OSD_GB=""
KEEP=0
OSD_ID=""
case "$cmd" in
    kill-osd | start-osd)
        OSD_ID="${1:?an OSD id}"
        shift
        ;;
esac
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) DIR="$2"; shift 2 ;;
        --osds) OSDS="$2"; shift 2 ;;
        --objectstore) STORE="$2"; shift 2 ;;
        --port) PORT="$2"; shift 2 ;;
        --pool) POOL="$2"; shift 2 ;;
        --size) SIZE="$2"; shift 2 ;;
        --min-size) MIN_SIZE="$2"; shift 2 ;;
        --mgr) MGR=1; shift ;;
        --osd-gb) OSD_GB="$2"; shift 2 ;;
        --keep) KEEP=1; shift ;;
        *) echo "ceph-dev-cluster: unknown option $1" >&2; exit 2 ;;
    esac
done
CONF="$DIR/ceph.conf"
log() { echo "ceph-dev-cluster: $*" >&2; }
die() { log "$*"; exit 1; }
ceph_() { timeout 60 ceph -c "$CONF" "$@"; }

# The daemons this directory's pid files name that are alive.
live_pids() {
    local f p
    for f in "$DIR"/run/*.pid; do
        [ -e "$f" ] || continue
        p="$(cat "$f" 2>/dev/null || true)"
        [ -n "$p" ] && kill -0 "$p" 2>/dev/null && echo "$p"
    done
    return 0
}

stop() {
    local pids p i
    pids="$(live_pids)"
    if [ -n "$pids" ]; then
        # shellcheck disable=SC2086
        kill -CONT $pids 2>/dev/null || true # paused ones too
        # shellcheck disable=SC2086
        kill -TERM $pids 2>/dev/null || true
        for i in $(seq 100); do
            [ -z "$(live_pids)" ] && break
            sleep 0.1
        done
        for p in $(live_pids); do
            log "pid $p did not stop in 10 s: SIGKILL"
            kill -KILL "$p" 2>/dev/null || true
        done
    fi
    if [ "$KEEP" = 0 ] && [ -f "$CONF" ]; then
        rm -rf "$DIR"
    fi
}

start_osd() {
    local id="$1"
    ceph-osd -c "$CONF" -i "$id" >>"$DIR/log/osd.$id.start.log" 2>&1 ||
        die "osd.$id did not start (see $DIR/log/osd.$id.log)"
}

start() {
    for b in ceph-mon ceph-osd ceph monmaptool ceph-authtool rados; do
        command -v "$b" >/dev/null || die "$b is missing: run scripts/setup.sh (Debian's ceph packages)"
    done
    [ "$MGR" = 0 ] || command -v ceph-mgr >/dev/null || die "ceph-mgr is missing"
    [ -n "$(live_pids 2>/dev/null || true)" ] && die "a cluster already runs in $DIR (stop it first)"
    case "$STORE" in memstore | bluestore) ;; *) die "--objectstore memstore or bluestore" ;; esac
    [ -n "$OSD_GB" ] || OSD_GB=$([ "$STORE" = memstore ] && echo 1 || echo 20)
    [ -n "$SIZE" ] || SIZE=$((OSDS < 3 ? OSDS : 3))
    [ -n "$MIN_SIZE" ] || MIN_SIZE=$((SIZE == 1 ? 1 : 2))
    rm -rf "$DIR"
    mkdir -p "$DIR"/{mon,osd,run,log}
    local t0 fsid v1 v2
    t0=$(date +%s%N)
    fsid="$(cat /proc/sys/kernel/random/uuid)"
    v1="127.0.0.1:$PORT"
    v2="127.0.0.1:$((PORT + 1))"
    cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon_host = [v2:$v2,v1:$v1]
public_network = 127.0.0.1/32
ms_bind_ipv6 = false
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
keyring = $DIR/keyring
run_dir = $DIR/run
pid_file = $DIR/run/\$name.pid
admin_socket = $DIR/run/\$name.asok
log_file = $DIR/log/\$name.log
# One machine: replicas on different OSDs, not hosts; small pools allowed.
osd_crush_chooseleaf_type = 0
osd_pool_default_size = $SIZE
osd_pool_default_min_size = $MIN_SIZE
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_data_avail_warn = 5
# Faults noticed and repaired quickly (file-backed OSDs count as "hdd").
mon_osd_down_out_interval = 10
osd_heartbeat_grace = 6
osd_recovery_sleep_hdd = 0
osd_recovery_max_active = 16
osd_max_backfills = 16
# One OSD, no peers to fail over to: a read lease of 100 x 6 s. With the default (0.8 x
# 6 s), Ceph 16.2 leaves a placement group whose lease ran out while the OSD was
# stopped (pause) "laggy" for ever, and its reads wait for ever. Several OSDs keep the
# default, which bounds how long reads wait after an OSD fails.
osd_pool_default_read_lease_ratio = $([ "$OSDS" = 1 ] && echo 100 || echo 0.8)
[mon]
mon_data = $DIR/mon/\$name
[osd]
osd_data = $DIR/osd/\$id
keyring = $DIR/osd/\$id/keyring
osd_objectstore = $STORE
memstore_device_bytes = $((OSD_GB << 30))
bluestore_block_create = true
bluestore_block_size = $((OSD_GB << 30))
osd_memory_target = 1073741824
[mgr]
mgr_data = $DIR/mgr/\$name
EOF
    ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph-authtool "$DIR/keyring" --gen-key -n client.admin --cap mon 'allow *' \
        --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
    monmaptool --create --fsid "$fsid" --addv a "[v2:$v2,v1:$v1]" "$DIR/monmap" >/dev/null
    ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/keyring"
    ceph-mon -c "$CONF" -i a >>"$DIR/log/mon.a.start.log" 2>&1 || die "the monitor did not start (see $DIR/log/mon.a.log)"
    if [ "$MGR" = 1 ]; then
        mkdir -p "$DIR/mgr/mgr.x"
        ceph_ auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
            >"$DIR/mgr/mgr.x/keyring"
        ceph-mgr -c "$CONF" -i x --keyring "$DIR/mgr/mgr.x/keyring" || die "ceph-mgr did not start"
    fi
    # The OSDs: made in parallel (mkfs is most of the time), then started.
    local i id uuid
    local -a ids=()
    for i in $(seq 0 $((OSDS - 1))); do
        uuid="$(cat /proc/sys/kernel/random/uuid)"
        id="$(ceph_ osd new "$uuid")"
        mkdir -p "$DIR/osd/$id"
        ceph_ auth get-or-create "osd.$id" mon 'allow profile osd' mgr 'allow profile osd' \
            osd 'allow *' >"$DIR/osd/$id/keyring"
        ceph-osd -c "$CONF" -i "$id" --mkfs --osd-uuid "$uuid" >"$DIR/log/osd.$id.mkfs.log" 2>&1 &
        ids+=("$id")
    done
    wait || die "ceph-osd --mkfs failed (see $DIR/log/osd.*.mkfs.log)"
    for id in "${ids[@]}"; do
        start_osd "$id"
    done
    ceph_ osd pool create "$POOL" 16 >/dev/null 2>&1
    ceph_ osd pool set "$POOL" size "$SIZE" --yes-i-really-mean-it >/dev/null 2>&1
    ceph_ osd pool set "$POOL" min_size "$MIN_SIZE" >/dev/null 2>&1
    ceph_ osd pool application enable "$POOL" cairn >/dev/null 2>&1 || true
    # Ready once an object can be written (the placement groups are active).
    local probe="$DIR/run/probe"
    echo probe >"$probe"
    local ready=0
    for i in $(seq 120); do
        if timeout 10 rados -c "$CONF" -p "$POOL" put cairn-probe "$probe" 2>/dev/null; then
            rados -c "$CONF" -p "$POOL" rm cairn-probe 2>/dev/null || true
            ready=1
            break
        fi
        sleep 0.5
    done
    [ "$ready" = 1 ] || die "the pool $POOL takes no writes after a minute (see $DIR/log)"
    log "$OSDS OSD(s) ($STORE), pool $POOL size $SIZE min_size $MIN_SIZE, monitor on $v1, ready in $((($(date +%s%N) - t0) / 1000000)) ms"
    echo "CEPH_CONF=$CONF"
}

case "$cmd" in
    start)
        # A failed start leaves nothing running.
        trap 'st=$?; if [ $st -ne 0 ]; then KEEP=1 stop; log "start failed; logs kept in $DIR/log"; fi' EXIT
        start
        trap - EXIT
        ;;
    stop) stop ;;
    status)
        [ -f "$CONF" ] || die "no cluster in $DIR"
        echo "daemons: $(live_pids | wc -l) running"
        ceph_ osd stat
        ceph_ df 2>/dev/null | sed -n '1,12p' || true
        ;;
    kill-osd)
        p="$(cat "$DIR/run/osd.$OSD_ID.pid" 2>/dev/null)" || die "no osd.$OSD_ID in $DIR"
        kill -KILL "$p"
        log "osd.$OSD_ID (pid $p) killed"
        ;;
    start-osd) start_osd "$OSD_ID" ;;
    pause | resume)
        pids="$(live_pids)"
        [ -n "$pids" ] || die "no daemons of $DIR run"
        sig=STOP
        [ "$cmd" = resume ] && sig=CONT
        # shellcheck disable=SC2086
        kill -$sig $pids
        log "$cmd: SIG$sig sent to $(echo $pids | wc -w) daemon(s)"
        ;;
    *)
        sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
