"""A TCP forwarder on 127.0.0.1 that delays every chunk by a fixed time in
each direction: a slow link to Redis without root or netem. Used where a test
needs commands to be in flight at a chosen moment (SIGTERM, a timer)."""
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
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
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
                d = t + self.delay - time.monotonic()
                if d > 0:
                    time.sleep(d)
                try:
                    dst.sendall(data)
                except OSError:
                    break
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
