"""The fault suite's checker can fail: fed records with a key delivered or
acked twice outside any fault, a key lost, a key pending, it goes red (issue 20)."""
from collections import Counter

import pytest

from faultlib import Faults, Ledger, check


class Recorded:                 # a worker whose deliveries are given
    def __init__(self, keys):
        self.keys = list(keys)

    def received(self):
        return list(self.keys)


def setup(env, done=("a", "b", "c")):
    r = env.r
    for k in done:
        r.set("idem:" + k, "D")
    r.xgroup_create("room", "g", "$", mkstream=True)
    return r, Ledger(env.tmp)


def test_clean_run_passes(env):
    r, ledger = setup(env)
    check("clean", r, ["a", "b", "c"], ledger, [Recorded("abc")], acked=Counter("abc"))


@pytest.mark.parametrize("what,delivered,acked", [
    ("delivered twice", "abcb", "abc"),
    ("acked twice", "abc", "abcc"),
])
def test_a_key_twice_without_a_fault_fails(env, what, delivered, acked):
    r, ledger = setup(env)
    with pytest.raises(AssertionError, match="more often than the faults allow"):
        check(what, r, ["a", "b", "c"], ledger, [Recorded(delivered)], acked=Counter(acked))


def test_twice_is_allowed_only_for_a_key_in_flight_at_a_fault_once_per_fault(env):
    r, ledger = setup(env)
    faults = Faults(r)
    faults.add("kill", ["b"])
    check("b in flight", r, ["a", "b", "c"], ledger, [Recorded("abcb")], faults=faults,
          acked=Counter("abcb"))
    with pytest.raises(AssertionError, match="more often than the faults allow"):
        check("c not in flight", r, ["a", "b", "c"], ledger, [Recorded("abcc")], faults=faults,
              acked=Counter("abc"))
    with pytest.raises(AssertionError, match="more often than the faults allow"):
        check("b three times", r, ["a", "b", "c"], ledger, [Recorded("abcbb")], faults=faults,
              acked=Counter("abc"))


def test_in_flight_is_what_was_delivered_and_not_done_at_the_fault(env):
    r, ledger = setup(env, done=("a",))
    w = Recorded("ab")
    faults = Faults(r)
    faults.inject("kill", lambda: w.keys.append("c"), [w], settle=0)
    assert faults.log == [("kill", {"b", "c"})]


def test_lost_pending_or_never_acked_fails(env):
    r, ledger = setup(env)
    with pytest.raises(AssertionError, match="never done"):
        check("lost", r, ["a", "b", "c", "d"], ledger, [Recorded("abcd")], acked=Counter("abcd"))
    with pytest.raises(AssertionError, match="done but never acked"):
        check("not acked", r, ["a", "b", "c"], ledger, [Recorded("abc")], acked=Counter("ab"))
    r.xadd("room", {"payload": "x"})
    r.xreadgroup("g", "c1", {"room": ">"})
    with pytest.raises(AssertionError, match="still pending"):
        check("pending", r, ["a", "b", "c"], ledger, [Recorded("abc")], acked=Counter("abc"))
