#!/usr/bin/env bash
# The rbd plugin's errors a user can act on: no cluster, bad or missing keyring, missing pool,
# image or snapshot -- each a clear message, none a hang, and the server keeps serving.
. "$(dirname "$0")/lib-rbd.sh"
cluster_up
rbd_ create --size 8M img1

# No monitor at the configured address: start-up fails within connect-timeout.
dead_port
sed -E "s/^mon host = .*/mon host = [v2:127.0.0.1:$DEAD_PORT]/" "$CEPH_CONF" >"$TMP/dead.conf"
start_fails 'no monitor answered within client_mount_timeout=3(\.0*)? s' conf="$TMP/dead.conf" \
  id=blkd connect-timeout=3 image=img1
# A Ceph option given as a parameter wins over the plugin's own setting of
# it: client_mount_timeout=2 over connect-timeout's default (20).
start_fails 'within client_mount_timeout=2(\.0*)? s' conf="$TMP/dead.conf" id=blkd \
  client_mount_timeout=2 image=img1

# A keyring with the wrong key, and one that is not there.
ceph-authtool --create-keyring "$TMP/bad.keyring" --gen-key -n client.blkd >/dev/null
start_fails 'authentication failed|Permission denied|Operation not permitted' \
  conf="$CEPH_CONF" id=blkd keyring="$TMP/bad.keyring" image=img1
start_fails 'keyring=.*No such file' conf="$CEPH_CONF" id=blkd keyring="$TMP/none" image=img1
start_fails 'no keyring found|No such file' conf="$CEPH_CONF" id=nobody image=img1
start_fails 'conf=.*No such file' conf="$TMP/none.conf" image=img1
start_fails "pool 'nopool'.*no such pool" conf="$CEPH_CONF" id=blkd pool=nopool
start_fails "unknown parameter 'colour'" conf="$CEPH_CONF" colour=blue
start_fails "rbd_colour=blue.*not a Ceph option" conf="$CEPH_CONF" id=blkd rbd_colour=blue image=img1
start_fails "dispatch=loop: expected caller or librbd" conf="$CEPH_CONF" id=blkd dispatch=loop image=img1
start_fails "rbd_non_blocking_aio=false: say dispatch=caller" conf="$CEPH_CONF" id=blkd \
  rbd_non_blocking_aio=false image=img1
start_fails "rbd_non_blocking_aio=1: say dispatch=caller" conf="$CEPH_CONF" id=blkd \
  rbd_non-blocking_aio=1 image=img1            # Ceph reads '-' as '_'

# A missing image or snapshot is refused at connect, with the reason in
# the server's log, and the server goes on serving what exists.
serve image=img1
log_at=$(stat -c %s "$TMP/server.log")
if nbdinfo "$URI/nope" >"$TMP/c.out" 2>&1; then fail "export 'nope' was served"; fi
grep -q "no image 'nope' in pool 'rbd'" "$TMP/server.log" || fail "no message for a missing image"
[ "$(nbdinfo --size "$URI")" = $((8 << 20)) ] || fail "the server stopped serving img1"
stop_server

serve image=img1 snap=nosnap
if nbdinfo "$URI" >"$TMP/c.out" 2>&1; then fail "a missing snapshot was served"; fi
grep -q "image 'img1' has no snapshot 'nosnap'" "$TMP/server.log" || fail "no message for a missing snapshot"
stop_server

# No export name and no image=: the client is told to name an image.
serve
if nbdinfo "$URI" >"$TMP/c.out" 2>&1; then fail "an empty export name was served without image="; fi
grep -q "image= is not set" "$TMP/server.log" || fail "no message for an empty export name"
[ "$(nbdinfo --size "$URI/img1")" = $((8 << 20)) ] || fail "export img1 by name"
echo "ok ($PLUGIN_HOST)"
