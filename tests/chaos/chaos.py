#!/usr/bin/env python3
"""Seeded chaos for idemproxy: a recorded history judged by a checker.

One seed picks everything: a configuration (layout, group or not, lock_key,
wait_ms, lease_ms, claim_idle_ms, ack_timeout_ms, max_inflight, on_busy, linger_ms, batch_ms,
commit_ms, fingerprint and on_conflict, fencing, 1-4 replicas, the batch window's key
taken by a string), a workload (copies of events,
some with another payload, shared rooms, entries near and over max_entry_bytes, bad
input, hostile producer entries, a lock_key of the wrong type; in fields mode, flat
fields and field names of thousands of dotted parts), worker
behaviour (fast, slow past the lease, RETRY, DROP, no answer, crash) and a
timeline of faults (kill -9 or SIGTERM of a replica, Redis connections killed,
CLIENT PAUSE, a Redis restart with AOF, a worker reconnecting, SIGTERM while
Redis is paused). Workers record every delivery when it arrives and its answer
when they answer; when the run has settled, check() reads Redis and judges the
history against docs/guarantee.md (see README.md in this directory for the rules).

    chaos.py --seed 17            # one seed, verbose
    chaos.py --seeds 100 --from 0 # seeds 0..99, one line each
    chaos.py --fixed              # the fixed set `make test` runs

Everything it starts listens on 127.0.0.1 or an ipc:// path in its temp dir.
The choices are a pure function of the seed; timing is not, so a replay runs
the same configuration, workload, answers and fault timeline, not the same
interleaving (rerun a seed a few times if it fails only sometimes).
"""
import argparse
import datetime
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

import pxtest  # noqa: E402
from pxtest import RedisServer, RedisCluster, Proxy, pb, wait_for  # noqa: E402
from slowlink import SlowLink  # noqa: E402
import redis as redis_lib  # noqa: E402
from redis.crc import key_slot  # noqa: E402
import test_tls  # noqa: E402 (the CA and pair makers, the TLS redis-server options)

# The seeds `make test` runs (tests/run, suite "chaos"): chosen because each
# reaches one of issue 15's defects on the code before its fix (README.md).
FIXED_SEEDS = [0, 2, 4, 8, 14, 1003,
               6059]   # linger_ms 100 with CLIENT PAUSE and killed links: red (no-outcome) on a
                       # build whose linger waits seconds, not milliseconds
# ... and against a Redis Cluster, with failovers, a master killed and slots migrated.
FIXED_CLUSTER_SEEDS = [5, 12]
# ... and over mutual TLS (--fixed --tls, suite "chaos-tls"): Redis restarted twice
# with AOF (8), and a cluster's master killed and failed over (12).
FIXED_TLS_SEEDS = [8]
FIXED_TLS_CLUSTER_SEEDS = [12]
# --tls: every proxy reaches Redis over mutual TLS (set by main()).
TLS = False
# ... and with --net, replies lost and held on the replicas' links (suite "chaos-net"):
# 4 loses a read's reply with entries (red in 2 of 3 runs on 72d906f^, before lost
# reads were corrected), 31 loses an XPENDING reply and holds an XAUTOCLAIM's.
FIXED_NET_SEEDS = [4, 31,
                   # issue 30's link faults, each red on 096ffd5 (tests/chaos/README.md):
                   9,    # finding 4: an 8 MB entry at 2 MB/s stops the stream (no-outcome)
                   34,   # finding 2: a parked read charged, dead-lettered never delivered
                   91]   # finding 1: a cut-off replica sends after another's ACK
# --net: every replica reaches Redis through a forwarder of its own that can lose
# or hold the reply of one chosen command (set by main(); single server, no TLS).
NET = False
# The --net seeds chosen before the link faults of issue 30 (refused commands, a
# throttled link, absent workers, foreign locks) keep the run they were chosen for.
PRE_LINK_SEEDS = {4, 31}
# --db (issue 35): workers write each effect into PostgreSQL through the inbox and
# fence of docs/database.md, and the checker judges the database too (set by main()).
DB = False
# --mutant skip-fence: the helper without its fence statement (the inbox kept).
MUTANT = None
# The fixed --db seeds (suite "chaos-db", --fixed --db):
FIXED_DB_SEEDS = [1,    # a forget: 5-17 keys delivered again after it, each stopped by the inbox
                  2,    # lock_key, a replica killed, a forget; 5-10 holders refused by the fence
                        # (--mutant skip-fence writes stale there: db-stale-write, 3 runs of 3)
                  4,    # lock_key, CLIENT PAUSE inside a forget's window
                  9]    # lock_key, group-less, 4 replicas (mutant: red in 2 runs of 3)
FIXED_BUDGET_S = 120
# The fixed seeds chosen before the linger was built keep linger_ms 0 (generate()).
PRE_LINGER_SEEDS = {0, 2, 4, 5, 8, 12, 14, 31, 1003}
SETTLE_CAP_S = 180
FINAL_RSS_KB = 32 * 1024
# The fixed sets' seeds keep tracing off: they keep the run they were chosen for.
PRE_TRACING_SEEDS = set(FIXED_SEEDS + FIXED_CLUSTER_SEEDS + FIXED_TLS_SEEDS + FIXED_TLS_CLUSTER_SEEDS
                        + FIXED_NET_SEEDS)

STREAM, GROUP, DEAD = "room", "g", "dead"
KEY_T = "#event.eventId"
LOCK_T = "room-lock:#{event.room}"
WRONGTYPE_ROOM = "wrongtype"
AOF = ["--appendonly", "yes", "--appendfsync", "always"]


# --- the seeded generator ---------------------------------------------------------

def generate(seed):
    """Everything a run does, from the seed alone."""
    rnd = random.Random(seed)
    c = {}
    c["layout"] = rnd.choice(["single", "split"])
    c["group"] = rnd.random() < 0.6
    c["lock_key"] = rnd.random() < 0.5
    c["lease_ms"] = rnd.choice([1000, 1500, 2000, 3000])
    c["wait_ms"] = rnd.choice([0, 200, int(c["lease_ms"] * 0.8), int(c["lease_ms"] * 1.5)])
    c["claim_idle_ms"] = rnd.choice([1000, 2000, 3000])
    c["ack_timeout_ms"] = rnd.choice([int(c["lease_ms"] * 0.7), c["lease_ms"] * 2, c["lease_ms"] * 3])
    c["max_inflight"] = rnd.choice([1, 2, 4, 16])
    c["on_busy"] = rnd.choice(["retry", "dead_letter"]) if c["lock_key"] else "retry"
    c["fencing"] = rnd.random() < 0.5
    c["replicas"] = rnd.choice([1, 2, 2, 3, 4])
    c["max_deliveries"] = rnd.choice([2, 3, 5])
    c["max_entry_bytes"] = rnd.choice([65536, 262144, 1048576])
    c["shutdown_grace_ms"] = rnd.choice([300, 1000, 3000])
    c["stable_consumer"] = rnd.random() < 0.8      # a restarted replica keeps its name
    c["workers_per_replica"] = rnd.choice([1, 2, 3])

    # Worker behaviour: the weights of each answer, and a few poison keys.
    mix = rnd.choice(["calm", "calm", "slow", "flaky", "hostile"])
    weights = {"calm": dict(ack=90, slow=3, retry=4, drop=1, none=1, crash=1),
               "slow": dict(ack=55, slow=35, retry=5, drop=2, none=2, crash=1),
               "flaky": dict(ack=55, slow=5, retry=25, drop=5, none=5, crash=5),
               "hostile": dict(ack=45, slow=15, retry=15, drop=10, none=5, crash=10)}[mix]
    c["mix"] = mix
    c["weights"] = weights
    c["slow_factor"] = rnd.choice([1.2, 1.6])  # slow answers take this many leases

    # Workload.
    nkeys = rnd.randint(8, 40)
    rooms = [f"r{i}" for i in range(rnd.randint(1, 5))]
    events = []
    for i in range(nkeys):
        k = f"ev{seed}-{i}"
        for _ in range(rnd.choice([1, 1, 2, 3])):
            events.append({"kind": "good", "key": k, "room": rnd.choice(rooms)})
    rnd.shuffle(events)
    lim = c["max_entry_bytes"]
    extras = []
    if rnd.random() < 0.4:
        extras.append({"kind": "near", "room": rnd.choice(rooms)})      # encoded just under the limit
    if rnd.random() < 0.4:
        extras.append({"kind": "over", "room": rnd.choice(rooms)})      # fields over the limit
    if rnd.random() < 0.4:
        extras.append({"kind": "bigkey", "room": rnd.choice(rooms)})    # fields under, encoded over
    if rnd.random() < 0.3:
        extras.append({"kind": "badjson"})
    if rnd.random() < 0.3:
        extras.append({"kind": "nokey", "room": rnd.choice(rooms)})
    if c["lock_key"] and rnd.random() < 0.35:
        for _ in range(rnd.choice([1, 2])):
            extras.append({"kind": "wrongtype"})
    if rnd.random() < 0.05:
        extras.append({"kind": "huge", "n": 3, "mb": 40})                 # 3 x 40 MB (defect 4)
    for x in extras:
        events.insert(rnd.randint(0, len(events)), x)
    for i, ev in enumerate(events):
        if ev["kind"] != "good" and "key" not in ev:
            ev["key"] = f"x{seed}-{i}-{ev['kind']}"
    c["events"] = events
    # Published in 1-3 batches along the timeline.
    c["batches"] = sorted(rnd.sample([0.0, 0.5, 1.0, 1.5, 2.0, 3.0], rnd.choice([1, 2, 3])))
    if c["batches"][0] != 0.0:
        c["batches"][0] = 0.0

    # The fault timeline.
    c["duration"] = rnd.choice([3.0, 4.0, 6.0])
    kinds = ["kill9", "sigterm", "client_kill", "pause", "redis_restart", "worker_reconnect",
             "pause_term"]
    faults = []
    for _ in range(rnd.choice([0, 1, 2, 3, 4])):
        f = {"t": round(rnd.uniform(0.2, c["duration"]), 2), "kind": rnd.choice(kinds),
             "replica": rnd.randrange(c["replicas"]),
             "down": round(rnd.uniform(0.2, 1.5), 2),
             "pause_ms": rnd.choice([150, 400, 900, 1600])}
        faults.append(f)
    c["faults"] = sorted(faults, key=lambda f: f["t"])
    c["behaviour_seed"] = rnd.getrandbits(32)
    c["cluster"] = False
    # streams[].linger_ms, from its own Random so the draws above stay those of
    # every seed found before the linger was built: off in four seeds of seven,
    # and in the fixed sets' seeds, which keep the run they were chosen for.
    c["linger_ms"] = (0 if seed in PRE_LINGER_SEEDS else
                      random.Random(f"{seed}/linger").choice([0, 0, 0, 0, 2, 30, 100]))
    # tracing (issue 32), from its own Random too: in one seed of three, spans to a
    # flaky collector (FlakyCollector) at this sample_ratio; never in the fixed sets.
    c["tracing"] = (None if seed in PRE_TRACING_SEEDS else
                    random.Random(f"{seed}/tracing").choice([None, None, None, None, 1.0, 0.5]))
    fingerprint(c, seed)
    hostile(c, seed)
    # streams[].batch_ms, from its own Random too: the default (not written, 2 ms)
    # in four seeds of six, and its extremes, 0 (never waits) and 100 (the most).
    c["batch_ms"] = random.Random(f"{seed}/batch").choice([None, None, None, None, 0, 100])
    # streams[].commit_ms, the same way: the default (5 ms) in four seeds of six,
    # 0 (done marks written at once) and 100 (the longest a done mark waits).
    c["commit_ms"] = random.Random(f"{seed}/commit").choice([None, None, None, None, 0, 100])
    # The batch window's key holds a string before the run in one seed of six:
    # every BLPOP refused (WRONGTYPE), the window waits in the daemon.
    c["window_key_taken"] = random.Random(f"{seed}/window-key").random() < 1 / 6
    # A peer that breaks the app socket's wire (the daemon's own SP side since
    # issue 34), from its own Random: in one seed of four, at a random moment,
    # a peer on one replica's socket sends a bad header, an ipc frame of type 2
    # or one of 2^40 bytes, after taking the delivery it may be sent meanwhile
    # (GarbagePeer). Only its connection may close; the run goes on.
    pr = random.Random(f"{seed}/peer")
    if seed not in PRE_FINGERPRINT_SEEDS and pr.random() < 0.25:
        c["faults"].append({"t": round(pr.uniform(0.2, c["duration"]), 2), "kind": "peer_garbage",
                            "replica": pr.randrange(c["replicas"]), "down": 0, "pause_ms": 0,
                            "how": pr.choice(["header", "type", "huge"])})
        c["faults"].sort(key=lambda f: f["t"])
    fields_mode(c, seed)
    return c


# The fixed sets' seeds keep the fingerprint off and no hostile entries (generate()).
PRE_FINGERPRINT_SEEDS = PRE_TRACING_SEEDS
# hostile() draws the first three in any seed; "deepname" is drawn by fields_mode().
HOSTILE_KINDS = ("deep", "forged", "longkey", "deepname")


def fingerprint(c, seed):
    """streams[].fingerprint and on_conflict (issue 31), from their own Random so the
    draws above stay those of every seed found before: a fingerprint in two seeds of
    five, and conflicting copies (a copy of a key with another "amount") in seven of
    ten, with or without one (without, they are plain duplicates). Which copy is the
    original is whichever is marked done first: the checker judges by the mark."""
    c["fingerprint"], c["on_conflict"] = "", "dead_letter"
    if seed in PRE_FINGERPRINT_SEEDS:
        return
    rnd = random.Random(f"{seed}/fingerprint")
    c["fingerprint"] = rnd.choice(["", "", "", "#event", "#event.amount"])
    c["on_conflict"] = rnd.choice(["dead_letter", "skip"])
    variants = rnd.random() < 0.7
    if c["fingerprint"] or variants:    # "#event.amount" reads it from every entry
        for ev in c["events"]:
            if ev["kind"] in ("good", "near", "bigkey", "wrongtype", "over"):
                ev["amount"] = 1
    if not variants:
        return
    copies = defaultdict(list)
    for ev in c["events"]:
        if ev["kind"] == "good":
            copies[ev["key"]].append(ev)
    for k in sorted(copies):
        if len(copies[k]) > 1 and rnd.random() < 0.5:
            rnd.choice(copies[k])["amount"] = 2        # any copy, the first published too


def hostile(c, seed):
    """Hostile producer entries (issue 37), from their own Random: in one seed of three,
    some of a payload nested deeper than 32 levels ("deep"; in fields mode a name
    of 40 dotted parts, deeper than the 31 objects a name may nest),
    forged idemproxy-stream/-reason/-entry-id fields on an entry without a key
    ("forged"; a dead letter keeps them, before idemproxy's own), and a key of over
    1024 bytes ("longkey"). Each is bad input: dead-lettered, never delivered; a
    good entry may carry forged fields too ("forged" set on it), and ends as any."""
    if seed in PRE_FINGERPRINT_SEEDS:
        return
    rnd = random.Random(f"{seed}/hostile")
    if not rnd.random() < 0.35:
        return
    rooms = sorted({ev["room"] for ev in c["events"] if ev["kind"] == "good"}) or ["r0"]
    for kind in HOSTILE_KINDS[:3]:
        for _ in range(rnd.choice([0, 1, 1, 2])):
            ev = {"kind": kind, "room": rnd.choice(rooms), "amount": 1}
            i = rnd.randint(0, len(c["events"]))
            ev["key"] = f"x{seed}-{i}-{kind}{rnd.getrandbits(16)}"
            if kind == "longkey":
                ev["key"] += "-" + "L" * 1100
            c["events"].insert(i, ev)
    goods = [ev for ev in c["events"] if ev["kind"] == "good"]
    if goods and rnd.random() < 0.5:
        rnd.choice(goods)["forged"] = True


def fields_mode(c, seed):
    """Fields mode (docs/configuration.md, payload_field: the Spring Data hash
    layout), from its own Random so
    every draw above stays what it was: in one seed of three (never in the fixed
    sets) the stream block has no payload_field, each event is written as flat
    fields (payload_for), and in two of those seeds of three 1-2 entries carry a
    field name of many dotted parts ("deepname", issue 37): 3,000, or as many as
    max_entry_bytes lets be read (250,000 at 1 MiB, the ~500 KB name that once
    crashed the daemon when json-c freed the tree). Bad input: dead-lettered."""
    c["fields_mode"] = False
    if seed in PRE_FINGERPRINT_SEEDS:
        return
    rnd = random.Random(f"{seed}/fields")
    if not rnd.random() < 1 / 3:
        return
    c["fields_mode"] = True
    if not rnd.random() < 2 / 3:
        return
    rooms = sorted({ev["room"] for ev in c["events"] if ev["kind"] == "good"}) or ["r0"]
    most = min(250000, (c["max_entry_bytes"] - 4096) // 2)
    for _ in range(rnd.choice([1, 1, 2])):
        i = rnd.randint(0, len(c["events"]))
        c["events"].insert(i, {"kind": "deepname", "room": rnd.choice(rooms), "amount": 1,
                               "parts": rnd.choice([3000, most, most]),
                               "key": f"x{seed}-{i}-deepname{rnd.getrandbits(16)}"})


def event_of_fields(fields):
    """The event the daemon builds from an entry's fields (event.c put_dotted):
    dotted names nest, a part of 256 bytes or more ends the nesting, a path into
    a string keeps the flat name; None where a name nests deeper than 31."""
    event = {}
    for name, value in fields.items():
        cur, seg, depth = event, name, 1
        while True:
            dot = seg.find(".")
            if dot <= 0 or dot == len(seg) - 1 or len(seg[:dot].encode()) >= 256:
                cur[seg] = value
                break
            depth += 1
            if depth >= 32:
                return None
            nxt = cur.setdefault(seg[:dot], {})
            if not isinstance(nxt, dict):
                event[name] = value
                break
            cur, seg = nxt, seg[dot + 1:]
    return event


def fingerprint_of(c, fields):
    """The 16 hex digits a done mark keeps for this entry: the first 8 bytes of the
    SHA-256 of the fingerprint's rendering (a string verbatim, as in a key; objects
    as canonical JSON, members sorted, no spaces); None without a fingerprint or
    for an entry it cannot render. In fields mode every value is a string."""
    if not c.get("fingerprint"):
        return None
    try:
        body = event_of_fields(fields) if c.get("fields_mode") else json.loads(fields["payload"])
        val = body if c["fingerprint"] == "#event" else body["amount"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    canon = val if isinstance(val, str) else json.dumps(val, sort_keys=True, separators=(",", ":"),
                                                        ensure_ascii=False)
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def clusterize(c, seed):
    """The same seed against a Redis Cluster (3 masters, a replica each): its own
    Random, so the configuration, workload and answers stay those of the seed.
    A Redis restart becomes a topology change (a coordinated failover, a master
    killed so that its replica takes over, or the slots of the stream and of
    the workload's keys migrated to another master while in use), and one more
    topology change is added to the timeline."""
    rnd = random.Random(f"{seed}/cluster")
    c["cluster"] = True
    topo = ["failover", "master_kill", "migrate"]
    for f in c["faults"]:
        if f["kind"] == "redis_restart":
            f["kind"] = rnd.choice(topo)
        f["node"] = rnd.choice(["stream", "other"])     # which master a pause or kill hits
    c["faults"].append({"t": round(rnd.uniform(0.2, c["duration"]), 2), "kind": rnd.choice(topo),
                        "replica": rnd.randrange(c["replicas"]), "down": round(rnd.uniform(0.2, 1.5), 2),
                        "pause_ms": rnd.choice([150, 400, 900]), "node": rnd.choice(["stream", "other"])})
    c["faults"].sort(key=lambda f: f["t"])
    return c


# Commands whose reply a --net fault loses or holds: each seed picks among what
# its mode sends (EVAL: the claim and commit scripts; XCLAIM: a count set back
# or the refresh of what a replica holds; XADD: a dead letter).
# "reply:X" loses instead the next reply of that kind that carries entries (matched
# in the bytes from Redis, REPLY_WITH_ENTRIES): a read or reclaim that took some.
NET_COMMANDS_GROUP = ["XREADGROUP", "XAUTOCLAIM", "XACK", "XCLAIM", "XPENDING", "EVAL", "SET",
                      "XGROUP", "reply:XREADGROUP", "reply:XREADGROUP", "reply:XAUTOCLAIM",
                      "reply:XAUTOCLAIM", "reply:XAUTOCLAIM"]
NET_COMMANDS_PLAIN = ["XREAD", "EVAL", "SET", "GET", "EXISTS", "reply:XREAD", "reply:XREAD"]
REPLY_WITH_ENTRIES = {
    # XREAD[GROUP]: [[stream, [[id, fields], ...]]] with one entry or more
    "reply:XREADGROUP": rb"\*1\r\n\*2\r\n\$4\r\nroom\r\n\*[1-9]",
    "reply:XREAD": rb"\*1\r\n\*2\r\n\$4\r\nroom\r\n\*[1-9]",
    # XAUTOCLAIM: [cursor, [[id, fields], ...], [deleted ids]] with one entry or more
    "reply:XAUTOCLAIM": rb"\*3\r\n\$\d+\r\n\d+-\d+\r\n\*[1-9]\d*\r\n\*2\r\n",
}


def netize(c, seed):
    """--net: the seed's own faults, unchanged, plus 1-3 faults of one replica's
    link to Redis, from their own Random(f"{seed}/net"): the next reply to a
    chosen command lost after Redis applied it (its connection closed 0.3 s
    later: a reset, a deadline) or held back 0.1-1.2 s (past the replicas'
    300 ms timeout_ms, a lost reply too; under it, a slow one)."""
    rnd = random.Random(f"{seed}/net")
    c["net"] = True
    cmds = NET_COMMANDS_GROUP if c["group"] else NET_COMMANDS_PLAIN
    stops = [f for f in c["faults"] if f["kind"] in ("kill9", "sigterm")]
    for _ in range(rnd.choice([1, 2, 2, 3])):
        f = {"t": round(rnd.uniform(0.2, c["duration"]), 2),
             "kind": rnd.choice(["lost_reply", "lost_reply", "slow_reply"]),
             "replica": rnd.randrange(c["replicas"]), "down": 0, "pause_ms": 0,
             "command": rnd.choice(cmds), "hold_s": rnd.choice([0.1, 0.25, 0.6, 1.2])}
        if f["command"] in REPLY_WITH_ENTRIES:      # while a batch is being read
            f["kind"] = "lost_reply"
            f["t"] = round(rnd.choice(c["batches"]) + rnd.uniform(0.0, 0.3), 2)
        if f["command"] == "reply:XAUTOCLAIM" and stops:
            # ... or, a reclaim's, on another replica once one was stopped: what
            # the stopped one held is reclaimed when idle past claim_idle_ms.
            stop = rnd.choice(stops)
            f["t"] = round(stop["t"] + 0.05, 2)
            others = [i for i in range(c["replicas"]) if i != stop["replica"]]
            f["replica"] = rnd.choice(others) if others else stop["replica"]
            f["wait_s"] = round(c["claim_idle_ms"] * 1.5 / 1000.0 + 2.0, 1)
        c["faults"].append(f)
    c["faults"].sort(key=lambda f: f["t"])
    if seed not in PRE_LINK_SEEDS:
        link_faults(c, seed)
    return c


# Commands a "refuse" fault drops the link on (matched framed, as hiredis sends
# them: "\r\nEVAL" is EVAL and EVALSHA, the claim, extension and commit scripts;
# XCLAIM the refresh and a count set back; SET the done mark and the claim's lock;
# XAUTOCLAIM the takeover). "ALL": the link refused whatever it carries.
REFUSE = {"XCLAIM": b"\r\nXCLAIM\r\n", "SET": b"\r\nSET\r\n", "EVAL": b"\r\nEVAL",
          "XAUTOCLAIM": b"\r\nXAUTOCLAIM\r\n", "BLPOP": b"\r\nBLPOP\r\n", "ALL": b"*"}


def link_faults(c, seed):
    """--net, issue 30: the faults that a link losing one reply does not reach, from
    their own Random(f"{seed}/link") (so every draw above stays what it was):
    - "refuse": for a while, one replica's link is closed whenever it carries one
      of some commands (nothing of that chunk reaches Redis);
    - "throttle": replies come at a few MB/s on some replicas' links for the whole
      run, and the workload gets entries of several MB (over max_entry_bytes);
    - "workers_absent": one replica's workers disconnect, and dial again only
      after its leases could run out (often with its link refused meanwhile);
    - "foreign_lock": another service holds the dedup lock or the room's lock of
      some keys of a batch (SET NX with its own token and a TTL) as it is read;
    - retry_hold: a worker's RETRY comes only after 1.2-1.6 leases (often with
      XCLAIM refused meanwhile, so the refresh of what it holds is lost);
    - a replica's links refused whenever they carry the batch window's BLPOP.
    Each is drawn on its own; 262 of seeds 0-299 get at least one."""
    rnd = random.Random(f"{seed}/link")
    lease = c["lease_ms"] / 1000.0
    n = c["replicas"]
    cmds = ["XCLAIM", "SET", "EVAL", "XAUTOCLAIM"] if c["group"] else ["SET", "EVAL"]
    new = []

    def refuse(t, replica, for_s, commands=None):
        new.append({"t": round(t, 2), "kind": "refuse", "replica": replica, "down": 0, "pause_ms": 0,
                    "command": "+".join(commands or sorted(rnd.sample(cmds, rnd.randint(1, len(cmds))))),
                    "for_s": round(for_s, 2)})

    if rnd.random() < 0.4:
        for _ in range(rnd.choice([1, 1, 2])):
            refuse(rnd.uniform(0.0, c["duration"]), rnd.randrange(n), rnd.choice([0.5, 1.5, 3.0, 6.0, 8.0]))
    if rnd.random() < 0.25:
        mbps = rnd.choice([2, 3, 5])
        who = list(range(n)) if rnd.random() < 0.7 else [rnd.randrange(n)]
        new.append({"t": -0.1, "kind": "throttle", "replica": who[0], "replicas": who, "down": 0,
                    "pause_ms": 0, "mbps": mbps})
        for _ in range(rnd.choice([1, 2])):
            big = {"kind": "huge", "n": 1, "mb": rnd.choice([2, 4, 8])}
            c["events"].insert(rnd.randint(0, len(c["events"])), big)
            big["key"] = f"x{seed}-huge{len(c['events'])}-{big['mb']}mb"
    if rnd.random() < 0.35:
        i = rnd.randrange(n)
        t = max(rnd.choice(c["batches"]) - 0.05, -0.05)
        # Often cut off too while its leases run out, and still cut off when its
        # workers come back: it cannot have learned that it lost them.
        cut = rnd.random() < 0.7
        cut_s = lease * rnd.choice([2.5, 3.5]) + 1.0
        away = lease * rnd.choice([1.2, 2.0]) + 1.0
        new.append({"t": round(t, 2), "kind": "workers_absent", "replica": i, "down": round(away, 2),
                    "pause_ms": 0})
        if cut:
            # once it has claimed what it read (the claim is an EVAL too)
            refuse(t + rnd.uniform(0.25, 0.65), i, cut_s, rnd.choice([["ALL"], ["EVAL"], ["EVAL", "SET"]]))
    if rnd.random() < 0.35:
        b = rnd.randrange(len(c["batches"]))
        nev = len(c["events"])
        cuts = [int(nev * k / len(c["batches"])) for k in range(len(c["batches"]) + 1)]
        goods = [ev for ev in c["events"][cuts[b]:cuts[b + 1]] if ev["kind"] == "good"]
        if goods:
            locks = []
            for ev in rnd.sample(goods, min(len(goods), rnd.choice([1, 2, 4]))):
                own = ("idem:" if c["layout"] == "single" else "lock:") + ev["key"]
                locks.append(f"room-lock:{ev['room']}" if c["lock_key"] and rnd.random() < 0.4 else own)
            t = max(c["batches"][b] - 0.05, -0.05)
            idle = c["claim_idle_ms"]
            new.append({"t": round(t, 2), "kind": "foreign_lock", "replica": None, "down": 0, "pause_ms": 0,
                        "locks": sorted(set(locks)),
                        "ttl_ms": rnd.choice([500, 1500, int(idle * 1.5), idle * 2])})
            if c["group"] and rnd.random() < 0.6:   # the refreshes of what they park lost
                for i in range(n):
                    refuse(t + 0.1, i, idle * 2.5 / 1000.0 + 1.0, ["XCLAIM", "SET"])
    c["retry_hold"] = rnd.random() < 0.3
    if c["retry_hold"] and c["group"] and rnd.random() < 0.7:
        # ... the refreshes of what the workers hold lost, past claim_idle_ms
        t = rnd.choice(c["batches"]) + rnd.uniform(0.0, 0.5)
        for i in range(n):
            refuse(t, i, c["claim_idle_ms"] / 1000.0 + lease * 2, ["XCLAIM"])
    # The batch window's BLPOP (issue 34), from its own Random: in one seed of
    # four, one replica's link is closed whenever it carries one, for a while
    # (the window and the read queued behind it lost together).
    wr = random.Random(f"{seed}/window")
    if wr.random() < 0.25:
        refuse(wr.uniform(0.0, c["duration"]), wr.randrange(n), wr.choice([1.5, 3.0, 8.0]), ["BLPOP"])
    c["faults"] = sorted(c["faults"] + new, key=lambda f: f["t"])


# --- the database sink (--db) -------------------------------------------------------

INBOX_SQL = ROOT / "sql" / "postgresql" / "001_idemproxy_inbox.sql"
# The user's effect, with no unique constraint: only the inbox and the fence keep it once.
EFFECTS_SQL = ("CREATE TABLE effects (id bigserial PRIMARY KEY, key text, lock text, token bigint, "
               "worker text, entry_id text)")
SLOW_WEIGHTS = dict(ack=55, slow=35, retry=5, drop=2, none=2, crash=1)


def dbize(c, seed):
    """--db: the seed's draws, plus from their own Random(f"{seed}/db"): fencing on
    (the fence needs tokens); lock_key in about four seeds of five (distinct keys
    sharing a lock: where a stale holder can write after its successor); holders
    that lose their lease while they work, drawn often: slow answers (a stall of
    1.2-1.6 leases) in half the calm seeds, an ack timeout under the lease in half
    the seeds (the stalled holder's entry or lock goes to another meanwhile), a
    replica killed while its workers work; and, single server only, in three seeds
    of five a Redis that forgets: a snapshot ("snapshot") and, 0.5-3 s later, Redis
    killed and started again from it ("forget")."""
    rnd = random.Random(f"{seed}/db")
    c["db"] = True
    c["fencing"] = True
    if not c["lock_key"] and rnd.random() < 0.6:
        c["lock_key"] = True
        c["on_busy"] = rnd.choice(["retry", "retry", "dead_letter"])
    if c["mix"] == "calm" and rnd.random() < 0.5:
        c["mix"], c["weights"] = "slow", dict(SLOW_WEIGHTS)
    if rnd.random() < 0.5:
        c["ack_timeout_ms"] = int(c["lease_ms"] * 0.7)
    if rnd.random() < 0.4:
        c["faults"].append({"t": round(rnd.choice(c["batches"]) + rnd.uniform(0.1, 0.6), 2), "kind": "kill9",
                            "replica": rnd.randrange(c["replicas"]), "down": round(rnd.uniform(0.2, 1.5), 2),
                            "pause_ms": 150})
    if not c["cluster"] and not c.get("tls") and rnd.random() < 0.6:
        t = round(rnd.uniform(0.3, c["duration"] * 0.7), 2)
        c["faults"] += [{"t": t, "kind": "snapshot", "replica": None, "down": 0, "pause_ms": 0},
                        {"t": round(t + rnd.choice([0.5, 1.0, 2.0, 3.0]), 2), "kind": "forget",
                         "replica": None, "down": round(rnd.uniform(0.1, 0.5), 2), "pause_ms": 0}]
    c["faults"].sort(key=lambda f: f["t"])
    return c


def pg_url():
    """The PostgreSQL of this process (and of the seeds it runs in processes of its
    own): IDEMPROXY_TEST_PG if set, else one started here as tests/with-postgres does,
    stopped and removed at exit."""
    url = os.environ.get("IDEMPROXY_TEST_PG")
    if url:
        return url
    import atexit
    import glob
    pg_ctl = shutil.which("pg_ctl") or (sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")) or [None])[-1]
    if not pg_ctl:
        raise RuntimeError("--db needs PostgreSQL (apt-get install postgresql)")
    bindir = Path(pg_ctl).parent
    d = Path(tempfile.mkdtemp(prefix="chaos-pg-"))
    port = pxtest.free_port()
    as_ = []
    if os.getuid() == 0:              # PostgreSQL refuses root
        shutil.chown(d, "postgres")
        as_ = ["runuser", "-u", "postgres", "--"]
    subprocess.run(as_ + [str(bindir / "initdb"), "-D", f"{d}/data", "-U", "postgres", "--auth=trust",
                          "-E", "UTF8", "--no-sync"], check=True, capture_output=True)
    subprocess.run(as_ + [str(bindir / "pg_ctl"), "-D", f"{d}/data", "-l", f"{d}/log", "-w", "-t", "30", "-o",
                          f"-p {port} -k {d} -c listen_addresses=127.0.0.1 -c fsync=off "
                          f"-c max_connections=200", "start"], check=True, capture_output=True)

    def stop():
        subprocess.run(as_ + [str(bindir / "pg_ctl"), "-D", f"{d}/data", "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(d, ignore_errors=True)
    atexit.register(stop)
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    os.environ["IDEMPROXY_TEST_PG"] = url         # the seeds run in processes of their own use it too
    return url


def enter_standin(conn, d, fence=True):
    """docs/database.md's steps 1 and 2 in the caller's transaction: "done" (the key
    is in the inbox), "stale" (a higher token has written for d.lock) or "run". The
    Python client's helper (idemproxy_worker.postgres.enter) runs the same SQL; this
    stands in for it where it is not there, and (fence=False) is the skip-fence mutant."""
    cur = conn.execute("INSERT INTO idemproxy_inbox (key, stream, entry_id, token) VALUES (%s, %s, %s, %s) "
                       "ON CONFLICT (key) DO NOTHING", (d.key, d.stream, d.entry_id, d.fencing_token))
    if cur.rowcount == 0:
        return "done"
    if fence and d.fencing_token:
        cur = conn.execute("INSERT INTO idemproxy_fence (lock, token) VALUES (%s, %s) ON CONFLICT (lock) "
                           "DO UPDATE SET token = EXCLUDED.token WHERE idemproxy_fence.token <= EXCLUDED.token",
                           (d.lock, d.fencing_token))
        if cur.rowcount == 0:
            return "stale"
    return "run"


def db_enter():
    """The helper the workers call: the client's when it is in the tree, else the
    stand-in; the stand-in without its fence for --mutant skip-fence."""
    if MUTANT == "skip-fence":
        return lambda conn, d: enter_standin(conn, d, fence=False)
    path = ROOT / "clients" / "python" / "src" / "idemproxy_worker" / "postgres.py"
    if not path.exists():
        return enter_standin
    sys.path.insert(0, str(path.parents[1]))
    from idemproxy_worker.postgres import enter
    return enter


class ChaosDB:
    """A fresh database for one seed on the process's PostgreSQL: the inbox and fence
    tables (sql/postgresql) and the effects table."""

    def __init__(self, seed):
        import psycopg
        from psycopg.conninfo import make_conninfo
        self.psycopg = psycopg
        self.admin_url = pg_url()
        self.name = f"chaos_{seed}_{os.getpid()}"
        with psycopg.connect(self.admin_url, autocommit=True) as a:
            a.execute(f"DROP DATABASE IF EXISTS {self.name}")
            a.execute(f"CREATE DATABASE {self.name}")
        self.url = make_conninfo(self.admin_url, dbname=self.name)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(INBOX_SQL.read_text())
            conn.execute(EFFECTS_SQL)
        self.enter = db_enter()

    def read(self):
        with self.psycopg.connect(self.url, autocommit=True) as conn:
            effects = [dict(zip(("id", "key", "lock", "token", "worker", "entry"), r)) for r in
                       conn.execute("SELECT id, key, lock, token, worker, entry_id FROM effects ORDER BY id")]
            inbox = {r[0]: {"entry": r[1], "token": r[2]} for r in
                     conn.execute("SELECT key, entry_id, token FROM idemproxy_inbox")}
            fence = dict(conn.execute("SELECT lock, token FROM idemproxy_fence").fetchall())
        return {"effects": effects, "inbox": inbox, "fence": fence}

    def drop(self):
        try:
            with self.psycopg.connect(self.admin_url, autocommit=True) as a:
                a.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        except self.psycopg.Error:
            pass


def as_fields(body, flat):
    """An event's entry fields: its JSON in "payload", or (fields mode) its members
    as flat fields, each value a string, as Spring Data's hash mappers write them."""
    return {n: str(v) for n, v in body.items()} if flat else {"payload": json.dumps(body)}


def payload_for(ev, lim, flat=False):
    """The entry fields of one event of the workload (flat: fields mode)."""
    k = ev["kind"]
    if k == "badjson":     # fields mode has no JSON: a key the dotted names make an object
        return {"eventId.part": "x", "room": "r0"} if flat else {"payload": "{not json"}
    if k == "wrongtype":
        return as_fields({"eventId": ev["key"], "room": WRONGTYPE_ROOM}, flat)
    if k == "nokey":
        return as_fields({"room": ev["room"], "no": "eventId"}, flat)
    forged = {"idemproxy-stream": "elsewhere", "idemproxy-reason": "busy", "idemproxy-entry-id": "0-1",
              "idemproxy-attempts": "9"}
    if k == "forged":      # no key, and fields a dead letter must not be read by
        return dict(forged, **as_fields({"room": ev["room"], "no": "eventId"}, flat))
    if k == "deep":        # nested 40 deep: deeper than a payload may be (32); a name of 40 parts
        if flat:
            return {"eventId": ev["key"], "room": ev["room"], ".".join(["deep"] * 40): "x"}
        return {"payload": json.dumps({"eventId": ev["key"], "room": ev["room"],
                                       "deep": json.loads("[" * 40 + "]" * 40)})}
    if k == "deepname":    # fields mode only: a name of thousands of dotted parts
        return {"eventId": ev["key"], "room": ev["room"], ".".join("a" * ev["parts"]): "x"}
    body = {"eventId": ev["key"], "room": ev["room"]}
    if "amount" in ev:
        body["amount"] = ev["amount"]
    if ev.get("forged"):
        return dict(forged, **as_fields(body, flat))
    if k == "near":        # the whole encoded Delivery about 2 KB under the limit
        body["pad"] = "n" * (lim - 2048 - 2 * len(ev["key"]) - 200)
    elif k == "over":      # the fields alone over the limit
        body["pad"] = "o" * (lim + 100)
    elif k == "bigkey":    # fields 100 bytes under the limit, but the key is repeated: ~1.4 x
        big = ev["key"] + "-" + "k" * int(lim * 0.4)
        ev["key"] = big
        body["eventId"] = big
        used = (sum(len(n) + len(str(v)) for n, v in body.items()) + len("pad") if flat else
                len(json.dumps(body)) + len("payload"))
        body["pad"] = "p" * (lim - 100 - used)
    return as_fields(body, flat)


def encoded_size(ev, fields):
    rest = [pb.Field(name=n, value=v.encode()) for n, v in fields.items() if n != "payload"]
    d = pb.Delivery(stream=STREAM, entry_id="1700000000000-1000", key=ev.get("key", ""), fields=rest,
                    payload=fields.get("payload", "").encode(), attempt=99, fencing_token=2 ** 40,
                    deadline_unix_ms=2 ** 42)
    return len(d.SerializeToString())


def delivered_room(d):
    """The room of a Delivery: its "room" field (fields mode), else its payload's."""
    for f in d.fields:
        if f.name == "room":
            return f.value.decode(errors="replace")
    try:
        return json.loads(d.payload).get("room")
    except (ValueError, AttributeError):
        return None


class FlakyCollector:
    """An OTLP/HTTP collector that misbehaves (tracing seeds): each POST is answered
    200, 500 or 503, answered after 6 s (past idemproxy's 5 s), or cut without an
    answer. Tracing must change nothing the checker sees."""

    def __init__(self, seed):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        rnd = random.Random(f"{seed}/collector")
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    how = rnd.choice(["ok", "ok", "500", "503", "slow", "cut"])
                if how == "cut":
                    self.close_connection = True
                    return
                if how == "slow":
                    time.sleep(6)
                self.send_response({"500": 500, "503": 503}.get(how, 200))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", pxtest.free_port()), Handler)
        self.server.daemon_threads, self.server.block_on_close = True, False
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# --- the workers: a recorded history ------------------------------------------------

class History:
    def __init__(self):
        self.lock = threading.Lock()
        self.rows = []
        self.faults = []          # {"t0","t1","kind","replica"}
        self.t0 = time.time()

    def add(self, row):
        with self.lock:
            self.rows.append(row)

    def fault(self, kind, replica=None, t0=None, t1=None):
        f = {"kind": kind, "replica": replica, "t0": t0 or time.time(), "t1": t1 or time.time()}
        with self.lock:
            self.faults.append(f)
        return f


class GarbagePeer:
    """A peer on replica i's ipc socket that breaks the SP wire ('how'): a
    header that is not a REP's; or a REP header, then, after whatever delivery
    the daemon sends it within 50 ms (recorded as received by a worker that
    crashed: it is delivered again after its ack timeout), an ipc frame of type
    2 ("type") or one announcing 2^40 bytes ("huge"). The daemon must close that
    connection and nothing else (nanomsg 1.1.5 aborted on "type")."""

    def __init__(self, run, replica, how):
        self.run_, self.replica, self.how = run, replica, how

    def run(self):
        path = f"{self.run_.tmp}/app{self.replica}.sock"
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(1.0)
        try:
            s.connect(path)
        except OSError:
            return                              # the replica is down: nothing to break
        try:
            proto = 0x30 if self.how == "header" else 0x31
            s.sendall(b"\x00SP\x00" + proto.to_bytes(2, "big") + b"\x00\x00")
            if self.how != "header":
                buf, t_end = b"", time.time() + 0.05
                s.settimeout(0.01)
                while time.time() < t_end:
                    try:
                        chunk = s.recv(1 << 16)
                    except socket.timeout:
                        continue
                    if not chunk:
                        break
                    buf += chunk
                size = 4 if self.how == "type" else 1 << 40
                s.sendall((b"\x02" if self.how == "type" else b"\x01") + size.to_bytes(8, "big") + b"abcd")
                s.settimeout(2.0)
                while True:                         # until the daemon closes it
                    chunk = s.recv(1 << 16)
                    if not chunk:
                        break
                    buf += chunk
                self.record(buf[8:])                # what was sent to it, up to the close
            else:
                s.settimeout(2.0)
                while s.recv(1 << 16):
                    pass
        except OSError:
            pass
        finally:
            s.close()

    def record(self, frames):
        """Each whole Delivery in 'frames' (ipc: 01, a 64-bit length, the
        request id, the body): received by a worker that crashed."""
        while len(frames) >= 9:
            n = int.from_bytes(frames[1:9], "big")
            if len(frames) < 9 + n or n < 4:
                break
            d = pb.Delivery()
            d.ParseFromString(frames[13:9 + n])
            frames = frames[9 + n:]
            now = time.time()
            self.run_.hist.add({"replica": self.replica, "worker": f"garbage{self.replica}", "key": d.key,
                                "entry": d.entry_id, "attempt": d.attempt, "token": d.fencing_token,
                                "start": now, "end": now, "answer": "crash",
                                "deadline": d.deadline_unix_ms / 1000.0, "size": n - 4,
                                "room": delivered_room(d)})
            self.run_.hist.fault("worker_crash", self.replica)


class Worker(threading.Thread):
    """A REP worker (pynng, so nng's 1 MiB receive limit, like a libnanomsg worker).
    Records each delivery on arrival, then its answer."""

    def __init__(self, run, replica, idx, endpoint):
        super().__init__(daemon=True)
        import pynng
        self.pynng = pynng
        self.run_ = run
        self.replica = replica
        self.name_ = f"w{replica}.{idx}"
        self.endpoint = endpoint
        self.reconnect = threading.Event()
        self.absent_until = 0.0           # --net workers_absent: dial again only then
        self.sock = None
        self.conn = None                  # --db: this worker's connection to the seed's database

    def behaviour(self, d):
        c = self.run_.c
        r = random.Random(f"{c['behaviour_seed']}/{d.entry_id}/{d.attempt}/{d.key[:64]}")
        w = c["weights"]
        return r.choices(list(w), weights=list(w.values()))[0]

    def run(self):
        stop = self.run_.stopping
        while not stop.is_set():
            self.reconnect.clear()
            away = self.absent_until - time.time()
            if away > 0:                # --net workers_absent: gone until then
                self.run_.hist.fault("worker_absent", self.replica, t1=self.absent_until + 0.2)
                stop.wait(away)
            sock = self.pynng.Rep0(recv_timeout=100)
            sock.dial(self.endpoint, block=False)
            self.sock = sock
            try:
                self.serve(sock)
            finally:
                # The reconnect takes effect here, when the socket closes (after the
                # request in hand is answered; nng drops a reply not yet written):
                # the fault spans from the request to this moment. (Seed 303: the
                # fault was recorded only when it was asked for, 50 ms before the
                # worker took its last delivery, whose ack the close then lost.)
                if self.reconnect.is_set() and self.absent_until <= time.time():
                    self.run_.hist.fault("worker_reconnect", self.replica)
                sock.close()
            stop.wait(0.2)          # reconnecting takes a moment

    def serve(self, sock):
        stop = self.run_.stopping
        c = self.run_.c
        while not stop.is_set() and not self.reconnect.is_set():
            try:
                msg = sock.recv()
            except self.pynng.Timeout:
                continue
            except self.pynng.Closed:
                return
            now = time.time()
            d = pb.Delivery()
            d.ParseFromString(msg)
            room = delivered_room(d)
            row = {"replica": self.replica, "worker": self.name_, "key": d.key, "entry": d.entry_id,
                   "attempt": d.attempt, "token": d.fencing_token, "start": now, "end": None,
                   "answer": None, "deadline": d.deadline_unix_ms / 1000.0, "size": len(msg),
                   "room": room}
            self.run_.hist.add(row)           # on arrival: a kill still leaves it recorded
            act = self.behaviour(d)
            if act == "crash":
                row["answer"], row["end"] = "crash", time.time()
                self.run_.hist.fault("worker_crash", self.replica)
                return                          # socket closed, then dialled again
            if act == "none":
                stop.wait(max(0.0, row["deadline"] - time.time()) + 0.05)
                row["answer"], row["end"] = "none", time.time()
                continue                        # the next recv abandons this request
            if act == "slow" or (act == "retry" and c.get("retry_hold")):
                stop.wait(c["lease_ms"] / 1000.0 * c["slow_factor"])
            elif act == "ack" and random.random() < 0.3:
                stop.wait(random.uniform(0.005, 0.05))
            reason = {"drop": "chaos-drop", "retry": "chaos-retry"}.get(act, "")
            if self.run_.db is not None and act in ("ack", "slow"):
                row["db"] = self.write_effect(d)        # after the stall: a lease lost meanwhile
                if row["db"] not in ("run", "done"):
                    act, reason = "retry", ("stale fencing token" if row["db"] == "stale" else "database error")
            status = {"ack": pb.Ack.ACK, "slow": pb.Ack.ACK, "retry": pb.Ack.RETRY,
                      "drop": pb.Ack.DROP}[act]
            row["answer"] = "drop" if act == "drop" else "retry" if act == "retry" else "ack"
            row["end"] = time.time()
            try:
                sock.send(pb.Ack(status=status, reason=reason).SerializeToString())
            except self.pynng.NNGException:
                row["send_failed"] = True

    def write_effect(self, d):
        """--db: the effect of delivery d, through the helper, in one transaction:
        "run" (the effect row inserted and committed: ACK), "done" (the inbox has
        the key: rolled back, ACK), "stale" (a higher token has written for the
        lock: rolled back, RETRY), or "error: ..." (rolled back, RETRY)."""
        db = self.run_.db
        try:
            if self.conn is None or self.conn.closed:
                self.conn = db.psycopg.connect(db.url)
            res = db.enter(self.conn, d)
            if res == "run":
                self.conn.execute("INSERT INTO effects (key, lock, token, worker, entry_id) "
                                  "VALUES (%s, %s, %s, %s, %s)",
                                  (d.key, d.lock, d.fencing_token, self.name_, d.entry_id))
                self.conn.commit()
            else:
                self.conn.rollback()
            return res
        except db.psycopg.Error as e:
            try:
                self.conn.rollback()
            except (db.psycopg.Error, AttributeError):
                self.conn = None
            return f"error: {str(e).strip()[:200]}"


# --- a Redis Cluster for cluster seeds ----------------------------------------------

class ChaosCluster(RedisCluster):
    """Three masters with a replica each, and the faults chaos does to them."""

    def __init__(self, tmp, pki=None):
        # With a pki (--tls) each node also serves TLS clients on a port of its own,
        # wanting a client certificate, and talks TLS on the bus and to its replica
        # (tls-cluster, tls-replication); the plain ports stay for the harness.
        self.pki, self.tls_ports = pki, {}
        extra = ["--tls-cluster", "yes", "--tls-replication", "yes"] if pki else []
        super().__init__(tmp, masters=3, replicas=1, node_timeout=1000, extra=extra)

    def start_node(self, port):
        if not self.pki:
            return super().start_node(port)
        tp = self.tls_ports.setdefault(port, pxtest.free_port())   # the same port after a restart
        saved = self.extra
        self.extra = [*saved, *test_tls.tls_server_args(self.pki, tp, "yes")]
        try:
            super().start_node(port)
        finally:
            self.extra = saved

    def connect(self):
        from redis.cluster import ClusterNode
        return redis_lib.RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in self.live_ports()],
                                      socket_timeout=10)

    def ready(self):
        """Settled, and every master that serves slots has a replica in sync (an old
        master started again is a master with no slots for a moment, then a replica)."""
        if not self.settled():
            return False
        try:
            for m in self.masters():
                if self.slots_of(m):
                    self.replica_of(m, timeout=0.05)
        except (AssertionError, redis_lib.exceptions.RedisError):
            return False
        return True

    def live_ports(self):
        return [p for p, proc in self.procs.items() if proc.poll() is None]

    def slots_of(self, port):
        out = set()
        for p, _, role, ranges in self.nodes():
            if p == port:
                for x in ranges:
                    if x.startswith("["):          # a slot being migrated or imported
                        continue
                    a, _, b = x.partition("-")
                    out.update(range(int(a), int(b or a) + 1))
        return out

    def owner(self, key):
        slot = key_slot(key.encode())
        return next(p for p in self.masters() if slot in self.slots_of(p))

    def migrate_slots(self, slots, src, dst):
        """Moves 'slots' from master 'src' to master 'dst' the way redis-cli does, with a
        moment in the middle when they are half moved (new keys go to dst by ASK)."""
        sid, did = self.node_id(src), self.node_id(dst)
        s, d = self.node(src), self.node(dst)
        for slot in sorted(slots):
            d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", sid)
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", did)
        time.sleep(0.2)
        for slot in sorted(slots):
            while True:
                keys = s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                if not keys:
                    break
                s.execute_command("MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", *keys)
            for port in [dst, src] + [m for m in self.masters() if m not in (src, dst)]:
                self.node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", did)


# --- a replica's link for --net -----------------------------------------------------

class ChaosLink(SlowLink):
    """SlowLink, plus: replies from Redis throttled to 'rate' bytes a second (0: not),
    'busy' recording when the throttle held a reply back (merged spans); and a
    refusal that adds to one still running instead of replacing it."""

    def __init__(self, target_port):
        self.rate = 0
        self.busy = []
        super().__init__(target_port, 0)

    def _accept(self):          # SlowLink's, with Redis' side throttled
        while not self.closed:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            try:
                u = _Throttled(socket.create_connection(self.target), self)
            except OSError:
                c.close()
                continue
            self.conns += [c, u]
            state = {"cut": False}
            for a, b, up in ((c, u, True), (u, c, False)):
                threading.Thread(target=self._pump, args=(a, b, state, up), daemon=True).start()

    def held_back(self, t0, t1):
        with self.cut_lock:
            if self.busy and t0 - self.busy[-1][1] < 0.5:
                self.busy[-1][1] = max(self.busy[-1][1], t1)
            else:
                self.busy.append([t0, t1])

    def refuse(self, patterns, seconds):
        """As SlowLink's; returns when (time.time()) the refusal ends."""
        with self.cut_lock:
            now = time.monotonic()
            keep = self.refused if now < self.refuse_until else []
            self.refused = sorted(set(keep) | set(patterns))
            self.refuse_until = max(self.refuse_until, now + seconds)
            return time.time() + self.refuse_until - now


class _Throttled:
    """Redis' side of a ChaosLink connection: recv() keeps to the link's rate."""

    def __init__(self, sock, link):
        self.sock, self.link = sock, link

    def recv(self, n):
        rate = self.link.rate
        if not rate:
            return self.sock.recv(n)
        data = self.sock.recv(min(n, max(4096, rate // 50)))
        d = len(data) / rate
        if len(data) >= 16384:                 # a small reply is not held back
            now = time.time()
            self.link.held_back(now, now + d)
        if d > 0:
            time.sleep(d)
        return data

    def __getattr__(self, name):
        return getattr(self.sock, name)


# --- one run ------------------------------------------------------------------------

class Run:
    def __init__(self, seed, binary, tmp, verbose=False, cluster=False):
        self.seed = seed
        self.c = generate(seed)
        if cluster:
            clusterize(self.c, seed)
        if NET:
            netize(self.c, seed)
        if DB:
            dbize(self.c, seed)
        self.db = None            # --db: the seed's database (ChaosDB)
        self.db_state = None      # ... what it holds at the end (ChaosDB.read)
        self.snap_t = None        # --db: when the snapshot a "forget" restores was taken
        self.links = []           # --net: each replica's forwarder to Redis
        self.binary = binary
        self.tmp = tmp
        self.verbose = verbose
        self.hist = History()
        self.stopping = threading.Event()
        self.proxies = []
        self.workers = []
        self.exits = []           # (replica, how, rc)
        self.rss = defaultdict(list)     # replica -> [(t, kB)]
        self.unexpected = []
        self.entries = []         # (entry id, event)
        self.asan = _is_asan(binary)
        self.c["tls"] = TLS
        self.pki = None
        self.not_tls = []         # --tls: what check_tls found not over TLS
        self.collector = None     # c["tracing"]: the OTLP collector the replicas export to

    def log(self, *a):
        if self.verbose:
            print(f"  [{time.time() - self.hist.t0:6.2f}s]", *a, flush=True)

    # setup
    def start_redis(self):
        d = self.tmp / "redis"
        d.mkdir()
        if self.c["tls"]:
            self.pki = self.tmp / "pki"
            self.pki.mkdir()
            test_tls.make_ca(self.pki, "ca")
            test_tls.make_pair(self.pki, "ca", "server", "redis.test", "DNS:localhost,IP:127.0.0.1")
            test_tls.make_pair(self.pki, "ca", "client", "idemproxy")
        if self.c["cluster"]:
            self.redis = ChaosCluster(d, self.pki)
            return
        self.redis = test_tls.TLSRedis(d, self.pki, "yes") if self.pki else RedisServer(d)
        self.redis.stop()
        self.redis.start(extra=AOF)       # a restart keeps what was acknowledged

    def r(self):
        if self.c["cluster"]:
            return self.redis.connect()
        return redis_lib.Redis(port=self.redis.port, socket_timeout=10)

    def redis_address(self):
        if self.pki and self.c["cluster"]:
            return [f"127.0.0.1:{self.redis.tls_ports[p]}" for p in self.redis.ports[:2]]
        if self.pki:
            return f"rediss://127.0.0.1:{self.redis.tls_port}"
        return self.redis.seeds[:2] if self.c["cluster"] else self.redis.url

    def redis_options(self):
        if not self.pki:
            return {}
        return {"tls": test_tls.tls_flow(ca_file=self.pki / "ca.crt", cert_file=self.pki / "client.crt",
                                         key_file=self.pki / "client.key")}

    def stream_conf(self, i):
        c = self.c
        s = {"stream": STREAM, "key": KEY_T, "layout": c["layout"],
             "lease_ms": c["lease_ms"], "wait_ms": c["wait_ms"], "max_deliveries": c["max_deliveries"],
             "retry_backoff_ms": 50, "dead_letter": DEAD, "fencing": c["fencing"], "start": "0"}
        if not c.get("fields_mode"):      # fields mode: the entry's fields are the event
            s["payload_field"] = "payload"
        if c["group"]:
            s["group"] = GROUP
            s["claim_idle_ms"] = c["claim_idle_ms"]
            if c["stable_consumer"]:
                s["consumer"] = f"replica{i}"
        if c["lock_key"]:
            s["lock_key"] = LOCK_T
            s["on_busy"] = c["on_busy"]
        if c.get("linger_ms"):
            s["linger_ms"] = c["linger_ms"]
        if c.get("fingerprint"):
            s["fingerprint"] = c["fingerprint"]
            s["on_conflict"] = c["on_conflict"]
        if c.get("batch_ms") is not None:
            s["batch_ms"] = c["batch_ms"]
        if c.get("commit_ms") is not None:
            s["commit_ms"] = c["commit_ms"]
        return s

    def start_proxies(self):
        c = self.c
        if c.get("window_key_taken"):
            self.r().set(f"idemproxy:window:{{{STREAM}}}:{STREAM}", "taken")
        if c.get("tracing") is not None:
            self.collector = FlakyCollector(c["behaviour_seed"])
        for i in range(c["replicas"]):
            ep = f"ipc://{self.tmp}/app{i}.sock"
            address = self.redis_address()
            if c.get("net"):
                self.links.append(ChaosLink(self.redis.port))
                address = self.links[-1].url
            p = self.replica_proxy(i, address, ep)
            self.start_proxy(p)
            self.proxies.append(p)
            for j in range(c["workers_per_replica"]):
                w = Worker(self, i, j, ep)
                w.start()
                self.workers.append(w)

    def replica_proxy(self, i, address, ep):
        """Replica i's Proxy, its config written (tests/chaos/test_checker.py
        puts every drawn config to `idemproxy check`)."""
        c = self.c
        return Proxy(self.tmp, f"replica{i}", address, ep, [self.stream_conf(i)],
                     timeout_ms=300, ack_timeout_ms=c["ack_timeout_ms"],
                     max_inflight=c["max_inflight"], max_entry_bytes=c["max_entry_bytes"],
                     log_level="info", shutdown_grace_ms=c["shutdown_grace_ms"],
                     redis=self.redis_options(),
                     tracing=({"otlp_endpoint": self.collector.url, "sample_ratio": c["tracing"]}
                              if self.collector else None))

    def start_proxy(self, p):
        """Start a replica and return once its own code runs: SIGTERM is blocked or
        handled (proxy/main.c blocks it first thing). A SIGTERM in the dynamic
        loader's first milliseconds kills any process, with nothing to drain yet;
        the faults do not aim there (seeds 241, 336, 348 did, right after a restart)."""
        p.start(**self.proc_env())
        deadline = time.time() + 5
        while time.time() < deadline and p.proc.poll() is None:
            try:
                st = dict(l.split(":", 1) for l in open(f"/proc/{p.proc.pid}/status") if ":" in l)
                if (int(st["SigBlk"], 16) | int(st["SigCgt"], 16)) & (1 << (signal.SIGTERM - 1)):
                    return
            except (OSError, KeyError, ValueError):
                pass
            time.sleep(0.001)

    def proc_env(self):
        return {"ASAN_OPTIONS": "detect_leaks=0", "IDEMPROXY_CHAOS_SEED": str(self.seed)}

    def publish(self, batch):
        c = self.c
        n = len(c["events"])
        cuts = [int(n * i / len(c["batches"])) for i in range(len(c["batches"]) + 1)]
        evs = c["events"][cuts[batch]:cuts[batch + 1]]
        r = self.r()
        for ev in evs:
            if ev["kind"] == "huge":
                for _ in range(ev["n"]):
                    body = {"eventId": ev["key"] + f"-{_}", "room": "r0"}
                    if c["fingerprint"]:
                        body["amount"] = 1
                    body["pad"] = "h" * (ev["mb"] << 20)
                    fields = as_fields(body, c.get("fields_mode"))
                    hev = dict(ev, key=ev["key"] + f"-{_}", kind="over")
                    self.entries.append((self._xadd(r, fields), hev, ev["mb"] << 20))
                continue
            fields = payload_for(ev, c["max_entry_bytes"], c.get("fields_mode"))
            ev["size"] = encoded_size(ev, fields)
            ev["fp"] = fingerprint_of(c, fields)
            self.entries.append((self._xadd(r, fields), ev, ev["size"]))
        self.log(f"published batch {batch}: {len(evs)} events")

    def _xadd(self, r, fields):
        for _ in range(200):               # through restarts and killed connections
            try:
                eid = r.xadd(STREAM, fields)
                return eid.decode() if isinstance(eid, bytes) else eid
            except (redis_lib.exceptions.ConnectionError, redis_lib.exceptions.TimeoutError,
                    redis_lib.exceptions.BusyLoadingError, redis_lib.exceptions.ClusterError,
                    redis_lib.exceptions.TryAgainError):
                time.sleep(0.05)
        raise RuntimeError("could not publish")

    def sample_rss(self):
        while not self.stopping.is_set():
            for i, p in enumerate(self.proxies):
                proc = p.proc
                if proc is None or proc.poll() is not None:
                    continue
                try:
                    for line in open(f"/proc/{proc.pid}/status"):
                        if line.startswith("VmRSS:"):
                            self.rss[i].append((time.time(), int(line.split()[1])))
                except OSError:
                    pass
            self.stopping.wait(0.05)

    # faults
    def stop_replica(self, i, sig):
        p = self.proxies[i]
        if p.proc is None:
            return
        rc = p.stop(sig, timeout=20)
        self.exits.append((i, signal.Signals(sig).name, rc))
        self.log(f"replica{i} stopped by {signal.Signals(sig).name}: exit {rc}")

    def restart_replica(self, i):
        p = self.proxies[i]
        if p.proc is None:
            # Its metrics port may have been taken while it was down (by an outgoing
            # connection of another harness on this machine: --net seed 481 beside a
            # CI run, every restart then exited 1): move it to a free one.
            probe = socket.socket()
            try:
                probe.bind(("127.0.0.1", p.metrics_port))
            except OSError:
                old, p.metrics_port = p.metrics_port, pxtest.free_port()
                p.config.write_text(p.config.read_text().replace(
                    f"listen: 127.0.0.1:{old}\n", f"listen: 127.0.0.1:{p.metrics_port}\n"))
                self.log(f"replica{i}'s metrics port {old} is taken: {p.metrics_port} now")
            finally:
                probe.close()
            self.start_proxy(p)
            self.log(f"replica{i} started again")

    def control(self):
        return redis_lib.Redis(port=self.redis.port, socket_timeout=5)

    def nodes_hit(self, f):
        """The cluster nodes a client kill or pause hits: every node, or one master."""
        cl = self.redis
        if f["kind"] == "client_kill":
            return cl.live_ports()
        if f["kind"] == "pause_term" or f.get("node") is None:
            return cl.masters()
        stream_master = cl.owner(STREAM)
        others = [m for m in cl.masters() if m != stream_master]
        return [stream_master] if f["node"] == "stream" or not others else others[:1]

    def cluster_fault(self, f):
        """A fault of the cluster's topology (the fault's 'node' picks the master)."""
        cl, kind = self.redis, f["kind"]
        # The victim is chosen once the topology has settled: chosen before, it
        # could be a master that a previous fault had just turned into a replica.
        wait_for(cl.ready, timeout=30, what="every replica in sync before a topology change")
        stream_master = cl.owner(STREAM)
        others = [m for m in cl.masters() if m != stream_master]
        victim = stream_master if f["node"] == "stream" or not others else others[0]
        if kind == "failover":
            self.log(f"failed over {victim} to {cl.failover(victim)}")
        elif kind == "master_kill":
            cl.kill(victim)
            wait_for(cl.served, timeout=30, what="a replica promoted")
            time.sleep(f["down"])
            cl.start_node(victim)          # it comes back as a replica of the promoted one
            self.log(f"killed master {victim}; masters now {cl.masters()}")
        elif kind == "migrate":
            dst = next(m for m in cl.masters() if m != victim)
            keys = [STREAM, DEAD] + [f"{pre}{ev['key']}" for ev in self.c["events"] if "key" in ev
                                     for pre in ("idem:", "done:", "lock:")]
            keys += [f"room-lock:{ev['room']}" for ev in self.c["events"] if "room" in ev]
            slots = {key_slot(k.encode()) for k in keys} & cl.slots_of(victim)
            cl.migrate_slots(slots, victim, dst)
            self.log(f"migrated {len(slots)} slots from {victim} to {dst}")

    def do_fault(self, f):
        if self.c["cluster"]:
            return self.do_cluster_fault(f)
        return self.do_single_fault(f)

    def do_cluster_fault(self, f):
        kind, i = f["kind"], f["replica"]
        if kind not in ("failover", "master_kill", "migrate", "client_kill", "pause"):
            return self.do_single_fault(f)
        t0 = time.time()
        self.log(f"fault {kind} replica{i} node {f['node']} down {f['down']} pause {f['pause_ms']}")
        cl = self.redis
        if kind in ("failover", "master_kill", "migrate"):
            self.cluster_fault(f)
            i = None
        elif kind in ("client_kill", "pause"):
            for port in self.nodes_hit(f):
                try:
                    if kind == "client_kill":
                        cl.node(port).execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
                    else:
                        cl.node(port).execute_command("CLIENT", "PAUSE", f["pause_ms"], "ALL")
                except redis_lib.exceptions.RedisError:
                    pass
            if kind == "pause":
                time.sleep(f["pause_ms"] / 1000.0)
            i = None
        self.hist.fault(kind, i, t0, time.time())

    def pause_all(self, ms):
        ports = self.nodes_hit({"kind": "pause_term"}) if self.c["cluster"] else [self.redis.port]
        for port in ports:
            redis_lib.Redis(port=port, socket_timeout=5).execute_command("CLIENT", "PAUSE", ms, "ALL")

    def do_single_fault(self, f):
        kind, i = f["kind"], f["replica"]
        t0 = time.time()
        self.log(f"fault {kind} replica{i} down {f['down']} pause {f['pause_ms']}")
        if kind in ("kill9", "sigterm"):
            self.stop_replica(i, signal.SIGKILL if kind == "kill9" else signal.SIGTERM)
            time.sleep(f["down"])
            self.restart_replica(i)
            i_ = i
        elif kind == "client_kill":
            self.control().execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            i_ = None
        elif kind == "pause":
            self.control().execute_command("CLIENT", "PAUSE", f["pause_ms"], "ALL")
            time.sleep(f["pause_ms"] / 1000.0)
            i_ = None
        elif kind == "pause_term":
            # Redis slow past the grace while a replica drains: acks still in flight at exit.
            # A burst first, so acks and XACKs are in flight when Redis stalls.
            r = self.r()
            for n in range(10):
                ev = {"kind": "good", "key": f"ev{self.seed}-burst{int(f['t'] * 100)}-{n}",
                      "room": f"r{n % 3}"}
                if self.c.get("fingerprint"):
                    ev["amount"] = 1
                fields = payload_for(ev, self.c["max_entry_bytes"], self.c.get("fields_mode"))
                ev["fp"] = fingerprint_of(self.c, fields)
                self.entries.append((self._xadd(r, fields), ev, encoded_size(ev, fields)))
            time.sleep(random.Random(f"{self.seed}/{f['t']}").uniform(0.02, 0.12))
            t0 = time.time()
            ms = self.c["shutdown_grace_ms"] + 700
            self.pause_all(ms)
            time.sleep(0.05)
            self.stop_replica(i, signal.SIGTERM)
            time.sleep(max(0.0, ms / 1000.0 - (time.time() - t0)))
            self.restart_replica(i)
            i_ = i
        elif kind == "redis_restart":
            self.redis.stop()
            time.sleep(f["down"])
            self.redis.start(extra=AOF)
            i_ = None
        elif kind == "snapshot":
            r = self.control()
            sec, usec = r.time()               # Redis' clock, as entry ids: older ones are in it
            self.snap_t = sec + usec / 1e6
            r.save()
            shutil.copy(self.redis.dir / "dump.rdb", self.tmp / "snapshot.rdb")
            return
        elif kind == "forget":
            return self.forget(f)
        elif kind == "worker_reconnect":
            for w in self.workers:
                if w.replica == i:
                    w.reconnect.set()
            i_ = i
        elif kind in ("lost_reply", "slow_reply"):
            return self.net_fault(f)
        elif kind == "refuse":
            until = self.links[i].refuse([REFUSE[x] for x in f["command"].split("+")], f["for_s"])
            rec = self.hist.fault(kind, i, t0, until)
            rec["command"] = f["command"]           # the checker's refused_setbacks()
            return rec
        elif kind == "throttle":
            for j in f["replicas"]:
                self.links[j].rate = f["mbps"] << 20       # for the run; recorded while it bites
            return
        elif kind == "workers_absent":
            for w in self.workers:
                if w.replica == i:
                    w.absent_until = t0 + f["down"]
                    w.reconnect.set()
            return                                       # recorded by each worker as it leaves
        elif kind == "peer_garbage":
            GarbagePeer(self, i, f["how"]).run()
            i_ = i
        elif kind == "foreign_lock":
            r = self.control()
            for n, name in enumerate(f["locks"]):
                r.set(name, f"foreign-{self.seed}-{n}", nx=True, px=f["ttl_ms"])
            # delays, never excuses (the checker does not know this kind)
            return self.hist.fault(kind, None, t0, t0 + f["ttl_ms"] / 1000.0)
        self.hist.fault(kind, i_, t0, time.time())

    def forget(self, f):
        """--db: Redis killed (-9) and started again from the snapshot: what was
        written since (done marks, locks, the group's state, entries, dead letters,
        the fencing counter's raises) is lost. Then AOF on again, as before."""
        killed = time.time()                # entries added from the snapshot to here are gone
        self.redis.stop()
        time.sleep(f["down"])
        shutil.copy(self.tmp / "snapshot.rdb", self.redis.dir / "dump.rdb")
        shutil.rmtree(self.redis.dir / "appendonlydir", ignore_errors=True)
        self.redis.start()                  # no AOF to load: the snapshot
        t1 = time.time()
        r = self.control()
        r.config_set("appendfsync", "always")
        r.config_set("appendonly", "yes")   # a rewrite of what it holds now
        wait_for(lambda: (lambda i: i["aof_enabled"] == 1 and not i["aof_rewrite_in_progress"]
                          and not i["aof_rewrite_scheduled"])(r.info("persistence")),
                 timeout=30, what="AOF on again after the restore")
        self.log(f"Redis forgot: started again from the snapshot of {self.snap_t - self.hist.t0:.2f}s")
        self.hist.fault("forget", None, self.snap_t, t1)["killed"] = killed

    def net_fault(self, f):
        """Lose or hold the next reply to f["command"] on replica f["replica"]'s
        link, if that command is sent within 2 s; recorded from the arming to the
        connection's close (lost) or the held reply's release (slow)."""
        link, cmd, t0 = self.links[f["replica"]], f["command"].encode(), time.time()
        wait = 2.0
        if f["command"] in REPLY_WITH_ENTRIES:
            before = link.cut
            link.cut_reply_matching(REPLY_WITH_ENTRIES[f["command"]])
            fired = lambda: link.cut > before
            wait = f.get("wait_s", 4.0)           # entries to read or reclaim come when they come
        elif f["kind"] == "lost_reply":
            link.cut_reply_to(cmd, None)
            fired = lambda: link.cuts_left == 0
        else:
            held = link.held
            link.hold_replies_after(cmd, f["hold_s"])
            fired = lambda: link.held > held
        deadline = t0 + wait
        while not fired() and time.time() < deadline:
            time.sleep(0.005)
        with link.cut_lock:                       # disarm: what did not fire by now will not
            link.cuts_left, link.hold_on, link.reply_cut = 0, None, None
        if not fired():
            self.log(f"fault {f['kind']} {f['command']} replica{f['replica']}: not seen within {wait:.0f} s")
            return
        t1 = time.time() + (link.cut_wait + 0.05 if f["kind"] == "lost_reply" else f["hold_s"])
        self.log(f"fault {f['kind']} {f['command']} replica{f['replica']} hold {f['hold_s']}")
        rec = self.hist.fault(f["kind"], None, t0, t1)       # a fault of Redis for the checker, but
        rec["link"], rec["command"] = f["replica"], f["command"]   # which link lost what (refused_setbacks)

    def check_tls(self):
        """--tls: the run was over TLS. The replicas still run: every Redis node that
        serves the stream (a cluster's masters) counts a client on its TLS port, and
        only the replicas (and a cluster's own replication links) connect there."""
        if self.c["cluster"]:
            nodes = [(self.redis.node(p), self.redis.tls_ports[p]) for p in self.redis.masters()]
        else:
            nodes = [(self.control(), self.redis.tls_port)]
        for r, tls_port in nodes:
            try:
                # (a replica's replication link, flag S, comes there too: not counted)
                ok = any(c.get("laddr", "").endswith(f":{tls_port}") and "S" not in c.get("flags", "")
                         for c in r.client_list())
            except redis_lib.exceptions.RedisError as e:
                ok = f"{e!r}"
            if ok is not True:
                self.not_tls.append(f"no replica connected on TLS port {tls_port} ({ok})")

    def check_alive(self):
        for i, p in enumerate(self.proxies):
            if p.proc is not None and p.proc.poll() is not None:
                rc = p.proc.returncode
                self.unexpected.append(f"replica{i} exited by itself with {rc}")
                self.log(f"replica{i} exited by itself: {rc}")
                p.proc = None
                p.logf.close()
                self.start_proxy(p)

    def execute(self, settle_timeout=30.0):
        c = self.c
        if c.get("db"):
            self.db = ChaosDB(self.seed)
        self.start_redis()
        r = self.r()
        if any(ev["kind"] == "wrongtype" for ev in c["events"]):
            r.rpush(f"room-lock:{WRONGTYPE_ROOM}", "not a lock")
        self.start_proxies()
        sampler = threading.Thread(target=self.sample_rss, daemon=True)
        sampler.start()
        timeline = [(t, "publish", b) for b, t in enumerate(c["batches"])]
        timeline += [(f["t"], "fault", f) for f in c["faults"]]
        timeline.sort(key=lambda x: (x[0], x[1] != "publish"))
        start = time.time()
        for t, what, arg in timeline:
            delay = start + t - time.time()
            if delay > 0:
                time.sleep(delay)
            self.check_alive()
            if what == "publish":
                self.publish(arg)
            else:
                self.do_fault(arg)
        delay = start + c["duration"] - time.time()
        if delay > 0:
            time.sleep(delay)
        for i in range(len(self.proxies)):
            self.restart_replica(i)
        # Settle: every entry has its outcome and nothing is pending, or time is
        # up. A workload that is still making progress (an entry got its outcome,
        # or a delivery was made) gets 10 s more from its last progress, up to
        # SETTLE_CAP_S: a stall is a stall, slowness not. (Seed 108: one entry at
        # a time behind a room's lock_key, each worker crash or silence costing
        # an ack timeout, needs well over a minute; the daemon was never idle.)
        start_settle = time.time()
        deadline = start_settle + settle_timeout
        settled, left, rows = False, None, len(self.hist.rows)
        while time.time() < min(deadline, start_settle + SETTLE_CAP_S):
            self.check_alive()
            try:
                st = self.read_state()
                n = self.unsettled(st)
                # --net workers_absent: not settled before the absent workers are
                # back, and a moment more: what their replica held must not go out
                # then (finding 1 of issue 30 sent it right after they came back).
                back = max([w.absent_until for w in self.workers] + [0.0]) + 1.5
                if not n and time.time() >= back:
                    settled = True
                    break
                if (left is not None and n < left) or len(self.hist.rows) > rows:
                    deadline = max(deadline, time.time() + 10.0)
                left, rows = n, len(self.hist.rows)
            except (redis_lib.exceptions.RedisError, redis_lib.exceptions.ClusterError):
                pass
            time.sleep(0.2)
        time.sleep(0.3)             # let late answers land in the history
        self.log("settled" if settled else "not settled in time")
        # Memory at the end: a group-less replica restarted late may still be reading
        # through the run's 40 MB entries when the others have settled (seed 103: 33
        # MiB at that moment, 5 MiB a second later). Up to 3 s for every replica to
        # come under the limit; a leak stays over it.
        t_mem = time.time()
        while time.time() - t_mem < 3.0 and any(v and v[-1][1] > FINAL_RSS_KB for v in self.rss.values()):
            time.sleep(0.1)
        self.final_rss = {i: (v[-1][1] if v else 0) for i, v in self.rss.items()}
        if self.pki:
            self.check_tls()
        for i in range(len(self.proxies)):
            self.stop_replica(i, signal.SIGTERM)
        self.stopping.set()
        try:
            self.state = self.read_state()
            self.state_error = None
        except redis_lib.exceptions.RedisError as e:
            self.state, self.state_error = None, repr(e)
        for w in self.workers:
            w.join(3)
        if self.db is not None:
            for w in self.workers:
                if w.conn is not None:
                    w.conn.close()
            self.db_state = self.db.read()
            self.db.drop()
        self.redis.stop()
        for i, link in enumerate(self.links):
            link.close()
            for t0, t1 in link.busy:                     # a throttle bites while it holds replies
                self.hist.fault("throttle", i, t0, t1)
        if self.collector:
            self.collector.close()
        return self

    # reading Redis (an error here is an error, never "nothing pending")
    def read_state(self):
        r = self.r()
        c = self.c
        keys = sorted({ev["key"] for _, ev, _ in self.entries if "key" in ev})
        done, marks = {}, {}
        pipe = r.pipeline(transaction=False) if not c["cluster"] else r.pipeline()
        for k in keys:
            pipe.get(f"idem:{k}" if c["layout"] == "single" else f"done:{k}")
        for k, v in zip(keys, pipe.execute()):
            done[k] = (v or b"")[:1] == b"D" if c["layout"] == "single" else v is not None
            if done[k]:
                marks[k] = parse_mark(v)
        dls = defaultdict(list)
        for did, f in r.xrange(DEAD):
            f = {a.decode(): b for a, b in f.items()}
            eid = f.get("idemproxy-entry-id", b"").decode()
            dls[eid].append({"id": did.decode(), "t": int(did.split(b"-")[0]) / 1000.0,
                             "reason": f.get("idemproxy-reason", b"").decode(errors="replace"),
                             "attempts": f.get("idemproxy-attempts", b"").decode()})
        pending, unread = None, 0
        if c["group"]:
            pending = r.xpending(STREAM, GROUP)["pending"]
            if any(f["kind"] == "forget" for f in self.hist.faults):
                unread = self.unread(r)
        return {"done": done, "marks": marks, "dls": dls, "pending": pending, "unread": unread}

    def unread(self, r):
        """After a forget (--db), the entries the group has not read again: the
        group's last-delivered-id went back with the restore, and an entry whose key
        is done (a copy) still goes out when it is read (seed 65: settled, then 6
        entries read and pending at the end). Those added since the snapshot are gone."""
        g = next(g for g in r.xinfo_groups(STREAM) if g["name"] in (GROUP, GROUP.encode()))
        last = g["last-delivered-id"]
        last = tuple(map(int, (last.decode() if isinstance(last, bytes) else last).split("-")))
        return sum(1 for eid, ev, _ in self.entries if tuple(map(int, eid.split("-"))) > last
                   and not any(vanished(f, eid) for f in self.hist.faults))

    def unsettled(self, st):
        """How many entries have no outcome yet, plus what is still pending."""
        xs = defaultdict(list)
        for x in list(self.hist.rows):
            xs[x["entry"]].append(x)
        logged = dead_letters_logged(self.proxies) if self.snap_t is not None else {}
        n = sum(1 for eid, ev, _ in self.entries
                if not st["dls"].get(eid) and not st["done"].get(ev["key"], False)
                and not forgotten(self.c, self.hist.faults, eid, xs[eid], settling=True,
                                  dead_logged=logged.get(eid, ())))
        return n + (st["pending"] or 0) + st.get("unread", 0)


def parse_mark(v):
    """A done mark's (ms, fingerprint): `D:<ms>[:<16 hex>]` (single) or
    `1:<ms>[:<16 hex>]` (split); (None, None) for a mark of another writer."""
    parts = v.decode(errors="replace").split(":")
    ms = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return ms, (parts[2] if len(parts) > 2 else None)


def _is_asan(binary):
    try:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    except OSError:
        return False
    return "libasan" in out


# --- the checker ------------------------------------------------------------------

BAD_KINDS = {"over", "bigkey", "badjson", "nokey", "wrongtype", "huge", "deep", "forged", "longkey",
             "deepname"}
# A conflicting copy (issue 31) may still be sent this long after its key's done
# mark was written: claimed while the holder's lease had run out, before its mark.
CONFLICT_SLACK = 1.0
# Faults of Redis itself: any lease or ack around one may be lost.
# A lost or held reply (--net) is one too, but not one that may hide a delivery from
# the attempt count: the reader corrects what a lost read or reclaim counted.
REDIS_FAULTS = ("client_kill", "pause", "redis_restart", "pause_term", "failover", "master_kill",
                "migrate", "lost_reply", "slow_reply", "forget")
# Faults of one replica's link (--net, issue 30): a command refused, replies throttled.
# They may cost that replica's leases and acks, no other replica's: the checker
# judges another replica's holders as if nothing happened (finding 1 of issue 30: a
# replica cut off sent after another one's ACK). Like a lost reply, they hide no
# delivery from the count. A foreign lock ("foreign_lock") only delays: it excuses
# nothing, so the checker does not name it.
LINK_FAULTS = ("refuse", "throttle")
LINK_KINDS = ("refuse", "throttle", "workers_absent")        # the generator's, for describe()
SLACK = 0.05


def vanished(f, eid):
    """Entry 'eid' was added between the snapshot (Redis' clock before SAVE) and the
    kill of the fault 'f' (a "forget"): the restore took it away. Exact bounds:
    an entry the restore kept is owed an outcome (seed 65: an entry added a few ms
    before the snapshot, judged gone, let the run settle before it was read)."""
    born = int(eid.split("-")[0]) / 1000.0
    return f["kind"] == "forget" and f["t0"] <= born <= f.get("killed", f["t1"])


# A replica's log line of an entry dead-lettered (bad input, busy, max_deliveries).
DEAD_LETTER_LOG = re.compile(r"^(\d{4}-\d\d-\d\dT[\d:.]+)Z \S+\s+stream \S+ entry (\S+) key .*"
                             r"(?:dead-lettered|max_deliveries \(\d+\) reached)", re.M)


def dead_letters_logged(proxies):
    """entry id -> when (time.time()) a replica logged it dead-lettered."""
    import datetime
    out = defaultdict(list)
    for p in proxies:
        for m in DEAD_LETTER_LOG.finditer(p.log_text()):
            t = datetime.datetime.fromisoformat(m.group(1)).replace(tzinfo=datetime.timezone.utc)
            out[m.group(2)].append(t.timestamp())
    return out


def forgotten(c, faults, eid, xs, settling=False, dead_logged=()):
    """An entry that a Redis which forgot ("forget", --db) may leave with no outcome:
    added after the snapshot (gone with everything written since); acked from a
    second before the snapshot to the kill (its done mark lost; in group mode its
    XACK, retried by the commit, may land after the restore: seed 97); or, group-less,
    added before the restore and either never delivered (a dead letter written then,
    busy or bad input, may be what was lost) or delivered while the snapshot was
    the past: its outcome written then and lost, and the readers, past it, do not
    read it again (its effect is in the database, which the database rules judge).
    Likewise dead-lettered in that time (the dead letter and its mark lost, the
    XACK retried after the restore: seed 97 again): 'dead_logged', when a replica
    logged it. 'xs': its recorded deliveries. 'settling': only what cannot come back
    yet, so a run does not settle before a group-less reader reaches an entry (seed 101)."""
    born = int(eid.split("-")[0]) / 1000.0
    for f in faults:
        if f["kind"] != "forget":
            continue
        if vanished(f, eid):
            return True
        if any(x["answer"] == "ack" and f["t0"] - 1.0 <= x["end"] <= f.get("killed", f["t1"]) for x in xs) \
                or any(f["t0"] - 1.0 <= t <= f.get("killed", f["t1"]) for t in dead_logged):
            return True
        if not settling and not c["group"] and born <= f["t1"] and (
                not xs or any(x["start"] <= f["t1"] and (x["end"] or time.time()) >= f["t0"] - 1.0
                              for x in xs)):
            return True
    return False


def check_db(run, rows):
    """--db: the database, judged on its own (docs/database.md), whatever Redis did:
    every key a worker acked has exactly one effect row and no key has more than
    one; for each lock, the effects' tokens never go down in commit order (id
    order: the fence row's lock serializes the writers of one lock); the inbox holds
    exactly the keys of the effects; and the database answered every worker."""
    v, db = [], run.db_state
    if db is None:
        return ["db-state: could not read the database after the run"]
    for x in rows:
        if str(x.get("db", "")).startswith("error"):
            v.append(f"db-error: {x['worker']} on key {x['key'][:40]} (entry {x['entry']}): {x['db'][:160]}")
    effects = defaultdict(list)
    for e in db["effects"]:
        effects[e["key"]].append(e)
    for k in sorted({x["key"] for x in rows if x["answer"] == "ack"}):
        if not effects.get(k):
            v.append(f"db-effect-missing: key {k[:60]} acked, no effect row in the database")
    for k, es in sorted(effects.items()):
        if len(es) > 1:
            v.append(f"db-effect-twice: key {k[:60]} has {len(es)} effect rows (entries "
                     f"{[e['entry'] for e in es]}, tokens {[e['token'] for e in es]}, "
                     f"workers {[e['worker'] for e in es]})")
    top = {}
    for e in db["effects"]:                      # id order
        t = top.get(e["lock"])
        if t is not None and e["token"] < t[0]:
            v.append(f"db-stale-write: lock {e['lock'][:60]}: key {e['key'][:40]} written by {e['worker']} "
                     f"with token {e['token']} after key {t[1][:40]} with token {t[0]} (effect ids "
                     f"{t[2]} then {e['id']})")
        if t is None or e["token"] >= t[0]:
            top[e["lock"]] = (e["token"], e["key"], e["id"])
    inbox, have = set(db["inbox"]), set(effects)
    if inbox != have:
        v.append(f"db-inbox: inbox keys without an effect {sorted(inbox - have)[:5]}, effects without an "
                 f"inbox row {sorted(have - inbox)[:5]}")
    return v


def db_summary(run):
    """--db: what the database did (printed for each seed): effects, deliveries the
    inbox stopped (and of them the doubles only it stopped, after Redis forgot: a
    key whose effect was committed before the restore, delivered again after it),
    holders the fence refused."""
    rows, db = run.hist.rows, run.db_state or {"effects": []}
    forgets = [f for f in run.hist.faults if f["kind"] == "forget"]
    ran = defaultdict(list)
    for x in rows:
        if x.get("db") == "run":
            ran[x["key"]].append(x["end"])
    doubles = sum(1 for x in rows if x.get("db") == "done" and any(
        x["sent"] >= f["t1"] - SLACK and any(e <= f["t1"] for e in ran[x["key"]]) for f in forgets))
    stops = sum(1 for x in rows if x.get("db") == "done")
    stale = sum(1 for x in rows if x.get("db") == "stale")
    return (f"db: {len(db['effects'])} effects, {stops} stopped by the inbox ({doubles} doubles after "
            f"{len(forgets)} forget), {stale} stale refused by the fence"), doubles


def check(run):
    """A list of violations (strings); empty when the history is legal."""
    c, v = run.c, []
    # A delivery is held from when the proxy sent it (its deadline minus
    # ack_timeout_ms), which can be well before it reaches a busy worker.
    for x in run.hist.rows:
        x["sent"] = min(x["start"], x["deadline"] - c["ack_timeout_ms"] / 1000.0)
    rows = sorted(run.hist.rows, key=lambda x: x["sent"])
    faults = run.hist.faults
    st = run.state
    lease = c["lease_ms"] / 1000.0
    if st is None:
        return [f"state: could not read Redis after the run: {run.state_error}"]

    for f in run.unexpected:
        v.append(f"crash: {f}")
    for f in getattr(run, "not_tls", []):
        v.append(f"tls: {f}")
    for i, how, rc in run.exits:
        if how == "SIGTERM" and rc != 0:
            v.append(f"exit: replica{i} exited {rc} after SIGTERM (want 0)")
    for p in run.proxies:
        text = p.log_text()
        for needle in ("AddressSanitizer", "runtime error:", "LeakSanitizer", "Assertion"):
            if needle in text:
                line = next(l for l in text.splitlines() if needle in l)
                v.append(f"sanitizer: {p.name}: {line.strip()[:200]}")
                break

    entry_ev = {eid: ev for eid, ev, _ in run.entries}
    dl_logged = dead_letters_logged(run.proxies) if any(f["kind"] == "forget" for f in faults) else {}
    timed_out = defaultdict(set)          # entry -> {(replica, attempt)} the replicas logged
    timed_out_sent = {}                   # (entry, replica, attempt) -> when it was sent
    for i, p in enumerate(run.proxies):
        for m in re.finditer(r"^(\S*).*?stream \S+ entry (\S+) key .* attempt (\d+): ack timeout",
                             p.log_text(), re.M):
            timed_out[m.group(2)].add((i, int(m.group(3))))
            try:
                at = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
            timed_out_sent[(m.group(2), i, int(m.group(3)))] = at - c["ack_timeout_ms"] / 1000.0
    taken_from = defaultdict(set)         # entry -> {replica} that logged it taken over from it
    for i, p in enumerate(run.proxies):
        for m in re.finditer(r"stream \S+ entry (\S+) key .*: taken over by another consumer", p.log_text()):
            taken_from[m.group(1)].add(i)
    by_entry = defaultdict(list)
    by_key = defaultdict(list)
    by_room = defaultdict(list)
    for x in rows:
        by_entry[x["entry"]].append(x)
        by_key[x["key"]].append(x)
        if c["lock_key"] and x["room"] is not None:
            by_room[x["room"]].append(x)

    def end_eff(x):
        """When the worker stopped holding the delivery, as far as the proxy may know."""
        e = x["end"] if x["end"] is not None else time.time()
        if x["answer"] in ("crash",):
            return x["sent"]
        return min(e, x["deadline"])

    def clean(x):
        """True if nothing could have cost this holder its lease or its ack."""
        if x["answer"] != "ack" or x["end"] is None or x["end"] > x["deadline"] - SLACK or x.get("send_failed"):
            return False
        for f in faults:
            if f["kind"] in REDIS_FAULTS and \
                    f["t0"] <= x["end"] + 1.0 and f["t1"] >= x["sent"] - lease:
                return False
            if f["kind"] in LINK_FAULTS and f["replica"] == x["replica"] and \
                    f["t0"] <= x["end"] + 1.0 and f["t1"] >= x["sent"] - lease:
                return False
            if f["replica"] == x["replica"] and f["kind"] in ("kill9", "sigterm", "pause_term",
                                                              "worker_reconnect", "worker_absent",
                                                              "worker_crash") and \
                    f["t0"] <= x["end"] + 2.0 and f["t1"] >= x["sent"]:
                return False
        return True

    def lease_safe(x):
        """Held without any fault that could cost the lease, answered or not."""
        for f in faults:
            if f["kind"] in REDIS_FAULTS and \
                    f["t0"] <= end_eff(x) + 0.5 and f["t1"] >= x["sent"] - lease:
                return False
            if f["kind"] in LINK_FAULTS and f["replica"] == x["replica"] and \
                    f["t0"] <= end_eff(x) + 0.5 and f["t1"] >= x["sent"] - lease:
                return False
            if f["replica"] == x["replica"] and f["kind"] in ("kill9", "sigterm", "pause_term") and \
                    f["t0"] <= end_eff(x) and f["t1"] >= x["sent"]:
                return False
        return True

    # 1. No key delivered after it was acked (unless that ack or lease could be lost),
    # and no key held by two at once while the first holder's lease was safe.
    for k, xs in by_key.items():
        for a_i, a in enumerate(xs):
            for b in xs[a_i + 1:]:
                if a["end"] is not None and a["answer"] == "ack" and b["sent"] > a["end"] and clean(a):
                    v.append(f"twice-after-ack: key {k[:60]} acked by {a['worker']} (entry {a['entry']}) at "
                             f"{a['end'] - run.hist.t0:.2f}s, delivered again to {b['worker']} (entry "
                             f"{b['entry']}, attempt {b['attempt']}) at {b['start'] - run.hist.t0:.2f}s")
                    break
                if b["sent"] < end_eff(a) - SLACK and lease_safe(a):
                    v.append(f"held-twice: key {k[:60]} sent to {b['worker']} at "
                             f"{b['sent'] - run.hist.t0:.2f}s while {a['worker']} held it since "
                             f"{a['sent'] - run.hist.t0:.2f}s")
                    break

    # 2. Fencing: a later holder of a lock has a higher token.
    if c["fencing"]:
        groups = by_room if c["lock_key"] else by_key
        for lk, xs in groups.items():
            for a_i, a in enumerate(xs):
                for b in xs[a_i + 1:]:
                    if b["sent"] >= end_eff(a) and b["token"] <= a["token"]:
                        v.append(f"fencing: lock {lk[:60]}: token {b['token']} at "
                                 f"{b['start'] - run.hist.t0:.2f}s after {a['token']}")
            for x in xs:
                if x["token"] == 0:
                    v.append(f"fencing: delivery of {x['key'][:60]} with token 0")
                    break

    # 3. lock_key holders never overlap.
    for room, xs in by_room.items():
        for a_i, a in enumerate(xs):
            for b in xs[a_i + 1:]:
                if b["sent"] < end_eff(a) - SLACK and lease_safe(a):
                    v.append(f"lock-overlap: room {room}: {b['worker']} got {b['key'][:40]} at "
                             f"{b['start'] - run.hist.t0:.2f}s while {a['worker']} held {a['key'][:40]} "
                             f"until {end_eff(a) - run.hist.t0:.2f}s")

    # 4. Size: nothing larger than max_entry_bytes is sent.
    for x in rows:
        if x["size"] > c["max_entry_bytes"]:
            v.append(f"oversize-delivered: entry {x['entry']} arrived as {x['size']} bytes "
                     f"(max_entry_bytes {c['max_entry_bytes']})")

    # 5. Every entry has exactly one legitimate outcome.
    def lost_allowance(eid, before):
        """Deliveries of entry 'eid' that faults may hide from its attempt count
        by 'before': one per fault of those kinds from a second before the entry
        was added (its id's time) on. A lost or held reply (--net) hides none.
        A Redis that forgot (--db) sets the count back to the snapshot's: what
        was counted since, up to max_deliveries (then it was dead-lettered), is
        forgotten, whenever those deliveries were sent (a replica may send what
        it read before the restore after it)."""
        born = int(eid.split("-")[0]) / 1000.0
        return sum(1 for f in faults if f["kind"] in (
            "kill9", "sigterm", "pause_term", "worker_reconnect", "worker_absent", "worker_crash", "failover",
            "master_kill", "migrate")
            and f["t1"] >= born - 1.0 and f["t0"] <= before) + \
            c["max_deliveries"] * sum(1 for f in faults if f["kind"] == "forget" and f["t0"] <= before
                                      and born <= f["t1"] + SLACK)
    idle_s = c["claim_idle_ms"] / 1000.0 if c["group"] and c.get("claim_idle_ms") else None

    def slow_claims(eid, before):
        """Counts of entry 'eid' no delivery made, by 'before' (group mode; seed
        67 of --net): a read or reclaim counts its entries as Redis applies it;
        when its reply takes claim_idle_ms or longer to arrive, another instance
        takes them over meanwhile (the reader cannot keep fresh what it has not
        seen) and counts that read, which it cannot tell from a delivery; the
        reader, which knows, no longer owns them, and logs the entry taken over
        when the reply comes. One per throttle that held back the replies of
        such a replica's link for claim_idle_ms or longer."""
        born = int(eid.split("-")[0]) / 1000.0
        return sum(1 for f in faults if f["kind"] == "throttle" and idle_s is not None
                   and f["replica"] in taken_from.get(eid, ())
                   and f["t1"] - f["t0"] >= idle_s and f["t1"] >= born - 1.0 and f["t0"] <= before)
    def blocks_scripts(f):
        """A refusal that keeps a replica's scripts (count set-backs and raises,
        refreshes) from Redis: of EVAL, of SET (the writes they ride in), or of
        everything."""
        return f["kind"] == "refuse" and bool({"EVAL", "SET", "ALL"} & set(f.get("command", "").split("+")))

    def sent_deliveries(eid):
        """Every delivery of entry 'eid' a replica sent, in the order sent: a
        delivery no worker recorded (it timed out before one read it) is one
        all the same (seed 314: a taker's only one), sent at its replica's ack
        timeout minus ack_timeout_ms."""
        xs = by_entry.get(eid, [])
        seen = {(x["replica"], x["attempt"]) for x in xs}
        return sorted(xs + [{"replica": i, "attempt": n, "sent": t, "start": t}
                            for (e, i, n), t in timed_out_sent.items() if e == eid and (i, n) not in seen],
                      key=lambda y: y["sent"])

    def refused_raises(eid, before):
        """Deliveries of entry 'eid' its count may not hold, by 'before' (group
        mode; seed 314 of --net, first form): replica A read it, set its count
        back while it waited for a worker (0: no delivery yet), then delivered
        it; the count's raise back (a script) went in a write the refusal
        dropped, so Redis' count stayed one low, and the replica that took it
        over after claim_idle_ms counted from there: attempt errs low (allowed,
        docs/guarantee.md), and the entry goes out once more than
        max_deliveries. One per delivery A sent during such a refusal of its
        own link (SET, EVAL or everything), when another replica delivered the
        entry after it."""
        if idle_s is None:
            return 0
        xs = [y for y in sent_deliveries(eid) if y["sent"] <= before + SLACK]
        total = 0
        for f in faults:
            if not blocks_scripts(f):
                continue
            a = f["replica"]
            during = [y for y in xs if y["replica"] == a and f["t0"] - SLACK <= y["sent"] <= f["t1"]]
            if during and any(y["replica"] != a and y["sent"] > during[0]["sent"] for y in xs):
                total += len(during)
        return total

    def refused_setbacks(eid, before):
        """Counts of entry 'eid' no delivery made, by 'before' (group mode; seed 230
        of --net): a read of it by replica A (and each read again after A's reader
        link dropped: a history replay counts too) counted a delivery that A then
        did not make; A sets such a count back by a script (EVAL), and while A's
        link refuses EVAL (or everything) that set-back cannot reach Redis, nor can
        A's refreshes: another replica takes the entry over after claim_idle_ms and
        counts once more. A refusal of SET does the same (seed 314): the forwarder
        drops each write that holds a SET and closes the link, and A, with entries
        to claim, sends a SET in its first write after every reconnect, so its
        command link is cut again and again for as long as the refusal lasts. The
        replica that knows cannot write, the one that writes cannot know. For each replica A with such a refusal from before the delivery
        and not ended before the entry was added, when the first delivery sent
        after the refusal began is another replica's, at least claim_idle_ms after
        the entry was added (a takeover): one for A's read (none if A had
        delivered it before), plus one per fault that drops A's reader link
        during the refusal (a read's or reclaim's reply lost or held on A's link,
        Redis' connections killed, paused or restarted)."""
        if idle_s is None:
            return 0
        born = int(eid.split("-")[0]) / 1000.0
        xs = sent_deliveries(eid)
        total = 0
        for a in sorted({f["replica"] for f in faults if f["kind"] == "refuse"}):
            spans = []
            for f in faults:
                if not blocks_scripts(f) or f["replica"] != a or f["t0"] > before or f["t1"] < born:
                    continue
                taker = next((y for y in xs if y["sent"] >= f["t0"] - SLACK), None)
                if taker is None or taker["sent"] > before + SLACK or taker["replica"] == a \
                        or taker["sent"] < born + idle_s - SLACK:
                    continue
                spans.append((f, taker))
            if not spans:
                continue
            taker = min((tk for _, tk in spans), key=lambda y: y["sent"])
            total += 0 if any(y["replica"] == a and y["sent"] < taker["sent"] for y in xs) else 1
            total += sum(1 for g in faults if g["t1"] >= born and
                         any(g["t0"] <= f["t1"] and g["t1"] >= f["t0"] for f, _ in spans) and
                         (g["kind"] in ("client_kill", "pause", "redis_restart", "pause_term") or
                          g["kind"] in ("lost_reply", "slow_reply") and g.get("link") == a and
                          any(r in g.get("command", "") for r in ("XREADGROUP", "XAUTOCLAIM"))))
        return total

    def mark_written(key, mark):
        """By when the done mark 'mark' of 'key' was in Redis at the latest. The mark
        keeps the time of its first try; a retry held up by a fault of Redis or of
        the link of the replica that delivered the original writes the same mark
        later, and a copy claimed meanwhile (the original's lease run out) is the
        double the guarantee allows (seed 208 of --net): the mark's time, moved to
        the end of each such fault under way by then."""
        if mark[0] is None:
            return None
        written = mark[0] / 1000.0
        replicas = {x["replica"] for x in by_key.get(key, []) if entry_ev.get(x["entry"], {}).get("fp") == mark[1]}
        moved = True
        while moved:
            moved = False
            for f in faults:
                if (f["kind"] in REDIS_FAULTS or f["kind"] in LINK_FAULTS and f["replica"] in replicas) \
                        and f["t0"] <= written + 0.2 and f["t1"] > written:
                    written, moved = f["t1"], True
        return written

    def judged_by_an_earlier_mark(key, mark, d, ev):
        """A conflict dead letter 'd' judged against another copy's mark: legal while
        the mark Redis keeps at the end was not yet written (its holder's commit held
        up by a fault, its lease run out), if that other copy was delivered and acked
        and the reason names both fingerprints (seed 169 of --net: the mark of an
        acked copy, then the held-up commit of the first one written over it)."""
        written = mark_written(key, mark)
        if written is None or d["t"] > written + SLACK or ev.get("fp") not in d["reason"]:
            return False
        return any(x["answer"] == "ack" and entry_ev.get(x["entry"], {}).get("fp") not in (None, ev.get("fp"))
                   and entry_ev[x["entry"]]["fp"] in d["reason"] for x in by_key.get(key, []))

    for eid, ev in entry_ev.items():
        dl = st["dls"].get(eid, [])
        xs = by_entry.get(eid, [])
        key = ev.get("key")
        failed = sum(1 for x in xs if not (x["answer"] == "ack" and clean(x)))
        # A delivery queued behind a worker's slow handler can time out before the
        # worker reads it (raw REQ round-robins; a Known limit): the worker never
        # records it, the replica logs its ack timeout. (Seeds 13, 63.)
        unrecorded = len(timed_out.get(eid, set()) - {(x["replica"], x["attempt"]) for x in xs})
        failed += unrecorded
        for n, x in enumerate(xs):
            hidden = lost_allowance(eid, x["start"]) + slow_claims(eid, x["start"]) + \
                refused_setbacks(eid, x["start"])
            if x["attempt"] > n + 1 + hidden + unrecorded:
                v.append(f"attempt-inflated: entry {eid} delivered with attempt {x['attempt']} "
                         f"after {n} recorded deliveries")
                break
        # The boundary (issue 30: a poison check of `>` for `>=` survived every
        # suite): no delivery past max_deliveries, and no more deliveries of an
        # entry than max_deliveries plus the faults that can hide one from the
        # count. Group-less, each replica process counts its own (README, Known
        # limits): counted per replica, from its last stop on, by when the replica
        # sent it: a slow worker may start a delivery after its sender was stopped
        # (seed 107: attempts 1 and 2 sent before a SIGTERM, started after it).
        over = next((x for x in xs if x["attempt"] > c["max_deliveries"]), None)
        if over is not None:
            v.append(f"over-max-deliveries: entry {eid} delivered to {over['worker']} with attempt "
                     f"{over['attempt']} at {over['start'] - run.hist.t0:.2f}s "
                     f"(max_deliveries {c['max_deliveries']})")
        counted = defaultdict(list)
        for x in xs:
            if c["group"]:
                counted[None].append(x)
            else:
                life = sum(1 for f in faults if f["replica"] == x["replica"] and
                           f["kind"] in ("kill9", "sigterm", "pause_term") and f["t0"] <= x["sent"])
                counted[(x["replica"], life)].append(x)
        for who, ys in counted.items():
            if len(ys) > c["max_deliveries"] + lost_allowance(eid, ys[-1]["start"]) + \
                    refused_raises(eid, ys[-1]["start"]):
                v.append(f"too-many-deliveries: entry {eid} delivered {len(ys)}x"
                         f"{'' if who is None else f' by replica{who[0]}'} (attempts "
                         f"{[y['attempt'] for y in ys]}, max_deliveries {c['max_deliveries']})")
        if len(dl) > 1:
            v.append(f"dead-lettered-{len(dl)}x: entry {eid} ({ev['kind']}): "
                     f"{[d['reason'][:50] for d in dl]}")
        if ev["kind"] in BAD_KINDS:
            if xs:
                v.append(f"bad-delivered: {ev['kind']} entry {eid} was delivered {len(xs)}x")
            if not dl and not forgotten(c, faults, eid, xs, dead_logged=dl_logged.get(eid, ())):
                v.append(f"no-outcome: {ev['kind']} entry {eid} was never dead-lettered")
            elif ev["kind"] != "wrongtype" and any(d["reason"].startswith(("max_deliveries", "busy", "conflict"))
                                                   for d in dl):
                v.append(f"bad-wrong-reason: {ev['kind']} entry {eid}: {dl[0]['reason'][:80]}")
            continue
        # Issue 31: the copy whose fingerprint the done mark keeps is the original,
        # whichever was published first; a copy with another one is a conflict once
        # that mark is there: never sent again, and (dead_letter) dead-lettered.
        mark = st.get("marks", {}).get(key) or (None, None)
        other = bool(c.get("fingerprint")) and None not in (mark[1], ev.get("fp")) and ev["fp"] != mark[1]
        if other:
            written = mark_written(key, mark)
            late = [x for x in xs if written is not None and x["sent"] > written + CONFLICT_SLACK]
            if late:
                v.append(f"conflict-delivered: entry {eid} (fingerprint {ev['fp']}) sent at "
                         f"{late[0]['sent'] - run.hist.t0:.2f}s, after its key {key[:40]} was done with "
                         f"{mark[1]} at {mark[0] / 1000.0 - run.hist.t0:.2f}s")
            if c["on_conflict"] == "dead_letter" and not dl and not xs and not forgotten(c, faults, eid, xs, dead_logged=dl_logged.get(eid, ())):
                v.append(f"conflict-no-outcome: entry {eid} (fingerprint {ev['fp']}) never delivered nor "
                         f"dead-lettered, its key {key[:40]} done with {mark[1]}")
        if not dl:
            if not st["done"].get(key) and not forgotten(c, faults, eid, xs, dead_logged=dl_logged.get(eid, ())):
                v.append(f"no-outcome: entry {eid} key {key[:60]} neither done nor dead-lettered "
                         f"({len(xs)} deliveries)")
            continue
        d = dl[0]
        reason = d["reason"]
        if reason == "busy":
            if not (c["lock_key"] and c["on_busy"] == "dead_letter"):
                v.append(f"bad-cause: entry {eid} dead-lettered busy with on_busy {c['on_busy']}")
            later = [x for x in xs if x["sent"] > min(dd["t"] for dd in dl) + SLACK]
            if later:
                v.append(f"delivered-after-refusal: entry {eid} refused (busy) then delivered "
                         f"at {later[0]['start'] - run.hist.t0:.2f}s")
        elif reason == "chaos-drop":
            if not any(x["answer"] == "drop" for x in xs):
                v.append(f"bad-cause: entry {eid} dead-lettered as dropped, never dropped by a worker")
        elif reason.startswith("max_deliveries"):
            if failed + lost_allowance(eid, d["t"]) + slow_claims(eid, d["t"]) + \
                    refused_setbacks(eid, d["t"]) < c["max_deliveries"]:
                v.append(f"bad-cause: entry {eid} dead-lettered '{reason[:70]}' after {len(xs)} "
                         f"recorded deliveries, {failed} failed (max_deliveries {c['max_deliveries']})")
        elif reason.startswith("conflict"):
            if not c.get("fingerprint") or c.get("on_conflict") != "dead_letter":
                v.append(f"bad-conflict: entry {eid} dead-lettered '{reason[:60]}' with fingerprint "
                         f"'{c.get('fingerprint', '')}', on_conflict {c.get('on_conflict')}")
            elif mark[1] is None:
                v.append(f"bad-conflict: entry {eid} dead-lettered as a conflict, its key has no "
                         f"fingerprinted done mark")
            elif (not other or mark[1] not in reason) and judged_by_an_earlier_mark(key, mark, d, ev):
                pass
            elif not other:
                v.append(f"bad-conflict: entry {eid}, a true copy (fingerprint {ev.get('fp')} as the done "
                         f"mark's), dead-lettered as a conflict")
            elif mark[1] not in reason or ev["fp"] not in reason:
                v.append(f"bad-conflict: entry {eid} ({ev['fp']}, done mark {mark[1]}): '{reason[:100]}'")
        else:
            v.append(f"bad-cause: good entry {eid} dead-lettered: {reason[:100]}")
        if reason != "busy" and not st["done"].get(key):
            v.append(f"not-done: entry {eid} dead-lettered ({reason[:40]}) but key not marked done")

    # 6. Nothing marked done that no worker acked (or dropped/exhausted).
    handled = {x["key"] for x in rows if x["answer"] in ("ack", "drop")}
    # An entry a replica logged exhausted is marked done even when its one dead letter
    # (per entry across replicas, group-less) is another replica's busy refusal (seed 145).
    exhausted = set()
    for p in run.proxies:
        exhausted.update(m.group(1) for m in re.finditer(
            r"stream \S+ entry (\S+) key .*: max_deliveries \(\d+\) reached", p.log_text()))
    for eid, ev in entry_ev.items():
        for d in st["dls"].get(eid, []):
            if d["reason"] != "busy":
                handled.add(ev.get("key"))
        if eid in exhausted:
            handled.add(ev.get("key"))
    for k, isdone in st["done"].items():
        if isdone and k not in handled:
            v.append(f"done-unacked: key {k[:60]} is done but no worker acked it")
    # ... and its mark keeps the fingerprint of a copy that was acked (or dropped or
    # dead-lettered after max_deliveries), never one of a copy no worker handled.
    if c.get("fingerprint"):
        fps = defaultdict(set)
        for x in rows:
            if x["answer"] in ("ack", "drop"):
                fps[x["key"]].add(entry_ev.get(x["entry"], {}).get("fp"))
        for eid, ev in entry_ev.items():
            if eid in exhausted or any(d["reason"].startswith("max_deliveries") for d in st["dls"].get(eid, [])):
                fps[ev.get("key")].add(ev.get("fp"))
        for k, (ms, fp) in st.get("marks", {}).items():
            if k not in handled:
                continue
            if fp is None:
                v.append(f"mark-without-fingerprint: key {k[:60]} done without a fingerprint "
                         f"('{c['fingerprint']}' set)")
            elif fp not in fps[k]:
                v.append(f"mark-of-unhandled-copy: key {k[:60]} done with fingerprint {fp}, which no "
                         f"copy a worker acked carries ({sorted(f for f in fps[k] if f)})")

    # 7. Nothing pending in the group.
    if c["group"] and st["pending"] != 0:
        v.append(f"pending: {st['pending']} entries still pending in group {GROUP}")

    # 8. Memory bounded.
    if not run.asan:
        for i, samples in run.rss.items():
            peak = max(kb for _, kb in samples) if samples else 0
            if peak > 128 * 1024:
                v.append(f"memory: replica{i} peak RSS {peak // 1024} MiB (limit 128 MiB)")
            last = run.final_rss.get(i, 0)
            if last > FINAL_RSS_KB:
                v.append(f"memory: replica{i} RSS {last // 1024} MiB at the end (limit 32 MiB)")

    # 9. --db: the database.
    if c.get("db"):
        v += check_db(run, rows)
    return v


# --- driving seeds ------------------------------------------------------------------

def describe(c):
    parts = ["CLUSTER" if c["cluster"] else "", "TLS" if c.get("tls") else "",
             "NET" if c.get("net") else "", "DB" if c.get("db") else "", c["layout"],
             "group" if c["group"] else "group-less",
             f"lock_key/{c['on_busy']}" if c["lock_key"] else "no-lock_key",
             f"lease={c['lease_ms']}", f"wait={c['wait_ms']}", f"ack_to={c['ack_timeout_ms']}",
             f"inflight={c['max_inflight']}", f"replicas={c['replicas']}", f"mix={c['mix']}",
             f"maxdel={c['max_deliveries']}", f"limit={c['max_entry_bytes']}",
             "fencing" if c["fencing"] else "", "fields-mode" if c.get("fields_mode") else "",
             f"linger={c['linger_ms']}" if c.get("linger_ms") else "",
             f"tracing={c['tracing']}" if c.get("tracing") is not None else "",
             f"fingerprint={c['fingerprint']}/{c['on_conflict']}" if c.get("fingerprint") else "",
             f"batch={c['batch_ms']}" if c.get("batch_ms") is not None else ""]
    kinds = Counter(ev["kind"] for ev in c["events"])
    parts.append(",".join(f"{k}:{n}" for k, n in sorted(kinds.items())))
    other = sum(1 for ev in c["events"] if ev.get("amount") == 2)
    if other:
        parts.append(f"conflicting-copies:{other}")
    if any(ev.get("forged") for ev in c["events"]):
        parts.append("forged-good")
    parts.append("faults=" + ",".join(f"{f['kind']}{'/' + f['command'] if 'command' in f else ''}"
                                      f"{'/' + str(f['mbps']) + 'MB/s' if 'mbps' in f else ''}"
                                      f"{'/' + '+'.join(f['locks']) if 'locks' in f else ''}"
                                      f"{'/r' + ','.join(map(str, f.get('replicas', [f['replica']]))) if f['kind'] in LINK_KINDS else ''}"
                                      f"@{f['t']}"
                                      for f in c["faults"]))
    if c.get("retry_hold"):
        parts.append("retry_hold")
    return " ".join(p for p in parts if p)


def outcomes(run):
    """What the issue 31 and 37 draws came to (--seed): conflicts dead-lettered,
    copies of another fingerprint than their key's mark, hostile entries dead-lettered."""
    st, c = run.state, run.c
    dls = {eid: d[0]["reason"] for eid, d in st["dls"].items() if d}
    conflicts = sum(1 for r in dls.values() if r.startswith("conflict"))
    marks = st.get("marks", {})
    other = sum(1 for eid, ev, _ in run.entries if ev.get("fp") and marks.get(ev.get("key"), (0, None))[1]
                not in (None, ev["fp"]))
    hostile = [(eid, ev["kind"]) for eid, ev, _ in run.entries if ev["kind"] in HOSTILE_KINDS]
    hdl = Counter(f"{kind}: {dls[eid][:40]}" for eid, kind in hostile if eid in dls)
    return (f"outcomes: {conflicts} conflict dead letters, {other} copies of another fingerprint than "
            f"their key's mark, {sum(1 for m in marks.values() if m[1])}/{len(marks)} marks with one; "
            f"hostile {sum(hdl.values())}/{len(hostile)} dead-lettered {dict(hdl)}")


def replay_cmd(seed, binary, cluster=False):
    b = Path(binary).resolve()
    default = (ROOT / "build" / "idemproxy").resolve()
    cmd = f"make chaos SEED={seed}" + (" CLUSTER=1" if cluster else "") + (" TLS=1" if TLS else "") \
        + (" NET=1" if NET else "") + (" DB=1" if DB else "") + (f" MUTANT={MUTANT}" if MUTANT else "")
    if b == default:
        return cmd
    rel = os.path.relpath(b.parent, ROOT)
    return f"{cmd} B={rel}" + (" SANITIZE=address" if _is_asan(b) else "")


def run_seed(seed, binary, verbose=False, keep=False, cluster=False):
    tmp = Path(tempfile.mkdtemp(prefix=f"chaos-{'c' if cluster else ''}{seed}-"))
    t = time.time()
    run = Run(seed, binary, tmp, verbose, cluster)
    dbline = ""
    try:
        run.execute()
        v = check(run)
        if verbose and run.state is not None:
            run.log(outcomes(run))
        if run.c.get("db"):
            dbline = "  " + db_summary(run)[0]
    except Exception:
        v = ["harness: " + traceback.format_exc().strip().replace("\n", "\n    ")]
        for p in run.proxies:
            if p.proc is not None:
                p.stop(signal.SIGKILL)
        run.stopping.set()
        try:
            run.redis.stop()
        except Exception:
            pass
        if run.db is not None:
            run.db.drop()
    dt = time.time() - t
    if v or keep:               # --keep: the history of a passing seed too
        try:
            (tmp / "history.json").write_text(json.dumps(
                {"seed": seed, "t0": run.hist.t0, "rows": run.hist.rows, "faults": run.hist.faults,
                 "entries": [(e, ev.get("key", "")[:80], ev["kind"]) for e, ev, _ in run.entries],
                 "violations": v, "db": run.db_state}, indent=1, default=str))
        except Exception:
            pass
    if v:
        print(f"seed {seed}{'c' if cluster else ''}: FAIL in {dt:.1f}s  [{describe(run.c)}]{dbline}")
        seen = Counter()
        for line in v:
            tag = line.split(":")[0]
            seen[tag] += 1
            if seen[tag] <= 3:
                print(f"    {line}")
        for tag, n in seen.items():
            if n > 3:
                print(f"    ... {n - 3} more {tag}")
        print(f"    logs: {tmp}")
        print(f"    replay: {replay_cmd(seed, binary, cluster)}")
    else:
        tag = f"{seed}{'c' if cluster else ''}"
        print(f"seed {tag}: ok in {dt:.1f}s  [{describe(run.c)}]{dbline}" if verbose else
              f"seed {tag}: ok in {dt:.1f}s{dbline}")
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    sys.stdout.flush()
    return not v, v


def run_parallel(a, seeds):
    """Each seed in a process of its own, a.jobs at a time (a run mostly waits:
    on its timeline, on timeouts, on settling), each printing as it ends."""
    import concurrent.futures
    t0 = time.time()

    def one(seed_cluster):
        s, cluster = seed_cluster
        if a.fixed and time.time() - t0 > a.budget:
            return s, cluster, False, f"seed {s}{'c' if cluster else ''}: not run, the {a.budget:.0f} s budget is spent: counted failed\n"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--bin", str(pxtest.BIN), "--seeds", "1",
               "--from", str(s)] + (["--cluster"] if cluster else []) + (["--keep"] if a.keep else []) \
            + (["--tls"] if TLS else []) + (["--net"] if NET else []) + (["--db"] if DB else []) \
            + (["--mutant", MUTANT] if MUTANT else [])
        res = subprocess.run(cmd, capture_output=True, text=True)
        out = "".join(l + "\n" for l in res.stdout.splitlines()
                      if l.strip() and not l.startswith(("chaos:", "failed seeds:", "replay one:"))
                      and not re.fullmatch(r"\d+ passed, \d+ failed", l.strip()))
        return s, cluster, res.returncode == 0, out + res.stderr[-2000:]

    passed = failed = 0
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as ex:
        for s, cluster, ok, out in ex.map(one, seeds):
            sys.stdout.write(out)
            sys.stdout.flush()
            if ok:
                passed += 1
            else:
                failed += 1
                failures.append((s, cluster))
    print(f"\nchaos: {len(seeds)} seeds in {time.time() - t0:.0f}s, {a.jobs} at a time")
    if failures:
        print("failed seeds: " + " ".join(f"{s}{'c' if c else ''}" for s, c in failures))
        print(f"replay one:   {replay_cmd(failures[0][0], pxtest.BIN, failures[0][1])}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, help="run this one seed, verbose")
    ap.add_argument("--seeds", type=int, default=20, help="how many seeds (default 20)")
    ap.add_argument("--from", dest="first", type=int, default=0, help="first seed")
    ap.add_argument("--fixed", action="store_true", help="the fixed set `make test` runs")
    ap.add_argument("--bin", default=str(pxtest.BIN), help="the idemproxy binary")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir of passing seeds")
    ap.add_argument("--show", action="store_true", help="print what the seed generates and exit")
    ap.add_argument("--budget", type=float, default=FIXED_BUDGET_S,
                    help=f"seconds the fixed set may take (default {FIXED_BUDGET_S})")
    ap.add_argument("--jobs", type=int, default=1,
                    help="run this many seeds at a time, each in its own process (default 1)")
    ap.add_argument("--cluster", action="store_true",
                    help="run the seeds against a Redis Cluster, with topology faults")
    ap.add_argument("--tls", action="store_true",
                    help="every proxy reaches Redis over mutual TLS; with --fixed, the fixed TLS seeds")
    ap.add_argument("--net", action="store_true",
                    help="each replica reaches Redis through a forwarder that loses or holds "
                         "chosen replies (single server, not with --tls or --cluster)")
    ap.add_argument("--db", action="store_true",
                    help="workers write each effect into PostgreSQL through the inbox and fence "
                         "(docs/database.md); the checker judges the database too; Redis may forget")
    ap.add_argument("--mutant", choices=["skip-fence"],
                    help="--db: a helper that skips its fence statement (the search must find it)")
    a = ap.parse_args()
    pxtest.BIN = Path(a.bin).resolve()
    global TLS, NET, DB, MUTANT
    TLS, NET, DB, MUTANT = a.tls, a.net, a.db, a.mutant
    if NET and (a.tls or a.cluster):
        ap.error("--net runs single-server seeds in plain TCP")
    if MUTANT and not DB:
        ap.error("--mutant needs --db")
    if a.show:
        seed = a.seed if a.seed is not None else a.first
        c = generate(seed)
        c = clusterize(c, seed) if a.cluster else c
        c = netize(c, seed) if NET else c
        print(describe(dbize(c, seed) if DB else c))
        return 0
    if a.seed is not None:
        seeds, verbose = [(a.seed, a.cluster)], True
    elif a.fixed and a.db:
        seeds, verbose = [(s, False) for s in FIXED_DB_SEEDS], False
    elif a.fixed and a.net:
        seeds, verbose = [(s, False) for s in FIXED_NET_SEEDS], False
    elif a.fixed and a.tls:
        seeds, verbose = [(s, False) for s in FIXED_TLS_SEEDS] + [(s, True) for s in FIXED_TLS_CLUSTER_SEEDS], False
    elif a.fixed:
        seeds, verbose = [(s, False) for s in FIXED_SEEDS] + [(s, True) for s in FIXED_CLUSTER_SEEDS], False
    else:
        seeds, verbose = [(s, a.cluster) for s in range(a.first, a.first + a.seeds)], False
    if DB:
        pg_url()            # one PostgreSQL for every seed this runs (IDEMPROXY_TEST_PG)
    if a.jobs > 1 and len(seeds) > 1:
        return run_parallel(a, seeds)
    passed = failed = 0
    failures = []
    t0 = time.time()
    for s, cluster in seeds:
        name = f"{s}{' (cluster)' if cluster else ''}"
        if a.fixed and time.time() - t0 > a.budget:
            print(f"seed {name}: not run, the {a.budget:.0f} s budget is spent: counted failed")
            failed += 1
            continue
        ok, v = run_seed(s, pxtest.BIN, verbose, a.keep, cluster)
        if ok:
            passed += 1
        else:
            failed += 1
            failures.append((s, cluster))
    print(f"\nchaos: {len(seeds)} seeds in {time.time() - t0:.0f}s")
    if failures:
        print("failed seeds: " + " ".join(f"{s}{'c' if c else ''}" for s, c in failures))
        print(f"replay one:   {replay_cmd(failures[0][0], pxtest.BIN, failures[0][1])}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
