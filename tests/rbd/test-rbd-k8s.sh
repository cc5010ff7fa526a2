#!/usr/bin/env bash
# deploy/k8s/rbd, checked without a cluster: every file parses, kustomization lists them all, the
# Service and Deployment select the same pods, the ConfigMap and Secret the pod uses exist, the
# Secret's files are mounted where the plugin arguments look for them, one replica replaced with
# Recreate, probes on the metrics port; and the image's entrypoint turns the ConfigMap into the
# blkd command line that serves the rbd plugin.
. "$(dirname "$0")/../lib.sh"
PY=/usr/bin/python3
[ -x "$PY" ] || skip "/usr/bin/python3 is not installed"
"$PY" -c 'import yaml' 2>/dev/null || skip "python3-yaml is not installed"
D=$TOP/deploy/k8s/rbd

"$PY" - "$D" "$TMP/env" <<'PYEOF' || fail "deploy/k8s/rbd manifests"
import glob, os, shlex, sys
import yaml
d, envfile = sys.argv[1], sys.argv[2]
docs = {}
for f in sorted(glob.glob(os.path.join(d, "*.yaml"))):
    for doc in yaml.safe_load_all(open(f)):
        if doc:
            assert "apiVersion" in doc and "kind" in doc, f
            docs.setdefault(doc["kind"], []).append((os.path.basename(f), doc))
for kind in ("Kustomization", "Deployment", "Service", "ConfigMap", "Secret"):
    assert len(docs.get(kind, [])) == 1, "want one %s, have %d" % (kind, len(docs.get(kind, [])))
one = lambda k: docs[k][0][1]
kust, dep, svc, cm, sec = (one(k) for k in ("Kustomization", "Deployment", "Service", "ConfigMap", "Secret"))
files = {f for v in docs.values() for f, _ in v} - {"kustomization.yaml"}
assert set(kust["resources"]) == files, (kust["resources"], files)

spec, tpl = dep["spec"], dep["spec"]["template"]
labels = tpl["metadata"]["labels"]
assert spec["selector"]["matchLabels"].items() <= labels.items(), "Deployment selector"
assert svc["spec"]["selector"].items() <= labels.items(), "Service selector"
assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate", "one replica, Recreate"
pod = tpl["spec"]
assert pod["securityContext"]["runAsNonRoot"] is True
c = pod["containers"][0]
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
assert ports == {"nbd": 10809, "metrics": 9100}, ports
for probe in ("readinessProbe", "livenessProbe"):
    assert c[probe]["httpGet"]["port"] == "metrics" and c[probe]["httpGet"]["path"] == "/healthz"
for p in svc["spec"]["ports"]:
    assert p["targetPort"] in ports, p
assert tpl["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
assert c["envFrom"][0]["configMapRef"]["name"] == cm["metadata"]["name"]

# The Secret's files are where conf= and keyring= point.
vols = {v["name"]: v for v in pod["volumes"]}
mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
data = cm["data"]
assert data["BLKD_PLUGIN"] == "rbd"
args = dict(a.split("=", 1) for a in shlex.split(data["BLKD_PLUGIN_ARGS"]))
found = {}
for name, v in vols.items():
    if "secret" not in v:
        continue
    assert v["secret"]["secretName"] == sec["metadata"]["name"], v
    for it in v["secret"]["items"]:
        assert it["key"] in sec["stringData"], it
        found[os.path.join(mounts[name], it["path"])] = it["key"]
assert found.get(args["conf"]) == "ceph.conf", (args, found)
assert found.get(args["keyring"]) == "keyring", (args, found)
assert "[client.%s]" % args["id"] in sec["stringData"]["keyring"], "keyring section for id="
assert "mon host" in sec["stringData"]["ceph.conf"]
# A CPU limit is a quota that neither blkd nor the plugin can see: the
# ConfigMap sets what suits that many CPUs (docs/RBD.md): on at most two,
# one librbd thread and one event loop; above, Ceph's threads and a loop
# per CPU.
cpu = str(c["resources"]["limits"]["cpu"])
limit = -(-int(cpu[:-1]) // 1000) if cpu.endswith("m") else int(-(-float(cpu) // 1))
small = limit <= 2
assert data["BLKD_SHARDS"] == ("1" if small else str(limit)), (data["BLKD_SHARDS"], limit)
assert (args.get("librados_thread_count") == "1") == small, (args, limit)
with open(envfile, "w") as fh:
    for k, v in data.items():
        fh.write("%s=%s\n" % (k, shlex.quote(v)))
print("manifests ok")
PYEOF

# The entrypoint with that environment: serves the rbd plugin by full path
# with the ConfigMap's arguments and the metrics port the probes use.
mkdir -p "$TMP/plugins" && touch "$TMP/plugins/nbdkit-rbd-plugin.so"
out=$(set -a; . "$TMP/env"; BLKD_DRY_RUN=1 BLKD_PLUGINDIR="$TMP/plugins" BLKD_BIN=/usr/local/bin/blkd \
      "$TOP/deploy/entrypoint.sh")
echo "$out"
for want in "$TMP/plugins/nbdkit-rbd-plugin.so" conf=/etc/ceph/ceph.conf keyring=/etc/ceph/keyring \
            id=blkd pool=rbd image=disk0 librados_thread_count=1 "--shards 1" \
            "--metrics 0.0.0.0:9100" "-p 10809"; do
  case " $out " in *" $want "*) ;; *) fail "entrypoint command lacks '$want'" ;; esac
done
echo ok
