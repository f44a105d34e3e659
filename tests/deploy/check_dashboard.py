#!/usr/bin/env python3
"""The Grafana dashboard's queries, checked without Grafana:
  check_dashboard.py DASHBOARD.json RULES_OUT.yaml METRICS.txt
- writes every panel query (Grafana's variables given plausible values) into a Prometheus
  rule file for `promtool check rules` to parse (RULES_OUT.yaml);
- every gpumoved_* metric the dashboard and deploy/prometheus's rules read must be one a
  live daemon exports (METRICS.txt: its /metrics), so a renamed metric fails here;
- panel ids are unique, every panel has a datasource and at least one query.
Prints findings; exit 1 on any."""
import json
import re
import sys

import yaml

VARIABLES = {"$__rate_interval": "1m", "$__interval": "30s", "$instance": ".*",
             "${datasource}": "prometheus"}


def main():
    dash_path, rules_out, metrics_path = sys.argv[1:4]
    with open(dash_path) as f:
        dash = json.load(f)
    bad = []
    exprs = []
    ids = set()
    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))
    for p in panels(dash.get("panels", [])):
        if p["id"] in ids:
            bad.append(f"panel id {p['id']} twice")
        ids.add(p["id"])
        if p["type"] == "row":
            continue
        if not p.get("datasource"):
            bad.append(f"panel {p['title']!r} has no datasource")
        if not p.get("targets"):
            bad.append(f"panel {p['title']!r} has no query")
        for t in p.get("targets", []):
            e = t["expr"]
            for k, v in VARIABLES.items():
                e = e.replace(k, v)
            if "$" in e:
                bad.append(f"panel {p['title']!r}: unknown variable in {t['expr']}")
            exprs.append((p["title"], e))
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": e} for i, (_, e) in enumerate(exprs)]}]}
    with open(rules_out, "w") as f:
        yaml.safe_dump(rules, f)
    with open(metrics_path) as f:
        exported = set(re.findall(r"^# TYPE (\S+) ", f.read(), re.M))
    used = set()
    for _, e in exprs:
        used |= set(re.findall(r"\bgpumoved_[a-z0-9_]+", e))
    rules_file = sys.argv[4] if len(sys.argv) > 4 else None
    if rules_file:
        with open(rules_file) as f:
            used |= set(re.findall(r"\bgpumoved_[a-z0-9_]+", f.read()))
    for name in sorted(used):
        family = re.sub(r"_(bucket|count|sum)$", "", name)
        if family not in exported and name not in exported:
            bad.append(f"{name} is read but a live gpumoved does not export it")
    for b in bad:
        print(f"FAIL {dash_path}: {b}")
    if not bad:
        print(f"ok   {dash_path}: {len(exprs)} queries, {len(used)} metrics, all exported")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
