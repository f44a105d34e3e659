#!/usr/bin/env python3
"""Asserts the least-privilege defaults and the wiring of a rendered gpumove manifest
(`kubectl kustomize` output): prints one line per finding, exit 1 on any.

  check_k8s.py RENDERED.yaml [--allow-host-ipc] [--allow-rdma] [--drain-grace-from FLAGS]

Checked: the DaemonSet's container is not privileged, cannot escalate, drops ALL
capabilities and adds IPC_LOCK only, runs as non-root on a read-only root file system
with the RuntimeDefault seccomp profile; it has startup, readiness and liveness probes;
the termination grace outlasts --drain_grace; no host namespaces (unless allowed) and no
hostPath volumes (unless the rdma overlay's); rolling updates and the PDB take one node
at a time; the peers' seed is a headless Service that publishes not-ready pods; a
NetworkPolicy selects the daemon's pods; no ServiceAccount token is mounted.
"""
import argparse
import re
import sys

import yaml


def durations_s(text):
    m = re.fullmatch(r"(\d+)(ms|s|m)", text)
    if not m:
        return None
    n, unit = int(m[1]), m[2]
    return n / 1000 if unit == "ms" else n * 60 if unit == "m" else n


def check(objs, allow_host_ipc, allow_rdma, flags_text):
    bad = []
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    ds_list = by_kind.get("DaemonSet", [])
    if len(ds_list) != 1:
        return [f"want one DaemonSet, found {len(ds_list)}"]
    ds = ds_list[0]
    spec = ds["spec"]["template"]["spec"]
    if spec.get("automountServiceAccountToken", True):
        bad.append("the pod mounts a ServiceAccount token")
    for key in ("hostNetwork",) + (() if allow_host_ipc else ("hostIPC", "hostPID")):
        if spec.get(key):
            bad.append(f"{key} is on")
    pod_sc = spec.get("securityContext", {})
    if not pod_sc.get("runAsNonRoot") or pod_sc.get("runAsUser", 0) == 0:
        bad.append("the pod may run as root")
    if pod_sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        bad.append("no RuntimeDefault seccomp profile")
    for v in spec.get("volumes", []):
        if "hostPath" in v and not (allow_rdma and v["hostPath"]["path"] == "/opt/hpcx"):
            bad.append(f"hostPath volume {v['name']}")
    containers = spec.get("containers", [])
    if len(containers) != 1:
        bad.append(f"want one container, found {len(containers)}")
    for c in containers:
        sc = c.get("securityContext", {})
        if sc.get("privileged", False):
            bad.append(f"container {c['name']} is privileged")
        if sc.get("allowPrivilegeEscalation", True):
            bad.append(f"container {c['name']} may escalate privileges")
        if not sc.get("readOnlyRootFilesystem", False):
            bad.append(f"container {c['name']} has a writable root file system")
        caps = sc.get("capabilities", {})
        if caps.get("drop") != ["ALL"]:
            bad.append(f"container {c['name']} does not drop ALL capabilities")
        if caps.get("add", []) != ["IPC_LOCK"]:
            bad.append(f"container {c['name']} adds {caps.get('add')} (want IPC_LOCK only)")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe not in c:
                bad.append(f"container {c['name']} has no {probe}")
        if "limits" not in c.get("resources", {}) or "requests" not in c.get("resources", {}):
            bad.append(f"container {c['name']} has no resource requests and limits")
        if not any(a.startswith("--peers=gpumove-peers.") for a in c.get("args", [])):
            bad.append("the daemon's --peers is not the headless Service")
    grace = spec.get("terminationGracePeriodSeconds", 30)
    m = re.search(r"^--drain_grace=(\S+)$", flags_text or "", re.M)
    drain = durations_s(m[1]) if m else None
    if drain is None:
        bad.append("no --drain_grace in the flags")
    elif grace <= drain:
        bad.append(f"terminationGracePeriodSeconds {grace} does not outlast --drain_grace {m[1]}")
    upd = ds["spec"].get("updateStrategy", {})
    if upd.get("type") != "RollingUpdate" or upd.get("rollingUpdate", {}).get("maxUnavailable") != 1:
        bad.append("updates do not roll one node at a time")
    pdbs = by_kind.get("PodDisruptionBudget", [])
    if not any(p["spec"].get("maxUnavailable") == 1 for p in pdbs):
        bad.append("no PodDisruptionBudget with maxUnavailable 1")
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    peers = services.get("gpumove-peers")
    if peers is None or peers["spec"].get("clusterIP") != "None" or \
            not peers["spec"].get("publishNotReadyAddresses"):
        bad.append("gpumove-peers is not a headless Service publishing not-ready pods")
    if "gpumove-metrics" not in services:
        bad.append("no metrics Service")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    policies = by_kind.get("NetworkPolicy", [])
    if not any(all(labels.get(k) == v for k, v in
                   p["spec"]["podSelector"].get("matchLabels", {}).items()) for p in policies):
        bad.append("no NetworkPolicy selects the daemon's pods")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rendered")
    ap.add_argument("--allow-host-ipc", action="store_true")
    ap.add_argument("--allow-rdma", action="store_true")
    a = ap.parse_args()
    with open(a.rendered) as f:
        objs = [o for o in yaml.safe_load_all(f) if o]
    flags = "".join(o.get("data", {}).get("gpumoved.flags", "") for o in objs
                    if o["kind"] == "ConfigMap")
    bad = check(objs, a.allow_host_ipc, a.allow_rdma, flags)
    for b in bad:
        print(f"FAIL {a.rendered}: {b}")
    if not bad:
        print(f"ok   {a.rendered}: least privilege and wiring")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
