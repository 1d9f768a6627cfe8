"""A raw SP REP peer over TCP, written out by hand (the SP wire: an 8-byte
handshake, then messages of a 64-bit big-endian size and a body that starts
with the REQ's request id). It answers any request id it likes, including old
ones: what a late reply looks like on the wire, which a cooked REP socket
cannot send."""
import socket
import struct
import time

NN_REQ, NN_REP = 0x30, 0x31


class RawRep:
    def __init__(self, port, timeout=10.0):
        deadline = time.time() + timeout
        while True:
            try:
                self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        self.s.sendall(b"\x00SP\x00" + struct.pack(">H", NN_REP) + b"\x00\x00")
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

    def recv(self):
        """(request id as 4 bytes, Delivery bytes)."""
        (size,) = struct.unpack(">Q", self._read(8))
        body = self._read(size)
        return body[:4], body[4:]

    def send(self, req_id, payload=b"\x08\x01"):
        body = req_id + payload
        self.s.sendall(struct.pack(">Q", len(body)) + body)

    def close(self):
        self.s.close()
