#!/usr/bin/env bash
# Access filters: ip (deny=all refuses, allow=allipv4 lets 127.0.0.1 in),
# limit (a second client is refused while the first is connected),
# exitlast and exitwhen (the server exits, with status 0, when the last
# client leaves or when a file appears), tls-fallback (a plain client gets
# the readme disk, a TLS client the plugin's).
. "$(dirname "$0")/lib.sh"
. "$TOP/tests/helpers/core.sh"
. "$TOP/tests/helpers/filters.sh"
. "$TOP/tests/helpers/tls.sh"
need_filter_server; need nbdinfo; need_nbd_py

# wait_exit PID: the server must exit by itself (60 s, generous under
# load), with status 0.
wait_exit() {
  local i rc
  for ((i = 0; i < 1200; i++)); do server_alive "$1" || break; sleep 0.05; done
  server_alive "$1" && fail "$2: the server is still running after 60 s"
  rc=0; wait "$1" || rc=$?
  expect_eq "$rc" 0 "$2: exit status"
}

if have_filter ip; then
  serve --filter=ip memory 1M deny=all
  expect_fail "ip deny=all: a client from 127.0.0.1 is refused" nbdinfo --size "$URI"
  # Debian's build of the ip filter cannot parse literal addresses
  # ("don't know how to parse rule": built without inet_pton), so the
  # address-family keywords stand in for them.
  serve --filter=ip memory 1M allow=allipv4 deny=all
  expect_eq "$(nbd_size "$URI")" 1048576 "ip allow=allipv4 deny=all: 127.0.0.1 gets in"
  serve --filter=ip memory 1M allow=allipv6 deny=all
  expect_fail "ip allow=allipv6 deny=all: 127.0.0.1 is refused" nbdinfo --size "$URI"
fi

if have_filter limit; then
  serve --filter=limit memory 1M limit=1
  "$PY" - "$URI" <<'PYEOF' || fail "limit"
import nbd, sys
uri = sys.argv[1]
a = nbd.NBD(); a.connect_uri(uri)
b = nbd.NBD()
try:
    b.connect_uri(uri)
    sys.exit("a second client got in with limit=1")
except nbd.Error:
    pass
a.pread(512, 0)
a.shutdown(); del a
# The first client's slot is freed when the server notices it is gone.
for i in range(100):
    try:
        c = nbd.NBD(); c.connect_uri(uri); break
    except nbd.Error:
        import time; time.sleep(0.1)
else:
    sys.exit("no client got in after the first left")
print("limit ok")
PYEOF
  ok "limit=1: a second client is refused until the first leaves"
fi

if have_filter exitlast; then
  serve --filter=exitlast memory 1M
  pid=$SERVER_PID
  expect_eq "$(nbd_size "$URI")" 1048576 "exitlast: a client is served"
  wait_exit "$pid" "exitlast: the server exits when its last client leaves"
  SERVER_PID=
fi

if have_filter exitwhen; then
  serve --filter=exitwhen memory 1M exit-when-file-created="$TMP/stop" exit-when-poll=1
  pid=$SERVER_PID
  expect_eq "$(nbd_size "$URI")" 1048576 "exitwhen: served while the file is absent"
  server_alive "$pid" || fail "exitwhen: exited with no event"
  touch "$TMP/stop"
  wait_exit "$pid" "exitwhen: the server exits once the file is created"
  SERVER_PID=
fi

if have_filter tls-fallback; then
  make_tls_material "$TMP/tls"
  serve --tls=on --tls-certificates="$TMP/tls/server" --filter=tls-fallback \
    memory 1M tlsreadme="use TLS, please"
  "$PY" - "$URI" "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/tls/client-ca" <<'PYEOF' \
    || fail "tls-fallback"
import nbd, sys
plain, tls = sys.argv[1:]
h = nbd.NBD(); h.set_tls(nbd.TLS_DISABLE); h.connect_uri(plain)
assert h.is_read_only(), "the plain export is writable"
got = h.pread(512, 0)
assert got.startswith(b"use TLS, please"), got[:40]
h.shutdown()
t = nbd.NBD(); t.set_uri_allow_local_file(True); t.connect_uri(tls)
assert t.get_size() == 1 << 20, t.get_size()
t.pwrite(b"secret" * 10, 0)
assert t.pread(60, 0) == b"secret" * 10
print("tls-fallback ok")
PYEOF
  ok "tls-fallback: a plain client reads the readme, a TLS client the disk"
fi
echo "ok"
