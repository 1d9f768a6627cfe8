#!/usr/bin/env python3
"""Check that every PromQL query of a Grafana dashboard or a Prometheus rule
file names only metrics that idemproxy's /metrics exports.

    check_dashboard.py --metrics SCRAPE FILE...

SCRAPE is the text of a GET /metrics ("-" reads stdin). Each FILE is a Grafana
dashboard (.json: panel targets, template variable queries, annotations, rows
and library panels nested at any depth) or a Prometheus rule file (.yaml/.yml:
groups[].rules[].expr).

For every query:
  - it parses as PromQL (a real parser, promql-parser; Grafana's $__interval
    style macros are replaced by a duration first; label_values(), query_result()
    and friends of variable queries are unwrapped);
  - it names at least one metric, and each one is a series the scrape exports:
    a sample name in it, or one its # TYPE lines imply (X_bucket/X_sum/X_count
    of a histogram X; a bare histogram name is not a series and fails);
  - each label in a selector's matchers is on that metric in the scrape, and an
    = or != matcher with a literal value names a value the scrape has (so
    outcome="ack" is caught: the outcome is "acked"); labels Prometheus adds at
    scrape time (instance, job, and the usual Kubernetes ones) are allowed;
  - each label in by/without/on/ignoring/group_* is on one of the query's metrics,
    or is a scrape-time label, or le on a histogram bucket.
Ends with "N passed, N failed" (one per query; a file without queries fails).
Exit 0 only when nothing failed.
"""

import argparse
import json
import re
import sys

import promql_parser as pq
import yaml

# Added by Prometheus at scrape time (target labels), not by /metrics.
SCRAPE_LABELS = {"instance", "job", "namespace", "pod", "container", "service",
                 "node", "endpoint", "kubernetes_namespace", "kubernetes_pod_name"}

# Grafana's global macros: stand-ins that parse as the same kind of token.
MACROS = [
    (re.compile(r"\$\{?__rate_interval\}?"), "5m"),
    (re.compile(r"\$\{?__interval_ms\}?"), "60000"),
    (re.compile(r"\$\{?__interval\}?"), "1m"),
    (re.compile(r"\$\{?__range_s\}?"), "3600"),
    (re.compile(r"\$\{?__range_ms\}?"), "3600000"),
    (re.compile(r"\$\{?__range\}?"), "1h"),
]


# --- the scrape -------------------------------------------------------------

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _parse_labels(text, pos, line):
    """Parse '{a="x",b="y"}' starting at text[pos] == '{'. Return (dict, end)."""
    labels = {}
    pos += 1
    while True:
        while pos < len(text) and text[pos] in " ,":
            pos += 1
        if pos < len(text) and text[pos] == "}":
            return labels, pos + 1
        m = _NAME.match(text, pos)
        if not m or text[m.end():m.end() + 2] != '="':
            raise ValueError(f"bad label in: {line}")
        name = m.group(0)
        pos = m.end() + 2
        value = []
        while pos < len(text) and text[pos] != '"':
            if text[pos] == "\\" and pos + 1 < len(text):
                value.append({"n": "\n"}.get(text[pos + 1], text[pos + 1]))
                pos += 2
            else:
                value.append(text[pos])
                pos += 1
        if pos >= len(text):
            raise ValueError(f"unterminated label value in: {line}")
        labels[name] = "".join(value)
        pos += 1


def parse_scrape(text):
    """Return (series, types): series maps a sample name to {label: set(values)};
    types maps a family name to its # TYPE."""
    series, types = {}, {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        m = _NAME.match(line)
        if not m:
            raise ValueError(f"line {lineno}: not a sample: {raw}")
        labels, end = ({}, m.end())
        if line[end:end + 1] == "{":
            labels, end = _parse_labels(line, end, raw)
        if not line[end:].strip():
            raise ValueError(f"line {lineno}: sample without a value: {raw}")
        entry = series.setdefault(m.group(0), {})
        for k, v in labels.items():
            entry.setdefault(k, set()).add(v)
    return series, types


def exported_names(series, types):
    """Every name a query may select: the sample names, and those the TYPE
    lines imply even when the scrape has no sample of them."""
    names = set(series)
    for fam, typ in types.items():
        if typ == "histogram" or typ == "gaugehistogram":
            names |= {fam + "_bucket", fam + "_sum", fam + "_count"}
        elif typ == "summary":
            names |= {fam, fam + "_sum", fam + "_count"}
        elif typ == "counter":
            names.add(fam if fam.endswith("_total") else fam + "_total")
        else:
            names.add(fam)
    # A histogram's family name is not a series of its own.
    names -= {f for f, t in types.items() if t in ("histogram", "gaugehistogram")}
    return names


# --- the queries ------------------------------------------------------------

def dashboard_queries(doc, where="dashboard"):
    """Yield (place, expr) for every PromQL query in a Grafana dashboard."""
    if isinstance(doc, dict):
        if "dashboard" in doc and isinstance(doc["dashboard"], dict):  # an API export
            yield from dashboard_queries(doc["dashboard"], where)
            return
        for i, panel in enumerate(doc.get("panels") or []):
            title = panel.get("title") or f"#{i}"
            place = f"{where} panel '{title}'"
            for j, t in enumerate(panel.get("targets") or []):
                if t.get("expr") is not None:
                    yield f"{place} target {t.get('refId', j)}", t["expr"]
            # rows (collapsed) and nested panels
            yield from dashboard_queries({"panels": panel.get("panels") or []}, place)
        for i, row in enumerate(doc.get("rows") or []):  # the old schema
            yield from dashboard_queries({"panels": row.get("panels") or []},
                                         f"{where} row {i}")
        for v in (doc.get("templating") or {}).get("list") or []:
            if v.get("type") != "query":
                continue
            q = v.get("query")
            if isinstance(q, dict):
                q = q.get("query")
            if q:
                yield f"{where} variable ${v.get('name')}", q
            elif v.get("definition"):
                yield f"{where} variable ${v.get('name')}", v["definition"]
        for a in (doc.get("annotations") or {}).get("list") or []:
            if a.get("expr"):
                yield f"{where} annotation '{a.get('name')}'", a["expr"]


def rule_queries(doc, where="rules"):
    for g in (doc or {}).get("groups") or []:
        for r in g.get("rules") or []:
            name = r.get("alert") or r.get("record") or "?"
            yield f"{where} {g.get('name')}/{name}", r.get("expr", "")


_VARQ = re.compile(r"^\s*(label_values|query_result|metrics|label_names)\s*\((.*)\)\s*$", re.S)


def unwrap_variable_query(q):
    """Grafana variable queries: label_values(EXPR, label) -> (EXPR, [label]);
    query_result(EXPR) -> EXPR; metrics(regex) / label_names() name no metric."""
    m = _VARQ.match(q)
    if not m:
        return q, []
    fn, inner = m.group(1), m.group(2).strip()
    if fn == "query_result":
        return inner, []
    if fn in ("metrics", "label_names"):
        return None, []
    # label_values(label) or label_values(expr, label): split at the last top-level comma
    depth, cut = 0, -1
    for i, ch in enumerate(inner):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif ch == "," and depth == 0:
            cut = i
    if cut < 0:
        return None, [inner]
    return inner[:cut].strip(), [inner[cut + 1:].strip()]


def substitute(expr):
    for rx, repl in MACROS:
        expr = rx.sub(repl, expr)
    return expr


def collect(ast):
    """Selectors (name, matchers) and grouping labels of a parsed query."""
    selectors, grouping = [], []

    def visit(node):
        if isinstance(node, pq.VectorSelector):
            name = node.name
            ms = list(node.matchers.matchers)
            for alt in node.matchers.or_matchers or []:
                ms.extend(alt)
            if name is None:
                for m in ms:
                    if m.name == "__name__" and m.op == pq.MatchOp.Equal:
                        name = m.value
            selectors.append((name, [m for m in ms if m.name != "__name__"]))
        elif isinstance(node, pq.AggregateExpr) and node.modifier is not None:
            grouping.extend(node.modifier.labels)
        elif isinstance(node, pq.BinaryExpr) and node.modifier is not None:
            if node.modifier.matching is not None:
                grouping.extend(node.modifier.matching.labels)
            grouping.extend(node.modifier.group_labels or [])
        return True

    pq.walk(ast, visit)
    return selectors, grouping


def check_query(expr, series, exported, extra_labels=()):
    """Return a list of problems (empty: the query passes)."""
    problems = []
    expr, var_labels = unwrap_variable_query(expr)
    if expr is None:
        return ["names no metric (metrics()/label_names() queries are not allowed here)"]
    try:
        ast = pq.parse(substitute(expr))
    except Exception as e:  # the parser raises ValueError with the position
        return [f"does not parse: {e}"]
    selectors, grouping = collect(ast)
    names = [n for n, _ in selectors if n]
    if not names:
        problems.append("names no metric")
    for name, matchers in selectors:
        if name is None:
            problems.append("a selector without a metric name")
            continue
        if name not in exported:
            problems.append(f"{name}: not exported by /metrics")
            continue
        have = series.get(name, {})
        for m in matchers:
            if m.name in SCRAPE_LABELS:
                continue
            if m.name not in have:
                problems.append(f"{name}: no label {m.name!r} (it has {sorted(have) or 'none'})")
                continue
            literal = "$" not in m.value
            if literal and m.op in (pq.MatchOp.Equal, pq.MatchOp.NotEqual) and m.value \
                    and m.value not in have[m.name]:
                problems.append(f"{name}: {m.name}={m.value!r} never occurs "
                                f"(values: {sorted(have[m.name])})")
    known = set(SCRAPE_LABELS)
    for name in names:
        known |= set(series.get(name, {}))
    for label in list(grouping) + list(var_labels) + list(extra_labels):
        if label not in known:
            problems.append(f"groups or selects by label {label!r}, which none of "
                            f"{sorted(set(names))} has")
    return problems


def family_of(name, types):
    """The family a series name belongs to: X for X_bucket of a histogram X."""
    for suffix in ("_bucket", "_sum", "_count"):
        fam = name[: -len(suffix)]
        if name.endswith(suffix) and types.get(fam) in ("histogram", "gaugehistogram", "summary"):
            return fam
    return name


def load_queries(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        return list(dashboard_queries(json.loads(text), path))
    return list(rule_queries(yaml.safe_load(text), path))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--metrics", required=True, help="a /metrics scrape, - for stdin")
    ap.add_argument("files", nargs="+", help="Grafana dashboards (.json), rule files (.yaml)")
    ap.add_argument("-q", "--quiet", action="store_true", help="print only failures")
    args = ap.parse_args(argv)

    text = sys.stdin.read() if args.metrics == "-" else open(args.metrics, encoding="utf-8").read()
    series, types = parse_scrape(text)
    exported = exported_names(series, types)
    passed = failed = 0
    if not series:
        print(f"FAIL {args.metrics}: no samples in the scrape")
        failed += 1
    used = set()
    for path in args.files:
        try:
            queries = load_queries(path)
        except (OSError, ValueError, yaml.YAMLError) as e:
            print(f"FAIL {path}: {e}")
            failed += 1
            continue
        if not queries:
            print(f"FAIL {path}: no queries found")
            failed += 1
            continue
        for place, expr in queries:
            problems = check_query(expr, series, exported)
            if problems:
                failed += 1
                print(f"FAIL {place}: {expr}")
                for p in problems:
                    print(f"     {p}")
            else:
                passed += 1
                if not args.quiet:
                    print(f"ok   {place}")
            try:
                sel, _ = collect(pq.parse(substitute(unwrap_variable_query(expr)[0] or "")))
                used |= {n for n, _ in sel if n}
            except Exception:
                pass
    families = {family_of(n, types) for n in exported}
    shown = {family_of(n, types) for n in used}
    unused = sorted(families - shown)
    if unused:
        print(f"note: exported but in no query: {', '.join(unused)}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
