#!/usr/bin/env bash
# Attach the export as a disk and put a file system on it: the kernel has
# no nbd driver here, so qemu-storage-daemon connects to the server and
# exports the disk as a FUSE file; losetup turns that into a block device;
# mkfs.ext4, mount, write files, unmount, e2fsck -fn must be clean; then a
# new qemu-storage-daemon (new NBD connection) remounts and the checksums
# must be equal.  Without loop devices the file system is made and checked
# directly on the FUSE file, and debugfs writes and reads a file in it.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
need_server
[ "$(id -u)" -eq 0 ] || skip "needs root (FUSE export, losetup, mount)"
[ -c /dev/fuse ] || skip "no /dev/fuse"
need qemu-storage-daemon
need mkfs.ext4
need e2fsck
need debugfs

QSD_PID="" LOOP="" MNT="$TMP/mnt" DISK="$TMP/disk"
attach_cleanup() {
  if mountpoint -q "$MNT" 2>/dev/null; then umount "$MNT" || umount -l "$MNT" || true; fi
  [ -n "$LOOP" ] && losetup -d "$LOOP" 2>/dev/null || true
  stop_qsd
}
trap 'rc=$?; attach_cleanup; cleanup "$rc"' EXIT
mkdir -p "$MNT"
touch "$DISK"

start_qsd() {
  qemu-storage-daemon \
    --blockdev "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=$PORT,node-name=disk,cache.direct=on" \
    --export type=fuse,id=exp,node-name=disk,mountpoint="$DISK",writable=on \
    >>"$TMP/qsd.log" 2>&1 &
  QSD_PID=$!
  local i
  for ((i = 0; i < 200; i++)); do
    if [ "$(stat -c %s "$DISK" 2>/dev/null)" = 268435456 ]; then return 0; fi
    if ! kill -0 "$QSD_PID" 2>/dev/null; then
      cat "$TMP/qsd.log"
      if grep -qi 'fuse' "$TMP/qsd.log"; then skip "qemu-storage-daemon cannot export over FUSE here"; fi
      fail "qemu-storage-daemon exited"
    fi
    sleep 0.05
  done
  cat "$TMP/qsd.log"; fail "the FUSE export did not appear at $DISK"
}
stop_qsd() {
  if [ -n "$QSD_PID" ]; then
    kill "$QSD_PID" 2>/dev/null || true
    wait "$QSD_PID" 2>/dev/null || true
    QSD_PID=""
  fi
  if grep -q " $DISK fuse" /proc/mounts; then fusermount3 -u "$DISK" 2>/dev/null || umount "$DISK" || true; fi
}

start_server memory size=256M
echo "# qemu-storage-daemon: NBD blockdev -> FUSE file"
start_qsd
expect_eq "$(stat -c %s "$DISK")" 268435456 "size of the FUSE file"

# Files to put on the file system: random contents, a few sizes.
mkdir -p "$TMP/files"
for f in a:4096 b:1048576 c:7340033 d:17; do
  head -c "${f#*:}" /dev/urandom >"$TMP/files/${f%%:*}"
done
(cd "$TMP/files" && sha256sum a b c d) >"$TMP/sums"

# BLKD_TEST_NO_LOOP=1 forces the no-loop path (to test it where loop works).
if [ -n "${BLKD_TEST_NO_LOOP:-}" ]; then echo "forced by BLKD_TEST_NO_LOOP" >"$TMP/losetup.err"; fi
if [ -z "${BLKD_TEST_NO_LOOP:-}" ] && LOOP=$(losetup -f --show "$DISK" 2>"$TMP/losetup.err"); then
  echo "# loop device $LOOP on the FUSE file"
  mkfs.ext4 -q -F -L blkdtest "$LOOP" || fail "mkfs.ext4 on $LOOP failed"
  ok "mkfs.ext4 on the loop device"
  mount "$LOOP" "$MNT" || fail "mount $LOOP failed"
  ok "mounted"
  cp "$TMP/files/"* "$MNT/"
  mkdir "$MNT/dir"
  for i in $(seq 1 50); do echo "file $i" >"$MNT/dir/f$i"; done
  dd if=/dev/urandom of="$MNT/big" bs=1M count=32 status=none conv=fsync
  sha256sum "$MNT/big" | cut -d' ' -f1 >"$TMP/big.sum"
  rm "$MNT/dir/f7"
  sync
  umount "$MNT" || fail "umount failed"
  ok "files written, unmounted"
  e2fsck -fn "$LOOP" >"$TMP/fsck.out" 2>&1 || { cat "$TMP/fsck.out"; fail "e2fsck -fn reports problems"; }
  ok "e2fsck -fn clean"
  losetup -d "$LOOP"; LOOP=""

  echo "# new qemu-storage-daemon (new NBD connection), remount, compare"
  stop_qsd
  start_qsd
  debugfs -R "cat /d" "$DISK" >"$TMP/d.debugfs" 2>/dev/null || fail "debugfs cat /d failed"
  cmp "$TMP/d.debugfs" "$TMP/files/d" || fail "debugfs reads /d differently"
  ok "debugfs reads /d from the FUSE file without mounting"
  LOOP=$(losetup -f --show "$DISK") || fail "second losetup failed"
  mount "$LOOP" "$MNT" || fail "remount failed"
  (cd "$MNT" && sha256sum -c "$TMP/sums") || fail "checksums differ after remount"
  expect_eq "$(sha256sum "$MNT/big" | cut -d' ' -f1)" "$(cat "$TMP/big.sum")" "sha256 of the 32 MiB file after remount"
  expect_eq "$(ls "$MNT/dir" | wc -l)" 49 "files in dir after remount"
  expect_eq "$(cat "$MNT/dir/f42")" "file 42" "contents of dir/f42"
  umount "$MNT"
  e2fsck -fn "$LOOP" >"$TMP/fsck.out" 2>&1 || { cat "$TMP/fsck.out"; fail "e2fsck -fn after remount reports problems"; }
  ok "e2fsck -fn clean after the remount"
  losetup -d "$LOOP"; LOOP=""
else
  note "losetup failed ($(cat "$TMP/losetup.err")): loop mount not tested; file system checked on the FUSE file directly"
  mkfs.ext4 -q -F -L blkdtest "$DISK" || fail "mkfs.ext4 on the FUSE file failed"
  ok "mkfs.ext4 on the FUSE file"
  for f in a b c d; do
    debugfs -w -R "write $TMP/files/$f $f" "$DISK" >/dev/null 2>&1 || fail "debugfs write $f failed"
  done
  ok "debugfs wrote 4 files"
  e2fsck -fn "$DISK" >"$TMP/fsck.out" 2>&1 || { cat "$TMP/fsck.out"; fail "e2fsck -fn reports problems"; }
  ok "e2fsck -fn clean"
  echo "# new qemu-storage-daemon (new NBD connection), read back with debugfs"
  stop_qsd
  start_qsd
  for f in a b c d; do
    debugfs -R "cat $f" "$DISK" >"$TMP/$f.back" 2>/dev/null || fail "debugfs cat $f failed"
    cmp "$TMP/$f.back" "$TMP/files/$f" || fail "file $f differs after reattaching"
  done
  ok "4 files read back exactly through a new connection"
fi

stop_qsd
check_alive
echo "all attach checks passed"
