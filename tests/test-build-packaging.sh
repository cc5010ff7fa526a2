#!/usr/bin/env bash
# The build as a packager drives it, in a scratch copy of the tracked tree:
# the user's CFLAGS/CPPFLAGS/LDFLAGS reach every binary and plugin without
# replacing the project's flags, a second make does nothing, a plugin is
# rebuilt alone when its source changes, WERROR=0 and NO_DEPS=1 do what
# they say, install/uninstall under DESTDIR leave nothing behind, and
# make dist names its tarball after VERSION.
# run.sh: serial (a whole extra build)
. "$(dirname "$0")/lib.sh"
need git
need readelf
git -C "$TOP" rev-parse --git-dir >/dev/null 2>&1 || skip "not a git checkout (needs git ls-files)"
# make exports its command-line variables: `make NO_DEPS=1 check` must not
# change what this test expects of a plain make.
unset NO_DEPS WERROR
src=$TMP/src
mkdir -p "$src"
git -C "$TOP" ls-files -z | (cd "$TOP" && xargs -0 cp --parents -t "$src")
cd "$src"
flags=(CFLAGS='-O1 -g' CPPFLAGS=-D_FORTIFY_SOURCE=2 LDFLAGS=-Wl,-z,now)

make -j2 "${flags[@]}" all blkperf >"$TMP/build.log" 2>&1 || { tail -30 "$TMP/build.log"; fail "build with user flags"; }
# Every compile has the project's include path and the user's flags.
compiles=$(grep -cE '^(gcc|cc) .* -c ' "$TMP/build.log")
[ "$compiles" -gt 10 ] || fail "only $compiles compiles in the log"
bad=$(grep -E '^(gcc|cc) .* -c ' "$TMP/build.log" | grep -v -- '-Iinclude' | grep -v -- '-O1 -g' || true)
bad+=$(grep -E '^(gcc|cc) .* -c ' "$TMP/build.log" | grep -v -- '-D_FORTIFY_SOURCE=2' || true)
[ -z "$bad" ] || { echo "$bad"; fail "compiles without the project's or the user's flags"; }
echo "ok: $compiles compiles, each with -Iinclude, -O1 -g and -D_FORTIFY_SOURCE=2"
for f in blkd blkperf plugins/*/nbdkit-*-plugin.so; do
  dyn=$(readelf -d "$f")
  grep -q 'BIND_NOW\|FLAGS.*NOW' <<<"$dyn" || fail "$f: LDFLAGS=-Wl,-z,now did not reach its link"
done
echo "ok: blkd, blkperf and every plugin linked with -z now"

out=$(make "${flags[@]}" all blkperf 2>&1)
grep -qE '^(gcc|cc) ' <<<"$out" && { echo "$out"; fail "a second make rebuilt something"; }
echo "ok: a second make does nothing"
touch plugins/ram/ram.c
out=$(make "${flags[@]}" all blkperf 2>&1)
built=$(grep -oE -- '-o [^ ]+' <<<"$out" | sort | tr '\n' ' ')
[ "$built" = "-o build/plugins/plugins/ram/ram.o -o plugins/ram/nbdkit-ram-plugin.so " ] ||
  fail "touching ram.c rebuilt: $built"
echo "ok: touching ram.c rebuilds the ram plugin only"

# Whole outputs into variables first: grep -q in a pipe would SIGPIPE make.
out=$(make -n WERROR=0 -B blkd)
grep -q -- '-Werror' <<<"$out" && fail "WERROR=0 still passes -Werror"
out=$(make -n -B blkd)
grep -q -- '-Werror' <<<"$out" || fail "-Werror is not on by default"
out=$(make -n NO_DEPS=1 check)
grep -q 'apt-get\|dpkg' <<<"$out" && fail "NO_DEPS=1 make check still runs the deps step"
out=$(make -n check)
grep -q 'dpkg' <<<"$out" || fail "make check lost its deps step"
echo "ok: WERROR=0 and NO_DEPS=1"

make -s "${flags[@]}" install DESTDIR="$TMP/dest" >/dev/null
for f in bin/blkd bin/blkperf share/man/man1/blkd.1 share/man/man1/blkperf.1 \
         lib/blkd/plugins/nbdkit-ram-plugin.so; do
  [ -f "$TMP/dest/usr/local/$f" ] || fail "make install did not install $f"
done
make -s uninstall DESTDIR="$TMP/dest" >/dev/null
left=$(find "$TMP/dest" -type f)
[ -z "$left" ] || fail "make uninstall left: $left"
echo "ok: install puts binaries, plugins and man pages in place; uninstall removes them"

cd "$TOP"
version=$(cat VERSION)
make -s dist >/dev/null
tarball=build/blkd-$version.tar.gz
[ -f "$tarball" ] || fail "make dist made no $tarball"
files=$(tar tzf "$tarball")
grep -qx "blkd-$version/VERSION" <<<"$files" || fail "$tarball has no VERSION"
[ "$("$BLKD" --version)" = "blkd $version" ] || fail "blkd --version is not VERSION ($version)"
echo "ok: make dist made $tarball; blkd --version says $version"
