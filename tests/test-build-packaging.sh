#!/usr/bin/env bash
# The build as a packager drives it, in a scratch copy of the tracked tree:
# the user's CFLAGS/CPPFLAGS/LDFLAGS reach every binary and plugin without
# replacing the project's flags, a second make does nothing, a plugin is
# rebuilt alone when its source changes, WERROR=0 and NO_DEPS=1 do what
# they say, blkd exports exactly the nbdkit API its version script lists,
# install puts binaries, plugins, man pages, the plugin header and blkd.pc
# in place (a plugin source compiles against them through pkg-config) and
# uninstall under DESTDIR leaves nothing behind, and make dist names its
# tarball after VERSION.
# run.sh: serial (a whole extra build)
. "$(dirname "$0")/lib.sh"
need git
need readelf
need nm
need pkg-config
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

# The dynamic symbol table: the version script's list and nothing of
# blkd's own.  glibc data the binary holds copies of (stderr, optarg: copy
# relocations) is exported under glibc's version, which is not ours.
want=$(sed -n 's/^ *\(nbdkit_[a-z0-9_]*\);$/\1/p' server/blkd.syms | sort)
[ "$(wc -l <<<"$want")" -ge 40 ] || fail "server/blkd.syms lists only $(wc -l <<<"$want") symbols"
# A sanitizer build also exports its runtime's own switches (__asan_*).
got=$(nm -D --defined-only blkd | awk '{print $3}' | grep -v -e '@GLIBC_' -e '^__asan_' -e '^__ubsan_' -e '^__lsan_' -e '^__sanitizer_' | sort)
[ "$got" = "$want" ] || { diff <(echo "$want") <(echo "$got"); fail "nm -D blkd differs from server/blkd.syms"; }
echo "ok: nm -D blkd exports exactly the $(wc -l <<<"$want") nbdkit API functions of server/blkd.syms"

make -s "${flags[@]}" install DESTDIR="$TMP/dest" >/dev/null
for f in bin/blkd bin/blkperf share/man/man1/blkd.1 share/man/man1/blkperf.1 \
         share/man/man1/nbdkit-ram-plugin.1 share/man/man1/nbdkit-rawio-plugin.1 \
         lib/blkd/plugins/nbdkit-ram-plugin.so lib/blkd/plugins/nbdkit-rawio-plugin.so \
         $([ -f plugins/rbd/nbdkit-rbd-plugin.so ] && echo share/man/man1/nbdkit-rbd-plugin.1 lib/blkd/plugins/nbdkit-rbd-plugin.so) \
         include/blkd-plugin.h lib/pkgconfig/blkd.pc; do
  [ -f "$TMP/dest/usr/local/$f" ] || fail "make install did not install $f"
done
[ -f "$TOP/LICENSE" ] || fail "no LICENSE file"
pc=(env PKG_CONFIG_PATH="$TMP/dest/usr/local/lib/pkgconfig" pkg-config)
[ "$("${pc[@]}" --modversion blkd)" = "$(cat VERSION)" ] || fail "blkd.pc does not carry VERSION"
[ "$("${pc[@]}" --variable=plugindir blkd)" = /usr/local/lib/blkd/plugins ] \
  || fail "blkd.pc: plugindir is $("${pc[@]}" --variable=plugindir blkd)"
# A plugin author's build: nbdkit's header and blkd's installed one, found
# through pkg-config (the header's directory given by hand as it lies under
# DESTDIR, not the prefix blkd.pc names).
cat >"$TMP/ext.c" <<'EOC'
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>
#include <blkd-plugin.h>
const struct blkd_plugin_extension blkd_plugin_extension = {
  .version = BLKD_PLUGIN_EXTENSION_VERSION,
  .size = sizeof (struct blkd_plugin_extension),
};
EOC
# shellcheck disable=SC2046
gcc -Wall -Werror -c -o "$TMP/ext.o" "$TMP/ext.c" $("${pc[@]}" --cflags blkd) \
  -I"$TMP/dest/usr/local/include" || fail "a plugin source does not compile against the installed header"
man_ok=$(LC_ALL=C.UTF-8 MANWIDTH=80 man -l "$TMP/dest/usr/local/share/man/man1/nbdkit-ram-plugin.1" 2>/dev/null \
         | grep -c 'size=' || true)
[ "$man_ok" -ge 1 ] || fail "the installed nbdkit-ram-plugin(1) does not render its size= parameter"
make -s uninstall DESTDIR="$TMP/dest" >/dev/null
left=$(find "$TMP/dest" -type f)
[ -z "$left" ] || fail "make uninstall left: $left"
echo "ok: install puts binaries, plugins, man pages (blkd, blkperf and the plugins), blkd-plugin.h and blkd.pc in place; uninstall removes them"

cd "$TOP"
version=$(cat VERSION)
make -s dist >/dev/null
tarball=build/blkd-$version.tar.gz
[ -f "$tarball" ] || fail "make dist made no $tarball"
files=$(tar tzf "$tarball")
grep -qx "blkd-$version/VERSION" <<<"$files" || fail "$tarball has no VERSION"
[ "$("$BLKD" --version)" = "blkd $version" ] || fail "blkd --version is not VERSION ($version)"
echo "ok: make dist made $tarball; blkd --version says $version"
