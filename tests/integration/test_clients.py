"""One scenario, run against every language's example worker, so the clients
cannot drift apart. A language joins by having clients/<lang>/Makefile with an
`example` target that honours the worker contract (see clients/c/example_worker.c):
stdout gets one '<key> attempt=<n>' line per delivery; WORKER_RETRY_KEYS,
WORKER_DROP_KEYS, WORKER_SLOW_KEYS/WORKER_SLOW_MS and WORKER_CONCURRENCY shape
the answers; WORKER_REPORT names a file that gets one JSON line per delivery."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from pxtest import ROOT, pending, wait_for

LANGS = sorted(p.parent.name for p in (ROOT / "clients").glob("*/Makefile"))
CONCURRENT = {"python", "go", "node", "java", "rust"}   # C's stub is one loop on one socket
LINE = re.compile(r"^(\S+) attempt=(\d+)$")
_built = {}


def build(lang):
    if lang not in _built:
        res = subprocess.run(["make", "-s", "-C", str(ROOT / "clients" / lang)],
                             capture_output=True, text=True, timeout=1200)
        _built[lang] = res
    res = _built[lang]
    assert res.returncode == 0, f"building clients/{lang} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"


class ExampleWorker:
    def __init__(self, lang, endpoint, tmp, **env):
        self.out = tmp / f"{lang}-worker.out"
        self.err = tmp / f"{lang}-worker.err"
        e = dict(os.environ)
        e.update({k: str(v) for k, v in env.items()})
        self.proc = subprocess.Popen(
            ["make", "-s", "--no-print-directory", "-C", str(ROOT / "clients" / lang), "example",
             f"ENDPOINT={endpoint}"],
            stdout=open(self.out, "wb"), stderr=open(self.err, "wb"), env=e, start_new_session=True)

    def lines(self):
        return [l for l in self.out.read_text(errors="replace").splitlines() if LINE.match(l)]

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.mark.parametrize("lang", LANGS)
def test_client_scenario(env, lang):
    build(lang)
    r = env.r
    report = env.tmp / f"{lang}-report.jsonl"
    ep = env.endpoint()
    w = ExampleWorker(lang, ep, env.tmp, WORKER_RETRY_KEYS="retry-me", WORKER_DROP_KEYS="drop-me",
                      WORKER_SLOW_KEYS="slow-1,slow-2", WORKER_SLOW_MS=1500, WORKER_CONCURRENCY=4,
                      WORKER_REPORT=report)
    try:
        # The worker starts first and keeps dialing until idemproxy is there.
        time.sleep(0.5)
        env.proxy([{"stream": "room", "group": "g", "consumer": "c1", "payload_field": "payload",
                    "key": "#event.eventId", "fencing": True, "dead_letter": "dlq",
                    "retry_backoff_ms": 50}], endpoint=ep, max_inflight=16)
        ids = {}
        for k in ["k1", "k2", "k3", "k4"] * 2 + ["retry-me", "drop-me", "slow-1", "slow-2"]:
            ids[k] = r.xadd("room", {"payload": json.dumps({"eventId": k, "n": 1})})
        ids["fields-1"] = r.xadd("room", {"source": "scenario", "payload": json.dumps({"eventId": "fields-1", "n": 7}),
                                          "trace": "t-1"})
        want = sorted(["k1 attempt=1", "k2 attempt=1", "k3 attempt=1", "k4 attempt=1",
                       "retry-me attempt=1", "retry-me attempt=2", "drop-me attempt=1",
                       "slow-1 attempt=1", "slow-2 attempt=1", "fields-1 attempt=1"])
        wait_for(lambda: len(w.lines()) >= len(want), timeout=30,
                 what=f"{lang} worker lines (stderr: {w.err.read_text(errors='replace')[-500:]})")
        wait_for(lambda: pending(r, "room", "g") == 0, what="everything acked")
        time.sleep(0.3)
        assert sorted(w.lines()) == want          # each key once, the retried one twice

        rows = [json.loads(l) for l in report.read_text().splitlines() if l.strip()]
        by = {}
        for row in rows:
            by.setdefault(row["key"], []).append(row)
        for row in rows:
            assert isinstance(row["key"], str) and isinstance(row["stream"], str)
            assert isinstance(row["entry_id"], str) and isinstance(row["payload"], str)
            for k in ("attempt", "fencing_token", "deadline_unix_ms", "start_ms", "end_ms"):
                assert isinstance(row[k], int) and not isinstance(row[k], bool), (k, row)
            assert isinstance(row["fields"], dict)
            assert row["stream"] == "room" and row["fencing_token"] > 0
            assert json.loads(row["payload"])["eventId"] == row["key"]
        f = by["fields-1"][0]
        assert f["fields"] == {"source": "scenario", "trace": "t-1"}
        assert f["entry_id"] == ids["fields-1"]
        assert json.loads(f["payload"]) == {"eventId": "fields-1", "n": 7}
        rt = by["retry-me"]
        assert [x["attempt"] for x in rt] == [1, 2] and [x["status"] for x in rt] == ["retry", "ack"]
        assert rt[1]["fencing_token"] > rt[0]["fencing_token"]

        dl = r.xrange("dlq")
        assert len(dl) == 1
        assert dl[0][1]["idemproxy-reason"] == "dropped by worker"
        assert dl[0][1]["idemproxy-entry-id"] == ids["drop-me"]
        for k in ["k1", "k2", "k3", "k4", "retry-me", "drop-me", "slow-1", "slow-2", "fields-1"]:
            assert r.get("idem:" + k) == "D", k

        if lang in CONCURRENT:
            a, b = by["slow-1"][0], by["slow-2"][0]
            assert a["start_ms"] < b["end_ms"] and b["start_ms"] < a["end_ms"], \
                f"{lang}: slow deliveries were not handled at the same time: {a} {b}"
    finally:
        w.stop()
