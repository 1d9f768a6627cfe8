#!/usr/bin/env python3
"""Cases for check_dashboard.py: queries it must pass and queries it must fail,
against the fixture scrape. Ends with "N passed, N failed"."""

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_dashboard as cd  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCRAPE = os.path.join(HERE, "fixtures", "metrics.txt")

GOOD = [
    'sum by (stream) (rate(idemproxy_entries_read_total{stream=~"$stream"}[$__rate_interval]))',
    'sum(rate(idemproxy_outcomes_total{outcome="acked", instance=~"$instance"}[5m]))',
    'histogram_quantile(0.99, sum by (le) (rate(idemproxy_ack_latency_seconds_bucket[5m])))',
    'rate(idemproxy_lock_wait_seconds_sum[5m]) / rate(idemproxy_lock_wait_seconds_count[5m])',
    'idemproxy_redis_up == 0',
    'sum by (instance) (idemproxy_entries_pending) > 0 and on (instance) sum by (instance) (idemproxy_inflight) > 0',
    '{__name__="idemproxy_inflight"}',
    'label_values(idemproxy_entries_read_total{instance=~"$instance"}, stream)',
    'label_values(idemproxy_redis_up, instance)',
    'query_result(topk(5, idemproxy_entries_pending))',
]

BAD = [
    ("not exported", 'rate(idemproxy_entries_total[5m])'),
    ("misspelt counter", 'rate(idemproxy_entries_read[5m])'),
    ("bare histogram name", 'idemproxy_ack_latency_seconds'),
    ("bucket of a counter", 'idemproxy_acks_total_bucket'),
    ("a label the metric lacks", 'idemproxy_redis_errors_total{stream="room"}'),
    ("a value that never occurs", 'idemproxy_outcomes_total{outcome="ack"}'),
    ("a status that never occurs", 'idemproxy_acks_total{status="nack"}'),
    ("grouping by a missing label", 'sum by (outcome) (rate(idemproxy_acks_total[5m]))'),
    ("does not parse", 'sum(rate(idemproxy_inflight[5m])'),
    ("names no metric", 'vector(1)'),
    ("one good, one bad", 'idemproxy_inflight + idemproxy_in_flight'),
    ("variable on a missing label", 'label_values(idemproxy_inflight, stream)'),
    ("metrics() names none", 'metrics(idemproxy_.*)'),
    ("up is not in /metrics", 'up{job="idemproxy"} == 0'),
]


def main():
    series, types = cd.parse_scrape(open(SCRAPE, encoding="utf-8").read())
    exported = cd.exported_names(series, types)
    passed = failed = 0

    def report(ok, what):
        nonlocal passed, failed
        if ok:
            passed += 1
            print(f"ok   {what}")
        else:
            failed += 1
            print(f"FAIL {what}")

    for q in GOOD:
        problems = cd.check_query(q, series, exported)
        report(not problems, f"accepts {q}" + (f"  ({problems})" if problems else ""))
    for why, q in BAD:
        problems = cd.check_query(q, series, exported)
        report(bool(problems), f"rejects ({why}) {q}" + (f"  -> {problems[0]}" if problems else ""))

    # Whole files through main(): one bad query makes the run fail.
    with tempfile.TemporaryDirectory() as d:
        good = {"panels": [{"title": "ok", "targets": [{"refId": "A", "expr": GOOD[0]}]}]}
        bad = {"panels": [{"title": "row", "type": "row", "panels": [
            {"title": "nested", "targets": [{"refId": "A", "expr": GOOD[0]},
                                            {"refId": "B", "expr": BAD[0][1]}]}]}]}
        empty = {"panels": [{"title": "text", "type": "text"}]}
        rules = {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": BAD[5][1]}]}]}
        for name, doc in (("good.json", good), ("bad.json", bad), ("empty.json", empty)):
            with open(os.path.join(d, name), "w") as f:
                json.dump(doc, f)
        with open(os.path.join(d, "rules.yaml"), "w") as f:
            json.dump(rules, f)  # JSON is YAML
        with open(os.path.join(d, "scrape.txt"), "w") as f:
            f.write("# nothing\n")
        quiet = ["-q", "--metrics", SCRAPE]
        devnull = open(os.devnull, "w")
        out, sys.stdout = sys.stdout, devnull
        try:
            rc_good = cd.main(quiet + [os.path.join(d, "good.json")])
            rc_bad = cd.main(quiet + [os.path.join(d, "bad.json")])
            rc_empty = cd.main(quiet + [os.path.join(d, "empty.json")])
            rc_rules = cd.main(quiet + [os.path.join(d, "rules.yaml")])
            rc_noscrape = cd.main(["-q", "--metrics", os.path.join(d, "scrape.txt"),
                                   os.path.join(d, "good.json")])
        finally:
            sys.stdout = out
            devnull.close()
        report(rc_good == 0, "a dashboard of good queries passes")
        report(rc_bad == 1, "a bad query in a nested panel fails the dashboard")
        report(rc_empty == 1, "a dashboard without queries fails")
        report(rc_rules == 1, "a bad alert expression fails the rule file")
        report(rc_noscrape == 1, "an empty scrape fails")

    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
