"""What every fault scenario shares: a workload of N entries (half of them
copies), workers whose every answer is recorded, and the checker that prints
one line per scenario: entries, keys, delivered, re-delivered, lost."""
import json
import os
import random
import time
from collections import Counter

from pxtest import CWorker, pending, wait_for

FULL = os.environ.get("FAULT_FULL") == "1"     # make test-fault: the full sizes


def size(full, fast):
    return full if FULL else fast


def workload(r, n, stream="room", copy_ratio=0.5, seed=1):
    """XADD n entries; about copy_ratio of them repeat an earlier eventId.
    Returns the list of keys in publishing order."""
    rnd = random.Random(seed)
    keys, uniq = [], []
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        if uniq and rnd.random() < copy_ratio:
            k = rnd.choice(uniq)
        else:
            k = f"ev-{seed}-{i}"
            uniq.append(k)
        keys.append(k)
        pipe.xadd(stream, {"payload": json.dumps({"eventId": k, "n": i})})
        if len(pipe) >= 500:
            pipe.execute()
    pipe.execute()
    return keys


class Ledger:
    """Reads the answers the C example workers recorded (WORKER_REPORT files)."""

    def __init__(self, tmp):
        self.dir = tmp / "ledger"
        self.dir.mkdir(exist_ok=True)
        self.n = 0

    def path(self):
        self.n += 1
        return self.dir / f"w{self.n}.jsonl"

    def rows(self):
        out = []
        for f in self.dir.glob("*.jsonl"):
            for line in f.read_text(errors="replace").splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass          # a line cut short by kill -9
        return out

    def acked(self):
        return Counter(r["key"] for r in self.rows() if r["status"] == "ack")


def worker(env, ledger, endpoint, **kw):
    return env.cworker(endpoint, WORKER_REPORT=ledger.path(), **kw)


def delivered_lines(workers):
    """Every delivery a worker printed (it prints each one, answered or not)."""
    c = Counter()
    for w in workers:
        for line in w.lines():
            c[line.split(" attempt=")[0]] += 1
    return c


def check(name, r, keys, ledger, workers, groups=(("room", "g"),), prefix="idem:",
          allowance=0, require_all=True):
    """Assert SPEC 5.7 and print the scenario's line. 'allowance' is how many
    re-deliveries the faults may cause (in flight at a kill, a lease lost)."""
    uniq = set(keys)
    acked = ledger.acked()
    seen = delivered_lines(workers)
    redelivered = sum(c - 1 for c in seen.values() if c > 1)
    done = {k for k in uniq if not (r.get(prefix + k) or "L:").startswith("L:")}   # "L:" = still locked
    lost = uniq - done
    still_pending = sum(pending(r, s, g) for s, g in groups)
    print(f"\n{name}: entries={len(keys)} keys={len(uniq)} delivered={len(seen)} "
          f"re-delivered={redelivered} lost={len(lost) + still_pending}")
    assert not lost, f"keys never done: {sorted(lost)[:10]}"
    assert still_pending == 0
    # Nothing marked done that no worker acked.
    assert done <= set(acked), f"done but never acked: {sorted(done - set(acked))[:10]}"
    assert redelivered <= allowance, f"{redelivered} re-deliveries > allowance {allowance}"
    return redelivered


def wait_all_done(r, keys, prefix="idem:", groups=(("room", "g"),), timeout=60):
    uniq = set(keys)

    def ok():
        if any(pending(r, s, g) for s, g in groups):
            return False
        pipe = r.pipeline(transaction=False)
        for k in uniq:
            pipe.get(prefix + k)
        # single layout: "L:<token>" is a lock still held, "D" is done
        return all(v is not None and not v.startswith("L:") for v in pipe.execute())
    wait_for(ok, timeout=timeout, what="every key done and nothing pending")
