"""docs/protocol.md's worked example, replayed against a real idemproxy: the
hex blocks are read out of the document and sent, or expected, byte for byte
on a raw socket (tcp and ipc), so the document cannot drift from the product.
Only the Delivery's fencing_token (the server's clock in microseconds) and
deadline_unix_ms (the time it is sent, plus ack_timeout_ms) differ from the
example; they are checked for their place and range instead."""
import re
import socket
import struct
import time

import pytest

from pxtest import ROOT, free_port, pb, pending, wait_for

DOC = ROOT / "docs" / "protocol.md"
BLOCKS = ("worker-handshake", "proxy-handshake", "delivery-frame", "ack-frame")
ACK_TIMEOUT_MS = 5000


def wire_blocks(text=None):
    """{name: bytes} of the document's ```hex NAME blocks: two-digit hex bytes,
    anything after '#' on a line is a comment."""
    text = DOC.read_text() if text is None else text
    out = {}
    for name, body in re.findall(r"^```hex ([\w-]+)\n(.*?)^```", text, re.S | re.M):
        tokens = [t for ln in body.splitlines() for t in ln.split("#", 1)[0].split()]
        bad = [t for t in tokens if not re.fullmatch(r"[0-9a-fA-F]{2}", t)]
        assert not bad, f"{name}: not hex bytes: {bad}"
        assert name not in out, f"{name}: two blocks of that name"
        out[name] = bytes.fromhex("".join(tokens))
    return out


def test_protocol_doc_blocks_parse():
    """The parser itself: every block is there, and a changed byte is seen."""
    blocks = wire_blocks()
    assert set(BLOCKS) <= set(blocks), sorted(blocks)
    # Each frame's 64-bit length is the length of what follows it.
    for name in ("delivery-frame", "ack-frame"):
        (n,) = struct.unpack(">Q", blocks[name][:8])
        assert n == len(blocks[name]) - 8, name
    changed = DOC.read_text().replace("```hex worker-handshake\n00 53 50 00 00 31",
                                      "```hex worker-handshake\n00 53 50 00 00 30", 1)
    assert wire_blocks(changed)["worker-handshake"] != blocks["worker-handshake"]
    with pytest.raises(AssertionError):
        wire_blocks("```hex x\n0g  # not hex\n```\n")


class Peer:
    """A worker written from the document alone: a socket and bytes."""

    def __init__(self, endpoint):
        self.ipc = endpoint.startswith("ipc://")
        deadline = time.time() + 10
        while True:
            try:
                if self.ipc:
                    self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    self.s.settimeout(10)
                    self.s.connect(endpoint[len("ipc://"):])
                else:
                    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
                    self.s = socket.create_connection((host, int(port)), timeout=10)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)

    def read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("idemproxy closed the connection")
            buf += chunk
        return buf

    def frame(self, tcp_frame):
        """The document's tcp frame as this transport sends it."""
        return (b"\x01" if self.ipc else b"") + tcp_frame

    def read_frame(self):
        head = self.read(9 if self.ipc else 8)
        (n,) = struct.unpack(">Q", head[-8:])
        return head + self.read(n)


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_protocol_doc_example_against_idemproxy(env, transport):
    blocks = wire_blocks()
    r = env.r
    endpoint = (f"tcp://127.0.0.1:{free_port()}" if transport == "tcp"
                else f"ipc://{env.tmp}/protocol.sock")
    # The configuration the document's example was taken with.
    env.proxy([{"stream": "orders", "group": "billing", "consumer": "c1",
                "payload_field": "payload", "key": "#event.eventId", "fencing": True}],
              endpoint=endpoint, ack_timeout_ms=ACK_TIMEOUT_MS)
    peer = Peer(endpoint)
    try:
        peer.s.sendall(blocks["worker-handshake"])
        assert peer.read(8) == blocks["proxy-handshake"]
        wait_for(lambda: env.proxies[0].metrics().get("idemproxy_workers_connected") == 1,
                 what="the raw worker counted as connected")

        before = int(time.time() * 1000)
        r.xadd("orders", {"payload": '{"eventId":"e-1"}', "source": "web"}, id="1700000000000-0")
        got = peer.read_frame()
        after = int(time.time() * 1000)

        want = peer.frame(blocks["delivery-frame"])
        # Byte for byte but for fencing_token (tag 0x38, an 8-byte varint of
        # microseconds until the year 2112) and deadline_unix_ms (tag 0x40, a
        # 6-byte varint until the year 2039), which are checked for their
        # range: the length, the request id, every field before them and
        # lock, the last field (5 bytes here).
        # The request id's generation is drawn at start (docs/protocol.md): only
        # its top bit and slot 0 (the low byte with max_inflight 256) are fixed.
        rid = (9 if peer.ipc else 8)
        assert len(got) == len(want), (got.hex(" "), want.hex(" "))
        assert got[rid] & 0x80 and got[rid + 3] == 0, got[rid:rid + 4].hex(" ")
        same = lambda b: b[:rid] + b[rid + 4:]  # noqa: E731
        assert same(got)[:-20] == same(want)[:-20], (got.hex(" "), want.hex(" "))
        assert got[-21] == 0x38 and got[-12] == 0x40, got.hex(" ")
        assert got[-5:] == want[-5:], (got.hex(" "), want.hex(" "))
        delivery = pb.Delivery()
        delivery.ParseFromString(got[(13 if peer.ipc else 12):])
        assert before + ACK_TIMEOUT_MS <= delivery.deadline_unix_ms <= after + ACK_TIMEOUT_MS
        assert before * 1000 - 5_000_000 <= delivery.fencing_token <= after * 1000 + 5_000_000, \
            ("the token is the server's clock in microseconds", delivery.fencing_token, before)
        assert delivery.lock == "e-1"

        ack = peer.frame(blocks["ack-frame"])
        peer.s.sendall(ack[:rid] + got[rid:rid + 4] + ack[rid + 4:])  # echo the id as sent
        wait_for(lambda: (r.get("idem:e-1") or "")[:1] == "D", what="the key marked done after the example's Ack")
        wait_for(lambda: pending(r, "orders", "billing") == 0, what="the entry XACKed")
        assert r.get("idemproxy:fence") == str(delivery.fencing_token)
        m = env.proxies[0].metrics()
        assert m['idemproxy_acks_total{stream="orders",group="billing",status="ack"}'] == 1
        assert m["idemproxy_protocol_errors_total"] == 0
    finally:
        peer.s.close()
