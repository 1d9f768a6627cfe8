"""The chaos checker on made-up histories: every rule goes red on a history
that breaks it, and a legal history (or one whose break a fault excuses)
stays green. The checker is a pure function of the run's record, so these
runs are records only: no Redis, no daemon."""
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chaos  # noqa: E402

ACK_S = 2.0


class Log:
    def __init__(self, name, text=""):
        self.name, self.text = name, text

    def log_text(self):
        return self.text


def record(**over):
    c = dict(layout="single", group=True, lock_key=True, on_busy="retry", fencing=True,
             lease_ms=1000, ack_timeout_ms=int(ACK_S * 1000), max_entry_bytes=65536,
             max_deliveries=3, cluster=False)
    c.update(over)
    hist = chaos.History()
    hist.t0 = 0.0
    return SimpleNamespace(c=c, hist=hist, state={"done": {}, "dls": {}, "pending": 0}, state_error=None,
                           unexpected=[], exits=[], proxies=[Log("replica0")], entries=[],
                           rss={0: [(0.0, 10 * 1024)]}, final_rss={0: 10 * 1024}, asan=False)


def entry(run, eid, key, kind="good", room="r0", fp=None):
    ev = {"kind": kind, "key": key, "room": room}
    if fp is not None:                        # the fingerprint the generator computed at publish
        ev["fp"] = fp
    run.entries.append((eid, ev, 100))


def deliver(run, key, eid, start, end, answer="ack", worker="w0.0", replica=0, attempt=1, token=None,
            room="r0", size=100, sent=None):
    token = token if token is not None else int(start * 100) + 1
    run.hist.rows.append({"replica": replica, "worker": worker, "key": key, "entry": eid, "attempt": attempt,
                          "token": token, "start": start, "end": end, "answer": answer,
                          "deadline": (start if sent is None else sent) + ACK_S, "size": size,
                          "room": room})


def done(run, *keys):
    for k in keys:
        run.state["done"][k] = True


def dead(run, eid, reason, t=5.0):
    run.state["dls"].setdefault(eid, []).append({"id": f"{int(t * 1000)}-0", "t": t, "reason": reason,
                                                 "attempts": "1"})


def tags(run):
    return sorted({v.split(":")[0] for v in chaos.check(run)})


def legal():
    """Two keys of one room, one after the other, each acked once and done."""
    run = record()
    entry(run, "1-0", "k1")
    entry(run, "2-0", "k2")
    deliver(run, "k1", "1-0", 1.0, 1.2)
    deliver(run, "k2", "2-0", 1.3, 1.5)
    done(run, "k1", "k2")
    return run


def test_a_legal_history_passes():
    assert chaos.check(legal()) == []


def test_twice_after_ack():
    run = legal()
    entry(run, "3-0", "k1")                       # a copy of k1, sent again after its ack
    deliver(run, "k1", "3-0", 2.0, 2.1)
    assert tags(run) == ["twice-after-ack"]


def test_twice_after_ack_is_excused_by_a_redis_fault_around_the_ack():
    run = legal()
    entry(run, "3-0", "k1")
    deliver(run, "k1", "3-0", 2.0, 2.1)
    run.hist.faults.append({"kind": "redis_restart", "replica": None, "t0": 1.25, "t1": 1.4})
    assert tags(run) == []


def test_held_twice():
    run = record(lock_key=False)
    entry(run, "1-0", "k1")
    deliver(run, "k1", "1-0", 1.0, 1.5)
    deliver(run, "k1", "1-0", 1.2, 1.3, worker="w1.0", replica=1, attempt=2)
    done(run, "k1")
    assert "held-twice" in tags(run)


def test_fencing_token_not_increasing_and_token_zero():
    run = legal()
    run.hist.rows[1]["token"] = run.hist.rows[0]["token"]       # the later holder, the same token
    assert tags(run) == ["fencing"]
    run = legal()
    run.hist.rows[0]["token"] = 0
    assert tags(run) == ["fencing"]


def test_lock_overlap():
    run = record(fencing=False)
    entry(run, "1-0", "k1")
    entry(run, "2-0", "k2")
    deliver(run, "k1", "1-0", 1.0, 1.5)
    deliver(run, "k2", "2-0", 1.2, 1.3, worker="w1.0")          # same room while k1 holds it
    done(run, "k1", "k2")
    assert tags(run) == ["lock-overlap"]


def test_oversize_delivered():
    run = legal()
    run.hist.rows[0]["size"] = 65537
    assert tags(run) == ["oversize-delivered"]


def test_attempt_inflated():
    run = legal()
    run.hist.rows[0]["attempt"] = 3
    assert tags(run) == ["attempt-inflated"]


def inflated_by_one(fault, t0, born="1000-0"):
    """k1 added at 'born', delivered at 2.0 as attempt 2 with no delivery before;
    'fault' from t0 to t0 + 0.1."""
    run = record()
    entry(run, born, "k1")
    deliver(run, "k1", born, 2.0, 2.1, attempt=2)
    done(run, "k1")
    run.hist.faults.append({"kind": fault, "replica": 0, "t0": t0, "t1": t0 + 0.1})
    return tags(run)


def test_attempt_inflated_by_one_is_excused_only_by_a_fault_in_the_entrys_life():
    # a restart between the entry's add and its delivery may hide one
    assert "attempt-inflated" not in inflated_by_one("kill9", 1.5)
    assert "attempt-inflated" not in inflated_by_one("master_kill", 1.5)
    # Redis restarted or its connections killed: the reader corrects what a lost
    # read or reclaim counted, so these hide none
    assert "attempt-inflated" in inflated_by_one("client_kill", 1.5)
    assert "attempt-inflated" in inflated_by_one("redis_restart", 1.5)
    # ... one a minute before it was added cannot, nor one after the delivery
    assert "attempt-inflated" in inflated_by_one("kill9", 1.5, born="62000-0")
    assert "attempt-inflated" in inflated_by_one("kill9", 2.5)
    # a lost or held reply (--net) never hides one: the reader corrects it
    assert "attempt-inflated" in inflated_by_one("lost_reply", 1.5)
    assert "attempt-inflated" in inflated_by_one("slow_reply", 1.5)


TAKEN = "x info  stream room entry {} key k1 attempt 0: taken over by another consumer; not delivered from here\n"


def test_a_reply_slower_than_claim_idle_may_add_one_count():
    """Seed 67 of --net: a read or reclaim answered through a throttled link
    counts a delivery of each entry it takes as Redis applies it, and its
    reply (an 8 MB entry at 2 MB/s) arrives after claim_idle_ms. Another
    instance has taken the entries over by then (their idle time ran out; the
    reader cannot keep fresh what it has not seen) and counted the read: the
    new owner cannot tell that claim from a delivery, and the reader, which
    knows, no longer owns them and logs them taken over when its reply comes.
    One per such bite of a link whose replica logged the entry taken over."""
    def slow(span, group=True, claim_idle_ms=2000, n=1, attempt=2, logged=(0, 1)):
        run = record(group=group, claim_idle_ms=claim_idle_ms)
        run.proxies.append(Log("replica1"))
        for i in logged:
            run.proxies[i].text = TAKEN.format("1000-0")
        entry(run, "1000-0", "k1")
        deliver(run, "k1", "1000-0", 9.0, 9.1, attempt=attempt)
        done(run, "k1")
        for i in range(n):
            run.hist.faults.append({"kind": "throttle", "replica": i, "t0": 1.0 + i, "t1": 1.0 + i + span})
        return tags(run)
    assert "attempt-inflated" not in slow(4.0)
    assert "attempt-inflated" not in slow(4.0, n=2, attempt=3)      # both links slow in turn
    assert "attempt-inflated" in slow(4.0, attempt=3)               # one bite adds one
    assert "attempt-inflated" in slow(1.5)                          # answered inside claim_idle_ms
    assert "attempt-inflated" in slow(4.0, claim_idle_ms=5000)
    assert "attempt-inflated" in slow(4.0, group=False)             # no takeover without a group
    assert "attempt-inflated" in slow(4.0, logged=())               # nothing was taken over ...
    assert "attempt-inflated" in slow(4.0, n=2, attempt=3, logged=(1,))  # ... from the slow link's replica
    assert "attempt-inflated" in inflated_by_one("throttle", 1.5)   # nor after the delivery, nor short
    # such a count can dead-letter an entry one real failure early ...
    run = record(max_deliveries=2, lock_key=False, claim_idle_ms=2000)
    run.proxies.append(Log("replica1", TAKEN.format("1-0")))
    entry(run, "1-0", "k1")
    deliver(run, "k1", "1-0", 6.0, 6.1, answer="retry", attempt=2)
    dead(run, "1-0", "max_deliveries (2) reached", t=6.2)
    done(run, "k1")
    assert sorted(tags(run)) == ["attempt-inflated", "bad-cause"]
    run.hist.faults.append({"kind": "throttle", "replica": 1, "t0": 1.0, "t1": 4.0})
    assert tags(run) == []
    # ... but hides no delivery: more than max_deliveries stays a break
    deliver(run, "k1", "1-0", 3.0, 3.1, answer="retry", attempt=1)
    deliver(run, "k1", "1-0", 5.0, 5.1, answer="retry", attempt=2, worker="w1.0", replica=1)
    assert tags(run) == ["too-many-deliveries"]


def test_a_count_set_back_refused_on_the_replica_that_lost_the_entry_may_stand():
    """Seed 230 of --net: replica 1 reads 4230-0 as its link starts refusing
    scripts (EVAL: the claim, the refresh and the count set-back) for 1.5 s, and
    the read's reply is lost; its replay reads it again (Redis counts 2 with no
    delivery). Its set-back to 0 is a script, refused; so are its refreshes, and
    after claim_idle_ms replica 0 takes it over (count 3) and delivers attempt 3.
    One count for the read and one for each fault that dropped that replica's
    reader link meanwhile, only when another replica took the entry over."""
    def lost(attempt=3, command="EVAL+XAUTOCLAIM", refused=1, deliverer=0, link=1, span=(4.21, 5.71),
             group=True, claim_idle_ms=1000, earlier=None, start=5.6):
        run = record(group=group, claim_idle_ms=claim_idle_ms, lock_key=False, max_deliveries=5)
        run.proxies.append(Log("replica1"))
        entry(run, "4230-0", "k1")
        if earlier is not None:                  # the refused replica delivered it before
            deliver(run, "k1", "4230-0", earlier, earlier + 0.1, answer="retry", worker="w1.0", replica=1)
        deliver(run, "k1", "4230-0", start, start + 0.1, attempt=attempt, worker=f"w{deliverer}.0",
                replica=deliverer)
        done(run, "k1")
        run.hist.faults.append({"kind": "refuse", "replica": refused, "t0": span[0], "t1": span[1],
                                "command": command})
        run.hist.faults.append({"kind": "lost_reply", "replica": None, "t0": 4.23, "t1": 4.59,
                                "link": link, "command": "reply:XREADGROUP"})
        return tags(run)
    assert lost() == []
    assert lost(command="ALL") == []                                  # everything refused
    assert lost(attempt=2, link=0) == []                              # the read alone
    # just outside: one count more than the read and its replay ...
    assert lost(attempt=4) == ["attempt-inflated"]
    assert lost(link=0) == ["attempt-inflated"]                       # ... another link's reply lost
    assert lost(command="XCLAIM") == ["attempt-inflated"]             # the set-back was not refused
    # seed 314: SET refused for 6 s, every claim's write dropped and the link
    # closed, the set-back and the refreshes with it; the read alone counted
    assert lost(command="SET", attempt=2, link=0, span=(0.69, 6.69)) == []
    assert lost(command="SET", attempt=3, link=0, span=(0.69, 6.69)) == ["attempt-inflated"]
    assert lost(refused=0) == ["attempt-inflated"]                    # the deliverer's own link
    assert lost(deliverer=1, refused=1) == ["attempt-inflated"]       # ... it never lost the entry
    assert lost(claim_idle_ms=3000) == ["attempt-inflated"]           # too soon for a takeover
    assert lost(span=(1.0, 4.0)) == ["attempt-inflated"]              # refused before it was added
    assert lost(span=(5.7, 7.0)) == ["attempt-inflated"]              # ... or after the delivery
    assert lost(group=False) == ["attempt-inflated"]                  # no takeover without a group
    # the refused replica delivered it before: its read counted that delivery
    assert lost(earlier=4.3, span=(4.5, 5.71), link=0) == ["attempt-inflated"]
    assert lost(earlier=4.3, span=(4.5, 5.71)) == []                  # its replay's count stood
    # such counts can dead-letter an entry early, never hide a delivery
    run = record(max_deliveries=3, lock_key=False, claim_idle_ms=1000)
    run.proxies.append(Log("replica1"))
    entry(run, "4230-0", "k1")
    deliver(run, "k1", "4230-0", 5.6, 5.7, answer="retry", attempt=3)
    dead(run, "4230-0", "max_deliveries (3) reached", t=5.8)
    done(run, "k1")
    assert sorted(tags(run)) == ["attempt-inflated", "bad-cause"]
    run.hist.faults.append({"kind": "refuse", "replica": 1, "t0": 4.21, "t1": 5.71, "command": "EVAL"})
    run.hist.faults.append({"kind": "lost_reply", "replica": None, "t0": 4.23, "t1": 4.59, "link": 1,
                            "command": "reply:XREADGROUP"})
    assert tags(run) == []
    for n in range(3):
        deliver(run, "k1", "4230-0", 6.0 + n, 6.1 + n, answer="retry", attempt=3)
    assert "too-many-deliveries" in tags(run)


def test_a_refused_set_back_counts_for_a_taker_no_worker_recorded():
    """Seed 314 of --net, second form: replica 1 reads 4230-0 (count 1) as its
    link refuses SET, so it never claims nor sets the count back; replica 0
    takes it over (count 2) and sends attempt 2, which times out before any
    worker reads it (only replica 0's log has it), and max_deliveries 2
    dead-letters it. The refused set-back excuses that count whether or not a
    worker recorded the taker's delivery, or recorded it only after the dead
    letter."""
    def run_of(log_line, refused=True):
        run = record(max_deliveries=2, lock_key=False, claim_idle_ms=1000)
        run.proxies = [Log("replica0", log_line), Log("replica1")]
        entry(run, "4230-0", "k1")
        dead(run, "4230-0", "max_deliveries (2) reached: ack timeout", t=8.0)
        done(run, "k1")
        if refused:
            run.hist.faults.append({"kind": "refuse", "replica": 1, "t0": 3.0, "t1": 9.0, "command": "SET"})
        return tags(run)
    timed_out = ("1970-01-01T00:00:07.600Z warn  stream room entry 4230-0 key k1 attempt 2: "
                 "ack timeout\n")                    # sent at 5.6, 1.4 s after the entry was added
    assert run_of(timed_out) == []
    assert run_of(timed_out, refused=False) == ["bad-cause"]
    assert run_of("") == ["bad-cause"]                # no delivery at all: nothing to excuse
    early = timed_out.replace("00:00:07.600", "00:00:06.700")    # sent at 4.7: before claim_idle_ms
    assert run_of(early) == ["bad-cause"]
    # the same delivery recorded by a worker that read it after its deadline,
    # after the dead letter (seed 314, third form): sent in time all the same
    def late(refused=True):
        run = record(max_deliveries=2, lock_key=False, claim_idle_ms=1000)
        run.proxies = [Log("replica0", timed_out), Log("replica1")]
        entry(run, "4230-0", "k1")
        deliver(run, "k1", "4230-0", 8.5, 8.6, attempt=2, sent=5.6)
        dead(run, "4230-0", "max_deliveries (2) reached: ack timeout", t=8.0)
        done(run, "k1")
        if refused:
            run.hist.faults.append({"kind": "refuse", "replica": 1, "t0": 3.0, "t1": 9.0, "command": "SET"})
        return tags(run)
    assert late() == []
    assert late(refused=False) == ["attempt-inflated", "bad-cause"]


def test_a_count_raise_refused_after_a_set_back_may_let_one_delivery_more():
    """Seed 314 of --net, first form (read from the run's AOF): replica 1 read
    4230-0 (count 1), set the count back to 0 while it waited for a worker,
    delivered attempt 1 during its link's refusal of SET, and the raise back
    to 1 went in a refused write. Replica 0 took it over (count 1) and sent
    attempt 1, then 2: three deliveries with max_deliveries 2, the low count
    the contract allows. One more delivery per delivery sent during the
    deliverer's own refusal, only when another replica delivered after it."""
    def run_of(refused=1, span=(4.0, 10.0), first=4.5, third=None):
        run = record(max_deliveries=2, lock_key=False, claim_idle_ms=1000)
        run.proxies.append(Log("replica1"))
        entry(run, "4230-0", "k1")
        deliver(run, "k1", "4230-0", first, first + 0.01, answer="retry", worker="w1.0", replica=1)
        deliver(run, "k1", "4230-0", 6.6, 6.7, answer="retry")
        deliver(run, "k1", "4230-0", 7.0, 7.1, answer="retry", attempt=2)
        if third is not None:
            deliver(run, "k1", "4230-0", third, third + 0.1, answer="retry", attempt=2)
        dead(run, "4230-0", "max_deliveries (2) reached: retry", t=8.0)
        done(run, "k1")
        if refused is not None:
            run.hist.faults.append({"kind": "refuse", "replica": refused, "t0": span[0], "t1": span[1],
                                    "command": "SET"})
        return tags(run)
    assert run_of() == []
    assert run_of(refused=None) == ["too-many-deliveries"]
    assert run_of(refused=0) == ["too-many-deliveries"]           # the taker's link, not the deliverer's
    assert run_of(span=(4.6, 10.0)) == ["too-many-deliveries"]    # delivered before the refusal
    assert run_of(third=7.5) == ["too-many-deliveries"]           # one more, not two


def test_no_delivery_past_max_deliveries():
    """Issue 30's mutant (the poison check `>=` turned `>`): attempts 1 and 2
    fail, a restart, then attempt 3 with max_deliveries 2. The restart may
    hide a delivery from the count, never make one past the limit legal."""
    run = record(max_deliveries=2)
    entry(run, "1-0", "k1")
    deliver(run, "k1", "1-0", 1.0, 1.1, answer="retry", attempt=1)
    deliver(run, "k1", "1-0", 1.5, 1.6, answer="retry", attempt=2)
    run.hist.faults.append({"kind": "kill9", "replica": 0, "t0": 1.7, "t1": 1.8})
    deliver(run, "k1", "1-0", 2.5, 2.6, answer="retry", attempt=3)
    dead(run, "1-0", "max_deliveries (2) reached")
    done(run, "k1")
    assert tags(run) == ["over-max-deliveries"]
    run.hist.rows.pop()                            # attempt 2 was the last: legal
    assert tags(run) == []


def test_no_more_deliveries_than_max_deliveries():
    """Issue 30's finding 3: two replicas each redeliver one group entry after a
    lost refresh, attempt 2 sent twice: 3 deliveries with max_deliveries 2."""
    run = record(max_deliveries=2, lock_key=False)
    entry(run, "1-0", "k1")
    deliver(run, "k1", "1-0", 1.0, 1.1, answer="retry", attempt=1)
    deliver(run, "k1", "1-0", 2.0, 2.1, answer="retry", attempt=2)
    deliver(run, "k1", "1-0", 2.2, 2.3, answer="retry", attempt=2, worker="w1.0", replica=1)
    dead(run, "1-0", "max_deliveries (2) reached")
    done(run, "k1")
    assert tags(run) == ["too-many-deliveries"]
    # a link fault (a refused XCLAIM) does not excuse it; a restart may hide one
    run.hist.faults.append({"kind": "refuse", "replica": 0, "t0": 1.2, "t1": 1.9})
    assert tags(run) == ["too-many-deliveries"]
    run.hist.faults.append({"kind": "kill9", "replica": 1, "t0": 1.2, "t1": 1.3})
    assert tags(run) == []


def test_group_less_replicas_count_their_own_deliveries():
    """Without a group each replica process counts its own (README, Known limits):
    two replicas at max_deliveries 2 each is legal, three by one is not."""
    run = record(group=False, max_deliveries=2, lock_key=False)
    entry(run, "1-0", "k1")
    for r, t in ((0, 1.0), (1, 1.5), (0, 2.0), (1, 2.5)):
        deliver(run, "k1", "1-0", t, t + 0.1, answer="retry", attempt=1 + (t >= 2.0),
                worker=f"w{r}.0", replica=r)
    run.hist.faults.append({"kind": "lost_reply", "replica": None, "t0": 1.2, "t1": 1.3})
    dead(run, "1-0", "max_deliveries (2) reached")
    done(run, "k1")
    assert tags(run) == []
    deliver(run, "k1", "1-0", 3.0, 3.1, answer="retry", attempt=2)
    assert tags(run) == ["too-many-deliveries"]
    # ... a restarted replica process starts its count again
    run.hist.faults.append({"kind": "sigterm", "replica": 0, "t0": 2.7, "t1": 2.8})
    assert tags(run) == []


def test_group_less_count_by_when_the_replica_sent_not_when_a_slow_worker_started():
    """Seed 107 (group-less, a slow worker, SIGTERM): attempts 1 and 2 were sent
    before the replica was stopped and started by the worker after it; the
    restarted process counted 1, 2, 3 again. Two lives, not five deliveries of
    one; but five sent in one life are still too many."""
    run = record(group=False, max_deliveries=3, lock_key=False)
    entry(run, "1-0", "k1")
    # each sent after the one before timed out (ACK_S), the first two started late
    deliver(run, "k1", "1-0", 4 * ACK_S, 4 * ACK_S + 0.1, answer="retry", attempt=1, sent=0.1)
    deliver(run, "k1", "1-0", 4 * ACK_S + 0.2, 4 * ACK_S + 0.3, answer="retry", attempt=2, sent=ACK_S + 0.2)
    run.hist.faults.append({"kind": "sigterm", "replica": 0, "t0": 2 * ACK_S + 0.5, "t1": 5 * ACK_S})
    for a in (1, 2, 3):
        t = (5 + a) * ACK_S
        deliver(run, "k1", "1-0", t + 0.05, t + 0.1, answer="retry", attempt=a, sent=t)
    dead(run, "1-0", "max_deliveries (3) reached", t=10 * ACK_S)
    done(run, "k1")
    assert tags(run) == []
    run.hist.faults.pop()                          # no restart: one life of five
    assert tags(run) == ["too-many-deliveries"]


def test_dead_lettered_twice():
    run = record()
    entry(run, "1-0", "k1")
    deliver(run, "k1", "1-0", 1.0, 1.1, answer="drop")
    dead(run, "1-0", "chaos-drop")
    dead(run, "1-0", "chaos-drop", t=6.0)
    done(run, "k1")
    assert tags(run) == ["dead-lettered-2x"]


def test_bad_cause_max_deliveries_without_failures():
    run = record()
    entry(run, "1-0", "k1")
    deliver(run, "k1", "1-0", 1.0, 1.1, answer="retry")
    dead(run, "1-0", "max_deliveries (3) reached")
    done(run, "k1")
    assert tags(run) == ["bad-cause"]


def test_max_deliveries_is_excused_only_by_faults_that_may_hide_a_delivery():
    for fault, excused in (("kill9", True), ("lost_reply", False)):
        run = record(max_deliveries=2)
        entry(run, "1-0", "k1")
        deliver(run, "k1", "1-0", 1.0, 1.1, answer="retry")
        run.hist.faults.append({"kind": fault, "replica": 0, "t0": 1.5, "t1": 1.6})
        dead(run, "1-0", "max_deliveries (2) reached")
        done(run, "k1")
        assert tags(run) == ([] if excused else ["bad-cause"]), fault


def test_dead_lettered_but_not_done():
    run = record()
    entry(run, "1-0", "k1")
    deliver(run, "k1", "1-0", 1.0, 1.1, answer="drop")
    dead(run, "1-0", "chaos-drop")
    assert tags(run) == ["not-done"]


def test_busy_refusal_then_delivered():
    run = record(on_busy="dead_letter")
    entry(run, "1-0", "k1")
    dead(run, "1-0", "busy", t=1.0)
    deliver(run, "k1", "1-0", 2.0, 2.1)
    done(run, "k1")
    assert tags(run) == ["delivered-after-refusal"]


def test_bad_entry_delivered_and_never_dead_lettered():
    run = legal()
    entry(run, "3-0", "x-badjson", kind="badjson")
    deliver(run, "x-badjson", "3-0", 2.0, 2.1)
    done(run, "x-badjson")
    assert tags(run) == ["bad-delivered", "no-outcome"]


def test_no_outcome():
    run = legal()
    del run.state["done"]["k2"]
    assert tags(run) == ["no-outcome"]


def test_done_unacked():
    run = legal()
    run.state["done"]["k3"] = True                 # no worker ever acked k3
    assert tags(run) == ["done-unacked"]


# --- issue 31: fingerprints and conflicting copies ---------------------------------

FP_A, FP_B = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"


def conflict(on_conflict="dead_letter", first=FP_A, second=FP_B):
    """Two copies of k1 with fingerprints 'first' (published first, entry 1-0) and
    'second' (2-0). The SECOND one published is read first, acked and marked done at
    1.5 s; the first published then meets that mark: a conflict, never delivered,
    dead-lettered (dead_letter) or only counted (skip). The original is the copy the
    mark keeps, not the first published."""
    run = record(lock_key=False, fingerprint="#event", on_conflict=on_conflict)
    entry(run, "1-0", "k1", fp=first)
    entry(run, "2-0", "k1", fp=second)
    deliver(run, "k1", "2-0", 1.0, 1.4)
    done(run, "k1")
    run.state["marks"] = {"k1": (1500, second)}
    if on_conflict == "dead_letter" and first != second:
        dead(run, "1-0", f"conflict: fingerprint {first} differs from the done mark's {second}", t=2.0)
    return run


def test_a_conflicting_copy_judged_by_the_mark_written_passes():
    assert chaos.check(conflict()) == []
    assert chaos.check(conflict("skip")) == []
    assert chaos.check(conflict(first=FP_B)) == []           # a true copy: a plain duplicate


def test_a_conflicting_copy_delivered_after_the_mark():
    run = conflict()
    deliver(run, "k1", "1-0", 3.0, 3.1, answer="retry")       # the mark (1.5 s) was there
    assert tags(run) == ["conflict-delivered", "twice-after-ack"]
    # A Redis fault around the ack excuses a copy sent again; not once the mark that
    # fault might have cost is there after all.
    run.hist.fault("client_kill", None, 1.3, 1.35)
    assert tags(run) == ["conflict-delivered"]
    run = conflict("skip")
    run.hist.fault("client_kill", None, 1.3, 1.35)
    deliver(run, "k1", "1-0", 3.0, 3.1, answer="retry")
    assert tags(run) == ["conflict-delivered"]
    # The mark keeps its first try's time: a link of the original's replica refused
    # past it holds the write back (seed 208 of --net), and a copy claimed meanwhile,
    # the original's lease run out, is the double the guarantee allows; once that
    # link is back and the mark is there, a copy sent is a conflict delivered again.
    run = conflict("skip")
    run.hist.fault("refuse", 0, 1.45, 2.5)
    run.hist.fault("refuse", 0, 2.4, 4.0)
    deliver(run, "k1", "1-0", 4.5, 4.6, replica=1, worker="w1.0")
    assert "conflict-delivered" not in tags(run)
    run = conflict("skip")
    run.hist.fault("refuse", 1, 1.45, 4.0)                     # another replica's link: no excuse
    deliver(run, "k1", "1-0", 4.5, 4.6, replica=1, worker="w1.0")
    assert "conflict-delivered" in tags(run)
    run = conflict("skip")
    run.hist.fault("refuse", 0, 1.45, 2.5)
    deliver(run, "k1", "1-0", 3.6, 3.7, replica=1, worker="w1.0")   # over a second after it
    assert "conflict-delivered" in tags(run)
    run = conflict()                                          # sent before the mark: legal
    run.hist.rows.insert(0, dict(run.hist.rows[0], entry="1-0", start=0.2, end=0.4, answer="retry",
                                 deadline=0.2 + ACK_S))
    run.hist.rows[0]["token"] = 1
    assert chaos.check(run) == []


def test_a_conflicting_copy_without_its_dead_letter():
    run = conflict()
    del run.state["dls"]["1-0"]
    assert tags(run) == ["conflict-no-outcome"]


def test_a_conflict_dead_letter_where_there_is_none():
    run = conflict(first=FP_B)                                # a true copy ...
    dead(run, "1-0", f"conflict: fingerprint {FP_B} differs from the done mark's {FP_A}", t=2.0)
    assert tags(run) == ["bad-conflict"]
    run = conflict()                                          # ... on_conflict skip
    run.c["on_conflict"] = "skip"
    assert tags(run) == ["bad-conflict"]
    run = conflict()                                          # ... no fingerprint
    run.c["fingerprint"] = ""
    assert "bad-conflict" in tags(run)
    run = conflict()                                          # ... naming another mark
    run.state["dls"]["1-0"][0]["reason"] = f"conflict: fingerprint {FP_A} differs from the done mark's {'c' * 16}"
    assert tags(run) == ["bad-conflict"]


def test_the_mark_keeps_a_copy_no_worker_acked():
    run = conflict()
    run.state["marks"]["k1"] = (1500, FP_A)                   # as if by publish order
    assert "mark-of-unhandled-copy" in tags(run)
    run = conflict()
    run.state["marks"]["k1"] = (1500, None)
    assert "mark-without-fingerprint" in tags(run)


# --- issue 37: hostile producer entries ----------------------------------------------

@pytest.mark.parametrize("kind", ["deep", "forged", "longkey", "deepname"])
def test_a_hostile_entry_is_dead_lettered_as_bad_input_only(kind):
    run = legal()
    entry(run, "3-0", f"x-{kind}", kind=kind)
    dead(run, "3-0", "key '#event.eventId': missing")
    assert chaos.check(run) == []
    run.state["dls"]["3-0"][0]["reason"] = "busy"             # the forged idemproxy-reason, read
    assert tags(run) == ["bad-wrong-reason"]
    run = legal()
    entry(run, "3-0", f"x-{kind}", kind=kind)
    deliver(run, f"x-{kind}", "3-0", 2.0, 2.1)
    assert tags(run) == ["bad-delivered", "no-outcome"]


def test_the_new_draws_keep_every_other_draw_and_the_fixed_seeds():
    """fingerprint and hostile come from Randoms of their own: without them a seed
    draws what it drew before; the fixed sets' seeds draw neither."""
    def strip(c):
        c = dict(c, events=[{k: v for k, v in ev.items() if k not in ("amount", "forged")}
                            for ev in c["events"] if ev["kind"] not in chaos.HOSTILE_KINDS])
        c.pop("fingerprint"), c.pop("on_conflict"), c.pop("fields_mode")
        return c
    saved = chaos.fingerprint, chaos.hostile, chaos.fields_mode
    try:
        chaos.fingerprint = chaos.hostile = chaos.fields_mode = lambda c, seed: None
        before = {seed: chaos.generate(seed) for seed in range(60)}
    finally:
        chaos.fingerprint, chaos.hostile, chaos.fields_mode = saved
    drawn = set()
    for seed, old in before.items():
        c = chaos.generate(seed)
        assert strip(c) == old, seed
        if c["fingerprint"]:
            drawn.add("fingerprint")
        if any(ev["kind"] in chaos.HOSTILE_KINDS for ev in c["events"]):
            drawn.add("hostile")
    assert drawn == {"fingerprint", "hostile"}
    for seed in chaos.PRE_FINGERPRINT_SEEDS:
        c = chaos.generate(seed)
        assert c["fingerprint"] == "" and not any("amount" in ev or ev["kind"] in chaos.HOSTILE_KINDS
                                                   for ev in c["events"]), seed


def test_fields_mode_is_drawn_for_some_seeds_never_the_fixed_sets():
    """fields_mode() comes from a Random of its own: about one seed in three runs
    with no payload_field, its events flat fields; "deepname" entries only there,
    some of 250,000 parts (under max_entry_bytes, so the name itself is read)."""
    modes, deepnames, huge = [], [], []
    for seed in range(60):
        c = chaos.generate(seed)
        modes.append(c["fields_mode"])
        run = chaos.Run.__new__(chaos.Run)
        run.c = c
        assert ("payload_field" in run.stream_conf(0)) == (not c["fields_mode"]), seed
        for ev in c["events"]:
            if ev["kind"] == "deepname":
                assert c["fields_mode"], seed
                deepnames.append(seed)
                fields = chaos.payload_for(ev, c["max_entry_bytes"], True)
                assert sum(len(n) + len(v) for n, v in fields.items()) < c["max_entry_bytes"]
                huge += [seed] if ev["parts"] == 250000 else []
    assert 10 <= sum(modes) <= 30 and deepnames and huge
    for seed in chaos.PRE_FINGERPRINT_SEEDS:
        assert not chaos.generate(seed)["fields_mode"], seed


def test_fields_mode_entries_mean_what_their_kinds_mean():
    """Flat fields: the key and room read as the daemon builds the event (dotted
    names nest; past 31 objects none), sizes against max_entry_bytes as in a
    payload, and the fingerprint of a string is the string (the daemon's mark for
    "amount": "1" is 6b86b273ff34fce1, as for the number 1 in a payload)."""
    lim = 65536

    def ev(kind, **more):
        return dict({"kind": kind, "key": f"x-{kind}", "room": "r1", "amount": 1}, **more)

    def event(kind, **more):
        return chaos.event_of_fields(chaos.payload_for(ev(kind, **more), lim, True))

    def size(fields):
        return sum(len(n) + len(v) for n, v in fields.items())
    assert event("good") == {"eventId": "x-good", "room": "r1", "amount": "1"}
    assert event("deep") is None and event("deepname", parts=3000) is None
    assert event("wrongtype")["room"] == chaos.WRONGTYPE_ROOM and "eventId" not in event("nokey")
    assert "eventId" not in event("forged") and event("forged")["idemproxy-reason"] == "busy"
    assert isinstance(event("badjson")["eventId"], dict)          # a key that is an object
    for kind, fields_over, encoded_over in (("near", False, False), ("over", True, True),
                                            ("bigkey", False, True)):
        e = ev(kind)
        fields = chaos.payload_for(e, lim, True)
        assert (size(fields) > lim, chaos.encoded_size(e, fields) > lim) == (fields_over, encoded_over), kind
    c = {"fingerprint": "#event.amount", "fields_mode": True}
    assert chaos.fingerprint_of(c, {"eventId": "k", "amount": "1"}) == "6b86b273ff34fce1"
    assert chaos.fingerprint_of(dict(c, fields_mode=False), {"payload": '{"amount": 1}'}) == "6b86b273ff34fce1"
    c["fingerprint"] = "#event"
    assert chaos.fingerprint_of(c, {"b": "2", "a.x": "1"}) == chaos.fingerprint_of(
        dict(c, fields_mode=False), {"payload": '{"b": "2", "a": {"x": "1"}}'})
    d = chaos.pb.Delivery(fields=[chaos.pb.Field(name="room", value=b"r2")])
    assert chaos.delivered_room(d) == "r2"
    assert chaos.delivered_room(chaos.pb.Delivery(payload=b'{"room": "r3"}')) == "r3"


def test_pending_and_unreadable_state():
    run = legal()
    run.state["pending"] = 1
    assert tags(run) == ["pending"]
    run = legal()
    run.state, run.state_error = None, "ConnectionError()"
    assert tags(run) == ["state"]


def test_memory():
    run = legal()
    run.rss[0].append((1.0, 200 * 1024))
    assert tags(run) == ["memory"]
    run = legal()
    run.final_rss[0] = 40 * 1024
    assert tags(run) == ["memory"]
    run.asan = True                                 # an ASan build's RSS is not judged
    assert tags(run) == []


@pytest.mark.parametrize("what", ["exit", "crash", "sanitizer"])
def test_process_rules(what):
    run = legal()
    if what == "exit":
        run.exits.append((0, "SIGTERM", 1))
    elif what == "crash":
        run.unexpected.append("replica0 exited by itself with -11")
    else:
        run.proxies[0].text = "==1==ERROR: AddressSanitizer: heap-use-after-free on address 0x1"
    assert tags(run) == [what]


def test_cluster_topology_faults_excuse_like_a_redis_restart():
    for kind in ("failover", "master_kill", "migrate"):
        run = legal()
        entry(run, "3-0", "k1")
        deliver(run, "k1", "3-0", 2.0, 2.1)
        run.hist.faults.append({"kind": kind, "replica": None, "t0": 1.25, "t1": 1.4})
        assert tags(run) == [], kind


def cut_off_replica_sends_after_anothers_ack(fault):
    """Issue 30's finding 1: replica 1 delivers k1 and its worker acks; replica 0,
    whose link 'fault' cut off while its lease ran out, then sends k1 too."""
    run = record(lock_key=False)
    entry(run, "1-0", "k1")
    deliver(run, "k1", "1-0", 3.0, 3.2, worker="w1.0", replica=1)
    deliver(run, "k1", "1-0", 4.0, 4.1, worker="w0.0", replica=0)
    done(run, "k1")
    run.hist.faults.append(dict(fault, t0=1.0, t1=3.5))
    return tags(run)


def test_a_link_fault_excuses_that_replicas_holders_only():
    # replica 0's link refused: replica 1's ack stays clean, sending after it is a break
    assert cut_off_replica_sends_after_anothers_ack({"kind": "refuse", "replica": 0}) == ["twice-after-ack"]
    assert cut_off_replica_sends_after_anothers_ack({"kind": "throttle", "replica": 0}) == ["twice-after-ack"]
    # ... replica 1's own link, or a fault of Redis itself, may have cost that ack
    assert cut_off_replica_sends_after_anothers_ack({"kind": "refuse", "replica": 1}) == []
    assert cut_off_replica_sends_after_anothers_ack({"kind": "lost_reply", "replica": None}) == []


def test_a_foreign_lock_delays_and_excuses_nothing():
    assert cut_off_replica_sends_after_anothers_ack({"kind": "foreign_lock", "replica": None}) == \
        ["twice-after-ack"]
    run = record(lock_key=False)                   # nor a second holder while the first holds it
    entry(run, "1-0", "k1")
    deliver(run, "k1", "1-0", 1.0, 1.5)
    deliver(run, "k1", "1-0", 1.2, 1.3, worker="w1.0", replica=1, attempt=2)
    done(run, "k1")
    run.hist.faults.append({"kind": "foreign_lock", "replica": None, "t0": 0.5, "t1": 3.0})
    assert "held-twice" in tags(run)
    run = legal()                                  # nor an attempt too high
    run.hist.rows[0]["attempt"] = 2
    run.hist.faults.append({"kind": "foreign_lock", "replica": None, "t0": 0.5, "t1": 3.0})
    assert tags(run) == ["attempt-inflated"]


def test_absent_workers_excuse_like_a_reconnect():
    # the ack of the delivery in hand when the workers left may be lost
    run = legal()
    entry(run, "3-0", "k1")
    deliver(run, "k1", "3-0", 2.0, 2.1)
    run.hist.faults.append({"kind": "worker_absent", "replica": 0, "t0": 1.25, "t1": 1.9})
    assert tags(run) == []
    # ... and a delivery sent to them uncounted; not another replica's ack
    assert "attempt-inflated" not in inflated_by_one("worker_absent", 1.5)
    run.hist.faults[-1]["replica"] = 1
    assert tags(run) == ["twice-after-ack"]


def test_max_deliveries_of_timeouts_no_worker_recorded_is_legitimate():
    """Deliveries that timed out queued behind a slow handler are never recorded
    by a worker; the replica's log counts them (seed 13). Without those lines
    the same dead letter is a bad cause."""
    run = record(max_deliveries=2)
    entry(run, "1-0", "k1")
    dead(run, "1-0", "max_deliveries (2) reached: ack timeout")
    done(run, "k1")
    assert tags(run) == ["bad-cause"]
    run.proxies[0].text = ("... warn  stream room entry 1-0 key k1 attempt 1: ack timeout\n"
                           "... warn  stream room entry 1-0 key k1 attempt 2: ack timeout\n")
    assert tags(run) == []


def test_recorded_failures_and_unrecorded_timeouts_add_up():
    """Seed 63: attempts 1-4 recorded (a RETRY and late answers), attempt 5 timed
    out unrecorded; the five make max_deliveries 5 legitimate. Taking the larger
    of the two counts (4 and 4) called it a bad cause."""
    run = record(max_deliveries=5)
    entry(run, "1-0", "k1")
    for a in (1, 2, 3, 4):
        deliver(run, "k1", "1-0", 1.0 + a, 1.0 + a + 0.1, answer="retry", attempt=a)
    dead(run, "1-0", "max_deliveries (5) reached: ack timeout", t=9.0)
    done(run, "k1")
    run.proxies[0].text = "".join(f"x warn  stream room entry 1-0 key k1 attempt {a}: ack timeout\n"
                                  for a in (1, 2, 4, 5))
    assert tags(run) == []
    run.proxies[0].text = "".join(f"x warn  stream room entry 1-0 key k1 attempt {a}: ack timeout\n"
                                  for a in (1, 2, 4))
    assert tags(run) == ["bad-cause"]


def test_the_generator_draws_only_configs_check_accepts(tmp_path):
    """Every replica config of 100 seeds (plain, --net and cluster draws) passes
    `idemproxy check` without an error: docs/configuration.md's rules (lease_ms >= 2 x
    timeout_ms, claim_idle_ms >= 3 x timeout_ms, done_ttl_ms >= lease_ms, key
    and dedup names) hold for what the search runs, so a finding is never a
    config the daemon would refuse."""
    import subprocess
    import types
    for seed in range(100):
        c = chaos.generate(seed)
        if seed % 3 == 1:
            chaos.netize(c, seed)
        elif seed % 3 == 2:
            chaos.clusterize(c, seed)
        if seed % 2:
            chaos.dbize(c, seed)                            # --db's draws too
        run = chaos.Run.__new__(chaos.Run)
        run.c, run.tmp, run.pki, run.seed = c, tmp_path, None, seed
        run.collector = (types.SimpleNamespace(url="http://127.0.0.1:4318")   # tracing seeds
                         if c.get("tracing") is not None else None)
        address = ["127.0.0.1:7000", "127.0.0.1:7001"] if c["cluster"] else "redis://127.0.0.1:6379"
        for i in range(c["replicas"]):
            p = run.replica_proxy(i, address, f"ipc://{tmp_path}/app{i}.sock")
            res = subprocess.run([str(chaos.pxtest.BIN), "check", "-c", str(p.config)],
                                 capture_output=True, text=True, timeout=10)
            assert res.returncode == 0, (seed, chaos.describe(c), res.stderr)


def test_a_copy_judged_by_a_mark_later_written_over():
    """Seed 169 of --net: 1-0 (FP_B) is acked, its done mark's write held up by its
    link refused past its lease; 3-0 (FP_A) is claimed meanwhile, acked, and its mark
    written; 4-0, a true copy of 1-0, meets that mark and is dead-lettered as a
    conflict; then 1-0's held-up commit writes FP_B over it, the mark kept at the end.
    Legal: the double the guarantee allows when a lease is lost. Without the fault
    that held the write up, the same history is a bad conflict."""
    def history(held_up):
        run = record(lock_key=False, fingerprint="#event", on_conflict="dead_letter")
        entry(run, "1-0", "k1", fp=FP_B)
        entry(run, "3-0", "k1", fp=FP_A)
        entry(run, "4-0", "k1", fp=FP_B)
        deliver(run, "k1", "1-0", 1.0, 1.4)
        deliver(run, "k1", "3-0", 2.0, 2.1, replica=1, worker="w1.0")
        dead(run, "4-0", f"conflict: fingerprint {FP_B} differs from the done mark's {FP_A}", t=3.0)
        done(run, "k1")
        run.state["marks"] = {"k1": (1500, FP_B)}
        if held_up:
            run.hist.fault("refuse", 0, 1.45, 4.0)
        return run
    assert chaos.check(history(True)) == []
    assert "bad-conflict" in tags(history(False))


# --- --db: the database sink (issue 35) ---------------------------------------------

def effect(run, key, token, worker="w0.0", lock="r0", eid="1-0", inbox=True):
    effects = run.db_state["effects"]
    effects.append({"id": len(effects) + 1, "key": key, "lock": lock, "token": token, "worker": worker,
                    "entry": eid})
    if inbox:
        run.db_state["inbox"].setdefault(key, {"entry": eid, "token": token})


def db_legal():
    """legal(), each ack written through the helper: k1 then k2 under room r0's
    lock, tokens going up, one inbox row each."""
    run = legal()
    run.c["db"] = True
    run.db_state = {"effects": [], "inbox": {}, "fence": {}}
    for x in run.hist.rows:
        x["db"] = "run"
        effect(run, x["key"], x["token"], eid=x["entry"])
    return run


def test_db_a_legal_history_passes():
    run = db_legal()
    assert chaos.check(run) == []
    assert chaos.db_summary(run)[0] == ("db: 2 effects, 0 stopped by the inbox (0 doubles after 0 forget), "
                                        "0 stale refused by the fence")


def test_db_an_acked_key_without_its_effect():
    run = db_legal()
    run.db_state["effects"].pop()
    del run.db_state["inbox"]["k2"]
    assert tags(run) == ["db-effect-missing"]


def test_db_a_key_with_two_effects():
    run = db_legal()
    effect(run, "k1", 500, worker="w1.0")           # written again: the inbox did not stop it
    assert tags(run) == ["db-effect-twice"]


def test_db_a_lower_token_written_after_a_higher_one_for_the_lock():
    """The skip-fence mutant's finding: k1's holder lost its lease while it worked,
    k2 was written under a higher token for the same lock, then k1's stale write."""
    run = db_legal()
    run.db_state["effects"][0]["token"] = 999       # k1 (id 1) under 999, then k2 (id 2) under 131
    assert tags(run) == ["db-stale-write"]
    run = db_legal()
    for e in run.db_state["effects"]:              # another lock each: no order between them
        e["lock"] = e["key"]
    run.db_state["effects"][0]["token"] = 999
    assert tags(run) == []


def test_db_the_inbox_holds_exactly_the_effects_keys():
    run = db_legal()
    run.db_state["inbox"]["k3"] = {"entry": "9-0", "token": 1}
    assert tags(run) == ["db-inbox"]
    run = db_legal()
    del run.db_state["inbox"]["k1"]
    assert tags(run) == ["db-inbox"]


def test_db_a_database_error_is_reported():
    run = db_legal()
    run.hist.rows[1].update(db="error: connection refused", answer="retry")
    entry(run, "3-0", "k2")                          # ... and k2 then acked
    deliver(run, "k2", "3-0", 3.0, 3.1)
    run.hist.rows[-1]["db"] = "done"
    assert tags(run) == ["db-error"]


def forgot(run, t0=1.1, t1=1.6):
    run.hist.fault("forget", None, t0, t1)


def test_db_after_a_forget_a_key_delivered_again_is_the_double_the_inbox_stops():
    """k1 acked at 1.2, after the snapshot (1.1): Redis forgot its done mark at 1.6
    and a copy is delivered at 2.0; the inbox answers "done". Legal, and counted
    as a double; without the forget, the redelivery is a violation."""
    def history(forget):
        run = db_legal()
        entry(run, "3-0", "k1")
        deliver(run, "k1", "3-0", 2.0, 2.1)
        run.hist.rows[-1]["db"] = "done"
        if forget:
            forgot(run)
        return run
    run = history(True)
    assert chaos.check(run) == []
    assert chaos.db_summary(run)[1] == 1
    assert tags(history(False)) == ["twice-after-ack"]


def test_db_after_a_forget_entries_added_since_the_snapshot_need_no_outcome():
    """Entry 1300-0 added at 1.3, between the snapshot (1.1) and the restore (1.6):
    gone with the restore, never delivered, never done. Legal only then."""
    run = db_legal()
    entry(run, "1300-0", "k9")
    forgot(run)
    assert chaos.check(run) == []
    run = db_legal()
    entry(run, "1300-0", "k9")
    forgot(run, t0=1.4)                              # added before the snapshot: kept, owed an outcome
    assert tags(run) == ["no-outcome"]
    run = db_legal()
    entry(run, "1300-0", "k9")
    forgot(run)
    run.hist.faults[-1]["killed"] = 1.25             # added after the kill: in the restarted Redis
    assert tags(run) == ["no-outcome"]


def test_db_after_a_forget_the_count_set_back_allows_one_more_round():
    """The delivery count set back to the snapshot's: up to max_deliveries more."""
    def history(forget):
        run = db_legal()
        entry(run, "3-0", "k3")
        for n, a in enumerate((1, 2, 1, 2, 3)):
            deliver(run, "k3", "3-0", 2.0 + n, 2.1 + n, answer="retry", attempt=a)
        dead(run, "3-0", "max_deliveries (3) reached: chaos-retry", t=8.0)
        done(run, "k3")
        if forget:
            forgot(run, 2.5, 3.5)
        return run
    assert chaos.check(history(True)) == []
    assert "too-many-deliveries" in tags(history(False))


def test_db_rules_stay_strict_after_a_forget():
    run = db_legal()
    forgot(run)
    effect(run, "k1", 500, worker="w1.0")
    assert tags(run) == ["db-effect-twice"]


def test_db_draws_fencing_shared_locks_stalls_and_forgets():
    """dbize() over 200 seeds: fencing always; distinct keys sharing a lock, holders
    that lose their lease while they work (slow answers past an ack timeout under
    the lease, a replica killed), and a Redis that forgets, each in a good share;
    a forget never against a cluster; the seed's other draws unchanged."""
    n, lock, stall, forget = 200, 0, 0, 0
    for seed in range(n):
        c = chaos.dbize(chaos.generate(seed), seed)
        assert c["db"] and c["fencing"]
        lock += c["lock_key"]
        stall += c["weights"]["slow"] >= 15 and c["ack_timeout_ms"] < c["lease_ms"] * c["slow_factor"] \
            or any(f["kind"] == "kill9" for f in c["faults"])
        kinds = [f["kind"] for f in c["faults"]]
        forget += "forget" in kinds
        if "forget" in kinds:
            assert kinds.index("snapshot") < kinds.index("forget")
        cl = chaos.dbize(chaos.clusterize(chaos.generate(seed), seed), seed)
        assert not {"snapshot", "forget"} & {f["kind"] for f in cl["faults"]}
        assert chaos.dbize(chaos.generate(seed), seed)["events"] == chaos.generate(seed)["events"]
    assert lock > 0.7 * n and stall > 0.5 * n and forget > 0.5 * n, (lock, stall, forget)


def test_db_after_a_forget_group_less_outcomes_written_then_may_be_lost():
    """Group-less, the readers do not read back: a bad entry added at 0.5 whose dead
    letter may have been written after the snapshot (1.1), and k1 acked at 1.2, lose
    their outcomes with the restore (1.6). In group mode both are read again and
    owed one; an entry delivered only after the restore is owed one either way."""
    def history(group, late=False):
        run = db_legal()
        run.c["group"] = group
        entry(run, "500-0", "x1", kind="badjson")
        run.state["done"]["k1"] = False
        if late:
            run.hist.rows[0].update(start=1.7, end=1.8, deadline=1.7 + ACK_S, token=171)
        forgot(run)
        return run
    assert chaos.check(history(False)) == []
    assert tags(history(True)) == ["no-outcome"]
    assert tags(history(False, late=True)) == ["no-outcome"]


def test_db_after_a_forget_an_entry_acked_in_its_window_may_lose_its_mark():
    """Seed 97: k3 acked at 1.3, its done mark and XACK written (the XACK retried after
    the restore at 1.6, so nothing is pending): Redis forgot the mark. Its effect is in
    the database. Owed an outcome if acked before the snapshot (1.1) by over a second."""
    def history(t):
        run = db_legal()
        entry(run, "50-0", "k3")
        deliver(run, "k3", "50-0", t - 0.1, t)
        run.hist.rows[-1]["db"] = "run"
        effect(run, "k3", run.hist.rows[-1]["token"], lock="r9", eid="50-0")
        forgot(run)
        return run
    assert chaos.check(history(1.3)) == []
    assert tags(history(0.05)) == ["no-outcome"]


def test_db_after_a_forget_an_entry_dead_lettered_in_its_window_may_lose_it():
    """Seed 97 again: a 40 MB entry dead-lettered at 1.3 (its dead letter lost, its
    XACK retried after the restore at 1.6): neither dead letter nor pending at the
    end. Legal when a replica logged the dead letter in the window, not before it."""
    def history(when):
        run = db_legal()
        entry(run, "50-0", "x9", kind="over")
        run.proxies[0].text = (f"1970-01-01T00:00:{when:06.3f}Z warn  stream room entry 50-0 key - attempt 0: "
                               f"bad entry: entry is 41943100 bytes, over max_entry_bytes 65536 (dead-lettered)\n")
        forgot(run)
        return run
    assert chaos.check(history(1.3)) == []
    assert tags(history(0.05)) == ["no-outcome"]


def exhausted_behind_a_busy_dead_letter():
    """Group-less, two replicas (seed 145): replica 1 finds the room lock held and
    dead-letters entry 1-0 as busy; replica 0 then exhausts it (max_deliveries) and
    marks its key done with its fingerprint, its own dead letter not written: one dead
    letter per entry across replicas, and that one says busy."""
    run = record(group=False, on_busy="dead_letter", max_deliveries=2, fingerprint="#event",
                 on_conflict="dead_letter")
    run.proxies = [Log("replica0"), Log("replica1")]
    entry(run, "1-0", "k1", fp=FP_A)
    deliver(run, "k1", "1-0", 1.0, 1.1, answer="retry")
    deliver(run, "k1", "1-0", 1.3, 1.4, answer="retry", attempt=2)
    dead(run, "1-0", "busy", t=1.5)
    done(run, "k1")
    run.state["marks"] = {"k1": (1600, FP_A)}
    return run


def test_a_mark_of_an_entry_a_replica_logged_exhausted_passes():
    run = exhausted_behind_a_busy_dead_letter()
    assert tags(run) == ["done-unacked"]                      # no replica said it exhausted it
    run.proxies[0].text = ("2026-11-26T17:01:49.676Z warn  stream room entry 1-0 key k1 attempt 2: "
                           "max_deliveries (2) reached: chaos-retry\n")
    assert chaos.check(run) == []


def test_a_replica_whose_metrics_port_was_taken_while_down_restarts_on_another(tmp_path):
    """The harness, not the checker: a replica restarted after a stop finds its
    metrics port taken (by another harness's outgoing connection: --net seed 481
    beside a CI run) and moves to a free one, its config with it, instead of
    exiting 1 on each restart."""
    import socket
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
    import pxtest
    p = pxtest.Proxy(tmp_path, "replica0", "redis://127.0.0.1:1", "ipc:///nonexistent", [])
    taker = socket.socket()
    taker.bind(("127.0.0.1", p.metrics_port))
    started, said = [], []
    run = SimpleNamespace(proxies=[p], log=said.append, start_proxy=started.append)
    try:
        chaos.Run.restart_replica(run, 0)
    finally:
        taker.close()
    old = int(said[0].split("port ")[1].split()[0])
    assert started == [p] and p.metrics_port != old
    assert f"listen: 127.0.0.1:{p.metrics_port}\n" in p.config.read_text()
    assert f"127.0.0.1:{old}" not in p.config.read_text()
