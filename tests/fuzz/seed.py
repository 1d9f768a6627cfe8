#!/usr/bin/env python3
"""Write the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

Run from anywhere; it only adds files (named after their content, as libFuzzer
names them), so running it again is harmless. What it seeds:

  template  every 'src' of tests/unit/template_cases.json, and for the cases
            with their own event, "src NUL event-json" (fuzz_template.c)
  event     entries in fuzz_event.c's format: header byte, pieces split at 0x1f
  ack       Ack encodings (08 01 and friends, echoes, reasons, junk) and
            Delivery-shaped inputs for the round trip (fuzz_ack.c)
  config    tests/unit/configs/*.yaml, docs/configuration.md's example, small valid and
            invalid configs, and - when a C compiler and the project's
            libraries are there - every YAML text tests/unit/test_config.c
            parses (captured by linking it with --wrap=px_config_parse)
  traceparent  W3C traceparents: valid ones (sampled or not) and the usual
            malformations (fuzz_traceparent.c)
  spframe   a flags byte (ipc, header done) and what a peer sends: its SP
            header, replies back to back, split, empty, under 4 bytes, at
            and over the 1 MiB limit, another ipc type byte (fuzz_spframe.c)

After a long run, `tests/fuzz/run.sh merge` folds what the fuzzers found back
into these directories, minimised with -merge=1.
"""
import functools
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SEP = b"\x1f"


def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def raw_event_json():
    """The 'defaults.event' object of template_cases.json as written there
    (numbers such as 1.50 and 1e3 keep their text)."""
    text = open(os.path.join(ROOT, "tests/unit/template_cases.json"), encoding="utf-8").read()
    start = text.index("{", text.index('"event"', text.index('"defaults"')))
    depth, i, instr = 0, start, False
    while True:
        c = text[i]
        if instr:
            if c == "\\":
                i += 1
            elif c == '"':
                instr = False
        elif c == '"':
            instr = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
        i += 1


def seed_template():
    cases = json.load(open(os.path.join(ROOT, "tests/unit/template_cases.json"), encoding="utf-8"))
    for c in cases["cases"]:
        src = c["src"].encode()
        put("template", src)
        if "event" in c:
            put("template", src + b"\0" + json.dumps(c["event"]).encode())
    put("template", b"#event.price + ''\0" + raw_event_json().encode())
    put("template", b"#event.a\0{\"a\": 1.50e+3}")
    put("template", b"#event[0]\0[\"x\", 2]")


def entry(header, pieces):
    return bytes([header]) + SEP.join(p.encode() if isinstance(p, str) else p for p in pieces)


def seed_event():
    ev = raw_event_json()
    payloads = [
        ev,
        '{"eventId":"spin-1","roomId":7,"winner":{"name":"ann"}}',
        '{"eventId": "e-1", "seq": 3}\r\n',
        '{"eventId":"a\\u0000b"}',
        '{"eventId":"\\ud83d\\udc22","roomId":-1.5e3}',
        '{"eventId":18446744073709551615}',
        '{"a":{"b":{"c":"deep"}},"dotted.name":"d"}',
        '{"items":[{"id":"i1"},2],"winner":null}',
        '[1,2,3]', '"text"', '{"eventId":"x"} {}', '{"eventId":', "{'eventId':'x'}",
        '{"eventId":"x",}', "", "  ",
    ]
    for i, p in enumerate(payloads):
        for key in (0, 1, 2, 7):
            put("event", entry(0x01 | key << 2 | (i % 4) << 5, [p, "kind", "join"]))
    put("event", entry(0x81, ['{"eventId":"x"}']))                    # payload field missing
    put("event", entry(0x03, ['{"eventId":"' + "x" * 80 + '"}']))    # over max_entry_bytes
    fields = [
        ["eventId", "e-1", "roomId", "7"],
        ["eventId", "e-1", "winner.name", "ann", "winner.team.id", "t1", "winner.score", "10"],
        ["a.b", "1", "a.b.c", "2", "a", "3", "a.b.c.d", "4"],
        ["dotted.name", "dn", "eventId", "", "payload", "{}"],
        [".lead", "x", "trail.", "y", "a..b", "z", "eventId", "e"],
        ["items.0.id", "i", "eventId", "\xff"],
        [b"bad\xffname", "v", "eventId", "e"],
        [b"nul\x00name", b"v\x00w", "eventId", b"e\x00f"],
        ["eventId"],
    ]
    for i, f in enumerate(fields):
        for key in range(8):
            put("event", entry(key << 2 | (i % 4) << 5, f))


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def ld(tag, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(tag << 3 | 2) + varint(len(data)) + data


def seed_ack():
    acks = [
        b"", b"\x08\x01", b"\x08\x02", b"\x08\x03", b"\x08\x00", b"\x08\x04", b"\x08\x7f",
        b"\x08\xff\xff\xff\xff\x0f", b"\x08", b"\x08\x80", b"\xff\xff", b"\x0a\x00",
        b"\x08\x01" + ld(2, "worker said so"),
        b"\x08\x03" + ld(2, "bad input: \xc5\xbc\xc3\xb3\xc5\x82w"),
        b"\x08\x01" + ld(3, "room") + ld(4, "1700000000000-0"),
        b"\x08\x01" + ld(3, "other"),
        b"\x08\x02" + ld(4, "1-0") + ld(2, "x"),
        b"\x08\x01" + ld(3, "") + ld(4, ""),
        b"\x08\x01" + ld(2, "a" * 300),
        b"\x08\x01" + ld(2, b"\xff\xfe"),
        b"\x08\x01" + ld(9, "unknown field") + b"\x50\x01",
        b"\x08\x01\x08\x02",                         # last one wins
        ld(2, "no status"),
        b"\x08\x01\x12\x05ab",                        # truncated
        b"\x08\x01\x1a\x04ro\x00m",
    ]
    for a in acks:
        put("ack", a)
    head = struct.pack("<IQQ", 1, 42, 1700000030000)
    put("ack", head + SEP.join([b"room", b"1700000000000-0", b"spin-1", b'{"eventId":"spin-1"}',
                                b"source", b"test", b"bin\x00ary", b"\x00\xff"]))
    put("ack", head + SEP.join([b"", b"", b"", b""]))
    put("ack", b"\xff" * 20 + SEP.join([b"s", b"1-0", b"k", b"", b"n"]))


SPEC_EXAMPLE = """\
redis:
  url: redis://127.0.0.1:6379
  cluster: []
  timeout_ms: 1000
app:
  endpoint: ipc:///tmp/idemproxy.sock
  max_inflight: 256
  max_entry_bytes: 1048576
  ack_timeout_ms: 30000
  socket_mode: "0660"
  allow_remote: false
metrics:
  listen: 127.0.0.1:9464
log:
  level: info
  format: text
shutdown_grace_ms: 10000
streams:
  - stream: room
    group: game-server
    consumer: ${HOSTNAME}
    start: "0"
    payload_field: payload
    key: "#event.eventId"
    lock_key: ""
    layout: single
    prefix: "idem:"
    lock_prefix: "lock:"
    done_prefix: "done:"
    wait_ms: 0
    on_busy: retry
    lease_ms: 5000
    done_ttl_ms: 600000
    max_deliveries: 5
    retry_backoff_ms: 100
    dead_letter: ""
    on_missing_key: dead_letter
    fencing: false
    claim_idle_ms: 30000
"""

CONFIGS = [
    SPEC_EXAMPLE,
    "streams: [{stream: room}]\n",
    "streams:\n  - stream: ${FUZZ_STREAM}\n    key: ${FUZZ_KEY}\n    lease_ms: ${FUZZ_MS}\n"
    "    consumer: ${FUZZ_UNSET:-c1}\n    prefix: $${NOT}\n    group: ${FUZZ_EMPTY}\n",
    "redis:\n  cluster: [\"a:7000\", \"b:7001\"]\nstreams: [{stream: s, key: 'room:#{event.roomId}'}]\n",
    "redis: {url: 'unix:///var/run/redis.sock'}\nstreams: [{stream: s}]\n",
    "redis: {url: 'redis://u:p%40ss@[::1]:6380/3'}\napp: {endpoint: 'tcp://0.0.0.0:5555', allow_remote: true}\n"
    "streams: [{stream: s, lock_key: \"lock:#{event.a?.b ?: 'x'}\", layout: split, on_busy: dead_letter}]\n",
    "streams:\n  - stream: a\n    group: g\n  - stream: a\n    group: g\n",
    "streams:\n  - &b {stream: a, key: '#event.x'}\n  - *b\n",
    "redis: {timeout_ms: 3000}\nstreams: [{stream: s, lease_ms: 5000, wait_ms: -1}]\n",
    "streams: [{stream: s, key: '#event.', lock_key: '#{'}]\nbogus: 1\napp: {max_inflight: 0}\n",
    "streams: [{stream: s, dead_letter: s, layout: split, lock_prefix: x, done_prefix: x}]\n",
    "---\nstreams: [{stream: s}]\n---\nstreams: []\n",
    "streams: [{stream: s, key: \"#event['caf\\u00e9'] + 'x'\"}]\nlog: {level: DEBUG, format: yaml}\n",
    "streams: [{stream: s, fencing: yes, max_deliveries: 1e3, socket_mode: 0660}]\n",
    "streams:\n  - stream: s\n    key: >-\n      #event.a +\n      #event.b\n",
    "\ufeffstreams: [{stream: s}]\n",
    "[1, 2]\n", "", "streams:\n", "streams: {stream: s}\n", "{ unterminated\n",
    "metrics: {listen: ''}\napp: {socket_mode: '0777', ack_timeout_ms: 0}\nstreams: [{stream: s}]\n",
]


def capture_unit_test_yamls(outdir):
    """Every text tests/unit/test_config.c hands to px_config_parse."""
    cc = shutil.which("cc") or shutil.which("clang")
    if cc is None:
        return
    gen = os.path.join(ROOT, "build/gen")
    with tempfile.TemporaryDirectory() as tmp:
        wrap = os.path.join(tmp, "wrap.c")
        with open(wrap, "w") as f:
            f.write(r'''
#include <stdio.h>
#include "config.h"
px_config *__real_px_config_parse(const char *, const char *, size_t, px_diags *);
px_config *__wrap_px_config_parse(const char *path, const char *text, size_t len, px_diags *d)
{
    static int n;
    char name[4096];
    snprintf(name, sizeof name, "%s/y%04d", getenv("SEED_OUT"), n++);
    FILE *f = fopen(name, "wb");
    if (f) { fwrite(text, 1, len, f); fclose(f); }
    return __real_px_config_parse(path, text, len, d);
}
''')
        libs = subprocess.run(["pkg-config", "--libs", "yaml-0.1", "json-c"],
                              capture_output=True, text=True).stdout.split()
        exe = os.path.join(tmp, "t")
        cmd = [cc, "-std=c11", "-D_GNU_SOURCE", "-I" + os.path.join(ROOT, "proxy"), "-I" + gen,
               "-o", exe, os.path.join(ROOT, "tests/unit/test_config.c"), wrap,
               os.path.join(ROOT, "proxy/config.c"), os.path.join(ROOT, "proxy/template.c"),
               os.path.join(ROOT, "proxy/px.c"), "-Wl,--wrap=px_config_parse"] + libs
        if subprocess.run(cmd).returncode != 0:
            print("seed: cannot build test_config with the wrapper; skipped", file=sys.stderr)
            return
        os.makedirs(outdir, exist_ok=True)
        subprocess.run([exe], cwd=ROOT, env=dict(os.environ, SEED_OUT=outdir),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def seed_config():
    for name in sorted(os.listdir(os.path.join(ROOT, "tests/unit/configs"))):
        put("config", open(os.path.join(ROOT, "tests/unit/configs", name), "rb").read())
    for c in CONFIGS:
        put("config", c)
    put("config", "\ufeffstreams: [{stream: s}]\n".encode("utf-16-le"))
    put("config", "streams: [{stream: s}]\n".encode("utf-16-be"))
    with tempfile.TemporaryDirectory() as tmp:
        capture_unit_test_yamls(tmp)
        for name in sorted(os.listdir(tmp)):
            put("config", open(os.path.join(tmp, name), "rb").read())


def seed_traceparent():
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    for s in (good, good[:-2] + "00", good[:-2] + "ff",
              "00-" + "0" * 32 + good[35:],                 # zero trace id
              good[:36] + "0" * 16 + good[52:],             # zero span id
              "01" + good[2:] + "-extra", "ff" + good[2:],  # other versions
              good.upper(), good[:-1], good + "0", "", "00-"):
        put("traceparent", s)


def seed_spframe():
    rep, req = b"\0SP\0\0\x31\0\0", b"\0SP\0\0\x30\0\0"
    ack = b"\x80\x00\x00\x01\x08\x01"                 # request id, Ack{status: ACK}

    def frame(ipc, payload, size=None, type_byte=1):
        n = len(payload) if size is None else size
        return (bytes([type_byte]) if ipc else b"") + struct.pack(">Q", n) + payload

    for ipc in (0, 1):
        for open_ in (0, 2):
            head = b"" if open_ else rep
            f = functools.partial(frame, ipc)
            for stream in (
                f(ack),
                f(ack) + f(b"\x80\x00\x00\x02\x08\x03" + ld(2, "bad input")) + f(b"") + f(b"abc"),
                f(ack)[:5], f(ack)[:-1], f(b"\x80\x00\x00\x03" + b"x" * 200),
                f(b"", size=1024 * 1024), f(b"", size=1024 * 1024 + 1), f(b"", size=1 << 40),
                f(b"", size=(1 << 64) - 1), f(ack, type_byte=2), f(ack, type_byte=0), b"",
            ):
                put("spframe", bytes([ipc | open_]) + head + stream)
        for bad in (req, rep[:5], b"\0SP\0\0\x10\0\0", b"\0SP\x01\0\x31\0\0", b"GET / HTTP/1.1\r\n",
                    b"\0SP\0\0\x31\xff\xff"):      # the last: reserved bytes are not looked at
            put("spframe", bytes([ipc]) + bad + frame(ipc, ack))


if __name__ == "__main__":
    seed_spframe()
    seed_traceparent()
    seed_template()
    seed_event()
    seed_ack()
    seed_config()
    for t in ("template", "event", "ack", "config", "traceparent", "spframe"):
        d = os.path.join(HERE, "corpus", t)
        print(f"{t}: {len(os.listdir(d))} files")
