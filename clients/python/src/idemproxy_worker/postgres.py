"""idemproxy_worker.postgres - the inbox and the fence in your PostgreSQL transaction.

The optional part of the client (``pip install 'idemproxy-worker[postgres]'``, psycopg 3)
that makes an effect land once in the database even when Redis forgets a done mark, and
refuses the writes of a holder whose lease was lost (docs/database.md). Apply the tables
once per database: ``001_idemproxy_inbox.sql`` ships in this package (``schema_sql()``).

    from idemproxy_worker import Worker
    from idemproxy_worker.postgres import Inbox

    inbox = Inbox("postgresql://app@db/app")     # or a psycopg_pool.ConnectionPool

    @inbox.handler
    def handle(conn, d):                         # inside the transaction of the inbox row
        conn.execute("UPDATE rooms SET n = n + 1 WHERE id = %s", (d.json()["roomId"],))

    Worker("ipc:///tmp/idemproxy.sock", handle, concurrency=4).run()

The answers: a key already in the inbox is ACK without running 'fn'; a fencing token
lower than one that has written for the delivery's lock is RETRY "stale fencing token";
otherwise 'fn' runs and the transaction commits (ACK), or 'fn' raises and everything is
rolled back (RETRY, or DROP for Drop, as for any handler). ``enter()`` is the step on
its own, for a transaction you manage yourself.
"""
from __future__ import annotations

import threading
from importlib import resources
from typing import Any, Awaitable, Callable, List, Literal, Protocol, Union

try:
    import psycopg
except ImportError as exc:  # the base package works without it; this module does not
    raise ImportError("idemproxy_worker.postgres needs psycopg 3: "
                      "pip install 'idemproxy-worker[postgres]'") from exc

from .worker import Delivery, Retry

__all__ = ["Inbox", "enter", "enter_async", "schema_sql", "STALE_TOKEN"]

# docs/database.md's statements, word for word but for psycopg's placeholders.
INBOX_SQL = ("INSERT INTO idemproxy_inbox (key, stream, entry_id, token) VALUES (%s, %s, %s, %s) "
             "ON CONFLICT (key) DO NOTHING")
FENCE_SQL = ("INSERT INTO idemproxy_fence (lock, token) VALUES (%s, %s) ON CONFLICT (lock) "
             "DO UPDATE SET token = EXCLUDED.token WHERE idemproxy_fence.token <= EXCLUDED.token")
STALE_TOKEN = "stale fencing token"   # the RETRY's reason for a refused fence

State = Literal["run", "done", "stale"]


class DeliveryLike(Protocol):
    """What enter() reads: the client's Delivery, or an idemproxy.v1.Delivery message."""
    @property
    def key(self) -> str: ...
    @property
    def stream(self) -> str: ...
    @property
    def entry_id(self) -> str: ...
    @property
    def lock(self) -> str: ...
    @property
    def fencing_token(self) -> int: ...


def schema_sql() -> str:
    """The text of 001_idemproxy_inbox.sql, the tables the helper writes
    (a byte-identical copy of the repository's sql/postgresql/ file)."""
    return resources.files(__package__).joinpath("001_idemproxy_inbox.sql").read_text(encoding="utf-8")


def _params(d: DeliveryLike) -> Any:
    inbox = (d.key, d.stream, d.entry_id, d.fencing_token)
    # An idemproxy older than Delivery.lock sends none: the key is the lock then.
    fence = (d.lock or d.key, d.fencing_token) if d.fencing_token else None
    return inbox, fence


def _check_transaction(conn: Any) -> None:
    if conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        raise ValueError("enter() needs a transaction: the connection is in autocommit mode "
                         "outside conn.transaction()")


def enter(conn: "psycopg.Connection[Any]", d: DeliveryLike) -> State:
    """Runs the inbox statement, then (with a fencing token) the fence statement, in the
    current transaction of 'conn' (one is begun if none is open; not in autocommit mode).
    Returns "run" (write your effect, then commit), "done" (the key's effect is already
    committed: roll back, answer ACK) or "stale" (a higher token for d.lock has written:
    roll back, answer RETRY). It never commits or rolls back."""
    _check_transaction(conn)
    inbox, fence = _params(d)
    if conn.execute(INBOX_SQL, inbox).rowcount == 0:
        return "done"
    if fence is not None and conn.execute(FENCE_SQL, fence).rowcount == 0:
        return "stale"
    return "run"


async def enter_async(conn: "psycopg.AsyncConnection[Any]", d: DeliveryLike) -> State:
    """enter() on a psycopg AsyncConnection."""
    _check_transaction(conn)
    inbox, fence = _params(d)
    if (await conn.execute(INBOX_SQL, inbox)).rowcount == 0:
        return "done"
    if fence is not None and (await conn.execute(FENCE_SQL, fence)).rowcount == 0:
        return "stale"
    return "run"


class _Undone(Exception):
    """A handler's psycopg.Rollback that would end the helper's own transaction: not
    an ACK, as nothing was committed, but a failure (RETRY)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"the handler rolled the transaction back ({type(exc).__name__})")


def _answer(state: State) -> None:
    """After the transaction: "stale" is RETRY; "run" (committed) and "done" are ACK."""
    if state == "stale":
        raise Retry(STALE_TOKEN)


def _reusable(conn: Any) -> bool:
    """A connection worth keeping: open, and outside any transaction."""
    return not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


class _Idle:
    """Connections to a conninfo kept open between deliveries: as many as handlers
    have run at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: List[Any] = []  # owned; idle, each taken by one handler at a time

    def take(self) -> Any:
        with self._lock:
            return self._conns.pop() if self._conns else None

    def take_all(self) -> List[Any]:
        with self._lock:
            conns, self._conns = self._conns, []
        return conns

    def put(self, conn: Any) -> None:
        with self._lock:
            self._conns.append(conn)


class Inbox:
    """Runs handlers in a transaction with the inbox and the fence. 'source' is a
    conninfo string (connections are opened as needed and kept, one per handler
    running at once, until close()) or a psycopg_pool ConnectionPool or
    AsyncConnectionPool (its connection() lends one per delivery)."""

    def __init__(self, source: Union[str, Any]) -> None:
        self.source = source
        self._idle = _Idle()        # psycopg.Connection
        self._idle_async = _Idle()  # psycopg.AsyncConnection

    def close(self) -> None:
        """Closes the connections kept for handler() (those of a pool are the pool's)."""
        for conn in self._idle.take_all():
            conn.close()

    async def aclose(self) -> None:
        """Closes the connections kept for async_handler()."""
        for conn in self._idle_async.take_all():
            await conn.close()

    def handler(self, fn: Callable[["psycopg.Connection[Any]", Delivery], object]) -> Callable[[Delivery], None]:
        """The Worker handler that runs fn(conn, d) in the transaction of d's inbox row."""
        def handle(d: Delivery) -> None:
            if isinstance(self.source, str):
                conn = self._idle.take() or psycopg.connect(self.source)
                try:
                    state = self._run(conn, d, fn)
                finally:
                    if _reusable(conn):
                        self._idle.put(conn)
                    else:
                        conn.close()
            else:
                with self.source.connection() as conn:
                    state = self._run(conn, d, fn)
            _answer(state)
        return handle

    @staticmethod
    def _run(conn: Any, d: Any, fn: Callable[[Any, Any], Any]) -> State:
        state: State = "done"
        with conn.transaction():
            state = enter(conn, d)
            if state != "run":
                raise psycopg.Rollback()  # ends the block, rolled back
            try:
                fn(conn, d)               # raises: rolled back, and on up
            except psycopg.Rollback as exc:
                raise _Undone(exc) from exc
        return state                      # committed (a failed commit raises)

    def async_handler(self, fn: Callable[["psycopg.AsyncConnection[Any]", Delivery], Awaitable[object]]
                      ) -> Callable[[Delivery], Awaitable[None]]:
        """The AsyncWorker handler that awaits fn(conn, d) in the transaction of d's
        inbox row, on a psycopg AsyncConnection."""
        async def handle(d: Delivery) -> None:
            if isinstance(self.source, str):
                conn = self._idle_async.take() or await psycopg.AsyncConnection.connect(self.source)
                try:
                    state = await self._run_async(conn, d, fn)
                finally:
                    if _reusable(conn):
                        self._idle_async.put(conn)
                    else:
                        await conn.close()
            else:
                async with self.source.connection() as conn:
                    state = await self._run_async(conn, d, fn)
            _answer(state)
        return handle

    @staticmethod
    async def _run_async(conn: Any, d: Any, fn: Callable[[Any, Any], Awaitable[Any]]) -> State:
        state: State = "done"
        async with conn.transaction():
            state = await enter_async(conn, d)
            if state != "run":
                raise psycopg.Rollback()
            try:
                await fn(conn, d)
            except psycopg.Rollback as exc:
                raise _Undone(exc) from exc
        return state
