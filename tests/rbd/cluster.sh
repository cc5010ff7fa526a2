#!/usr/bin/env bash
# A throw-away one-node Ceph cluster for the rbd tests: one mon, one MemStore OSD, optional mgr.
#
#   tests/rbd/cluster.sh start DIR [--mgr]   bootstrap in DIR (must not exist or be empty)
#   tests/rbd/cluster.sh stop DIR            stop every daemon of DIR (SIGTERM, bounded wait)
#   tests/rbd/cluster.sh status DIR          which daemons run; `ceph -s` when a mon answers
#   tests/rbd/cluster.sh osd-stop DIR        stop the OSD cleanly (its data survives: MemStore
#   tests/rbd/cluster.sh osd-start DIR       writes it out on a clean stop and reloads it)
#
# After start, DIR/ceph.conf is a complete client configuration: CEPH_CONF=DIR/ceph.conf
# with the default id (admin) or `--id blkd` (a user limited to `profile rbd` on pool rbd,
# keyring DIR/ceph.client.blkd.keyring) reaches pool "rbd" (size 1, namespace "ns1").
#
# Everything binds to 127.0.0.1; the mon port is one the kernel handed out a moment
# before (a port-0 bind, then closed): ceph-mon cannot be told to pick its own.  A
# failed start stops whatever it had started before it returns, so no daemon outlives
# the caller's trap either way.
#
# MemStore facts this configuration is built on (Ceph 16.2):
# - a full store hangs writes without an error: `memstore device bytes` is set well
#   above what the tests write (RBD_CLUSTER_BYTES, default 1 GiB, is only a cap);
# - its default layout allocates 64 KiB pages: the page set with 4 KiB pages keeps
#   random 4k writes from costing 16x their size;
# - it persists only on a clean stop, and `osd fast shutdown` skips that, so it is off;
#   a SIGKILLed OSD silently comes back at its last clean stop.  This script never
#   SIGKILLs an OSD unless a SIGTERM went unheeded for RBD_STOP_TIMEOUT seconds during
#   `stop` (teardown: the data is being thrown away).
set -euo pipefail

CMD=${1:-}
DIR=${2:-}
STEP_TIMEOUT=${RBD_STEP_TIMEOUT:-30}
STOP_TIMEOUT=${RBD_STOP_TIMEOUT:-60}
BYTES=${RBD_CLUSTER_BYTES:-1073741824}

die() { echo "cluster.sh: $*" >&2; exit 1; }
[ -n "$CMD" ] && [ -n "$DIR" ] || die "usage: $0 start|stop|status|osd-stop|osd-start DIR [--mgr]"
case $DIR in /*) ;; *) DIR=$PWD/$DIR ;; esac
CONF=$DIR/ceph.conf

# ceph CLI with a bounded wait for the mon: --connect-timeout covers the
# handshake, timeout(1) everything else (the python client can hang past it).
ceph_() { timeout "$STEP_TIMEOUT" ceph -c "$CONF" --connect-timeout 10 "$@"; }

pid_of() { local f=$DIR/run/$1.pid; [ -s "$f" ] && cat "$f"; }
alive() { local p; p=$(pid_of "$1") && kill -0 "$p" 2>/dev/null; }

# stop_daemon NAME [keep]: SIGTERM, wait, and only if it ignored that for
# STOP_TIMEOUT seconds, SIGKILL (teardown only: the caller discards the
# data).  With "keep" (osd-stop in the middle of a test) it never kills:
# a SIGKILLed MemStore OSD would come back silently rolled back.
stop_daemon() {
  local name=$1 keep=${2:-} pid i
  pid=$(pid_of "$name") || return 0
  kill -0 "$pid" 2>/dev/null || { rm -f "$DIR/run/$name.pid"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$DIR/run/$name.pid"; return 0; }
    sleep 0.1
  done
  [ -z "$keep" ] || die "$name (pid $pid) did not stop within ${STOP_TIMEOUT}s of SIGTERM"
  echo "cluster.sh: $name (pid $pid) ignored SIGTERM for ${STOP_TIMEOUT}s; killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$DIR/run/$name.pid"
}

# wait_pidfile NAME: a daemon forks and writes its pid file once it runs.
wait_pidfile() {
  local i
  for ((i = 0; i < STEP_TIMEOUT * 10; i++)); do
    alive "$1" && return 0
    sleep 0.1
  done
  die "$1 did not start (see $DIR/log/$1.log)"
}

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

write_conf() {
  local fsid=$1 port=$2
  cat >"$CONF" <<EOF
# Written by tests/rbd/cluster.sh: a one-node test cluster, not for production.
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$port]
public addr = 127.0.0.1
ms bind msgr1 = false
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
run dir = $DIR/run
pid file = $DIR/run/\$name.pid
admin socket = $DIR/run/\$name.asok
log file = $DIR/log/\$name.log
log to stderr = false
err to stderr = true
osd pool default size = 1
osd pool default min size = 1
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
# Bounded waits for clients that cannot reach the mon at all; an OSD that
# goes away makes requests wait (rados osd op timeout stays 0: forever).
client mount timeout = 20
rados mon op timeout = 20

[mon]
mon data = $DIR/mon/\$cluster-\$id
keyring = $DIR/mon/\$cluster-\$id/keyring
paxos propose interval = 0.1

[osd]
osd data = $DIR/osd/\$cluster-\$id
keyring = $DIR/osd/\$cluster-\$id/keyring
osd objectstore = memstore
memstore device bytes = $BYTES
memstore page set = true
memstore page size = 4096
osd fast shutdown = false
osd crush update on start = true
osd max object name len = 256
osd max object namespace len = 64

[mgr]
mgr data = $DIR/mgr/\$cluster-\$id
keyring = $DIR/mgr/\$cluster-\$id/keyring

[client]
keyring = $DIR/\$cluster.\$name.keyring
EOF
}

start_osd() {
  ceph-osd -c "$CONF" -i 0 2>>"$DIR/log/osd.0.stderr" || die "ceph-osd did not start (see $DIR/log/osd.0.log)"
  wait_pidfile osd.0
}

# ceph osd stat --format json: {"num_osds":1,"num_up_osds":1,...}
wait_osd_up() {
  local i
  for ((i = 0; i < STEP_TIMEOUT * 5; i++)); do
    if grep -q '"num_up_osds":1' <<<"$(ceph_ osd stat --format json 2>/dev/null)"; then return 0; fi
    sleep 0.2
  done
  die "osd.0 is not up after ${STEP_TIMEOUT}s (see $DIR/log/osd.0.log)"
}

cmd_start() {
  local with_mgr=0 fsid port osd_uuid t0
  [ "${1:-}" = --mgr ] && with_mgr=1
  for b in ceph-mon ceph-osd ceph-authtool monmaptool ceph rbd uuidgen; do
    command -v "$b" >/dev/null || die "$b is not installed"
  done
  [ $with_mgr = 0 ] || command -v ceph-mgr >/dev/null || die "ceph-mgr is not installed"
  if [ -e "$DIR" ] && [ -n "$(ls -A "$DIR")" ]; then die "$DIR is not empty"; fi
  t0=$(date +%s.%N)
  mkdir -p "$DIR"/{run,log,mon/ceph-a,osd/ceph-0}
  fsid=$(uuidgen)
  osd_uuid=$(uuidgen)
  port=$(free_port)
  write_conf "$fsid" "$port"
  # From here on, a failure stops whatever was started.
  trap 'rc=$?; [ $rc = 0 ] || cmd_stop; exit $rc' EXIT

  local mk=$DIR/mon.keyring
  ceph-authtool --create-keyring "$mk" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$DIR/ceph.client.admin.keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
  ceph-authtool --create-keyring "$DIR/osd/ceph-0/keyring" --gen-key -n osd.0 \
    --cap mon 'allow profile osd' --cap mgr 'allow profile osd' --cap osd 'allow *' >/dev/null
  ceph-authtool "$mk" --import-keyring "$DIR/ceph.client.admin.keyring" >/dev/null
  ceph-authtool "$mk" --import-keyring "$DIR/osd/ceph-0/keyring" >/dev/null
  if [ $with_mgr = 1 ]; then
    mkdir -p "$DIR/mgr/ceph-x"
    ceph-authtool --create-keyring "$DIR/mgr/ceph-x/keyring" --gen-key -n mgr.x \
      --cap mon 'allow profile mgr' --cap osd 'allow *' --cap mds 'allow *' >/dev/null
    ceph-authtool "$mk" --import-keyring "$DIR/mgr/ceph-x/keyring" >/dev/null
  fi
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" "$DIR/monmap" >/dev/null
  timeout "$STEP_TIMEOUT" ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$mk" \
    || die "ceph-mon --mkfs failed (see $DIR/log/mon.a.log)"
  ceph-mon -c "$CONF" -i a || die "ceph-mon did not start (see $DIR/log/mon.a.log)"
  wait_pidfile mon.a

  [ "$(ceph_ osd create "$osd_uuid")" = 0 ] || die "ceph osd create did not give id 0"
  timeout "$STEP_TIMEOUT" ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" \
    >"$DIR/log/osd-mkfs.out" 2>&1 || die "ceph-osd --mkfs failed (see $DIR/log/osd-mkfs.out)"
  start_osd
  if [ $with_mgr = 1 ]; then
    ceph-mgr -c "$CONF" -i x || die "ceph-mgr did not start"
    wait_pidfile mgr.x
  fi
  wait_osd_up

  ceph_ osd pool create rbd 8 8 >/dev/null 2>&1 || die "ceph osd pool create failed"
  ceph_ osd pool set rbd size 1 --yes-i-really-mean-it >/dev/null 2>&1 || die "ceph osd pool set failed"
  # rbd pool init writes to the pool, so it also waits for its PGs.
  timeout "$STEP_TIMEOUT" rbd -c "$CONF" pool init rbd || die "rbd pool init timed out"
  timeout "$STEP_TIMEOUT" rbd -c "$CONF" namespace create rbd/ns1
  ceph_ auth get-or-create client.blkd mon 'profile rbd' osd 'profile rbd pool=rbd' \
    mgr 'profile rbd pool=rbd' -o "$DIR/ceph.client.blkd.keyring" 2>/dev/null
  trap - EXIT
  echo "cluster up in $(echo "$(date +%s.%N) - $t0" | bc | sed 's/^\./0./' | cut -c1-5)s: CEPH_CONF=$CONF"
}

cmd_stop() {
  [ -d "$DIR/run" ] || return 0
  # The OSD first, while the mon it reports to is still there.
  stop_daemon osd.0
  stop_daemon mgr.x
  stop_daemon mon.a
}

cmd_status() {
  local n rc=0
  for n in mon.a osd.0 mgr.x; do
    if alive "$n"; then echo "$n: running (pid $(pid_of "$n"))"
    elif [ -e "$DIR/run/$n.pid" ]; then echo "$n: dead"; rc=1
    fi
  done
  alive mon.a && STEP_TIMEOUT=10 ceph_ -s || true
  return $rc
}

shift 2
case $CMD in
  start) cmd_start "$@" ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  osd-stop) stop_daemon osd.0 keep ;;
  osd-start) alive osd.0 || start_osd ;;
  *) die "unknown command $CMD" ;;
esac
