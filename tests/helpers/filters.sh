# Helpers for the tests/test-filter-*.sh family tests.  Source after lib.sh
# and core.sh.  Every check runs against the server under test ($BLKD: blkd,
# or nbdkit itself with BLKD=/usr/bin/nbdkit) with Debian's nbdkit filters,
# so the same script proves both behave alike.

FILTERDIR=$(pkg-config --variable=filterdir nbdkit 2>/dev/null || true)
[ -n "$FILTERDIR" ] || FILTERDIR=$(nbdkit --dump-config 2>/dev/null | sed -n 's/^filterdir=//p')
PLUGINDIR=$(pkg-config --variable=plugindir nbdkit 2>/dev/null || true)
[ -n "$PLUGINDIR" ] || PLUGINDIR=$(nbdkit --dump-config 2>/dev/null | sed -n 's/^plugindir=//p')

# Under SANITIZE=1, leaks inside Debian's filters themselves are not
# blkd's (the file names each one and why).
export LSAN_OPTIONS="suppressions=$TOP/tests/helpers/lsan-filters.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

# A failing check shows what the server said: most filter failures are
# explained there (a refused key, an undefined symbol).
fail() {
  echo "--- server log (last 30 lines)" >&2
  tail -n 30 "$TMP/server.log" >&2 2>/dev/null || true
  echo "FAIL: $*" >&2
  exit 1
}

# The server must take --filter; blkd gains it with the layer stack.
need_filter_server() {
  need_server
  [ -n "$FILTERDIR" ] && [ -d "$FILTERDIR" ] || skip "no nbdkit filter directory (nbdkit not installed?)"
  if ! server_is_nbdkit && ! "$BLKD" --help 2>&1 | grep -q -- '--filter'; then
    skip "$BLKD has no --filter option (the layer stack is not in this build)"
  fi
}

# have_filter NAME: true when Debian's filter is installed; otherwise notes
# which checks are not made.
have_filter() {
  [ -f "$FILTERDIR/nbdkit-$1-filter.so" ] && return 0
  note "filter $1 is not installed: its checks are not made"
  return 1
}

# serve ARGS...: the server under test on a fresh port, filters and all;
# the previous one (if any) is stopped first.
serve() {
  [ -n "${SERVER_PID:-}" ] && stop_server
  : >"$TMP/server.log"
  start_server "$@"
}

# nbd_size URI: the export's size, from nbdinfo.
nbd_size() { nbdinfo --size "$1"; }

# nbd_get URI FILE: the whole export into FILE, with nbdcopy.
nbd_get() { rm -f "$2"; nbdcopy "$1" "$2"; }

# slice FILE OFFSET LENGTH: LENGTH bytes of FILE from OFFSET, on stdout.
slice() { dd if="$1" iflag=skip_bytes,count_bytes skip="$2" count="$3" bs=64K status=none; }

# same_bytes WHAT A B: the two files must be byte-identical.
same_bytes() {
  cmp -s "$2" "$3" || fail "$1: contents differ ($(cmp "$2" "$3" 2>&1 | head -1))"
  ok "$1"
}

# fill_of FILE OFFSET LENGTH: the distinct byte values (hex) in that range,
# e.g. "22" when it is all 0x22.
fill_of() {
  slice "$1" "$2" "$3" | od -An -v -tx1 | tr -s ' \n' '\n' | grep -v '^$' | sort -u | tr -d '\n'
}

# info URI KEY: one field of the export in `nbdinfo --json` (true/false,
# numbers), e.g. info "$URI" can_fua.
info() {
  nbdinfo --json "$1" | "$PY" -c 'import json, sys
v = json.load(sys.stdin)["exports"][0].get(sys.argv[1])
print(str(v).lower() if isinstance(v, bool) else v)' "$2"
}

# nbd_must_fail WHAT ERRNAME URI STATEMENT: with `h` connected to URI (strict
# mode off, so libnbd sends what the server must refuse), the Python
# STATEMENT must fail with that errno (EIO, EINVAL, EPERM...).
nbd_must_fail() {
  "$PY" - "$3" "$2" "$4" <<'PYEOF' || fail "$1"
import errno, nbd, sys
uri, want, stmt = sys.argv[1:]
h = nbd.NBD(); h.set_strict_mode(0); h.connect_uri(uri)
try:
    exec(stmt)
except nbd.Error as e:
    if e.errnum != getattr(errno, want):
        sys.exit("%s: got %s, want %s" % (stmt, e, want))
    sys.exit(0)
sys.exit("%s succeeded" % stmt)
PYEOF
  ok "$1"
}
