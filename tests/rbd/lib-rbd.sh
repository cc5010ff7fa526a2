# Shared by the rbd tests: a cluster of the test's own, the plugin under blkd or nbdkit. Source it.
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
# Every rbd test runs against blkd and against nbdkit: the *-nbdkit.sh
# wrappers set PLUGIN_HOST=nbdkit.
PLUGIN_HOST=${PLUGIN_HOST:-blkd}
RBD_SO=$TOP/plugins/rbd/nbdkit-rbd-plugin.so
CLUSTER=$TOP/tests/rbd/cluster.sh
PY=/usr/bin/python3

for b in ceph-mon ceph-osd ceph-authtool monmaptool ceph rbd uuidgen; do need "$b"; done
need nbdinfo
[ -f "$RBD_SO" ] || skip "$RBD_SO is not built (librbd-dev missing? make WITH_RBD=1)"
[ "$PLUGIN_HOST" = blkd ] || need nbdkit

# The cluster goes down after the servers (its clients) and before $TMP.
rbd_cleanup() {
  local rc=${1:-$?}
  stop_servers
  [ -d "$TMP/ceph" ] && "$CLUSTER" stop "$TMP/ceph"
  cleanup "$rc"
}
trap rbd_cleanup EXIT

# cluster_up: bootstrap the test's cluster; sets CEPH_CONF (exported, so
# the rbd CLI and the plugin's default both find it).
cluster_up() {
  if ! "$CLUSTER" start "$TMP/ceph" "$@"; then
    tail -n 30 "$TMP"/ceph/log/*.log >&2 2>/dev/null || true
    fail "the test cluster did not start"
  fi
  export CEPH_CONF=$TMP/ceph/ceph.conf
}

rbd_() { timeout 60 rbd "$@"; }

# serve ARGS...: the plugin with ARGS under PLUGIN_HOST, as the
# rbd-limited user; sets PORT, URI, SERVER_PID.
# Under blkd with metrics, so aio_count can tell which path requests took;
# RBD_EXTRA adds plugin parameters to every server (aio=false).
serve() {
  if [ "$PLUGIN_HOST" = blkd ]; then
    start_server blkd --metrics 127.0.0.1:0 "$RBD_SO" conf="$CEPH_CONF" id=blkd ${RBD_EXTRA:-} "$@"
  else
    start_server nbdkit "$RBD_SO" conf="$CEPH_CONF" id=blkd ${RBD_EXTRA:-} "$@"
  fi
}

# aio_count: requests the plugin completed through blkd's aio calls so far
# (blkd_plugin_aio_total); "" under nbdkit.
aio_count() {
  [ "$PLUGIN_HOST" = blkd ] || return 0
  curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" | awk '$1 == "blkd_plugin_aio_total" { print $2 }'
}

# request_count: reads and writes blkd answered so far (blkd_requests_total).
request_count() {
  curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" \
    | awk '$1 ~ /^blkd_requests_total[{]cmd="(read|write)"[}]$/ { n += $2 } END { print n + 0 }'
}

# check_aio_path BEFORE: under blkd, requests since BEFORE went through the
# aio calls -- or, with aio=false, none did.  With RBD_SOME_ON_WORKERS=1
# (a tiny librados throttle), some must have gone to the workers too.
check_aio_path() {
  [ "$PLUGIN_HOST" = blkd ] || return 0
  local now all; now=$(aio_count); all=$(request_count)
  [ -n "$now" ] || fail "no blkd_plugin_aio_total in /metrics"
  case " ${RBD_EXTRA:-} " in
    *" aio=false "*) [ "$now" = "$1" ] || fail "aio=false, yet $((now - $1)) requests took the aio path" ;;
    *) [ "$now" -gt "$1" ] || fail "no request took the aio path ($now)" ;;
  esac
  if [ "${RBD_SOME_ON_WORKERS:-0}" = 1 ] && [ "$now" -ge "$all" ]; then
    fail "every request ($all) took the aio path: none was sent to the workers"
  fi
  echo "aio requests: $1 -> $now; reads and writes: $all"
}

# start_fails WANT ARGS...: the server must exit non-zero, within 60 s,
# printing a line matching WANT.
start_fails() {
  local want=$1 rc=0 bin=$BLKD; shift
  [ "$PLUGIN_HOST" = nbdkit ] && bin=nbdkit
  timeout 60 "$bin" -f -i 127.0.0.1 -p 0 "$RBD_SO" "$@" >"$TMP/fail.log" 2>&1 || rc=$?
  cat "$TMP/fail.log"
  [ $rc -ne 0 ] || fail "the server started with $*"
  [ $rc -ne 124 ] || fail "the server hung (still starting after 60 s) with $*"
  grep -qE "$want" "$TMP/fail.log" || fail "no message matching '$want' for $*"
}

# sum_nbd URI: md5 of the export's whole content.
sum_nbd() { nbdcopy "$1" - | md5sum | cut -d' ' -f1; }

# nbdpy URI CODE: run CODE with h connected to URI (nbdsh wants the
# system interpreter, which is $PY).
nbdpy() {
  $PY -c 'import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1]); exec(sys.argv[2])' "$1" "$2"
}
