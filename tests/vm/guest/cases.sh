# Guest cases, run by /vm/run.sh as: sh /vm/cases.sh CASE SERVER [ARGS...]
# SERVER is blkd or nbdkit: the same steps run against both.  Servers are
# started on the host by the control service (tests/vm/control.py) at
# 192.0.2.2:$VM_CTLPORT; the guest reaches them at 192.0.2.2 too.
# A case ends with exit 0 (pass), 77 (skip) or anything else (fail); its
# one-line detail goes to /tmp/case.detail.
# Debian's busybox shell runs its own applets before PATH: tools that
# busybox also has (blkdiscard) are called by their full path.
H=192.0.2.2
NBD=/dev/nbd0
CASE=$1
SRV=${2:-blkd}
shift 2 2>/dev/null || shift $#
SID=$SRV-$CASE

say() { echo "# $*"; }
note() { echo "$*" >>/tmp/case.detail; }
fail() { echo "FAIL: $*"; note "$*"; exit 1; }
skip() { note "$*"; exit 77; }

# ctl CMD ARGS: one command to the host's control service; prints the reply.
ctl() { echo "$*" | timeout 60 nc "$H" "$VM_CTLPORT"; }
# ctl_ok CMD ARGS: the reply's words after OK, or the case fails.
ctl_ok() {
  r=$(ctl "$@")
  case $r in OK*) echo "${r#OK }" ;; *) fail "ctl $1: ${r:-no reply}" ;; esac
}

# serve ID ARGS...: start SERVER with ARGS as server ID; sets PORT.
serve() {
  SID=$1; shift
  r=$(ctl start "$SID" "$SRV" "$@")
  case $r in OK*) set -- $r; PORT=$2 ;; *) fail "start $SID: $r" ;; esac
  say "$SRV $SID on port $PORT"
}

# plugin NAME SIZE: PLUG becomes the plugin's arguments (Debian's memory
# and file, blkd's ram and rawio with O_DIRECT); file-backed plugins get a
# sparse host file of SIZE bytes named after $SID.
plugin() {
  case $1 in
    memory) PLUG="memory size=$2" ;;
    ram) PLUG="@TOP@/plugins/ram/nbdkit-ram-plugin.so size=$2" ;;
    file) ctl_ok mkfile "$SID.img" "$2" >/dev/null || exit 1
          PLUG="file file=@TMP@/$SID.img" ;;
    rawio) ctl_ok mkfile "$SID.img" "$2" >/dev/null || exit 1
           PLUG="@TOP@/plugins/rawio/nbdkit-rawio-plugin.so file=@TMP@/$SID.img direct=true" ;;
    *) fail "unknown plugin $1" ;;
  esac
}

# attach ARGS...: nbd-client to $PORT on /dev/nbd0 (netlink unless -L),
# then wait until the kernel shows the size.
attach() {
  say "nbd-client $H $PORT $NBD $*"
  timeout 60 nbd-client "$H" "$PORT" "$NBD" "$@" || fail "nbd-client $* failed"
  i=0
  while [ "$(cat /sys/block/nbd0/size)" = 0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  [ "$(cat /sys/block/nbd0/size)" != 0 ] || fail "nbd0 has no size after attach"
}

detach() { timeout 30 nbd-client -d "$NBD" >/dev/null 2>&1 || true; }

size_bytes() { echo $(($(cat /sys/block/nbd0/size) * 512)); }
# stat_field N: field N of /sys/block/nbd0/stat (1 read ios, 3 read
# sectors, 5 write ios, 7 write sectors, 12 discard ios).
stat_field() { awk -v n="$1" '{ print $n }' /sys/block/nbd0/stat; }

# raise_max_sectors: max_sectors_kb up to what the driver allows; prints it.
raise_max_sectors() {
  q=/sys/block/nbd0/queue
  cat $q/max_hw_sectors_kb >$q/max_sectors_kb 2>/dev/null
  cat $q/max_sectors_kb
}

# fio_verify NAME ARGS...: a verified fio job on /dev/nbd0 (fails the case
# on any error or verify mismatch).
fio_verify() {
  n=$1; shift
  fio --name="$n" --filename="$NBD" --ioengine=libaio --direct=1 \
      --verify=crc32c --verify_fatal=1 --do_verify=1 --group_reporting \
      --output-format=terse --terse-version=3 "$@" >/tmp/fio.$n 2>&1 ||
    { cat /tmp/fio.$n; fail "fio $n failed (see console)"; }
}

io_errors() { dmesg | grep -c -E 'I/O error|blk_update_request|Buffer I/O' || true; }
# The nbd driver's complaints about its connections (timeouts, dead sockets).
nbd_msgs() { dmesg | grep -c -E 'nbd[0-9]+: ' || true; }

# metric SERIES: blkd's /metrics sample (summed over label sets that
# start with SERIES); nbdkit has none.
metric() { ctl_ok metric "$SID" "$1"; }
logcount() { ctl_ok count "$SID" "$1"; }

# fill_fs: files with checksums on the mounted /mnt; the sums in /tmp/sums.
fill_fs() {
  mkdir -p /mnt/small
  for i in 1 2 3 4; do
    dd if=/dev/urandom of=/mnt/big$i bs=64k count=$((i * 16)) 2>/dev/null || fail "write big$i"
  done
  i=0
  while [ $i -lt 40 ]; do
    dd if=/dev/urandom of=/mnt/small/f$i bs=1k count=$((i % 7 + 1)) 2>/dev/null || fail "write small/f$i"
    i=$((i + 1))
  done
  (cd /mnt && find . -type f | sort | xargs sha256sum) >/tmp/sums
}

# bg_load SECS ARGS: fio writing and reading /dev/nbd0 (or a file given by
# --filename in ARGS) in the background for SECS; sets FIO_PID.
bg_load() {
  secs=$1; shift
  fio --name=load --filename="$NBD" --ioengine=libaio --direct=1 --rw=randrw --bs=4k \
      --iodepth=8 --size=32M --time_based --runtime="$secs" "$@" \
      --output-format=terse --terse-version=3 >/tmp/fio.load 2>&1 &
  FIO_PID=$!
}

# wait_pid PID SECS: wait up to SECS for PID to end; 0 if it did.
wait_pid() {
  i=0
  while kill -0 "$1" 2>/dev/null && [ $i -lt $(($2 * 10)) ]; do sleep 0.1; i=$((i + 1)); done
  ! kill -0 "$1" 2>/dev/null
}

# serves_again REATTACH ARGS...: after a server restart, whether the device
# reads again: by itself, or (REATTACH=yes) after nbd-client -d and a new
# attach with ARGS; sets how.  Fails the case otherwise.
serves_again() {
  re=$1; shift
  how="by itself"
  timeout 30 dd if=$NBD of=/dev/null bs=1M count=4 iflag=direct 2>/dev/null && return 0
  [ "$re" = yes ] || fail "device not usable after the restart"
  detach
  attach "$@"
  timeout 30 dd if=$NBD of=/dev/null bs=1M count=4 iflag=direct 2>/dev/null ||
    fail "device not usable after detach and attach"
  how="after nbd-client -d and a new attach"
}

# ---------------------------------------------------------------- cases

# fs PLUGIN BLOCKSIZE: attach, size, mkfs.ext4, files with checksums,
# sync, umount, detach, reattach, e2fsck -fn, remount, re-check.
case_fs() {
  plug=$1 bs=$2
  plugin "$plug" 268435456
  serve "$SID" $PLUG
  attach -b "$bs" -t 60
  [ "$(size_bytes)" = 268435456 ] || fail "size $(size_bytes), want 268435456"
  got=$(blockdev --getss $NBD)
  [ "$got" = "$bs" ] || fail "logical block size $got, want $bs"
  mkfs.ext4 -q -F $NBD || fail "mkfs.ext4"
  mount -t ext4 $NBD /mnt || fail "mount"
  fill_fs
  sync
  umount /mnt || fail "umount"
  detach
  # Reattached, so what follows reads the server, not the page cache.
  attach -b "$bs" -t 60
  e2fsck -fn $NBD >/tmp/fsck 2>&1 || { cat /tmp/fsck; fail "e2fsck -fn found problems"; }
  mount -t ext4 $NBD /mnt || fail "remount"
  (cd /mnt && sha256sum -c -s /tmp/sums) || fail "checksums differ after remount"
  umount /mnt || fail "umount 2"
  detach
  [ "$(io_errors)" = 0 ] || fail "I/O errors in the kernel log"
  note "$plug -b $bs: size right, ext4 with $(wc -l </tmp/sums) files, e2fsck -fn clean, sums match after reattach"
}

# fio PLUGIN: verified 4k random and 1 MiB / 32 MiB sequential O_DIRECT
# with max_sectors_kb raised; the request sizes the kernel sent.
case_fio() {
  plugin "$1" 268435456
  serve "$SID" $PLUG
  attach -b 4096 -t 60
  msk0=$(cat /sys/block/nbd0/queue/max_sectors_kb)
  msk=$(raise_max_sectors)
  fio_verify rand4k --rw=randwrite --bs=4k --iodepth=16 --size=16M
  fio_verify seq1m --rw=write --bs=1M --iodepth=4 --size=32M
  w0=$(stat_field 5) s0=$(stat_field 7)
  fio_verify seq32m --rw=write --bs=32M --iodepth=2 --size=64M
  w1=$(stat_field 5) s1=$(stat_field 7)
  avg=$(((s1 - s0) * 512 / (w1 - w0) / 1024))
  detach
  [ "$(io_errors)" = 0 ] || fail "I/O errors in the kernel log"
  [ "$avg" -ge "$msk" ] || [ "$avg" -ge 32768 ] ||
    fail "32M writes went out as ${avg} KiB requests with max_sectors_kb=$msk"
  note "$1: 4k rand, 1M and 32M seq verified; max_sectors_kb $msk0 raised to $msk, 32M job's writes averaged ${avg} KiB"
}

# discard: blkdiscard, flush (sync) and FUA (O_DSYNC O_DIRECT) reach the
# plugin, seen in the log filter below the server (and blkd's /metrics);
# blkdiscard -z goes out as writes (no WRITE_ZEROES before Linux 6.12).
case_discard() {
  serve "$SID" --filter=log memory size=67108864 logfile=@LOG@
  attach -b 4096 -t 60
  /usr/sbin/blkdiscard $NBD || fail "blkdiscard"
  t=$(logcount '^.* Trim id=')
  [ "$t" -gt 0 ] || fail "no Trim reached the plugin"
  f0=$(logcount '^.* Flush id=')
  dd if=/dev/urandom of=$NBD bs=4k count=16 conv=fsync 2>/dev/null || fail "write + fsync"
  f1=$(logcount '^.* Flush id=')
  [ "$f1" -gt "$f0" ] || fail "fsync on the device sent no Flush"
  mkfs.ext4 -q -F $NBD && mount -t ext4 $NBD /mnt || fail "mkfs + mount"
  dd if=/dev/urandom of=/mnt/f bs=64k count=4 2>/dev/null && sync || fail "file + sync"
  f2=$(logcount '^.* Flush id=')
  [ "$f2" -gt "$f1" ] || fail "sync on ext4 sent no Flush"
  umount /mnt || fail umount
  fio --name=dsync --filename=$NBD --ioengine=psync --direct=1 --sync=dsync --rw=write \
      --bs=4k --size=64k >/tmp/fio.dsync 2>&1 || fail "O_DSYNC writes"
  fua=$(logcount '^.* Write id=.* fua=1')
  [ "$fua" -gt 0 ] || fail "O_DSYNC writes carried no FUA"
  z0=$(logcount '^.* Zero id=') w0=$(logcount '^.* Write id=')
  /usr/sbin/blkdiscard -z -o 0 -l 1048576 $NBD || fail "blkdiscard -z"
  z1=$(logcount '^.* Zero id=') w1=$(logcount '^.* Write id=')
  extra=
  if [ "$SRV" = blkd ]; then
    mt=$(metric 'blkd_requests_total{cmd="trim"}') mf=$(metric 'blkd_requests_total{cmd="flush"}')
    [ "${mt%.*}" -gt 0 ] && [ "${mf%.*}" -gt 0 ] || fail "/metrics trim=$mt flush=$mf"
    extra=", /metrics trim=$mt flush=$mf"
  fi
  detach
  note "trim=$t flush: fsync $((f1 - f0)), ext4 sync $((f2 - f1)); fua-writes=$fua, blkdiscard -z: $((z1 - z0)) zero + $((w1 - w0)) write requests$extra"
}

# multiconn: nbd-client -C 4; four connections, each one carrying
# verified writes.
case_multiconn() {
  # Without multi-conn in the export's flags the kernel refuses -C 4
  # (nbd-client negotiates all four connections, then the netlink
  # connect fails).
  serve "$SRV-single" --filter=multi-conn memory size=67108864 multi-conn-mode=disable
  if timeout 30 nbd-client "$H" "$PORT" $NBD -b 4096 -t 30 -C 4 >/tmp/single 2>&1; then
    fail "-C 4 attached to an export without multi-conn"
  fi
  [ "$(cat /sys/block/nbd0/size)" = 0 ] || fail "the refused -C 4 attach left a size"
  refused=$(dmesg | grep -i 'multiple connections' | tail -n1 | sed 's/^\[[^]]*\] //')
  [ -n "$refused" ] || { cat /tmp/single; fail "-C 4 without multi-conn failed, but not for multi-conn"; }
  serve "$SRV-multiconn" --filter=log memory size=268435456 logfile=@LOG@
  attach -b 4096 -t 60 -C 4
  c=$(logcount '^.* connection=[0-9]+ Connect ')
  [ "$c" = 4 ] || fail "$c connections, want 4"
  # The kernel picks the connection by the submitting CPU's hardware queue.
  [ "$(nproc)" -ge 4 ] || fail "the guest has $(nproc) CPUs; -C 4 needs 4 to use every connection"
  map=$(for q in /sys/block/nbd0/mq/*; do printf ' %s:%s' "${q##*/}" "$(cat $q/cpu_list)"; done)
  say "hardware queue:CPUs$map"
  fio_verify mc --rw=randwrite --bs=4k --iodepth=8 --numjobs=4 --size=16M --offset_increment=32M
  per=
  for n in 1 2 3 4; do
    k=$(logcount "^.* connection=$n Write ")
    per="$per $k"
    [ "$k" -gt 0 ] || fail "connection $n carried no writes"
  done
  detach
  [ "$(io_errors)" = 0 ] || fail "I/O errors in the kernel log"
  note "4 connections; writes per connection:$per; verified; without multi-conn the kernel refused: $refused"
}

# readonly: -r export; the kernel marks the device read-only, reads work,
# writes fail with an error, nothing hangs.
case_readonly() {
  v=; [ "$SRV" = blkd ] && v=-v
  serve "$SID" $v -r memory size=67108864
  attach -b 4096 -t 30
  [ "$(blockdev --getro $NBD)" = 1 ] || fail "device not read-only"
  dd if=$NBD of=/dev/null bs=1M count=8 2>/dev/null || fail "read"
  if timeout 30 dd if=/dev/zero of=$NBD bs=4k count=1 oflag=direct 2>/tmp/dd.err; then
    fail "a write to the read-only device succeeded"
  fi
  if timeout 60 mkfs.ext4 -q -F $NBD >/dev/null 2>&1; then fail "mkfs on a read-only device succeeded"; fi
  detach
  sr=
  if [ "$SRV" = blkd ]; then
    # blkd -v logs how each connection entered transmission: the kernel's
    # client (nbd-client's handshake) never asks for structured replies.
    n=$(ctl_ok grep "$SID" 'transmission phase') || exit 1
    k=$(ctl_ok grep "$SID" 'transmission phase.*structured replies') || exit 1
    [ "$n" -ge 1 ] && [ "$k" = 0 ] || fail "transmission phases $n, with structured replies $k"
    sr="; simple replies ($n connection(s), none structured)"
  fi
  note "read-only device; write refused: $(head -n1 /tmp/dd.err)$sr"
}

# tls: certificates against --tls=require; verified I/O; a plaintext
# attach is refused.
case_tls() {
  v=; [ "$SRV" = blkd ] && v=-v
  serve "$SID" $v --tls=require --tls-certificates=@TLS@ memory size=67108864
  if timeout 30 nbd-client "$H" "$PORT" $NBD -b 4096 -t 30 >/tmp/plain 2>&1; then
    fail "plaintext attach succeeded"
  fi
  [ "$(cat /sys/block/nbd0/size)" = 0 ] || fail "plaintext attach left a size"
  attach -b 4096 -t 30 -certfile /vm/tls/client-cert.pem -keyfile /vm/tls/client-key.pem \
    -cacertfile /vm/tls/ca-cert.pem -tlshostname localhost
  # The kernel has no TLS: nbd-client stays behind as the relay.
  pidof nbd-client >/dev/null || fail "no nbd-client process relaying the TLS session"
  fio_verify tls --rw=randwrite --bs=4k --iodepth=8 --size=8M
  fio_verify tls1m --rw=write --bs=1M --iodepth=2 --size=16M
  detach
  ver=
  if [ "$SRV" = blkd ]; then
    n=$(ctl_ok grep "$SID" 'TLS up: TLSv1\.2')
    [ "$n" -gt 0 ] || fail "blkd logged no TLS 1.2 session"
    ver=", blkd logged $n TLS 1.2 session(s)"
  fi
  note "plaintext refused ($(tail -n1 /tmp/plain)); TLS attach through nbd-client's relay verified$ver"
}

# disconnect: nbd-client -d while fio runs: fio ends, the server frees
# the connection.
case_disconnect() {
  serve "$SID" memory size=268435456
  fd0=$(ctl_ok fds "$SID")
  attach -b 4096 -t 30
  bg_load 60
  sleep 3
  timeout 30 nbd-client -d $NBD || fail "nbd-client -d failed or hung"
  wait_pid "$FIO_PID" 60 || fail "fio still running 60s after nbd-client -d"
  ok=$(ctl_ok settle "$SID" "$fd0" 20) || exit 1
  note "fio ended after -d ($(io_errors) I/O errors logged, expected); server: $ok"
}

# sigterm: SIGTERM to the server while the device is busy: the server
# drains and exits, the device fails I/O (no hang) and can be detached.
case_sigterm() {
  serve "$SID" memory size=268435456
  attach -b 4096 -t 10
  bg_load 120
  sleep 3
  e0=$(io_errors)
  t0=$(date +%s)
  ctl_ok signal "$SID" TERM >/dev/null || exit 1
  rc=$(ctl wait "$SID" 20)
  wait_pid "$FIO_PID" 90 || fail "fio hung: still running 90s after SIGTERM (server: $rc)"
  t=$(($(date +%s) - t0))
  e=$(($(io_errors) - e0))
  first=$(dmesg | grep -E 'I/O error' | head -n1 | cut -c1-100)
  timeout 30 nbd-client -d $NBD || fail "detach after the server left"
  msg="fio ended ${t}s after SIGTERM with $e I/O error lines ($first)"
  [ "$rc" = "OK 0" ] || fail "server did not exit within 20s of SIGTERM ($rc); $msg"
  if [ "$SRV" = blkd ]; then
    # blkd warns when requests in flight outlive its drain.
    n=$(ctl_ok grep "$SID" 'did not drain in time') || exit 1
    [ "$n" = 0 ] || fail "blkd closed connections that did not drain; $msg"
  fi
  note "server drained and exited 0; $msg"
}

# restart MODE: stop the server and start it again on the same port (what
# systemctl restart does) under load, with the released nbd-client: MODE
# persist is ioctl mode with -persist (it reconnects by itself), netlink
# the default mode (no reconnect: detach and attach again by hand).
# Passes when nothing hangs and the device serves again without a reboot;
# the I/O errors the guest saw are the detail.
case_restart() {
  mode=$1
  plugin file 268435456
  serve "$SID" $PLUG
  case $mode in
    persist) attach -b 4096 -t 10 -L -persist ;;
    netlink) attach -b 4096 -t 10 ;;
    *) fail "unknown mode $mode" ;;
  esac
  bg_load 30
  sleep 3
  e0=$(io_errors)
  t0=$(date +%s)
  rr=$(ctl_ok restart "$SID") || exit 1
  wait_pid "$FIO_PID" 90 || fail "fio hung after the restart"
  wait "$FIO_PID"; frc=$?
  kn=; case $rr in *killed*) kn="; the server outlived SIGTERM by 20s and was killed" ;; esac
  t=$(($(date +%s) - t0))
  e=$(($(io_errors) - e0))
  ferr=$(grep -m1 -E 'error|err=' /tmp/fio.load | sed 's/.*: \(Input.*\): .*/\1/' | cut -c1-60)
  reattach=yes; [ "$mode" = netlink ] || reattach=no
  serves_again "$reattach" -b 4096 -t 10 || exit 1
  detach
  note "fio ended ${t}s after the restart with exit $frc${ferr:+ ($ferr)}, $e I/O error lines in dmesg; device served again $how$kn"
}

# load_start SECS: ext4 on /dev/nbd0 with checksummed files, then fio
# random writes with verify on a file in it for SECS, and a loop of
# fsync'd writes beside it (FIO_PID, SYNC_PID); the kernel log's counts
# now in e0 and m0.
load_start() {
  mkfs.ext4 -q -F $NBD && mount -t ext4 $NBD /mnt || fail "mkfs + mount"
  fill_fs
  e0=$(io_errors) m0=$(nbd_msgs)
  fio --name=load --filename=/mnt/fio.dat --size=32M --ioengine=libaio --direct=1 \
      --rw=randwrite --bs=4k --iodepth=8 --verify=crc32c --verify_backlog=256 \
      --verify_fatal=1 --time_based --runtime="$1" --serialize_overlap=1 \
      --output-format=terse --terse-version=3 \
      >/tmp/fio.load 2>&1 &
  FIO_PID=$!
  (i=0; while [ $i -lt 60 ]; do dd if=/dev/urandom of=/mnt/sync.$((i % 4)) bs=64k count=2 \
     conv=fsync 2>/dev/null || exit 1; i=$((i + 1)); sleep 0.1; done) &
  SYNC_PID=$!
}

# load_check WHAT: after load_start and WHAT (the restarts): fio and the
# fsync loop clean, no I/O error or nbd driver message in the kernel log,
# the files' sums, e2fsck -fn clean; detaches.
load_check() {
  wait_pid "$FIO_PID" 90 || fail "fio hung"
  wait "$FIO_PID" || { cat /tmp/fio.load; fail "fio failed across the $1"; }
  wait "$SYNC_PID" || fail "write + fsync failed across the $1"
  e=$(($(io_errors) - e0))
  nbdmsg=$(($(nbd_msgs) - m0))
  # The kernel must not have seen a dead connection or a timeout either.
  [ "$nbdmsg" = 0 ] || { dmesg | grep -E 'nbd[0-9]+: ' | tail -n 5; fail "$nbdmsg nbd driver messages during the $1"; }
  [ "$e" = 0 ] || { dmesg | tail -n 20; fail "$e I/O error lines in the kernel log"; }
  (cd /mnt && sha256sum -c -s /tmp/sums) || fail "checksums differ after the $1"
  umount /mnt || fail umount
  e2fsck -fn $NBD >/tmp/fsck 2>&1 || { cat /tmp/fsck; fail "e2fsck -fn found problems"; }
  detach
}

# live: blkd's live restart (SIGUSR2: same PID, the connections handed to
# the new image) three times while ext4 on a host file (the file plugin:
# its data outlive the process) is under fio load with verify; no I/O
# error in the kernel's log, fio clean, checksums and e2fsck clean after.
case_live() {
  [ "$SRV" = blkd ] || skip "$SRV has no live restart (SIGUSR2 would end it)"
  plugin file 268435456
  serve "$SID" $PLUG
  pid0=$(ctl_ok pid "$SID") || exit 1
  attach -b 4096 -t 30
  load_start 20
  for n in 1 2 3; do
    sleep 5
    ctl_ok signal "$SID" USR2 >/dev/null || exit 1
    i=0
    while :; do
      d=$(ctl_ok grep "$SID" "live restart [0-9]+ done") || exit 1
      [ "$d" -ge $n ] && break
      i=$((i + 1))
      [ $i -lt 100 ] || fail "restart $n did not finish within 20s"
      sleep 0.2
    done
    [ "$(ctl_ok pid "$SID")" = "$pid0" ] || fail "the PID changed"
  done
  load_check "live restarts"
  h=$(ctl_ok grep "$SID" 'live restart [0-9]+ done: serving again, 1 connection')
  note "3 live restarts (same PID, $h logged 1 connection handed over) under fio verify + fsync on ext4: fio clean, no I/O error or nbd driver message in dmesg, sums match, e2fsck -fn clean"
}

# fdstore: `systemctl restart blkd` three times under the same load as
# live: blkd runs as the shipped blkd.service (--fdstore) with systemd 252
# as PID 1 in a podman container on the host's network (the control
# service starts it; rawio on a file in the unit's StateDirectory), so
# each restart is a new process that takes the kernel's connection back
# from systemd's file descriptor store.  Each restart must give a new
# MainPID and leave the store empty; then the same checks as live.
case_fdstore() {
  [ "$SRV" = blkd ] || skip "$SRV has no restart through systemd's file descriptor store"
  r=$(ctl sdstart "$SID" 268435456)
  case $r in
    OK*) set -- $r; PORT=$2 ;;
    SKIP*) skip "${r#SKIP }" ;;
    *) fail "sdstart: ${r:-no reply}" ;;
  esac
  say "blkd.service in systemd on port $PORT"
  attach -b 4096 -t 30
  load_start 30
  pids=$(ctl_ok pid "$SID") || exit 1
  for n in 1 2 3; do
    sleep 5
    # OK OLDPID NEWPID: the control service checked that the PID is new
    # and the store empty again.
    r=$(ctl_ok sdrestart "$SID") || exit 1
    set -- $r
    pids="$pids $2"
    say "systemctl restart $n: MainPID $1 -> $2"
  done
  load_check "systemctl restarts"
  h=$(ctl_ok grep "$SID" "from systemd's file descriptor store, 1 connection") || exit 1
  [ "$h" -ge 3 ] || fail "blkd took the connection from the store $h times, want 3"
  note "3 x systemctl restart (MainPIDs $pids; store empty after each; $h times 1 connection taken from the store) under fio verify + fsync on ext4: fio clean, no I/O error or nbd driver message in dmesg, sums match, e2fsck -fn clean"
}

# livetls: a live restart with a TLS session attached.  blkd closes TLS
# sessions instead of handing them over, so this records what the
# released client does then; passes when nothing hangs and the device
# serves again without a reboot (by hand if need be).
case_livetls() {
  [ "$SRV" = blkd ] || skip "$SRV has no live restart"
  plugin file 268435456
  serve "$SID" --tls=require --tls-certificates=@TLS@ $PLUG
  tls="-certfile /vm/tls/client-cert.pem -keyfile /vm/tls/client-key.pem -cacertfile /vm/tls/ca-cert.pem -tlshostname localhost"
  attach -b 4096 -t 10 $tls
  bg_load 30
  sleep 3
  e0=$(io_errors)
  t0=$(date +%s)
  ctl_ok signal "$SID" USR2 >/dev/null || exit 1
  wait_pid "$FIO_PID" 90 || fail "fio hung after the live restart"
  wait "$FIO_PID"; frc=$?
  t=$(($(date +%s) - t0))
  e=$(($(io_errors) - e0))
  serves_again yes -b 4096 -t 10 $tls || exit 1
  detach
  note "TLS session closed by the restart: fio exit $frc after ${t}s, $e I/O error lines; device served again $how"
}

# kill: last case of a boot: the host kills qemu with I/O in flight and
# checks that the server frees the connection (it prints that result).
case_kill() {
  serve "$SID" memory size=268435456
  attach -b 4096 -t 30 -C 2
  bg_load 120 --numjobs=2
  sleep 4
  ctl killvm "$SID"
  sleep 60
  fail "still running after killvm"
}

cleanup() {
  for p in $(pidof fio); do kill -9 "$p" 2>/dev/null; done
  umount /mnt 2>/dev/null
  detach
  ctl stopall >/dev/null
}

case $CASE in
  cleanup) cleanup ;;
  bench) . /vm/bench.sh; case_bench "$@" ;;
  *) "case_$CASE" "$@" ;;
esac
