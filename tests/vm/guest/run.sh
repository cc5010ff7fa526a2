# Guest: runs each line of /vm/plan ("NAME SECS ARGS...") as
# `sh /vm/cases.sh NAME ARGS...` under a timeout and prints one line per
# case on the console: CASE NAME ARGS PASS|FAIL|SKIP detail (Ns).
# After each case, whatever it left (mounts, devices, processes) is undone.
[ -e /vm/plan ] || { echo "VMERR no /vm/plan"; exit 0; }
while read -r name secs args; do
  case $name in ''|'#'*) continue ;; esac
  : >/tmp/case.detail
  t0=$(date +%s)
  timeout -s KILL "$secs" sh /vm/cases.sh "$name" $args </dev/null >/tmp/case.out 2>&1
  rc=$?
  t=$(($(date +%s) - t0))
  detail=$(tail -n1 /tmp/case.detail)
  case $rc in
    0) verdict=PASS ;;
    77) verdict=SKIP ;;
    137) verdict=FAIL; detail="timed out after ${secs}s; $detail" ;;
    *) verdict=FAIL ;;
  esac
  if [ "$verdict" != PASS ] || [ -n "$VM_VERBOSE" ]; then
    sed 's/^/  | /' /tmp/case.out | tail -n 40
  fi
  echo "CASE $name${args:+ $args} $verdict ${detail:-ok} (${t}s)"
  sh /vm/cases.sh cleanup </dev/null >/dev/null 2>&1
done </vm/plan
