"""A TCP forwarder on 127.0.0.1 that delays every chunk by a fixed time in
each direction: a slow link to Redis without root or netem. Used where a test
needs commands to be in flight at a chosen moment (SIGTERM, a timer).

cut_reply_to(pattern, applied) arms one lost reply: the next chunk from the
client that contains 'pattern' is forwarded to Redis; from then on whatever
Redis sends back on that connection is dropped, and once applied() is true
(the test reads Redis to see the command took effect) the connection is shut
on both sides. The client sees the reply of a command that took effect lost,
as after a network cut (a retry must expect its own write)."""
import socket
import threading
import time


class SlowLink:
    def __init__(self, target_port, delay_s):
        self.target = ("127.0.0.1", target_port)
        self.delay = delay_s
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.closed = False
        self.conns = []
        self.cut_pattern = None
        self.cut_applied = None
        self.cuts = 0               # connections cut by cut_reply_to
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self.target)
            except OSError:
                c.close()
                continue
            self.conns += [c, u]
            pair = {"cut": False, "c": c, "u": u}
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b, pair, a is c), daemon=True).start()

    def cut_reply_to(self, pattern: bytes, applied):
        with self.lock:
            self.cut_pattern, self.cut_applied = pattern, applied

    def _cut_when_applied(self, pair, applied):
        deadline = time.monotonic() + 10
        while not applied() and time.monotonic() < deadline:
            time.sleep(0.005)
        with self.lock:
            self.cuts += 1
        for s in (pair["c"], pair["u"]):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _pump(self, src, dst, pair, upstream):
        # Read chunks as they come; a sender thread writes each one 'delay'
        # after it arrived, in order (the link is slow, not reordering).
        q, cv = [], threading.Condition()

        def sender():
            while True:
                with cv:
                    while not q:
                        cv.wait()
                    t, data = q.pop(0)
                if data is None:
                    break
                trigger = False
                if upstream:
                    with self.lock:
                        if self.cut_pattern is not None and self.cut_pattern in data:
                            trigger, applied = True, self.cut_applied
                            self.cut_pattern = self.cut_applied = None
                d = t + self.delay - time.monotonic()
                if d > 0:
                    time.sleep(d)
                if not upstream and pair["cut"]:
                    continue            # a reply after the trigger: lost
                if trigger:
                    pair["cut"] = True  # before Redis can answer it
                try:
                    dst.sendall(data)
                except OSError:
                    break
                if trigger:
                    threading.Thread(target=self._cut_when_applied, args=(pair, applied),
                                     daemon=True).start()
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        threading.Thread(target=sender, daemon=True).start()
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            with cv:
                q.append((time.monotonic(), data or None))
                cv.notify()
            if not data:
                return

    def close(self):
        self.closed = True
        self.lsock.close()
        for s in self.conns:
            try:
                s.close()
            except OSError:
                pass
