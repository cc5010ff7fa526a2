#!/usr/bin/env bash
# No shell script of the tests or benchmarks pipes a command into `grep -q`:
# under pipefail (lib.sh sets it) grep's exit at the first match kills a
# producer still writing with SIGPIPE, and the pipeline fails at random.
# ldd, which writes a line at a time, lost that race about once in 300
# runs: a sanitized build then looked unsanitized and a test took the wrong
# branch.  Match against captured output instead: grep -q PAT <<<"$(cmd)".
. "$(dirname "$0")/lib.sh"
need git
git -C "$TOP" rev-parse --git-dir >/dev/null 2>&1 || skip "not a git checkout (needs git ls-files)"
scripts=()
while IFS= read -r f; do
  case "$f" in
    *.sh|.ci/*) scripts+=("$f") ;;
    *) [[ $(head -n 1 "$TOP/$f") == '#!'*sh ]] && scripts+=("$f") ;;
  esac
done < <(git -C "$TOP" ls-files tests bench deploy .ci)
[ "${#scripts[@]}" -gt 50 ] || fail "only ${#scripts[@]} shell scripts found"
# A single `|` or `|&` (not `||`), then grep (egrep, fgrep; behind an
# assignment, `command`, `timeout N` ...) with -q, --quiet or --silent
# among its words, on a line that is not a comment (a trailing comment
# without quotes in it is dropped); a line ending in `|` or `\` is read
# with the next.  Not seen: a `|` inside a quoted grep pattern ahead of -q.
bad=$(cd "$TOP" && awk '
  FNR == 1 { buf = ""; start = 0 }
  /^[[:space:]]*#/ && buf == "" { next }
  {
    line = $0
    sub(/[[:space:]]#[^"'\'']*$/, "", line)
    if (buf == "") start = FNR
    buf = buf " " line
    if (line ~ /(\||\\)[[:space:]]*$/) next
    if (buf ~ /(^|[^|])\|&?[^|;&]*(^|[[:space:]\\])[ef]?grep([[:space:]]+[^|;&]*)?[[:space:]](-[a-zA-Z0-9]*q[^[:space:]]*|--quiet|--silent)([[:space:]]|$)/)
      print FILENAME ":" start ":" buf
    buf = ""
  }' "${scripts[@]}")
[ -z "$bad" ] || fail "piped into grep -q (use grep -q PAT <<<\"\$(cmd)\"):
$bad"
echo "${#scripts[@]} scripts: no pipeline ends in grep -q"
