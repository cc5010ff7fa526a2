#!/usr/bin/env bash
# Quiet like nbdkit: started by another program (--run's command, a client
# over -s, socket activation as `nbdinfo -- [ blkd ... ]` does it, a
# private -U - socket), blkd says nothing on stderr at the default
# verbosity, TLS's start-up line included; the program's own output is
# all there is.  With -v, and for an interactive -f start, the "serving"
# line is there.  Runs against nbdkit too (BLKD=/usr/bin/nbdkit): the
# behaviour copied is nbdkit's.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/helpers/core.sh"
need_server
need nbdinfo
need_nbd_py

# quiet WHAT: the last command's stderr ($TMP/err) must be empty.
quiet() {
  if [ -s "$TMP/err" ]; then cat "$TMP/err"; fail "$1: blkd wrote to stderr"; fi
  ok "$1: nothing on stderr"
}

echo "# --run"
out=$(timeout 60 "$BLKD" --run 'nbdinfo --size "$uri"' memory 1G 2>"$TMP/err") || fail "--run failed"
expect_eq "$out" 1073741824 "--run: the command's output"
quiet "--run"

echo "# --run with -U -"
out=$(timeout 60 "$BLKD" -U - --run 'nbdinfo --size "$uri"' memory 1G 2>"$TMP/err") \
  || fail "-U - --run failed"
expect_eq "$out" 1073741824 "-U - --run: the command's output"
quiet "-U - --run"

echo "# socket activation: nbdinfo -- [ blkd ... ]"
out=$(timeout 60 nbdinfo --size -- [ "$BLKD" memory 1G ] 2>"$TMP/err") \
  || fail "nbdinfo with a socket-activated server failed"
expect_eq "$out" 1073741824 "socket activation: nbdinfo --size"
quiet "socket activation"

echo "# -s: a client on stdin/stdout"
out=$(timeout 60 "$PY" -c '
import sys, nbd
h = nbd.NBD()
h.connect_command([sys.argv[1], "-s", "memory", "1G"])
print(h.get_size())
h.shutdown()' "$BLKD" 2>"$TMP/err") || fail "-s failed"
expect_eq "$out" 1073741824 "-s: the client's output"
quiet "-s"

if command -v openssl >/dev/null; then
  echo "# --run with TLS: no TLS start-up line either"
  (umask 077; echo "alice:$(openssl rand -hex 32)" >"$TMP/keys.psk")
  out=$(timeout 60 "$BLKD" -U - --tls=require --tls-psk="$TMP/keys.psk" \
          --run 'nbdinfo --size "nbds+unix://alice@/?socket=$unixsocket&tls-psk-file='"$TMP/keys.psk"'"' \
          memory 1G 2>"$TMP/err") || { cat "$TMP/err"; fail "--run with TLS failed"; }
  expect_eq "$out" 1073741824 "--run with TLS: the command's output"
  quiet "--run with TLS"
fi

if blkd_only "-v and -f print the start-up line" "nbdkit -v prints its own debug lines"; then
  echo "# -v brings the line back"
  timeout 60 "$BLKD" -v --run 'nbdinfo --size "$uri" >/dev/null' memory 1G 2>"$TMP/err" \
    || fail "-v --run failed"
  grep -q "info: serving memory on " "$TMP/err" || { cat "$TMP/err"; fail "-v --run: no serving line"; }
  ok "-v --run: the serving line is there"
  echo "# an interactive -f start keeps it"
  start_server memory 1G
  grep -q "info: serving memory on nbd://" "$TMP/server.log" || fail "-f: no serving line"
  ok "-f: the serving line is there"
  stop_server
fi
