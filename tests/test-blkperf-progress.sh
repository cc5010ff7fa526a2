#!/usr/bin/env bash
# blkperf's live line: on a terminal it is redrawn in place with elapsed
# time, MiB/s, IOPS and p99 and cleared at the end; with --quiet or when
# stderr is not a terminal there is none of it.
. "$(dirname "$0")/lib.sh"
[ -x "$BLKPERF" ] || skip "blkperf is not built (make blkperf)"
need nbdkit
PY=/usr/bin/python3

start_server nbdkit memory 1G

# on_tty OUT ARGS...: runs blkperf with stderr (and stdin) on a pty and
# stdout into OUT.stdout; what the terminal got goes to OUT.tty.
on_tty() {
  local out=$1; shift
  "$PY" - "$out" "$BLKPERF" "$@" <<'EOF'
import os, pty, sys
out, *argv = sys.argv[1:]
pid, fd = pty.fork()
if pid == 0:
    so = os.open(out + ".stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(so, 1)
    os.execv(argv[0], argv)
got = b""
while True:
    try:
        chunk = os.read(fd, 4096)
    except OSError:            # EIO: the child closed the pty
        break
    if not chunk:
        break
    got += chunk
_, status = os.waitpid(pid, 0)
open(out + ".tty", "wb").write(got)
sys.exit(os.waitstatus_to_exitcode(status))
EOF
}

on_tty "$TMP/live" -t RAND_READ -l 4 "$URI" || fail "blkperf on a pty failed"
"$PY" - "$TMP/live.tty" <<'EOF' || fail "no live line on the terminal"
import re, sys
t = open(sys.argv[1], "rb").read().decode()
print(repr(t[:400]))
lines = re.findall(r"\r\x1b\[Kiteration 1/1 +([0-9.]+)s +([0-9.]+) MiB/s +([0-9]+) IOPS +p99 +([0-9.]+) us", t)
if len(lines) < 2:
    sys.exit("expected the line redrawn at least twice, got %d" % len(lines))
if not all(float(s) > 0 and float(m) > 0 and int(i) > 0 and float(p) > 0 for s, m, i, p in lines):
    sys.exit("a live line with a zero figure: %r" % (lines,))
if not t.endswith("\r\x1b[K"):
    sys.exit("the live line is not cleared at the end")
if "\n" in t:
    sys.exit("the live line scrolled instead of being redrawn in place")
EOF
grep -q "^NBD RAND_READ TEST" "$TMP/live.stdout" || fail "the report is missing from stdout"
grep -q "iteration" "$TMP/live.stdout" && fail "progress leaked into stdout"

# --quiet on a terminal: nothing on it.
on_tty "$TMP/quiet" -t RAND_READ -l 3 --quiet "$URI" || fail "blkperf --quiet on a pty failed"
[ ! -s "$TMP/quiet.tty" ] || { cat -v "$TMP/quiet.tty"; fail "--quiet still drew on the terminal"; }

# stderr not a terminal: nothing either.
"$BLKPERF" -t RAND_READ -l 3 "$URI" >"$TMP/plain.out" 2>"$TMP/plain.err" || fail "plain run failed"
[ ! -s "$TMP/plain.err" ] || { cat -v "$TMP/plain.err"; fail "progress written to a non-terminal"; }

echo "all progress checks passed"
