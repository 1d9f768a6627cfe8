"""idemproxy_worker.postgres against a real PostgreSQL (IDEMPROXY_TEST_PG, set by
tests/with-postgres): each test in a fresh schema holding the inbox, the fence and
a table the handler writes. Answers are what the client sends idemproxy (answer())."""
import asyncio
import os
import pathlib
import threading
import time
import uuid

import pytest

psycopg = pytest.importorskip("psycopg", reason="psycopg 3 not installed (the postgres extra)")
from psycopg import conninfo as pgconninfo  # noqa: E402

from idemproxy_worker import Drop, answer, answer_async, idemproxy_pb2 as pb  # noqa: E402
from idemproxy_worker.postgres import Inbox, enter, schema_sql  # noqa: E402

PG = os.environ.get("IDEMPROXY_TEST_PG")
pytestmark = pytest.mark.skipif(not PG, reason="IDEMPROXY_TEST_PG is unset: run under tests/with-postgres")
ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture
def db():
    """A conninfo whose search_path is a fresh schema with the tables applied."""
    schema = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(PG, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        info = pgconninfo.make_conninfo(PG, options=f"-c search_path={schema}", application_name=schema)
        with psycopg.connect(info, autocommit=True) as c:
            c.execute(schema_sql())
            c.execute("CREATE TABLE effects (key text PRIMARY KEY, token bigint NOT NULL)")
        yield info
        admin.execute(f"DROP SCHEMA {schema} CASCADE")


def rows(info, sql):
    with psycopg.connect(info) as c:
        return c.execute(sql).fetchall()


def delivery(key, token=0, lock=None, entry_id="1700000000000-0"):
    return pb.Delivery(stream="room", entry_id=entry_id, key=key, attempt=1, fencing_token=token,
                       lock=(key if lock is None else lock) if token else "").SerializeToString()


def ack(data):
    a = pb.Ack.FromString(data)
    return pb.Ack.Status.Name(a.status), a.reason


def effect(conn, d):
    """The handler's write: one row per delivery."""
    conn.execute("INSERT INTO effects (key, token) VALUES (%s, %s)", (d.key, d.fencing_token))


def counted(fn):
    calls = []

    def handler(conn, d):
        calls.append(d.key)
        return fn(conn, d)
    return handler, calls


def test_schema_sql_is_the_repository_file():
    repo = ROOT / "sql" / "postgresql" / "001_idemproxy_inbox.sql"
    if not repo.exists():
        pytest.skip("not in the idemproxy repository")
    assert schema_sql().encode() == repo.read_bytes()


def test_a_new_key_runs_the_handler_and_commits_with_its_inbox_row(db):
    fn, calls = counted(effect)
    assert ack(answer(Inbox(db).handler(fn), delivery("k1", token=7))) == ("ACK", "")
    assert calls == ["k1"]
    assert rows(db, "SELECT key, token FROM effects") == [("k1", 7)]
    assert rows(db, "SELECT key, stream, entry_id, token FROM idemproxy_inbox") == \
        [("k1", "room", "1700000000000-0", 7)]
    assert rows(db, "SELECT lock, token FROM idemproxy_fence") == [("k1", 7)]


def test_the_same_key_again_is_acked_without_the_handler(db):
    inbox = Inbox(db)
    answer(inbox.handler(effect), delivery("k1", token=7))
    fn, calls = counted(effect)   # would fail on the effects key if it ran
    # A redelivery (Redis forgot its done mark): a new entry, a new, higher token.
    assert ack(answer(inbox.handler(fn), delivery("k1", token=9, entry_id="1700000000001-0"))) == ("ACK", "")
    assert calls == []
    assert rows(db, "SELECT key, token FROM effects") == [("k1", 7)]
    assert rows(db, "SELECT entry_id, token FROM idemproxy_inbox") == [("1700000000000-0", 7)]
    assert rows(db, "SELECT lock, token FROM idemproxy_fence") == [("k1", 7)]


def test_a_stale_token_is_rolled_back_and_retried(db):
    inbox = Inbox(db)
    # The next holder of the lock (another key, the same lock_key) wrote with token 20.
    assert ack(answer(inbox.handler(effect), delivery("k2", token=20, lock="room-1"))) == ("ACK", "")
    fn, calls = counted(effect)
    assert ack(answer(inbox.handler(fn), delivery("k1", token=10, lock="room-1"))) == \
        ("RETRY", "stale fencing token")
    assert calls == []
    assert rows(db, "SELECT key FROM effects ORDER BY key") == [("k2",)]
    assert rows(db, "SELECT key FROM idemproxy_inbox ORDER BY key") == [("k2",)]
    assert rows(db, "SELECT lock, token FROM idemproxy_fence") == [("room-1", 20)]
    # The holder of token 20 writes again (another key under the same lease): accepted.
    assert ack(answer(inbox.handler(effect), delivery("k3", token=20, lock="room-1"))) == ("ACK", "")
    assert rows(db, "SELECT key FROM effects ORDER BY key") == [("k2",), ("k3",)]


def test_a_stale_token_rolls_back_the_inbox_row_with_enter(db):
    """enter() on a transaction the caller owns: the caller rolls back on "stale"."""
    d = pb.Delivery(key="k1", stream="room", entry_id="1-0", lock="room-1", fencing_token=10)
    with psycopg.connect(db) as c:
        c.execute("INSERT INTO idemproxy_fence (lock, token) VALUES ('room-1', 11)")
        c.commit()
        assert enter(c, d) == "stale"
        c.rollback()
        assert enter(c, pb.Delivery(key="k1", stream="room", entry_id="1-0", lock="room-1",
                                    fencing_token=11)) == "run"
        c.commit()
    assert rows(db, "SELECT key, token FROM idemproxy_inbox") == [("k1", 11)]


def test_enter_refuses_autocommit_outside_a_transaction(db):
    d = pb.Delivery(key="k1", stream="room", entry_id="1-0")
    with psycopg.connect(db, autocommit=True) as c:
        with pytest.raises(ValueError, match="needs a transaction"):
            enter(c, d)
        with c.transaction():
            assert enter(c, d) == "run"
    assert rows(db, "SELECT key FROM idemproxy_inbox") == [("k1",)]


@pytest.mark.parametrize("exc, want", [(RuntimeError("disk full"), ("RETRY", "disk full")),
                                       (Drop("bad event"), ("DROP", "bad event"))])
def test_a_failing_handler_rolls_everything_back(db, exc, want):
    def fn(conn, d):
        effect(conn, d)
        raise exc
    assert ack(answer(Inbox(db).handler(fn), delivery("k1", token=7))) == want
    assert rows(db, "SELECT * FROM effects") == []
    assert rows(db, "SELECT * FROM idemproxy_inbox") == []
    assert rows(db, "SELECT * FROM idemproxy_fence") == []
    # Retried later, it runs.
    assert ack(answer(Inbox(db).handler(effect), delivery("k1", token=8))) == ("ACK", "")
    assert rows(db, "SELECT key, token FROM effects") == [("k1", 8)]


def test_a_failing_commit_is_retried(db):
    """A deferred constraint fails at COMMIT: nothing is kept, the answer is RETRY."""
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("CREATE TABLE later (n int UNIQUE DEFERRABLE INITIALLY DEFERRED)")

    def fn(conn, d):
        effect(conn, d)
        conn.execute("INSERT INTO later VALUES (1), (1)")   # refused at COMMIT
    status, reason = ack(answer(Inbox(db).handler(fn), delivery("k1", token=7)))
    assert status == "RETRY" and "later" in reason, reason
    assert rows(db, "SELECT * FROM effects") == rows(db, "SELECT * FROM idemproxy_inbox") == []


def test_token_zero_is_the_inbox_alone(db):
    inbox = Inbox(db)
    with psycopg.connect(db) as c:   # a fence row that any token 0 would be "below"
        c.execute("INSERT INTO idemproxy_fence (lock, token) VALUES ('k1', 5), ('', 5)")
    assert ack(answer(inbox.handler(effect), delivery("k1"))) == ("ACK", "")
    fn, calls = counted(effect)
    assert ack(answer(inbox.handler(fn), delivery("k1"))) == ("ACK", "")
    assert calls == []
    assert rows(db, "SELECT key, token FROM effects") == [("k1", 0)]
    assert rows(db, "SELECT key, token FROM idemproxy_inbox") == [("k1", 0)]
    assert rows(db, "SELECT lock, token FROM idemproxy_fence ORDER BY lock") == [("", 5), ("k1", 5)]


def waiting_on_a_lock(info):
    """Backends of this test (its application_name) waiting for a lock."""
    return rows(info, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                      "AND application_name = current_setting('application_name')")[0][0]


def test_two_holders_of_one_key_run_the_handler_once(db):
    """The first holder is inside its handler; the second's inbox insert waits on the
    first's row, then finds it committed: ACK without running its handler."""
    inside, release = threading.Event(), threading.Event()
    calls = []

    def fn(conn, d):
        calls.append(threading.current_thread().name)
        effect(conn, d)
        inside.set()
        assert release.wait(30)

    handle = Inbox(db).handler(fn)
    acks = {}

    def holder(name, token):
        acks[name] = ack(answer(handle, delivery("k1", token=token)))

    first = threading.Thread(target=holder, args=("first", 7), name="first")
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=holder, args=("second", 8), name="second")
    second.start()
    deadline = time.monotonic() + 30
    while waiting_on_a_lock(db) == 0:   # the second holder is blocked on the inbox row
        assert time.monotonic() < deadline and second.is_alive()
        time.sleep(0.02)
    release.set()
    first.join(30)
    second.join(30)
    assert acks == {"first": ("ACK", ""), "second": ("ACK", "")}
    assert calls == ["first"]
    assert rows(db, "SELECT key, token FROM effects") == [("k1", 7)]


def test_async_handler_runs_once_and_refuses_stale_tokens(db):
    calls = []

    async def fn(conn, d):
        calls.append(d.key)
        await conn.execute("INSERT INTO effects (key, token) VALUES (%s, %s)", (d.key, d.fencing_token))

    async def main():
        handle = Inbox(db).async_handler(fn)
        return [ack(await answer_async(handle, delivery(k, token=t, lock="room-1")))
                for k, t in [("k1", 20), ("k1", 21), ("k2", 10), ("k3", 20)]]

    assert asyncio.run(main()) == [("ACK", ""), ("ACK", ""), ("RETRY", "stale fencing token"), ("ACK", "")]
    assert calls == ["k1", "k3"]
    assert rows(db, "SELECT key, token FROM effects ORDER BY key") == [("k1", 20), ("k3", 20)]
    assert rows(db, "SELECT lock, token FROM idemproxy_fence") == [("room-1", 20)]


def test_connections_are_kept_and_a_broken_one_is_replaced(db):
    """With a conninfo, one connection serves delivery after delivery; one whose server
    end died answers that delivery RETRY and the next one gets a new connection."""
    pids = []

    def fn(conn, d):
        pids.append(conn.info.backend_pid)
        effect(conn, d)
    inbox = Inbox(db)
    handle = inbox.handler(fn)
    assert ack(answer(handle, delivery("k1")))[0] == "ACK"
    assert ack(answer(handle, delivery("k2")))[0] == "ACK"
    assert pids[0] == pids[1]
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT pg_terminate_backend(%s, 30000)", (pids[0],))   # waits until it is gone
    assert ack(answer(handle, delivery("k3")))[0] == "RETRY"
    assert ack(answer(handle, delivery("k3")))[0] == "ACK"
    assert pids[-1] != pids[0]
    assert rows(db, "SELECT key FROM effects ORDER BY key") == [("k1",), ("k2",), ("k3",)]
    inbox.close()
    assert waiting_on_a_lock(db) == 0 and rows(db, "SELECT count(*) FROM pg_stat_activity "
                                                   "WHERE application_name = current_setting('application_name') "
                                                   "AND pid <> pg_backend_pid()") == [(0,)]


def test_a_pool_lends_the_connection(db):
    from psycopg_pool import AsyncConnectionPool, ConnectionPool
    with ConnectionPool(db, min_size=1, max_size=2, open=True) as pool:
        handle = Inbox(pool).handler(effect)
        assert [ack(answer(handle, delivery(k, token=t, lock="r")))[1]
                for k, t in [("k1", 5), ("k1", 6), ("k2", 4)]] == ["", "", "stale fencing token"]

    async def main():
        async with AsyncConnectionPool(db, min_size=1, max_size=2, open=False) as apool:
            async def afn(conn, d):
                await conn.execute("INSERT INTO effects (key, token) VALUES (%s, %s)", (d.key, d.fencing_token))
            handle = Inbox(apool).async_handler(afn)
            return [ack(await answer_async(handle, delivery(k, token=t, lock="r")))[1]
                    for k, t in [("k3", 7), ("k3", 8), ("k4", 6)]]
    assert asyncio.run(main()) == ["", "", "stale fencing token"]
    assert rows(db, "SELECT key, token FROM effects ORDER BY key") == [("k1", 5), ("k3", 7)]


def test_a_handler_that_rolls_the_transaction_back_is_retried(db):
    """psycopg.Rollback from the handler would end the helper's transaction quietly:
    nothing is committed, so the answer is RETRY, not ACK."""
    def fn(conn, d):
        effect(conn, d)
        raise psycopg.Rollback()
    status, reason = ack(answer(Inbox(db).handler(fn), delivery("k1")))
    assert (status, reason) == ("RETRY", "the handler rolled the transaction back (Rollback)")
    assert rows(db, "SELECT * FROM effects") == rows(db, "SELECT * FROM idemproxy_inbox") == []


def test_an_async_handler_cancelled_at_its_deadline_leaves_nothing(db):
    """AsyncWorker cancels a handler at the delivery's deadline: the transaction is
    rolled back (RETRY) and the kept connection serves the next delivery."""
    async def slow(conn, d):
        await conn.execute("INSERT INTO effects (key, token) VALUES (%s, %s)", (d.key, d.fencing_token))
        if d.key == "slow":
            await conn.execute("SELECT pg_sleep(30)")

    async def main():
        handle = Inbox(db).async_handler(slow)
        late = pb.Delivery(stream="room", entry_id="1-0", key="slow",
                           deadline_unix_ms=int(time.time() * 1000) + 500).SerializeToString()
        t0 = time.monotonic()
        first = ack(await answer_async(handle, late))
        assert time.monotonic() - t0 < 20
        return first, ack(await answer_async(handle, delivery("k2")))
    assert asyncio.run(main()) == (("RETRY", "deadline passed while the handler ran"), ("ACK", ""))
    assert rows(db, "SELECT key FROM effects") == rows(db, "SELECT key FROM idemproxy_inbox") == [("k2",)]


def test_a_token_without_a_lock_fences_the_key(db):
    """An idemproxy older than Delivery.lock sends a token and no lock: the key is the
    lock (as it is without lock_key), not one "" row every key would share."""
    with psycopg.connect(db) as c:
        assert enter(c, pb.Delivery(key="k1", stream="room", entry_id="1-0", fencing_token=5)) == "run"
    assert rows(db, "SELECT lock, token FROM idemproxy_fence") == [("k1", 5)]
