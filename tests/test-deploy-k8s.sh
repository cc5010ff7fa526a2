#!/usr/bin/env bash
# deploy/k8s manifests, checked without a cluster: every file parses, the
# required kinds are there, and the names that tie them together agree --
# Service selectors pick the StatefulSet's pods (and not the Job's),
# serviceName is the headless Service, probes and the Prometheus annotation
# point at the metrics port, the ConfigMap/Secret the pods use exist, and the
# indexed Job targets <statefulset>-$(JOB_COMPLETION_INDEX).<headless> on the
# NBD port, one completion per replica. Also runs gather-blkperf.py against a
# stand-in kubectl.
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
[ -x "$PY" ] || skip "/usr/bin/python3 is not installed"
"$PY" -c 'import yaml' 2>/dev/null || skip "python3-yaml is not installed (apt-get install python3-yaml)"

"$PY" - "${K8S_DIR:-$TOP/deploy/k8s}" <<'EOF'
import glob, os, re, sys
import yaml

d = sys.argv[1]
errors = []
def err(msg): errors.append(msg)

files = sorted(glob.glob(os.path.join(d, "*.yaml")))
if not files:
    sys.exit(f"FAIL: no manifests in {d}")

docs = []   # (file, doc)
for f in files:
    try:
        with open(f) as fh:
            for doc in yaml.safe_load_all(fh):
                if doc is not None:
                    docs.append((os.path.basename(f), doc))
    except yaml.YAMLError as e:
        err(f"{f}: does not parse: {e}")
if errors:
    sys.exit("FAIL: " + "\n".join(errors))

objs = {}
for f, doc in docs:
    for key in ("apiVersion", "kind"):
        if key not in doc:
            err(f"{f}: no {key}")
    if doc.get("kind") != "Kustomization" and not doc.get("metadata", {}).get("name"):
        err(f"{f}: {doc.get('kind')} has no metadata.name")
    objs.setdefault(doc.get("kind"), []).append((f, doc))

def one(kind):
    got = objs.get(kind, [])
    if len(got) != 1:
        err(f"want exactly one {kind}, found {len(got)}")
        return None
    return got[0][1]

def get(obj, path, default=None):
    cur = obj
    for p in path.split("."):
        if not isinstance(cur, dict) or p not in cur:
            return default
        cur = cur[p]
    return cur

for kind in ("StatefulSet", "Service", "ConfigMap", "Secret", "Job", "Kustomization"):
    if kind not in objs:
        err(f"no {kind} manifest")
if errors:
    sys.exit("FAIL: " + "\n".join(errors))

sts, job, cm, secret = one("StatefulSet"), one("Job"), one("ConfigMap"), one("Secret")
kust = one("Kustomization")
if errors:
    sys.exit("FAIL: " + "\n".join(errors))

# --- kustomization lists the server's manifests; files exist ---
res = kust.get("resources", [])
for r in res:
    if not os.path.exists(os.path.join(d, r)):
        err(f"kustomization.yaml lists missing {r}")
for f, doc in docs:
    if doc["kind"] not in ("Kustomization", "Job") and f not in res:
        err(f"kustomization.yaml does not list {f} ({doc['kind']})")

# --- StatefulSet ---
sname = sts["metadata"]["name"]
spec = sts["spec"]
tmpl = spec["template"]
plabels = get(tmpl, "metadata.labels", {})
sel = get(spec, "selector.matchLabels", {})
if not sel:
    err("StatefulSet has no selector.matchLabels")
for k, v in sel.items():
    if plabels.get(k) != v:
        err(f"StatefulSet selector {k}={v} does not match its pod labels {plabels}")
replicas = spec.get("replicas", 1)

containers = get(tmpl, "spec.containers", [])
blkd = next((c for c in containers if c["name"] == "blkd"), None)
if blkd is None:
    sys.exit("FAIL: StatefulSet has no container named blkd")
ports = {p.get("name"): p["containerPort"] for p in blkd.get("ports", [])}
for need in ("nbd", "metrics"):
    if need not in ports:
        err(f"blkd container has no port named {need}")
nbd_port, metrics_port = ports.get("nbd"), ports.get("metrics")

def port_is(ref, name, number):
    return ref == name or ref == number

for probe in ("readinessProbe", "livenessProbe"):
    p = blkd.get(probe)
    if not p:
        err(f"blkd container has no {probe}")
        continue
    hg = p.get("httpGet", {})
    if hg.get("path") != "/healthz":
        err(f"{probe} path is {hg.get('path')!r}, want /healthz")
    if not port_is(hg.get("port"), "metrics", metrics_port):
        err(f"{probe} port {hg.get('port')!r} is not the metrics port ({metrics_port})")

ann = get(tmpl, "metadata.annotations", {})
if ann.get("prometheus.io/scrape") != "true":
    err("pod template lacks prometheus.io/scrape: \"true\"")
if str(ann.get("prometheus.io/port")) != str(metrics_port):
    err(f"prometheus.io/port {ann.get('prometheus.io/port')!r} != metrics port {metrics_port}")
if ann.get("prometheus.io/path", "/metrics") != "/metrics":
    err("prometheus.io/path is not /metrics")

for c in containers + get(tmpl, "spec.initContainers", []):
    r = c.get("resources", {})
    if not r.get("requests") or not r.get("limits"):
        err(f"container {c['name']} lacks resource requests and limits")
    if not (c.get("image") or "").strip():
        err(f"container {c['name']} has no image")

psc = get(tmpl, "spec.securityContext", {})
if not psc.get("runAsNonRoot"):
    err("StatefulSet pods do not set runAsNonRoot")
if get(blkd, "securityContext.allowPrivilegeEscalation") is not False:
    err("blkd container allows privilege escalation")

# volumeClaimTemplates back the data mount, which holds rawio's file.
vcts = [v["metadata"]["name"] for v in spec.get("volumeClaimTemplates", [])]
if not vcts:
    err("StatefulSet has no volumeClaimTemplates")
mounts = {m["name"]: m["mountPath"] for m in blkd.get("volumeMounts", [])}
vols = {v["name"]: v for v in get(tmpl, "spec.volumes", [])}
for m in mounts:
    if m not in vols and m not in vcts:
        err(f"blkd mounts volume {m}, which is neither a volume nor a claim template")
if not any(v in mounts for v in vcts):
    err("no volumeClaimTemplate is mounted in the blkd container")

# ConfigMap and Secret the pods refer to exist, and agree with the ports.
cmname, secname = cm["metadata"]["name"], secret["metadata"]["name"]
refs = [e.get("configMapRef", {}).get("name") for e in blkd.get("envFrom", [])]
if cmname not in refs:
    err(f"blkd container does not load ConfigMap {cmname} (envFrom: {refs})")
secvols = [v["secret"]["secretName"] for v in vols.values() if "secret" in v]
if secname not in secvols:
    err(f"no pod volume uses Secret {secname}")
data = cm.get("data", {})
if data.get("BLKD_PLUGIN") != "rawio":
    err(f"ConfigMap BLKD_PLUGIN is {data.get('BLKD_PLUGIN')!r}, want rawio (PVC-backed)")
bfile = data.get("BLKD_FILE", "")
data_mount = next((mounts[v] for v in vcts if v in mounts), None)
if not data_mount or not bfile.startswith(data_mount.rstrip("/") + "/"):
    err(f"BLKD_FILE {bfile!r} is not on the claim's mount {data_mount!r}")
if str(data.get("BLKD_PORT")) != str(nbd_port):
    err(f"ConfigMap BLKD_PORT {data.get('BLKD_PORT')!r} != container port nbd {nbd_port}")
if not str(data.get("BLKD_METRICS", "")).endswith(f":{metrics_port}"):
    err(f"ConfigMap BLKD_METRICS {data.get('BLKD_METRICS')!r} is not on port {metrics_port}")
for v in data.values():
    if not isinstance(v, str):
        err(f"ConfigMap value {v!r} is not a string (quote it)")
tlskeys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
for k in ("ca-cert.pem", "server-cert.pem", "server-key.pem"):
    if k not in tlskeys:
        err(f"Secret {secname} lacks {k}")

# --- Services ---
services = {doc["metadata"]["name"]: doc for _, doc in objs["Service"]}
headless = [n for n, s in services.items() if s["spec"].get("clusterIP") == "None"]
clusterip = [n for n, s in services.items()
             if s["spec"].get("clusterIP") != "None" and s["spec"].get("type", "ClusterIP") == "ClusterIP"]
if len(headless) != 1:
    err(f"want one headless Service, found {headless}")
if len(clusterip) != 1:
    err(f"want one ClusterIP Service, found {clusterip}")
if headless and spec.get("serviceName") != headless[0]:
    err(f"StatefulSet serviceName {spec.get('serviceName')!r} != headless Service {headless[0]!r}")
jlabels = get(job, "spec.template.metadata.labels", {})
for n, s in services.items():
    ssel = s["spec"].get("selector", {})
    if not ssel:
        err(f"Service {n} has no selector")
    for k, v in ssel.items():
        if plabels.get(k) != v:
            err(f"Service {n} selector {k}={v} does not match StatefulSet pod labels")
    if ssel and all(jlabels.get(k) == v for k, v in ssel.items()):
        err(f"Service {n} selector also matches the blkperf Job's pods")
    for p in s["spec"].get("ports", []):
        tp = p.get("targetPort", p.get("port"))
        if tp not in ports and tp not in ports.values():
            err(f"Service {n} targetPort {tp!r} is not a blkd container port")
    sp = {p.get("name"): p for p in s["spec"].get("ports", [])}
    if "nbd" not in sp:
        err(f"Service {n} has no nbd port")

# --- Job: indexed, one completion per replica, targets each replica ---
jspec = job["spec"]
if jspec.get("completionMode") != "Indexed":
    err("Job completionMode is not Indexed")
if jspec.get("completions") != replicas or jspec.get("parallelism") != replicas:
    err(f"Job completions/parallelism {jspec.get('completions')}/{jspec.get('parallelism')} "
        f"!= StatefulSet replicas {replicas}")
jpod = jspec["template"]["spec"]
if jpod.get("restartPolicy") not in ("Never", "OnFailure"):
    err("Job restartPolicy must be Never or OnFailure")
jc = next((c for c in jpod.get("containers", []) if c["name"] == "blkperf"), None)
if jc is None:
    sys.exit("FAIL: Job has no container named blkperf\n" + "\n".join(errors))
argv = list(jc.get("command", [])) + [str(a) for a in jc.get("args", [])]
if not any(os.path.basename(a) == "blkperf" for a in argv[:1]):
    err(f"Job container does not run blkperf: {argv[:1]}")
for flag in ("--json",):
    if flag not in argv:
        err(f"Job blkperf lacks {flag}")
if "-t" not in argv or argv[argv.index("-t") + 1] != "STREAM_READ":
    err("Job blkperf does not run -t STREAM_READ")
hs = headless[0] if headless else "?"
want = f"nbd://{sname}-$(JOB_COMPLETION_INDEX).{hs}:{nbd_port}"
if want not in argv:
    err(f"Job does not target {want}; argv: {argv}")
for a in argv:
    for m in re.finditer(r"https?://([^/:]+)(?::(\d+))?", a):
        host, port = m.group(1), m.group(2)
        if host != f"{sname}-$(JOB_COMPLETION_INDEX).{hs}" or str(port) != str(metrics_port):
            err(f"Job metrics URL {a} is not {sname}-N.{hs}:{metrics_port}")
for c in jpod.get("containers", []) + jpod.get("initContainers", []):
    envnames = {e["name"] for e in c.get("env", [])}
    text = " ".join(list(c.get("command", [])) + [str(x) for x in c.get("args", [])])
    for v in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", text):
        if v not in envnames:
            err(f"Job container {c['name']} uses $({v}) but does not define it in env")
    for e in c.get("env", []):
        if e["name"] == "JOB_COMPLETION_INDEX":
            fp = get(e, "valueFrom.fieldRef.fieldPath", "")
            if "job-completion-index" not in fp:
                err(f"JOB_COMPLETION_INDEX in {c['name']} is not from the completion-index annotation")
    if "blkd-headless" in text or hs in text:
        if hs not in text:
            err(f"Job container {c['name']} names a host other than {hs}")
if jc.get("image") != blkd.get("image"):
    err(f"Job image {jc.get('image')} differs from the StatefulSet's {blkd.get('image')}")

if errors:
    print("FAIL: " + "\n  ".join(errors), file=sys.stderr)
    sys.exit(1)
print(f"{len(files)} manifests, {len(docs)} objects: "
      f"StatefulSet {sname} x{replicas} behind {hs} + {clusterip[0]}, "
      f"Job targets {want}")
EOF

# gather-blkperf.py against a stand-in kubectl: two pods, one per index
# (index 1 listed first, plus a failed earlier try of index 1).
fake=$TMP/kubectl
cat > "$fake" <<'EOF'
#!/bin/bash
case "$*" in
  *wait*) exit 0 ;;
  *"get pods"*) cat <<'J'
{"items": [
 {"metadata": {"name": "blkperf-1-aaa", "annotations": {"batch.kubernetes.io/job-completion-index": "1"}},
  "spec": {"nodeName": "n2"}, "status": {"phase": "Failed"}},
 {"metadata": {"name": "blkperf-1-bbb", "annotations": {"batch.kubernetes.io/job-completion-index": "1"}},
  "spec": {"nodeName": "n2"}, "status": {"phase": "Succeeded"}},
 {"metadata": {"name": "blkperf-0-ccc", "annotations": {"batch.kubernetes.io/job-completion-index": "0"}},
  "spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}}]}
J
  ;;
  *"logs blkperf-0-ccc"*) echo '{"test": "STREAM_READ", "throughput_mib_s": 100, "iops": 400}' ;;
  *"logs blkperf-1-bbb"*) echo 'some noise'; echo '{"test": "STREAM_READ", "throughput_mib_s": 200.5, "iops": 800}' ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
EOF
chmod +x "$fake"
KUBECTL=$fake "$PY" "$TOP/deploy/k8s/gather-blkperf.py" -- -n bench > "$TMP/gathered.json" ||
  fail "gather-blkperf.py: $(cat "$TMP/gathered.json")"
"$PY" - "$TMP/gathered.json" <<'EOF' || fail "gather-blkperf.py output is wrong: $(cat "$TMP/gathered.json")"
import json, sys
g = json.load(open(sys.argv[1]))
assert [r["index"] for r in g["results"]] == [0, 1], g
assert [r["result"]["throughput_mib_s"] for r in g["results"]] == [100, 200.5], g
assert g["total"] == {"replicas": 2, "throughput_mib_s": 300.5, "iops": 1200}, g
assert g["failed"] == [], g
EOF
echo "gather-blkperf.py: results ordered by index, retried pod resolved"
