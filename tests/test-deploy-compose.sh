#!/usr/bin/env bash
# deploy/compose.yaml, checked without running it: it parses, has the blkd
# server and a blkperf client, the client waits for and targets the blkd
# service on the port and metrics address blkd is given, blkd stops on
# SIGTERM with a health check, and no per-service ulimits (they make podman
# drop deploy/containers.conf's defaults and fail to start the container).
# `podman-compose -f deploy/compose.yaml up` runs it for real (deploy/README.md).
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
[ -x "$PY" ] || skip "/usr/bin/python3 is not installed"
"$PY" -c 'import yaml' 2>/dev/null || skip "python3-yaml is not installed (apt-get install python3-yaml)"

"$PY" - "$TOP/deploy/compose.yaml" <<'EOF'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
errors = []
svc = c.get("services", {})
for name in ("blkd", "blkperf"):
    if name not in svc:
        sys.exit(f"FAIL: no service {name}")
b, p = svc["blkd"], svc["blkperf"]
env = b.get("environment", {})
port = str(env.get("BLKD_PORT", "10809"))
metrics = str(env.get("BLKD_METRICS", "0.0.0.0:9100")).rsplit(":", 1)[-1]
if b.get("image") != p.get("image"):
    errors.append("blkd and blkperf use different images")
if b.get("build", {}).get("dockerfile") != "deploy/Containerfile":
    errors.append("blkd does not build from deploy/Containerfile")
if b.get("stop_signal") != "SIGTERM":
    errors.append("blkd stop_signal is not SIGTERM")
if "blkd-healthcheck" not in " ".join(b.get("healthcheck", {}).get("test", [])):
    errors.append("blkd healthcheck does not run blkd-healthcheck")
for name, s in svc.items():
    if "ulimits" in s:
        errors.append(f"service {name} sets ulimits")
published = [str(x).rsplit(":", 1)[-1] for x in b.get("ports", [])]
for want in (port, metrics):
    if want not in published:
        errors.append(f"blkd does not publish container port {want}")
dep = p.get("depends_on", {})
if "blkd" not in dep:
    errors.append("blkperf does not depend on blkd")
elif isinstance(dep, dict) and dep["blkd"].get("condition") != "service_healthy":
    errors.append("blkperf does not wait for blkd to be healthy")
cmd = p.get("command", [])
cmd = " ".join(cmd) if isinstance(cmd, list) else str(cmd)
for want in ("blkperf", "--json", f"nbd://blkd:{port}", f"http://blkd:{metrics}/metrics"):
    if want not in cmd:
        errors.append(f"blkperf command lacks {want!r}: {cmd}")
if errors:
    sys.exit("FAIL: " + "\n  ".join(errors))
print(f"compose: blkd on {port} (metrics {metrics}), blkperf -> nbd://blkd:{port}")
EOF
