"""A TCP forwarder on 127.0.0.1 that delays every chunk by a fixed time in
each direction: a slow link to Redis without root or netem. Used where a test
needs commands to be in flight at a chosen moment (SIGTERM, a timer).

With 'cut_on', it also loses a reply: the first 'cuts' times a chunk from the
client holds those bytes, the chunk goes to the server, which applies it, but
nothing more comes back on that connection, and after 'cut_wait' seconds (or,
armed with cut_reply_to, once the test's applied() sees the write in Redis) the
connection is closed: a write that took effect, its reply lost.

With cut_reply_matching(), the loss is chosen by the reply: the next chunk
from the server that matches a pattern (a reply that carries entries, say) is
dropped, and that connection closed.

With refuse(), a connection that sends one of some commands within a time is
closed without forwarding them: a link that keeps dropping as it is used.

With hold_replies_after(), a reply comes late instead: from the next command
holding a pattern on, that connection's replies wait a set time (a slow
answer, in order, not lost).

With after_command(), a test acts at an exact moment: once the n-th command
holding a pattern went to the server, the commands after it on that
connection wait until the test's function has returned (it may wait to see
the command applied, then change what the next ones find).

With 'rate' (bytes a second; may be changed while connections are open), the
server-to-client direction is throttled: a slow link, not a delayed one, where
a large reply takes seconds to arrive while its bytes keep coming. With
stall_replies_after(), a reply stops mid-way instead: a connection that has
carried that many bytes to the client sends nothing more, and stays open
until the client closes it."""
import re
import socket
import threading
import time


class SlowLink:
    def __init__(self, target_port, delay_s, cut_on=None, cuts=1, cut_wait=0.3, rate=None):
        self.target = ("127.0.0.1", target_port)
        self.delay = delay_s
        self.rate = rate
        self.stall_at = None
        self.stalled_at = self.stall_closed_at = None   # time.monotonic() of each
        self.cut_on = cut_on
        self.cuts_left = cuts if cut_on else 0
        self.cut_wait = cut_wait
        self.cut = 0                      # connections cut so far
        self.cut_applied = None
        self.cut_lock = threading.Lock()
        self.hold_on, self.hold_s, self.held = None, 0, 0
        self.after = None                 # [pattern, commands to skip, fn]
        self.reply_cut = None
        self.refused, self.refuse_until, self.refusing = [], 0.0, 0
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
            state = {"cut": False}
            for a, b, up in ((c, u, True), (u, c, False)):
                threading.Thread(target=self._pump, args=(a, b, state, up), daemon=True).start()

    @property
    def cuts(self):
        return self.cut

    def cut_reply_to(self, pattern: bytes, applied):
        """Arm one lost reply for the next command containing 'pattern'; the
        connection is shut once applied() is true (at most 10 s)."""
        with self.cut_lock:
            self.cut_on, self.cuts_left, self.cut_applied = pattern, 1, applied

    def cut_reply_matching(self, regex: bytes):
        """Lose the next chunk of replies that matches 'regex': it and every
        later reply on its connection never arrive, and the connection is
        closed (commands Redis applied, their replies lost). 'reply_cut' is
        None again once it happened."""
        with self.cut_lock:
            self.reply_cut = re.compile(regex, re.S)

    def _reply_cut_now(self, data):
        with self.cut_lock:
            if self.reply_cut is None or not self.reply_cut.search(data):
                return False
            self.reply_cut = None
            return True

    def refuse(self, patterns, seconds):
        """For 'seconds': a chunk from a client that holds any of 'patterns'
        is not forwarded, and its connection is closed ('refusing' counts)."""
        with self.cut_lock:
            self.refused, self.refuse_until = list(patterns), time.monotonic() + seconds

    def _refuse_now(self, data):
        with self.cut_lock:
            if time.monotonic() > self.refuse_until or not any(p in data for p in self.refused):
                return False
            self.refusing += 1
            return True

    def hold_replies_after(self, pattern: bytes, seconds):
        """The next command containing 'pattern': its reply, and every later
        one on that connection, arrive 'seconds' late. 'held' counts them."""
        with self.cut_lock:
            self.hold_on, self.hold_s = pattern, seconds

    def _hold_now(self, data):
        with self.cut_lock:
            if not self.hold_on or self.hold_on not in data:
                return 0
            self.hold_on = None
            self.held += 1
            return self.hold_s

    def after_command(self, pattern: bytes, fn, nth=1):
        """The n-th command (counted from now) containing 'pattern': once it
        was forwarded, its connection forwards nothing more until fn()
        returned."""
        with self.cut_lock:
            self.after = [pattern, nth - 1, fn]

    def _after_now(self, data):
        with self.cut_lock:
            if not self.after or self.after[0] not in data:
                return None
            if self.after[1] > 0:
                self.after[1] -= 1
                return None
            fn, self.after = self.after[2], None
            return fn

    def stall_replies_after(self, nbytes):
        """The first connection to carry 'nbytes' bytes to the client (counted
        from its start) stops there: the rest of its replies never arrive, and
        it stays open until the client closes it. 'stalled_at' and
        'stall_closed_at' say when each happened."""
        with self.cut_lock:
            self.stall_at = nbytes

    def _send_down(self, dst, data, state):
        """Server to client: paced to 'rate', up to a stall."""
        while data and not state.get("stalled"):
            piece = data[:16384] if self.rate else data
            with self.cut_lock:
                sent = state.get("down", 0)
                if self.stall_at is not None and sent + len(piece) >= self.stall_at:
                    piece = piece[:self.stall_at - sent]
                    self.stall_at, state["stalled"] = None, True
                    self.stalled_at = time.monotonic()
                state["down"] = sent + len(piece)
            if self.rate:
                t = max(state.get("next", 0.0), time.monotonic()) + len(piece) / self.rate
                state["next"] = t
                d = t - time.monotonic()
                if d > 0:
                    time.sleep(d)
            dst.sendall(piece)
            data = data[len(piece):]

    def _cut_now(self, data):
        if not self.cut_on or self.cut_on not in data:
            return False
        with self.cut_lock:
            if self.cuts_left == 0:
                return False
            self.cuts_left -= 1
            return True

    def _pump(self, src, dst, state, up):
        # Read chunks as they come; a sender thread writes each one 'delay'
        # after it arrived, in order (the link is slow, not reordering).
        q, cv = [], threading.Condition()

        def sender():
            while True:
                with cv:
                    while not q:
                        cv.wait()
                    t, data, after = q.pop(0)
                if data is None:
                    break
                d = t + self.delay - time.monotonic()
                if d > 0:
                    time.sleep(d)
                if state["cut"] and not up:
                    continue                  # the reply is lost
                if not up and data and self.reply_cut is not None and self._reply_cut_now(data):
                    state["cut"] = True       # this reply and the rest are lost
                    for s in (src, dst):
                        try:
                            s.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                    self.cut += 1
                    continue
                if not up and state.get("hold_until"):
                    d = state["hold_until"] - time.monotonic()
                    if d > 0:
                        time.sleep(d)
                try:
                    if up:
                        dst.sendall(data)
                        if after:
                            after()
                    else:
                        self._send_down(dst, data, state)
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
            if up and data and self._refuse_now(data):
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                data = b""
            cut = up and data and self._cut_now(data)
            hold = up and data and self._hold_now(data)
            if hold:
                state["hold_until"] = time.monotonic() + hold   # before the server can answer
            if cut:
                state["cut"] = True           # before the server can answer
            after = up and data and self._after_now(data)
            with cv:
                q.append((time.monotonic(), data or None, after))
                cv.notify()
            if cut:
                if self.cut_applied:
                    deadline = time.monotonic() + 10
                    while not self.cut_applied() and time.monotonic() < deadline:
                        time.sleep(0.005)
                else:
                    time.sleep(self.delay + self.cut_wait)
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    s.close()
                with cv:
                    q.append((time.monotonic(), None, None))
                    cv.notify()
                self.cut += 1
                return
            if not data:
                if up and state.get("stalled"):
                    self.stall_closed_at = time.monotonic()
                return

    def close(self):
        self.closed = True
        self.lsock.close()
        for s in self.conns:
            try:
                s.close()
            except OSError:
                pass
