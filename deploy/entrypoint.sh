#!/bin/bash
# blkd container entrypoint: turns environment variables and arguments into
# one blkd command line, then execs blkd so it is PID 1 and gets the
# SIGTERM that `podman stop` / the kubelet send (blkd drains and exits 0).
#
#   (no arguments)             serve $BLKD_PLUGIN (default: ram, 1 GiB)
#   PLUGIN [key=value ...]     serve PLUGIN with these plugin arguments
#   -x ... [PLUGIN key=value]  leading words starting with '-' are extra
#                              blkd options (after those from BLKD_ARGS)
#   blkperf ... | blkd ... | any other command
#                              run it as is (e.g. the compose/k8s client)
#
# Environment (see deploy/README.md for the full table):
#   BLKD_PLUGIN       plugin name or path to a .so         (ram)
#   BLKD_SIZE         size= for ram                        (1G)
#   BLKD_FILE         file= for rawio
#   BLKD_PLUGIN_ARGS  extra plugin key=value words
#   BLKD_ADDR         listen address                       (0.0.0.0)
#   BLKD_PORT         NBD port                             (10809)
#   BLKD_METRICS      metrics ADDR:PORT or PORT; "off"     (0.0.0.0:9100)
#   BLKD_TLS          off|on|require    (require when BLKD_TLS_DIR is set)
#   BLKD_TLS_DIR      directory with ca-cert.pem, server-cert.pem, server-key.pem
#   BLKD_SHARDS       --shards N                           (blkd's default)
#   BLKD_EXPORT       -e EXPORTNAME
#   BLKD_READONLY     1/true/yes: -r
#   BLKD_VERBOSE      1/true/yes: -v
#   BLKD_ARGS         extra blkd options, split on whitespace
#   BLKD_DRY_RUN      1: print the command instead of running it (tests)
set -euo pipefail

prog=blkd-entrypoint
PREFIX=${BLKD_PREFIX:-/usr/local}
BLKD_BIN=${BLKD_BIN:-$PREFIX/bin/blkd}
PLUGINDIR=${BLKD_PLUGINDIR:-$PREFIX/lib/blkd/plugins}

die() { echo "$prog: $*" >&2; exit 2; }
truthy() { case "${1,,}" in 1|y|yes|true|on) return 0 ;; *) return 1 ;; esac; }

# Anything that is not an option and not a plugin is a command to run as is.
is_plugin() {
  case "$1" in
    */*|*.so) return 0 ;;
  esac
  [ -e "$PLUGINDIR/nbdkit-$1-plugin.so" ]
}
if [ $# -gt 0 ] && [[ "$1" != -* ]] && ! is_plugin "$1"; then
  exec "$@"
fi

opts=()
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do
  if [ "$1" = -- ]; then shift; break; fi
  opts+=("$1"); shift
done

plugin=${1:-${BLKD_PLUGIN:-ram}}
[ $# -gt 0 ] && shift
plugin_args=("$@")
if [ ${#plugin_args[@]} -eq 0 ] && [ -n "${BLKD_PLUGIN_ARGS:-}" ]; then
  read -r -a plugin_args <<<"$BLKD_PLUGIN_ARGS"
fi
has_key() { local a; for a in "${plugin_args[@]}"; do [[ "$a" == "$1="* ]] && return 0; done; return 1; }

# A short name found in the plugin directory is passed as a full path, so
# the image works whatever plugin directory blkd was compiled with.
plugin_name=$(basename "$plugin" .so); plugin_name=${plugin_name#nbdkit-}; plugin_name=${plugin_name%-plugin}
if [[ "$plugin" != */* ]] && [ -e "$PLUGINDIR/nbdkit-$plugin-plugin.so" ]; then
  plugin="$PLUGINDIR/nbdkit-$plugin-plugin.so"
fi
case "$plugin_name" in
  ram)   has_key size || plugin_args+=("size=${BLKD_SIZE:-1G}") ;;
  *)     if [ -n "${BLKD_SIZE:-}" ] && ! has_key size; then plugin_args+=("size=$BLKD_SIZE"); fi ;;
esac
if [ -n "${BLKD_FILE:-}" ] && ! has_key file; then plugin_args+=("file=$BLKD_FILE"); fi

cmd=("$BLKD_BIN" -f -i "${BLKD_ADDR:-0.0.0.0}" -p "${BLKD_PORT:-10809}")

metrics=${BLKD_METRICS-0.0.0.0:9100}
case "${metrics,,}" in
  ''|off|no|none|0) ;;
  *:*)              cmd+=(--metrics "$metrics") ;;
  *[!0-9]*)         die "BLKD_METRICS='$metrics': want ADDR:PORT, PORT or off" ;;
  *)                cmd+=(--metrics "0.0.0.0:$metrics") ;;
esac

tls=${BLKD_TLS:-}
if [ -n "${BLKD_TLS_DIR:-}" ]; then
  for f in ca-cert.pem server-cert.pem server-key.pem; do
    [ -r "$BLKD_TLS_DIR/$f" ] || die "BLKD_TLS_DIR=$BLKD_TLS_DIR has no readable $f"
  done
  cmd+=("--tls=${tls:-require}" "--tls-certificates=$BLKD_TLS_DIR")
elif [ -n "$tls" ] && [ "$tls" != off ]; then
  die "BLKD_TLS=$tls needs BLKD_TLS_DIR (a directory holding the certificates)"
fi

[ -n "${BLKD_SHARDS:-}" ] && cmd+=(--shards "$BLKD_SHARDS")
[ -n "${BLKD_EXPORT:-}" ] && cmd+=(-e "$BLKD_EXPORT")
truthy "${BLKD_READONLY:-}" && cmd+=(-r)
truthy "${BLKD_VERBOSE:-}" && cmd+=(-v)
if [ -n "${BLKD_ARGS:-}" ]; then
  read -r -a extra <<<"$BLKD_ARGS"
  cmd+=("${extra[@]}")
fi
cmd+=("${opts[@]}" "$plugin" "${plugin_args[@]}")

if truthy "${BLKD_DRY_RUN:-}"; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
echo "$prog: ${cmd[*]}" >&2
exec "${cmd[@]}"
