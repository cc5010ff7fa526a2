# Guest side of bench/kernel.sh (sourced by cases.sh for the "bench"
# case): fio on /dev/nbd0 against each server in turn within each round
# (the order reversed on every other round); one line per run on the
# console:
#   BENCH ROUND SERVER CONNS JOB IOPS MIBS REQUESTS AVG_KIB CPU_TICKS CPU_NS
# REQUESTS and AVG_KIB are what the kernel sent (/sys/block/nbd0/stat:
# reads, writes, discards and flushes completed); CPU_TICKS is the
# server's utime+stime over the run (/proc/PID/stat on the host), CPU_NS
# the same time exactly (the process's CPU clock; control.py's "cpu").
# /vm/bench.conf sets BENCH_SERVERS, BENCH_JOBS, BENCH_CONNS,
# BENCH_SECONDS, BENCH_ROUNDS and BENCH_SIZE (bytes), and BENCH_TRACE=1
# when the host's control service is to trace each run (TRACE).

# bench_start NAME: starts server NAME on the host; sets PORT_<NAME>.
# blkd-memory.V and blkd-ram.V run the host's blkd variant V (VARIANTS).
bench_start() {
  kind=blkd
  case $1 in blkd-*.*) kind=blkd:${1#*.} ;; esac
  case ${1%%.*} in
    blkd-memory) set -- "$1" "$kind" memory size=$BENCH_SIZE ;;
    blkd-ram) set -- "$1" "$kind" @TOP@/plugins/ram/nbdkit-ram-plugin.so size=$BENCH_SIZE ;;
    nbdkit-memory) set -- "$1" nbdkit memory size=$BENCH_SIZE ;;
    nbd-server) ctl_ok mkfile "$1.img" "$BENCH_SIZE" >/dev/null || exit 1
                set -- "$1" nbd-server @TMP@/$1.img ;;
    qemu-nbd) ctl_ok mkfile "$1.img" "$BENCH_SIZE" >/dev/null || exit 1
              set -- "$1" qemu-nbd -f raw --cache=writeback @TMP@/$1.img ;;
    *) fail "unknown bench server $1" ;;
  esac
  v=PORT_$(echo "$1" | tr -c 'a-z0-9\n' _)
  r=$(ctl start "$@")
  case $r in OK*) set -- $r; eval "$v=\$2" ;; *) fail "start: $r" ;; esac
}

# bench_attach NAME CONNS: 0 when attached.
bench_attach() {
  eval "p=\$PORT_$(echo "$1" | tr -c 'a-z0-9\n' _)"
  name=; [ "$1" = nbd-server ] && name="-N $1"
  timeout 60 nbd-client "$H" "$p" $NBD $name -b 4096 -t 60 -C "$2" >/tmp/attach 2>&1 || return 1
  i=0
  while [ "$(cat /sys/block/nbd0/size)" = 0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  raise_max_sectors >/dev/null
}

# bench_job JOB CONNS: fio arguments for JOB (its queue depth spread over
# one fio job per connection, so every connection's queue is used).
bench_job() {
  case $1 in
    randread4k-qd1) set -- randread 4k 1 1 ;;
    randwrite4k-qd1) set -- randwrite 4k 1 1 ;;
    randread4k-qd32) set -- randread 4k 32 "$2" ;;
    randwrite4k-qd32) set -- randwrite 4k 32 "$2" ;;
    read128k) set -- read 128k 8 "$2" ;;
    write128k) set -- write 128k 8 "$2" ;;
    read1m) set -- read 1m 4 "$2" ;;
    write1m) set -- write 1m 4 "$2" ;;
    *) fail "unknown bench job $1" ;;
  esac
  qd=$(($3 / $4)); [ $qd -ge 1 ] || qd=1
  echo "--rw=$1 --bs=$2 --iodepth=$qd --numjobs=$4"
}

bench_stat() { awk '{ print $1 + $5 + $12 + $16, $3 + $7 }' /sys/block/nbd0/stat; }

case_bench() {
  . /vm/bench.conf
  for s in $BENCH_SERVERS; do bench_start "$s"; done
  # Fill each disk once, so reads read data, not holes.
  for s in $BENCH_SERVERS; do
    bench_attach "$s" 1 || fail "attach $s: $(tail -n1 /tmp/attach)"
    fio --name=fill --filename=$NBD --ioengine=libaio --direct=1 --rw=write --bs=1m \
        --iodepth=4 --size="$BENCH_SIZE" >/dev/null 2>&1 || fail "fill $s"
    detach
  done
  r=1
  while [ $r -le "$BENCH_ROUNDS" ]; do
    # Servers in turn, the order reversed on every other round.
    order=$BENCH_SERVERS
    if [ $((r % 2)) = 0 ]; then order=; for s in $BENCH_SERVERS; do order="$s $order"; done; fi
    for c in $BENCH_CONNS; do
      for s in $order; do
        if ! bench_attach "$s" "$c"; then
          echo "BENCH $r $s $c - n/a $(tail -n1 /tmp/attach | tr ' ' _)" >/dev/console
          detach
          continue
        fi
        for j in $BENCH_JOBS; do
          set -- $(bench_stat); q0=$1 s0=$2
          # (In a subshell: ctl_ok sets r, the round.)
          [ -n "${BENCH_TRACE:-}" ] && { (ctl_ok trace "$s" start "$r-$c-$j") >/dev/null || exit 1; }
          t0=$(ctl_ok cpu "$s") || exit 1
          fio --name="$j" --filename=$NBD --ioengine=libaio --direct=1 $(bench_job "$j" "$c") \
              --size="$BENCH_SIZE" --time_based --runtime="$BENCH_SECONDS" --group_reporting \
              --output-format=terse --terse-version=3 >/tmp/fio.bench 2>&1 || {
            [ -n "${BENCH_TRACE:-}" ] && (ctl trace "$s" stop) >/dev/null
            echo "BENCH $r $s $c $j fio-failed" >/dev/console; continue; }
          t1=$(ctl_ok cpu "$s") || exit 1
          [ -n "${BENCH_TRACE:-}" ] && { (ctl_ok trace "$s" stop) >/dev/null || exit 1; }
          set -- $t0 $t1
          cpu="$(($3 - $1)) $(($4 - $2))"     # ticks, ns
          set -- $(bench_stat); q1=$1 s1=$2
          q=$((q1 - q0))
          avg=0; [ $q -gt 0 ] && avg=$(((s1 - s0) * 512 / 1024 / q))
          # terse v3: field 7/8 read KiB/s and IOPS, 48/49 write's.
          set -- $(awk -F';' '{ printf "%d %.1f", $8 + $49, ($7 + $48) / 1024 }' /tmp/fio.bench)
          echo "BENCH $r $s $c $j $1 $2 $q $avg $cpu" >/dev/console
        done
        detach
      done
    done
    r=$((r + 1))
  done
  note "bench done"
}
