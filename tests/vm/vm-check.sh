#!/usr/bin/env bash
# make vm-check: the kernel's NBD client (Debian's nbd.ko and nbd-client in
# a qemu guest) against blkd and, with the same guest script, against
# nbdkit as the reference.  Two boots per server (2 CPUs for most cases, 4
# for -C 4); the guest asks the host's control service
# (tests/vm/control.py) to start, signal and inspect servers.
# Prints one line per case and a table; fails when a blkd case fails.  A
# case failing on nbdkit is reported, not hidden, and does not fail the run.
# VM_SERVERS="blkd nbdkit" and VM_CASES="fs:memory:4096 live ..." (cases
# as in ALL_CASES below) choose a subset.
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/vm.sh"
. "$(dirname "$0")/../helpers/tls.sh"
. "$(dirname "$0")/../helpers/systemd-image.sh"

why=$(vm_can_run) || skip "$why"
[ -x "$BLKD" ] || fail "$BLKD is not built (make all)"
need nbdkit
vm_base || skip "could not fetch or unpack Debian's kernel package (see above)"

# Host files for rawio's O_DIRECT must not be on tmpfs: the run's directory
# lives in the cache on /var/tmp.
RUN=$(mktemp -d "$VM_CACHE/run.XXXXXX")
trap 'cleanup; rm -rf "$RUN"' EXIT
make_tls_material "$RUN/pki"
mkdir -p "$RUN/tls"
cp "$RUN/pki/client/"{ca-cert.pem,client-cert.pem,client-key.pem} "$RUN/tls/"

# The ALL_CASES and CASES below; SERVERS likewise.
ALL_CASES="fs:memory:4096 fs:ram:512 fs:file:4096 fs:rawio:4096 fio:memory discard multiconn
readonly tls disconnect sigterm restart:persist restart:netlink live livetls fdstore kill"
SERVERS=${VM_SERVERS:-blkd nbdkit}
CASES=${VM_CASES:-$ALL_CASES}

# fdstore runs blkd.service under systemd in a podman container: the
# image (built once, kept) and the shipped units, where podman and the
# base image are here; without them the case skips and says why.
SD_IMAGE='' SD_WHY="the fdstore case was not asked for" SD_UNITS=''
if [[ " $CASES " == *" fdstore "* && " $SERVERS " == *" blkd "* ]]; then
  RAWIO=$TOP/plugins/rawio/nbdkit-rawio-plugin.so
  [ -f "$RAWIO" ] || fail "$RAWIO is not built (make all)"
  if sd_image "${BASE:-localhost/debian:bookworm}" "$RUN/image" "$BLKD" "$RAWIO"; then
    sd_units "$RUN/root" || fail "make install-systemd, or its blkd.service lacks --fdstore"
  fi
fi

/usr/bin/python3 "$VM_DIR/control.py" --tmp "$RUN" --tls "$RUN/pki/server" --top "$TOP" \
  --blkd "$BLKD" --port-file "$RUN/ctl.port" --podman "$PODMAN" \
  --sd-image "$SD_IMAGE" --sd-units "$SD_UNITS" --sd-why "$SD_WHY" 2>"$RUN/control.log" &
SERVER_PIDS+=("$!")
for ((i = 0; i < 100; i++)); do [ -s "$RUN/ctl.port" ] && break; sleep 0.1; done
[ -s "$RUN/ctl.port" ] || fail "the control service did not start: $(cat "$RUN/control.log")"
CTLPORT=$(cat "$RUN/ctl.port")
# host_ctl CMD: one command to the control service from the host side.
host_ctl() {
  local r
  exec 3<>"/dev/tcp/127.0.0.1/$CTLPORT" || return 1
  echo "$*" >&3
  read -r -t 90 r <&3 || r="ERR no reply"
  exec 3<&-
  echo "$r"
}

# Each case's time limit in seconds (the cases, NAME[:ARG[:ARG]], are in
# ALL_CASES above and tests/vm/guest/cases.sh; "kill" must be last: it
# ends the boot).
declare -A LIMIT=([fs]=120 [fio]=300 [discard]=90 [multiconn]=150 [readonly]=90 [tls]=150
                  [disconnect]=120 [sigterm]=180 [restart]=180 [live]=180 [livetls]=150
                  [fdstore]=240 [kill]=120)
ACCEL=$(vm_accel)
echo "vm-check: kernel $VM_KVER, accel $ACCEL, servers: $SERVERS"

# run_boot SERVER CPUS CASES...: one boot running CASES against SERVER.
run_boot() {
  local srv=$1 cpus=$2; shift 2
  [ $# -gt 0 ] || return 0
  local c name a1 a2 total=60 rc=0 t0
  : >"$RUN/plan"
  for c in "$@"; do
    IFS=: read -r name a1 a2 <<<"$c"
    echo "$name ${LIMIT[$name]:-120} $srv $a1 $a2" >>"$RUN/plan"
    total=$((total + ${LIMIT[$name]:-120}))
  done
  vm_initrd "$RUN/initrd" "$RUN/plan" "$RUN/tls"
  echo "=== guest ($cpus cpus) against $srv: $* (limit ${total}s)"
  t0=$(date +%s)
  VM_CPUS=$cpus VM_QEMU_ARGS="-pidfile $RUN/qemu.pid" vm_boot "$RUN/initrd" "$RUN/console" \
    "$total" "vm.ctlport=$CTLPORT ${VM_VERBOSE:+vm.verbose=1}" 2>/dev/null || rc=$?
  echo "(boot and cases: $(($(date +%s) - t0))s, qemu status $rc)"
  cat "$RUN/console" >>"$RUN/console.$srv"
  # The control service answers one command at a time: once stopall is
  # answered, a killvm verdict is in its log.
  host_ctl stopall >/dev/null || true
  grep -a -v '^CASE ' "$RUN/console" | grep -a -E '^  \||VMERR|Kernel panic|BUG|Oops' || true
  grep -a '^CASE ' "$RUN/console" | tee -a "$RUN/results" || true
  grep -a "^CASE kill $srv " "$RUN/control.log" | tee -a "$RUN/results" || true
  for c in "$@"; do
    IFS=: read -r name a1 a2 <<<"$c"
    grep -q "^CASE $name $srv${a1:+ $a1}${a2:+ $a2} " "$RUN/results" ||
      echo "CASE $name $srv${a1:+ $a1}${a2:+ $a2} FAIL no result (guest died or timed out; see console)" |
      tee -a "$RUN/results"
  done
}

: >"$RUN/results"
t_all=$(date +%s)
for srv in $SERVERS; do
  # -C 4 spreads requests over the connections by blk-mq hardware queue,
  # one per guest CPU: the multi-connection cases get a 4-CPU guest (and
  # kill, which must come last, rides along); the rest boot with 2, which
  # TCG runs faster.
  small=() big=()
  for c in $CASES; do
    case $c in multiconn*|kill*) big+=("$c") ;; *) small+=("$c") ;; esac
  done
  run_boot "$srv" 2 "${small[@]}"
  run_boot "$srv" 4 "${big[@]}"
done
echo "(all boots: $(($(date +%s) - t_all))s)"

echo "=== summary"
printf '%-22s %-6s %s\n' case server result
awk '{ name = $2; srv = $3; verdict = "";
       for (i = 4; i <= NF; i++) if ($i ~ /^(PASS|FAIL|SKIP)$/) { verdict = $i; break }
       args = ""; for (j = 4; j < i; j++) args = args " " $j
       printf "%-22s %-6s %s\n", name args, srv, verdict }' "$RUN/results"
if grep -q '^CASE [^ ]* nbdkit .*FAIL' "$RUN/results"; then
  echo "note: the reference (nbdkit) failed the cases above marked FAIL under nbdkit"
fi
if grep -q '^CASE [^ ]* blkd .*FAIL' "$RUN/results"; then
  [ -n "${VM_KEEP:-}" ] && cp -r "$RUN" "$VM_CACHE/failed.$$"
  fail "blkd failed a kernel-client case"
fi
echo "all blkd cases passed"
