#!/bin/sh
# Print the Debian mirror this host's apt uses for bookworm, so debootstrap
# and the image's own apt talk to the same place (the build machines reach no
# other registry). Reads both source formats:
#   one-line  /etc/apt/sources.list, /etc/apt/sources.list.d/*.list
#             deb [options] URI SUITE COMPONENT...
#   deb822    /etc/apt/sources.list.d/*.sources
#             Types: deb / URIs: URI / Suites: bookworm ...
# Takes the first enabled "deb" source whose suite is exactly SUITE (default
# bookworm), which skips bookworm-security / bookworm-updates stanzas and
# files renamed away from .list/.sources (e.g. *.disabled). Falls back to
# deb.debian.org when nothing matches. Override with MIRROR=... in make.
suite=${1:-bookworm}
dir=${APT_DIR:-/etc/apt}

found=
for f in "$dir/sources.list" "$dir"/sources.list.d/*.list; do
  [ -f "$f" ] || continue
  found=$(awk -v suite="$suite" '
    /^[ \t]*#/ { next }
    $1 == "deb" {
      i = 2
      if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
      if ($(i + 1) == suite) { print $i; exit }
    }' "$f")
  [ -n "$found" ] && break
done

if [ -z "$found" ]; then
  for f in "$dir"/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # Stanzas are separated by blank lines; collect fields per stanza.
    found=$(awk -v suite="$suite" '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ (" " suite " ") && uris != "") {
          split(uris, u, " "); print u[1]; done = 1; exit
        }
        types = ""; uris = ""; suites = ""; enabled = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      {
        key = tolower($1); sub(/:$/, "", key)
        val = $0; sub(/^[^:]*:[ \t]*/, "", val)
        if (key == "types") types = val
        else if (key == "uris") uris = val
        else if (key == "suites") suites = val
        else if (key == "enabled") enabled = tolower(val)
      }
      END { if (!done) flush() }' "$f")
    [ -n "$found" ] && break
  done
fi

echo "${found:-http://deb.debian.org/debian}"
