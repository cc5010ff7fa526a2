#!/usr/bin/env python3
"""Gather the blkperf Job's results into one JSON document.

usage: gather-blkperf.py [--job blkperf] [--no-wait] [kubectl args ...]
  e.g. deploy/k8s/gather-blkperf.py -- -n bench --context prod

Waits for the indexed Job to complete, reads each pod's log (blkperf
--json --quiet prints one JSON object on stdout), and prints
  {"job": ..., "results": [{"index": N, "pod": ..., "node": ...,
                            "result": {...blkperf JSON...}}, ...],
   "failed": [{"index": N, "pod": ..., "error": ...}],
   "total": {"replicas": N, "throughput_mib_s": sum, "iops": sum}}
ordered by completion index, so replica N's numbers are at index N. Exits
non-zero when any index has no parsable result. Needs only kubectl (set
KUBECTL to use another binary) and the Python standard library.
"""
import argparse
import json
import os
import subprocess
import sys

INDEX_KEY = "batch.kubernetes.io/job-completion-index"


def kubectl(kargs, *args):
    cmd = [os.environ.get("KUBECTL", "kubectl"), *kargs, *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def last_json_object(text):
    """The last line (or trailing block) of the log that parses as JSON."""
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise ValueError("no JSON object in the log")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="blkperf")
    ap.add_argument("--timeout", default="15m")
    ap.add_argument("--no-wait", action="store_true")
    ap.add_argument("kubectl_args", nargs="*")
    a = ap.parse_args()
    k = a.kubectl_args

    if not a.no_wait:
        try:
            kubectl(k, "wait", "--for=condition=complete", f"job/{a.job}",
                    f"--timeout={a.timeout}")
        except subprocess.CalledProcessError as e:
            print(f"gather-blkperf: job/{a.job} did not complete: "
                  f"{e.stderr.strip()}; gathering what there is", file=sys.stderr)

    pods = json.loads(kubectl(k, "get", "pods", "-l", f"job-name={a.job}", "-o", "json"))
    # Retried indexes leave several pods: keep the last succeeded one.
    by_index = {}
    for p in pods.get("items", []):
        md = p["metadata"]
        idx = md.get("annotations", {}).get(INDEX_KEY)
        if idx is None:
            continue
        idx = int(idx)
        prev = by_index.get(idx)
        ok = p.get("status", {}).get("phase") == "Succeeded"
        if prev is None or (ok and prev[0] != "Succeeded"):
            by_index[idx] = (p.get("status", {}).get("phase"), p)

    results, failed = [], []
    for idx in sorted(by_index):
        phase, p = by_index[idx]
        name = p["metadata"]["name"]
        entry = {"index": idx, "pod": name, "node": p.get("spec", {}).get("nodeName")}
        try:
            if phase != "Succeeded":
                raise ValueError(f"pod phase {phase}")
            entry["result"] = last_json_object(kubectl(k, "logs", name, "-c", "blkperf"))
            results.append(entry)
        except (ValueError, subprocess.CalledProcessError) as e:
            entry["error"] = str(getattr(e, "stderr", None) or e).strip()
            failed.append(entry)

    # All replicas ran at once, so their rates add up to the cluster's.
    total = {"replicas": len(results)}
    for key in ("throughput_mib_s", "iops"):
        vals = [r["result"].get(key) for r in results if isinstance(r["result"], dict)]
        if vals and all(isinstance(v, (int, float)) for v in vals):
            total[key] = round(sum(vals), 2)
    json.dump({"job": a.job, "results": results, "failed": failed, "total": total},
              sys.stdout, indent=2)
    print()
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
