"""What every fault scenario shares: a workload of N entries (half of them
copies), workers whose every delivery (on arrival) and answer is recorded, the
faults with what was in flight at each, and the checker every scenario ends
in, which prints one line: entries, keys, delivered, re-delivered, faults,
in flight at them, lost."""
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


def received(workers):
    """How many times each key was delivered, counted as deliveries arrived
    (answered or not: one in hand at a kill -9 counts)."""
    c = Counter()
    for w in workers:
        c.update(w.received())
    return c


def done_keys(r, keys, prefix="idem:"):
    """The keys of 'keys' that Redis holds as done (single layout: "D" or a
    value not "L:<token>"; split layout, prefix "done:": the key exists)."""
    keys = list(keys)
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.get(prefix + k)
    return {k for k, v in zip(keys, pipe.execute()) if v is not None and not v.startswith("L:")}


class Faults:
    """Every fault a scenario injects, with what was in flight at it: the keys
    delivered (to the workers the fault touches) and not done in Redis. The
    guarantee (docs/guarantee.md) allows a key to be delivered again only
    because of a fault it was in flight at: at most one more delivery per such
    fault, and nothing else."""

    def __init__(self, r, prefix="idem:"):
        self.r = r
        self.prefix = prefix
        self.log = []          # (label, set of keys in flight)

    def inject(self, label, do, workers, settle=0.3, done_before=None):
        """Run do(), the fault. In flight at it: what 'workers' received up to
        'settle' seconds after it (a delivery already on the socket still
        arrives) minus what was done just before it. 'done_before' gives that
        set when Redis cannot be asked after the fault's set-up."""
        if done_before is None:
            done_before = done_keys(self.r, set(received(workers)), self.prefix)
        out = do()
        time.sleep(settle)
        self.log.append((label, set(received(workers)) - done_before))
        return out

    def add(self, label, keys):
        """A fault whose keys in flight the test knows (a garbage reply)."""
        self.log.append((label, set(keys)))

    def allowed(self):
        """Per key, how many extra deliveries the faults allow."""
        c = Counter()
        for _, keys in self.log:
            c.update(keys)
        return c


def check(name, r, keys, ledger, workers, groups=(("room", "g"),), prefix="idem:",
          faults=None, acked=None):
    """Assert the guarantee (docs/guarantee.md) and print the scenario's line.
    Nothing lost: every key
    done, nothing pending. Nothing twice: a key delivered (or acked) more than
    once must have been in flight at a fault, once more per such fault at
    most. Nothing marked done that no worker acked. 'acked' (a Counter) is
    for workers that keep no ledger."""
    uniq = set(keys)
    acked = ledger.acked() if acked is None else acked
    seen = received(workers)
    allowed = faults.allowed() if faults else Counter()
    redelivered = sum(c - 1 for c in seen.values() if c > 1)
    done = done_keys(r, uniq, prefix)
    lost = uniq - done
    still_pending = sum(pending(r, s, g) for s, g in groups)
    in_flight = sum(len(k) for _, k in faults.log) if faults else 0
    print(f"\n{name}: entries={len(keys)} keys={len(uniq)} delivered={len(seen)} "
          f"re-delivered={redelivered} faults={len(faults.log) if faults else 0} "
          f"in-flight-at-faults={in_flight} lost={len(lost) + still_pending}")
    assert not lost, f"keys never done: {sorted(lost)[:10]}"
    assert still_pending == 0, f"{still_pending} entries still pending"
    assert uniq <= set(seen), f"done but never delivered: {sorted(uniq - set(seen))[:10]}"
    # Nothing marked done that no worker acked.
    assert done <= set(acked), f"done but never acked: {sorted(done - set(acked))[:10]}"
    twice = {k: c for k, c in seen.items() if c - 1 > allowed[k]}
    assert not twice, (f"delivered more often than the faults allow (key: deliveries, allowed "
                       f"extra): {[(k, c, allowed[k]) for k, c in sorted(twice.items())[:10]]}")
    acked_twice = {k: c for k, c in acked.items() if c - 1 > allowed[k]}
    assert not acked_twice, f"acked more often than the faults allow: {sorted(acked_twice.items())[:10]}"
    return redelivered


def wait_all_done(r, keys, prefix="idem:", groups=(("room", "g"),), timeout=60):
    uniq = set(keys)

    def ok():
        if any(pending(r, s, g) for s, g in groups):
            return False
        return done_keys(r, uniq, prefix) == uniq
    wait_for(ok, timeout=timeout, what="every key done and nothing pending")
