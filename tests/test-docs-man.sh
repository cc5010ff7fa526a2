#!/usr/bin/env bash
# The manual pages: blkd(1) and blkperf(1) render without warnings and
# document every option the programs' --help lists, so an option added
# without a line in its man page fails here; each installed plugin's
# nbdkit-NAME-plugin(1) renders cleanly and documents every key=value
# its config_help (blkd NAME --help) names.
. "$(dirname "$0")/lib.sh"
need man
need groff
[ -x "$BLKD" ] || skip "no blkd binary at $BLKD"
[ -x "$BLKPERF" ] || skip "no blkperf binary at $BLKPERF"

# OPTIONS_OF PROGRAM: each option token in PROGRAM --help, once.  A token
# is a dash-word not glued to a word before it (so "read-only" is not one).
options_of() {
  "$1" --help 2>&1 | grep -oP '(?<![\w-])--?[A-Za-z0-9][\w-]*' | sort -u
}

# renders_clean PAGE: man's own check, as Debian's lintian runs it, then
# groff's -ww: any warning text at all fails.
renders_clean() {
  local warn
  warn=$(LC_ALL=C.UTF-8 MANROFFSEQ='' MANWIDTH=80 \
         man --warnings -E UTF-8 -l -Tutf8 -Z "$1" 2>&1 >/dev/null)
  [ -z "$warn" ] || { echo "$warn"; fail "$(basename "$1"): man --warnings complains"; }
  warn=$(groff -ww -man -Tutf8 -z "$1" 2>&1)
  [ -z "$warn" ] || { echo "$warn"; fail "$(basename "$1"): groff -ww complains"; }
}

bad=0
for prog in "$BLKD" "$BLKPERF"; do
  name=$(basename "$prog")
  page="$TOP/man/$name.1"
  [ -f "$page" ] || fail "no manual page $page"

  renders_clean "$page"
  echo "ok: $name.1 renders without warnings"

  # Rendered as plain ASCII (\- becomes '-', no overstrike, no
  # hyphenation: the page says .nh) so a grep sees what a reader sees.
  text=$(groff -man -Tascii -P-c -P-b -P-u "$page" 2>/dev/null)
  n=0
  while read -r opt; do
    n=$((n + 1))
    if ! grep -qP -- "(?<![\w-])\Q$opt\E(?![\w-])" <<<"$text"; then
      echo "MISSING: $name --help lists $opt but $name.1 does not document it"
      bad=$((bad + 1))
    fi
  done < <(options_of "$prog")
  [ "$n" -gt 10 ] || fail "only $n options found in $name --help: extraction broken?"
  echo "ok: $name.1 checked against $n options from --help"
done
[ "$bad" -eq 0 ] || fail "$bad option(s) missing from the manual pages"

for name in ram rawio rbd; do
  page="$TOP/man/nbdkit-$name-plugin.1"
  [ -f "$page" ] || fail "no manual page $page"
  renders_clean "$page"
  text=$(groff -man -Tascii -P-c -P-b -P-u "$page" 2>/dev/null)
  keys=$("$BLKD" "$name" --help 2>&1 | sed -n 's/^\([a-z_]*\)=<.*/\1/p')
  [ -n "$keys" ] || fail "no key=value lines in blkd $name --help"
  for k in $keys; do
    grep -q -- "$k=" <<<"$text" || fail "nbdkit-$name-plugin.1 does not document $k="
  done
  echo "ok: nbdkit-$name-plugin.1 renders without warnings and documents" $keys
done
