"""The harness's own verdicts can fail: each check here feeds a fixture the
fault it must notice (issue 20)."""
import signal
import subprocess

import pytest
import redis as redis_lib

from pxtest import Env, Proxy, pending, wait_for


def test_pending_raises_on_a_missing_group(env):
    env.r.xadd("room", {"payload": "x"})
    with pytest.raises(redis_lib.exceptions.ResponseError, match="NOGROUP"):
        pending(env.r, "room", "no-such-group")


def test_pending_raises_on_a_key_of_the_wrong_type(env):
    env.r.set("room", "a string")
    with pytest.raises(redis_lib.exceptions.ResponseError, match="WRONGTYPE"):
        pending(env.r, "room", "g")


def test_pending_raises_when_redis_is_down(env):
    env.r.xgroup_create("room", "g", "0", mkstream=True)
    assert pending(env.r, "room", "g") == 0
    env.redis.stop()
    with pytest.raises(redis_lib.exceptions.ConnectionError):
        pending(env.r, "room", "g")


def _fake_proxy(tmp, script):
    """A Proxy whose process is a shell running 'script' (the harness, not the daemon)."""
    p = Proxy(tmp, "fake", "redis://127.0.0.1:1", "ipc:///nonexistent", [])
    p.logf = open(p.log, "ab")
    p.proc = subprocess.Popen(["sh", "-c", script], stdout=p.logf, stderr=subprocess.STDOUT)
    if "trap" in script:          # its trap is set before it is sent SIGTERM
        wait_for(lambda: "ready" in p.log_text(), what="the fake proxy's trap")
    return p


class _Srv:          # Env needs a server with a client; none is used here
    client = None


@pytest.mark.parametrize("script,why", [
    ("trap 'exit 23' TERM; echo ready; while :; do sleep 0.05; done", "exit 23"),          # LeakSanitizer's code
    ("trap 'kill -SEGV $$' TERM; echo ready; while :; do sleep 0.05; done", "exit -11"),    # a crash at shutdown
], ids=["leak-exit-23", "crash-sigsegv"])
def test_close_fails_when_a_proxy_ends_badly_on_sigterm(tmp_path, script, why):
    e = Env(tmp_path, _Srv())
    e.proxies.append(_fake_proxy(tmp_path, script))
    with pytest.raises(AssertionError, match=why):
        e.close()


def test_close_fails_when_a_proxy_hangs_on_sigterm(tmp_path, monkeypatch):
    import pxtest
    monkeypatch.setattr(pxtest, "STOP_TIMEOUT", 0.5)
    e = Env(tmp_path, _Srv())
    e.proxies.append(_fake_proxy(tmp_path, "trap '' TERM; echo ready; while :; do sleep 0.05; done"))
    with pytest.raises(AssertionError, match=f"exit {-signal.SIGKILL}"):
        e.close()


def test_close_passes_a_clean_exit_and_leaves_an_ended_proxy_alone(tmp_path):
    e = Env(tmp_path, _Srv())
    e.proxies.append(_fake_proxy(tmp_path, "trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done"))
    dead = _fake_proxy(tmp_path, "exit 1")      # a test about a failing start
    dead.proc.wait()
    e.proxies.append(dead)
    e.close()
