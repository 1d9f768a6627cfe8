"""A raw SP REP peer, written out by hand (the SP wire, docs/protocol.md: an
8-byte handshake, then messages of a 64-bit big-endian size and a body that
starts with the REQ's request id; on ipc each message has a type byte 01
first). It answers any request id it likes, including old ones: what a late
reply looks like on the wire, which a cooked REP socket cannot send. It can
also send what no correct peer sends (another handshake, another type byte, a
size it never follows with a body), for the tests of hostile peers.

RawRep(port) is a peer on tcp://127.0.0.1:port; RawRep("ipc:///path") or
RawRep("tcp://host:port") one on that endpoint."""
import socket
import struct
import time

NN_PAIR, NN_REQ, NN_REP = 0x10, 0x30, 0x31
IPC_MSG = 0x01              # the one type byte of an ipc frame


def sp_header(proto):
    """The 8-byte SP connection header naming protocol 'proto'."""
    return b"\x00SP\x00" + struct.pack(">H", proto) + b"\x00\x00"


def dial(endpoint, timeout=10.0, rcvbuf=None):
    """A stream socket connected to an app endpoint (tcp://host:port or
    ipc:///path), trying again while it is refused or not there yet.
    'rcvbuf' sets SO_RCVBUF before the connect."""
    deadline = time.time() + timeout
    while True:
        if endpoint.startswith("ipc://"):
            s, addr = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), endpoint[len("ipc://"):]
        elif endpoint.startswith("tcp://"):
            host, port = endpoint[len("tcp://"):].rsplit(":", 1)
            s, addr = socket.socket(socket.AF_INET, socket.SOCK_STREAM), (host.strip("[]"), int(port))
        else:
            raise ValueError(f"not an SP endpoint: {endpoint!r}")
        if rcvbuf is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(timeout)
        try:
            s.connect(addr)
            return s
        except OSError:
            s.close()
            if time.time() > deadline:
                raise
            time.sleep(0.05)


class RawRep:
    def __init__(self, port, timeout=10.0, handshake=True, rcvbuf=None):
        self.endpoint = port if isinstance(port, str) else f"tcp://127.0.0.1:{port}"
        self.ipc = self.endpoint.startswith("ipc://")
        self.s = dial(self.endpoint, timeout, rcvbuf)
        if handshake:
            self.handshake()

    def handshake(self):
        """Send REP's header and check idemproxy's (REQ)."""
        self.s.sendall(sp_header(NN_REP))
        hs = self._read(8)
        assert hs[:4] == b"\x00SP\x00" and struct.unpack(">H", hs[4:6])[0] == NN_REQ, hs

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def frame(self, body, type_byte=IPC_MSG, size=None):
        """'body' framed for this transport: on ipc a type byte first; 'size'
        announces another length than the body's."""
        head = struct.pack(">Q", len(body) if size is None else size)
        return (bytes([type_byte]) if self.ipc else b"") + head + body

    def recv(self):
        """(request id as 4 bytes, Delivery bytes)."""
        if self.ipc:
            t = self._read(1)[0]
            assert t == IPC_MSG, f"ipc frame of type {t}"
        (size,) = struct.unpack(">Q", self._read(8))
        body = self._read(size)
        return body[:4], body[4:]

    def send(self, req_id, payload=b"\x08\x01"):
        self.s.sendall(self.frame(req_id + payload))

    def sees_close(self, timeout=5.0):
        """(closed, what was read): closed is True once idemproxy has closed
        this connection (EOF or a reset), False if it is still open after
        'timeout' seconds; what was read is every byte that came before."""
        got = b""
        was = self.s.gettimeout()
        deadline = time.time() + timeout
        try:
            while True:
                left = deadline - time.time()
                if left <= 0:
                    return False, got
                self.s.settimeout(left)
                chunk = self.s.recv(65536)
                if not chunk:
                    return True, got
                got += chunk
        except socket.timeout:
            return False, got
        except OSError:                 # ECONNRESET, EPIPE
            return True, got
        finally:
            self.s.settimeout(was)

    def close(self):
        self.s.close()
