"""bench/run.py - `make bench`: idemproxy against its baselines, in one run, on
one local redis-server, with the same data.

It starts ONE redis-server (a free port, a temp dir, no persistence) and, for
each measurement, FLUSHALLs it and reloads the same entries (bench_producer with
the same seed gives the same keys in the same order). Then:

  throughput, per read mode (group, plain) and layout (single, split): the
    stream is loaded before the proxy starts; workers (bench_worker, one REP
    socket per thread) connect; the proxy starts in group mode (XREADGROUP +
    XACK, the setup for many replicas) or group-less ("plain": XREAD from 0,
    nothing acked, seed 000's fromStart() setup).
    keys/s    = unique keys / time from the proxy's start to the worker's
                receipt of the last unique key;
    entries/s = N / time until /metrics shows entries_read = N and
                entries_pending = 0 (every entry done and XACKed);
    copies/s  = a second proxy re-reads the whole stream from 0 (XGROUP SETID)
                after every key is done: all N entries are skipped copies;
    CPU       = the proxy's utime + stime (/proc/PID/stat) for the run;
    Redis commands per unique key = INFO commandstats after CONFIG RESETSTAT;
    Redis CPU per unique key = INFO commandstats' usec summed (issue 18: what
                each pod costs the Redis they share), beside redis-server's own
                utime + stime over the run, and Redis' read and reply-write
                events (INFO stats; a pipeline in more pieces costs more of
                them); with (b)'s, and (a)'s in the split
                layout (its only form), per read mode and layout, and the pods
                one Redis core serves at 1k entries/s per pod.
  baselines on the same data: (a) the seeds' per-event algorithm, 5 round trips
    per new key (on a sample: it is slow; keys/s is a rate) and (b) the same
    dedup pipelined from C, for each read mode and layout, reading the way
    idemproxy does in that mode (XREADGROUP and XACK in group mode, so Redis
    does the same work; bench_baseline.c says what they do).
  latency: entries XADDed at a steady rate (each stamped with its send time) to
    an idle proxy; the worker histograms now - stamp at receipt. The same load
    read by a plain blocked XREAD client, no proxy, is the "floor". Issue 18's
    table (the sidecar tax): per rate, proxy CPU s per 1k entries, p99 and
    p99.9 over the floor's, its targets marked met or missed. Per entry at
    each rate: the proxy's CPU and context switches by thread (/proc/PID/task,
    the main libev loop and nanomsg's thread), Redis CPU (commandstats usec,
    XADD left out) and, from a second untimed run at the same rate, the
    proxy's system calls by kind and thread (perf stat on the
    syscalls:sys_enter_* tracepoints; strace -c -f where perf cannot).
  allocations: one more run of the first variant with bench/alloc_count.c
    preloaded into the proxy: heap allocations per entry read, by library.
  memory: VmRSS of an idle proxy, and with BENCH_HOLD entries claimed and held
    for a worker that never answers (max_inflight = BENCH_HOLD + 256), over a
    socket per 128 (idemproxy's most per connected worker; flow control sends
    each only its first window, the rest wait claimed).
  A/B, with BENCH_AB_BIN set to a second idemproxy binary (the "before" build,
    e.g. of the commit before a change): keys/s of this idemproxy ("now") and
    of that one on the same data, in rounds that interleave them (the order
    shifts each round), for two worker shapes: ONE worker of concurrency
    BENCH_AB_CONCURRENCY on one connection (bench_worker --concurrency: a raw
    REP socket, a receiving thread, that many handler threads) and the default
    BENCH_WORKERS one-socket workers. Each round gives a ratio now/before per
    shape; the row is their median and min-max, with each binary's median
    keys/s and proxy CPU, deliveries beyond one per unique key and the largest
    idemproxy_delivery_window the now binary showed; with
    BENCH_AB_CONTROL, the now binary runs once more in each round and now
    again / now is an A/A control, the noise of a ratio. Issue 21's target:
    flow control (576505c) keeps a worker of concurrency 16 at the throughput of
    576505c^. keys/s as in the throughput rows; no copies re-read.
Throughput runs and baselines are repeated in BENCH_REPEAT interleaved rounds;
each row is its median round.

Knobs (environment, default):
  BENCH_N 200000             entries in the throughput runs
  BENCH_COPIES 0.5           share of entries that repeat an earlier eventId
  BENCH_REPEAT 5             rounds of throughput runs and baselines (on 2 shared cores
                             one round of a row varies by up to +-20 %: the median of 5)
  BENCH_LAYOUTS single,split
  BENCH_READS group,plain    read modes of the throughput rows and of (b)
  BENCH_SAMPLE_A 5000        entries baseline (a) runs on
  BENCH_BATCH 256            baseline (b)'s pipeline batch
  BENCH_RATES 1000,5000,20000, BENCH_RATE_SECONDS 5, BENCH_LAT_LAYOUT single,
  BENCH_LAT_COPIES (= BENCH_COPIES)
  BENCH_LINGER_MS 5          the rate rows at 1k and 5k/s again with streams[].linger_ms
                             at this value (a fixed wait after every short page; not set
                             by default), shown beside the default rows; 0 or empty: not run
  BENCH_OFF 1                the rate rows at 1k and 5k/s again with streams[].batch_ms: 0
                             (no batch window: the lowest latency, the default before
                             issue 34), shown beside the default rows; 0: not run
  BENCH_SLOW_RATE 15, BENCH_SLOW_SECONDS 60  a latency row with entries more than 50 ms
                             apart (the batch window must not hold them); 0: not run.
                             60 s: about 450 deliveries (half the entries are copies), so
                             its p99 is the fifth-slowest, not the slowest (10 s made it
                             the slowest of 75: one stall of the VM)
  BENCH_HEAD_ROUNDS 3        rounds of the headline pair (idemproxy with the defaults, then
                             the live guard) at each rate, interleaved over the rates: the
                             headline's ratio and p99 are their median, with the range
  BENCH_LAT_CONTROL 1        each rate row's idemproxy run again just after it (an A/A
                             control: again / first is the noise of the headline's CPU
                             ratio); 0: not run
  BENCH_WORKERS (cores, at least 2)  worker threads, one REP socket each: a worker pool
                             sized to the machine, as one would deploy it (4 threads on 2
                             cores measured ~9 % fewer keys/s: they compete with Redis)
  BENCH_MAX_INFLIGHT 256     the proxy's default
  BENCH_HOLD 10000           deliveries held for the memory measurement
  BENCH_PERF ""              "record": `perf record -g` the proxy in the first
                             throughput run (build/bench/perf-<layout>.txt);
                             "stat": its context switches and syscalls per
                             thread (build/bench/perf-stat-<layout>.txt)
  BENCH_SYSCALLS perf        how the latency rates' system calls are counted: perf, strace,
                             or empty (not counted; saves a run per rate)
  BENCH_CLUSTER_N 100000     entries in the Redis Cluster rows (bench/cluster.py): 1, 2
                             and 3 idemproxy replicas against a local 3-master cluster
  BENCH_TLS group/single      read modes/layouts of the TLS throughput rows: idemproxy on
                             rediss:// to a TLS port of the same redis-server (a CA and
                             a server pair made by the openssl CLI; TLS 1.3, the server's
                             default ciphers), in the same rounds as the plain rows. (b)
                             has no TLS row: it is built on hiredis 0.14, which has none.
  BENCH_FP group/single      read modes/layouts of the fingerprint rows: idemproxy with
                             streams[].fingerprint "#event" (every entry's whole event
                             parsed, canonicalised and hashed; the hash rides in the done
                             mark and is compared on every copy), in the same rounds as the
                             rows without it, and the ratio of the two
  BENCH_FENCE group/single   read modes/layouts of the fencing rows: idemproxy with
                             streams[].fencing true (each claim also raises the fencing
                             counter by a script, on the claim's own round trip), in the
                             same rounds as the rows without it, and the ratio of the two
  BENCH_AB_BIN ""             a second idemproxy binary for the A/B rows (unset or empty: no A/B)
  BENCH_AB_VARIANT group/single  read mode and layout of the A/B runs
  BENCH_AB_CONCURRENCY 16    handler threads of the one-connection worker
  BENCH_AB_SHAPES c,w        worker shapes of the A/B rows: c the one connection of
                             concurrency BENCH_AB_CONCURRENCY, w the BENCH_WORKERS sockets
  BENCH_AB_CONTROL 1         also run this idemproxy a second time in every round (an A/A
                             control: the spread of its ratio is the noise); 0: only A/B
  BENCH_AB_REPEAT (= BENCH_REPEAT)  A/B rounds
  BENCH_TRACING off,1.0,0.01,down,500  the tracing rows (issue 32): the BENCH_TRACING_VARIANT
                             throughput run with tracing off and on at each sample_ratio
                             given, spans POSTed to a local OTLP sink (an HTTP server in
                             this process that answers 200); "down": ratio 1.0 to a port
                             nobody listens on, "500": ratio 1.0 to a sink that answers
                             500 (every span a counted drop: keys/s should not move);
                             proxy CPU per 1k entries and keys/s beside each other, in
                             BENCH_REPEAT interleaved rounds; empty: not run
  BENCH_TRACING_VARIANT group/single
  BENCH_CLIENTS c,go,java,node,python,rust  the client rows (issue 32): each client's
                             example worker (clients/<lang>, `make example`, built first;
                             a client that does not build gets a row saying so) against
                             idemproxy (group/single) with the same traffic: after
                             BENCH_CLIENT_WARMUP deliveries (the runtime's start and JIT
                             left out), BENCH_CLIENT_N unique entries; the worker's CPU
                             (utime + stime of every process of its session) per 1k
                             deliveries, beside each other, in BENCH_REPEAT interleaved
                             rounds; empty: not run
  BENCH_CLIENT_N 50000, BENCH_CLIENT_WARMUP 2000, BENCH_CLIENT_CONCURRENCY 16
                             (WORKER_CONCURRENCY of each example; C's handles one at a time;
                             Rust's is built with PROFILE=release, as a user would ship it;
                             CPU comes in 10 ms ticks: C's 50k deliveries are about 20 of them)
  BENCH_TIMEOUT 300          seconds any one wait may take
  IDEMPROXY_BIN build/idemproxy (copied first: a rebuild meanwhile is harmless)
An empty BENCH_RATES, BENCH_LAYOUTS, BENCH_READS, BENCH_TLS, BENCH_FP or BENCH_FENCE, or 0 for BENCH_SAMPLE_A, BENCH_HOLD or
BENCH_CLUSTER_N, skips that part: e.g. only the A/B rows,
  BENCH_AB_BIN=/tmp/before/build/idemproxy BENCH_N=50000 BENCH_READS= BENCH_SAMPLE_A=0 \
  BENCH_RATES= BENCH_HOLD=0 BENCH_CLUSTER_N=0 make -C bench run Prints the table and writes build/bench/results.md and
results.json. A missed target never fails the run: the table says which were met.
"""
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import redis as redis_lib

import cluster as bench_cluster

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "bench"
BIN_DIR = OUT
STREAM, GROUP = "bench", "bench"


def env(name, default, conv=str):
    v = os.environ.get(name)
    return default if v is None else conv(v)


N = env("BENCH_N", 200000, int)
COPIES = env("BENCH_COPIES", 0.5, float)
LAT_COPIES = env("BENCH_LAT_COPIES", COPIES, float)
RATES = [int(x) for x in env("BENCH_RATES", "1000,5000,20000").split(",") if x]
# streams[].linger_ms of the extra rate rows at 1k and 5k/s (0: none; it is not set by default)
LINGER_MS = int(env("BENCH_LINGER_MS", "5") or 0)
OFF_ROWS = env("BENCH_OFF", 1, int)                 # the rate rows again with batch_ms: 0
SLOW_RATE = env("BENCH_SLOW_RATE", 15.0, float)     # entries/s of the row "more than 50 ms apart"
SLOW_SECONDS = env("BENCH_SLOW_SECONDS", 60.0, float)
LAT_CONTROL = env("BENCH_LAT_CONTROL", 1, int)
HEAD_ROUNDS = max(1, env("BENCH_HEAD_ROUNDS", 3, int))
RATE_SECONDS = env("BENCH_RATE_SECONDS", 5.0, float)
SAMPLE_A = env("BENCH_SAMPLE_A", 5000, int)
WORKERS = env("BENCH_WORKERS", max(2, os.cpu_count() or 2), int)
MAX_INFLIGHT = env("BENCH_MAX_INFLIGHT", 256, int)
HOLD = env("BENCH_HOLD", 10000, int)
CLUSTER_N = env("BENCH_CLUSTER_N", 100000, int)
HOLD_INFLIGHT = HOLD + 256
LAYOUTS = [x for x in env("BENCH_LAYOUTS", "single,split").split(",") if x]
READS = [x for x in env("BENCH_READS", "group,plain").split(",") if x]
VARIANTS = [f"{read}/{layout}" for read in READS for layout in LAYOUTS]   # "group/single", ...
TLS_VARIANTS = [x for x in env("BENCH_TLS", "group/single").split(",") if x]
FP_VARIANTS = [x for x in env("BENCH_FP", "group/single").split(",") if x]
FP_LABEL = ', fingerprint "#event"'
FENCE_VARIANTS = [x for x in env("BENCH_FENCE", "group/single").split(",") if x]
LAT_LAYOUT = env("BENCH_LAT_LAYOUT", "single")
BATCH = env("BENCH_BATCH", 256, int)
PERF = env("BENCH_PERF", "")
SYSCALLS = env("BENCH_SYSCALLS", "perf")
PERF_EVENTS = ("task-clock,context-switches,cpu-migrations,syscalls:sys_enter_write,"
               "syscalls:sys_enter_read,syscalls:sys_enter_sendmsg,syscalls:sys_enter_recvmsg,"
               "syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex")
TIMEOUT = env("BENCH_TIMEOUT", 300.0, float)
TRACING = [x for x in env("BENCH_TRACING", "off,1.0,0.01,down,500").split(",") if x]
TRACING_VARIANT = env("BENCH_TRACING_VARIANT", "group/single")
CLIENTS = [x for x in env("BENCH_CLIENTS", "c,go,java,node,python,rust").split(",") if x]
CLIENT_N = env("BENCH_CLIENT_N", 50000, int)
CLIENT_WARMUP = env("BENCH_CLIENT_WARMUP", 2000, int)
CLIENT_CONCURRENCY = env("BENCH_CLIENT_CONCURRENCY", 16, int)
CLIENT_MAKE = {"rust": ["PROFILE=release"]}   # as a user ships it (its `make example` is the dev profile)
REPEAT = env("BENCH_REPEAT", 5, int)
AB_BIN = env("BENCH_AB_BIN", "")
AB_VARIANT = env("BENCH_AB_VARIANT", "group/single")
AB_CONCURRENCY = env("BENCH_AB_CONCURRENCY", 16, int)
AB_REPEAT = env("BENCH_AB_REPEAT", REPEAT, int)
AB_SHAPE_NAMES = [x for x in env("BENCH_AB_SHAPES", "c,w").split(",") if x]
AB_CONTROL = env("BENCH_AB_CONTROL", 1, int)
SEED = 1
CLK_TCK = os.sysconf("SC_CLK_TCK")
SPAWNED = []        # every process started here, killed at the end if still running


def spawn(cmd, **kw):
    proc = subprocess.Popen(cmd, **kw)
    SPAWNED.append(proc)
    return proc


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg():
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_ticks():
    """(steal, total) ticks of all CPUs from /proc/stat: time a hypervisor gave
    to other guests shows as steal, and explains a slow run."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return f[7] if len(f) > 7 else 0, sum(f[:8])


def run_cpu(b, p, w):
    """CPU seconds so far of everything a latency run starts: the proxy, Redis,
    the worker and (finished children of this script) the producer. From
    utime + stime, which Linux scales to each task's exact run time, where
    /proc/stat's per-tick sampling misses the short bursts of a modest rate."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return p.cpu() + b.redis_cpu() + cpu_seconds(w.proc.pid) + ru.ru_utime + ru.ru_stime


def cpu_seconds(pid):
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_stats(pid):
    """Per thread of pid, {tid: [cpu_s, voluntary, nonvoluntary context switches]}
    (/proc/PID/task/TID/stat and status)."""
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            f = (t / "stat").read_text().rsplit(")", 1)[1].split()
            sw = {k: int(v) for k, v in (line.split(":") for line in (t / "status").read_text().splitlines()
                                         if "ctxt_switches:" in line)}
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[int(t.name)] = [(int(f[11]) + int(f[12])) / CLK_TCK, sw.get("voluntary_ctxt_switches", 0),
                            sw.get("nonvoluntary_ctxt_switches", 0)]
    return out


def thread_label(pid, tid, tids):
    """The main thread runs idemproxy's libev loop; the others are nanomsg's
    (its worker thread; idemproxy starts none of its own)."""
    if tid == pid:
        return "main loop"
    others = sorted(t for t in tids if t != pid)
    return "nanomsg thread" + (f" {others.index(tid) + 1}" if len(others) > 1 else "")


def status_kib(pid, key):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


class Bench:
    def __init__(self, tmp):
        self.tmp = Path(tmp)
        # A private copy of the binary: others may rebuild build/idemproxy meanwhile.
        src = Path(os.environ.get("IDEMPROXY_BIN", ROOT / "build" / "idemproxy"))
        self.bin = self.tmp / "idemproxy"
        shutil.copy2(src, self.bin)
        self.port = free_port()
        self.tls_port = free_port() if TLS_VARIANTS else 0
        self.redis_proc = spawn(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.tmp),
             "--save", "", "--appendonly", "no", *self.tls_args()],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.r = redis_lib.Redis(port=self.port, decode_responses=True)
        self.wait(self._ping, 10, "redis-server")
        self.nproxy = 0

    def tls_args(self):
        """The same redis-server also serves TLS on tls_port (no client certificate
        wanted), with a CA and a server pair the openssl CLI makes here."""
        if not self.tls_port:
            return []
        def openssl(*args):
            subprocess.run(["openssl", *args], cwd=self.tmp, check=True, capture_output=True, timeout=60)
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=bench-ca",
                "-keyout", "ca.key", "-out", "ca.crt")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key",
                "-out", "server.csr")
        (self.tmp / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
        openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-extfile", "server.ext", "-out", "server.crt")
        return ["--tls-port", str(self.tls_port), "--tls-cert-file", str(self.tmp / "server.crt"),
                "--tls-key-file", str(self.tmp / "server.key"), "--tls-ca-cert-file", str(self.tmp / "ca.crt"),
                "--tls-auth-clients", "no"]

    def _ping(self):
        try:
            return self.r.ping()
        except redis_lib.exceptions.ConnectionError:
            return False

    def close(self):
        for proc in SPAWNED:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    @staticmethod
    def wait(cond, timeout, what, every=0.025):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = cond()
            if v:
                return v
            time.sleep(every)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")

    # --- data and Redis ---------------------------------------------------

    def load(self, n=N, copies=COPIES, prefix="evt", seed=SEED, rate=None, seconds=None):
        """FLUSHALL-free: XADD entries with bench_producer; returns its JSON."""
        cmd = [str(BIN_DIR / "bench_producer"), "--port", str(self.port), "--stream", STREAM,
               "--copies", str(copies), "--seed", str(seed), "--prefix", prefix]
        cmd += ["--rate", str(rate), "--seconds", str(seconds)] if rate else ["--entries", str(n)]
        return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)

    def fresh(self, **kw):
        self.r.flushall()
        return self.load(**kw)

    def reset_stats(self):
        self.r.config_resetstat()

    def command_stats(self, field="calls", skip=()):
        """Calls (or, field="usec", microseconds of Redis CPU spent executing them)
        per command since the last reset, without the bench's own and 'skip'."""
        own = {"info", "config|resetstat", "flushall", "ping", "xgroup|setid", *skip}
        stats = {}
        for k, v in self.r.info("commandstats").items():
            name = k.removeprefix("cmdstat_")
            if name not in own and not name.startswith("client|"):
                stats[name] = v[field]
        return stats

    def io_events(self):
        """Redis' read and write events so far (INFO stats total_reads_processed,
        total_writes_processed): a pipeline that arrives in more, smaller pieces
        costs Redis a read() and a reply write() per piece, which commandstats
        leaves out."""
        st = self.r.info("stats")
        return st.get("total_reads_processed", 0) + st.get("total_writes_processed", 0)

    def redis_cpu(self):
        """redis-server's own utime + stime: command execution and everything
        around it (reading, parsing, replying), which commandstats' usec leaves out."""
        return cpu_seconds(self.redis_proc.pid)

    # --- processes --------------------------------------------------------

    def proxy(self, layout, max_inflight=MAX_INFLIGHT, ack_timeout_ms=30000, read="group", binary=None,
              tls=False, linger_ms=0, fingerprint="", tracing=None, stream_opts=None):
        self.nproxy += 1
        name = f"proxy{self.nproxy}"
        endpoint = f"ipc://{self.tmp}/app.sock"
        mport = free_port()
        cfg = self.tmp / f"{name}.yaml"
        group = f"    group: {GROUP}\n" if read == "group" else ""
        url = (f"rediss://127.0.0.1:{self.tls_port}\n  tls: {{ca_file: '{self.tmp / 'ca.crt'}'}}" if tls
               else f"redis://127.0.0.1:{self.port}")
        cfg.write_text(f"""redis:
  url: {url}
app:
  endpoint: {endpoint}
  max_inflight: {max_inflight}
  ack_timeout_ms: {ack_timeout_ms}
metrics:
  listen: 127.0.0.1:{mport}
log:
  level: warn
shutdown_grace_ms: 2000
""" + (f"tracing:\n  otlp_endpoint: {tracing[0]}\n  sample_ratio: {tracing[1]}\n" if tracing else "") + f"""streams:
  - stream: {STREAM}
{group}    consumer: bench
    payload_field: payload
    key: "#event.eventId"
    layout: {layout}
""" + (f"    linger_ms: {linger_ms}\n" if linger_ms else "")
          + (f"    fingerprint: \"{fingerprint}\"\n" if fingerprint else "")
          + "".join(f"    {k}: {v}\n" for k, v in (stream_opts or {}).items()))
        return Proxy(binary or self.bin, cfg, self.tmp / f"{name}.log", mport, endpoint)

    def worker(self, endpoint, expect=0, hold=False, concurrency=0):
        return Worker(self.tmp, endpoint, expect, hold, concurrency)


class Proxy:
    def __init__(self, binary, cfg, logpath, mport, endpoint):
        self.binary, self.cfg, self.logpath, self.mport, self.endpoint = binary, cfg, logpath, mport, endpoint
        self.proc = None

    def start(self, perf=None, perf_out=None, env=None):
        self.logf = open(self.logpath, "ab")
        self.t0 = time.monotonic()
        self.proc = spawn([str(self.binary), "-c", str(self.cfg)], stdout=self.logf,
                          stderr=subprocess.STDOUT, env=env)
        self.perf = None
        if perf == "record":
            cmd = ["perf", "record", "-g", "-q", "-o", f"{perf_out}.data"]
        elif perf == "stat":
            cmd = ["perf", "stat", "--per-thread", "-e", PERF_EVENTS, "-o", f"{perf_out}.txt"]
        if perf:
            self.perf = spawn(cmd + ["-p", str(self.proc.pid)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        return self

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.mport}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, ""
        except (urllib.error.URLError, ConnectionError, OSError):
            return 0, ""

    def metrics(self):
        out = {}
        for line in self.get("/metrics")[1].splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                # one stream block: drop its stream and group labels
                k = re.sub(r'group="[^"]*",?', "", k.replace(f'stream="{STREAM}",', ""))
                out[k.replace(f'stream="{STREAM}"', "").replace("{,", "{").replace("{}", "")] = float(v)
        return out

    def alive(self):
        """Raises when the proxy is gone; else False (for use inside wait conditions)."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"idemproxy exited with {self.proc.returncode}; see {self.logpath}:\n"
                               + self.logpath.read_text(errors="replace")[-2000:])
        return False

    def finished(self, n):
        """Metrics when n entries were read and none is pending, else None."""
        self.alive()
        m = self.metrics()
        if m.get("idemproxy_entries_read_total", -1) >= n and m.get("idemproxy_entries_pending", 1) == 0:
            return m
        return None

    def ready(self):
        self.alive()
        return self.get("/readyz")[0] == 200

    def cpu(self):
        return cpu_seconds(self.proc.pid)

    def rss_kib(self):
        return status_kib(self.proc.pid, "VmRSS")

    def hwm_kib(self):
        return status_kib(self.proc.pid, "VmHWM")

    def stop(self):
        if self.perf:
            self.perf.send_signal(signal.SIGINT)
            self.perf.wait(30)
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.logf.close()
        return rc


class Worker:
    def __init__(self, tmp, endpoint, expect, hold, concurrency=0):
        self.progress = Path(tmp) / "worker.progress"
        self.progress.unlink(missing_ok=True)
        cmd = [str(BIN_DIR / "bench_worker"), "--endpoint", endpoint, "--progress", str(self.progress)]
        # Holding: a socket per 128 deliveries, idemproxy's window per worker.
        # Concurrency: one socket, that many handler threads.
        cmd += (["--hold", "--threads", str(HOLD // 128 + 1)] if hold else
                ["--concurrency", str(concurrency), "--expect", str(expect)] if concurrency else
                ["--threads", str(WORKERS), "--expect", str(expect)])
        self.proc = spawn(cmd, stdout=subprocess.PIPE, text=True)

    def count(self):
        try:
            return int(self.progress.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=15)
        return json.loads(out.strip().splitlines()[-1])


# --- measurements -------------------------------------------------------------

def median_run(runs):
    """The run with the median keys/s, with the spread of all runs attached, and
    each round's Redis µs per key in round order (redis_ratio pairs them)."""
    usec = [r.get("redis_usec_per_key") for r in runs]
    runs = sorted(runs, key=lambda r: r["keys_per_s"])
    med = dict(runs[(len(runs) - 1) // 2])
    med["keys_range"] = [runs[0]["keys_per_s"], runs[-1]["keys_per_s"]]
    med["all_keys_per_s"] = [r["keys_per_s"] for r in runs]
    med["rounds_redis_usec_per_key"] = usec
    return med


def redis_ratio(t, bb):
    """idemproxy / (b) Redis µs per key: the median of the ratios of the same
    round (idemproxy and (b) run one after the other in each, so a change in
    this machine's load meets both), with their min and max. The medians of each
    side apart swing more: (b) alone, run 6 times in a row, spent 8.7 to 13.7 µs
    per key on the shared 2-core VM (2026-11-25)."""
    rs = sorted(x / y for x, y in zip(t.get("rounds_redis_usec_per_key", []), bb.get("rounds_redis_usec_per_key", []))
                if x and y)
    if not rs:
        r = t["redis_usec_per_key"] / bb["redis_usec_per_key"]
        return r, r, r
    return rs[(len(rs) - 1) // 2], rs[0], rs[-1]


def spread(r):
    lo, hi = r["keys_range"]
    return f"{r['keys_per_s']:,.0f}" + (f" ({lo:,.0f}–{hi:,.0f})" if hi > lo else "")


def throughput(b, variant, data, perf=None, tls=False, fp=False, fence=False):
    read, layout = variant.split("/")
    log(f"throughput, {read} read, layout {layout}{', TLS' if tls else ''}: {N} entries loaded, "
        f"{data['unique']} unique keys")
    b.reset_stats()
    rcpu0, io0 = b.redis_cpu(), b.io_events()
    w = b.worker(f"ipc://{b.tmp}/app.sock", expect=data["unique"])
    time.sleep(0.2)                                      # let the worker's sockets exist
    fpt = "#event" if fp else ""
    p = b.proxy(layout, read=read, tls=tls, fingerprint=fpt, stream_opts={"fencing": "true"} if fence else None)
    perf = perf if variant == VARIANTS[0] and not tls and not fp and not fence else None
    p.start(perf, OUT / f"perf{'-stat' if perf == 'stat' else ''}-{layout}")
    m = b.wait(lambda: p.finished(N), TIMEOUT, f"{N} entries done ({variant})")
    t_all = time.monotonic() - p.t0
    cpu = p.cpu()
    hwm = p.hwm_kib()
    stats = b.command_stats()
    usec = b.command_stats("usec")
    rcpu, io = b.redis_cpu() - rcpu0, b.io_events() - io0
    rc = p.stop()
    wr = w.stop()
    t_keys = (wr["expect_mono"] / 1e6 - p.t0) if wr["expect_mono"] else float("nan")
    res = {
        "variant": variant + (" tls" if tls else "") + (" fp" if fp else "") + (" fence" if fence else ""), "tls": tls, "fp": fp, "fence": fence, "read": read, "layout": layout, "entries": N, "unique": data["unique"], "load": loadavg(),
        "t_keys": t_keys, "t_all": t_all,
        "keys_per_s": data["unique"] / t_keys, "entries_per_s": N / t_all,
        "cpu_s": cpu, "cpu_per_1k": cpu / (N / 1000), "vmhwm_kib": hwm,
        "deliveries": wr["deliveries"], "redeliveries": wr["redeliveries"],
        "max_gap_s": wr["max_gap_us"] / 1e6,
        "acked": m.get('idemproxy_outcomes_total{outcome="acked"}', 0),
        "duplicates": m.get('idemproxy_outcomes_total{outcome="duplicate"}', 0),
        "dup_before": m.get('idemproxy_duplicates_total{stage="before_lock"}', 0),
        "dup_after": m.get('idemproxy_duplicates_total{stage="after_lock"}', 0),
        "lock_busy": m.get("idemproxy_lock_busy_total", 0),
        "ack_timeouts": m.get("idemproxy_ack_timeouts_total", 0),
        "commands": stats, "commands_total": sum(stats.values()), "exit": rc,
    }
    res["cmds_per_key"] = res["commands_total"] / data["unique"]
    res.update(redis_usec=usec, redis_usec_per_key=sum(usec.values()) / data["unique"],
               redis_usec_per_entry=sum(usec.values()) / N, redis_cpu_us_per_key=rcpu * 1e6 / data["unique"],
               redis_io_per_key=io / data["unique"])
    if perf == "record":
        report = OUT / f"perf-{layout}.txt"
        with open(report, "w") as f:
            for how in (["--no-children", "--sort", "dso,symbol"], ["--children", "--sort", "symbol"]):
                subprocess.run(["perf", "report", "-i", str(OUT / f"perf-{layout}.data"), "--stdio",
                                "--percent-limit", "2", "-g", "none", *how],
                               stdout=f, stderr=subprocess.DEVNULL)
        res["perf_report"] = str(report.relative_to(ROOT))
    log(f"  keys/s {res['keys_per_s']:.0f} ({t_keys:.2f} s), entries/s {res['entries_per_s']:.0f} "
        f"({t_all:.2f} s), CPU {cpu:.2f} s, busy {res['lock_busy']:.0f}, cmds/key {res['cmds_per_key']:.2f}, "
        f"Redis µs/key {res['redis_usec_per_key']:.2f} (redis-server CPU {res['redis_cpu_us_per_key']:.1f}, "
        f"reads + writes {res['redis_io_per_key']:.3f}), longest gap {res['max_gap_s']:.2f} s")

    # The same stream again, every key done: all copies (a restart reading from 0;
    # group-less, a new proxy reads from "0" anyway).
    if read == "group":
        b.r.xgroup_setid(STREAM, GROUP, "0")
    b.reset_stats()
    p = b.proxy(layout, read=read, tls=tls, fingerprint=fpt)
    p.start()
    m = b.wait(lambda: p.finished(N), TIMEOUT, f"{N} copies skipped ({variant})")
    t_copy = time.monotonic() - p.t0
    res["copy_cpu_s"] = p.cpu()
    cstats = b.command_stats()
    p.stop()
    res["t_copies"] = t_copy
    res["copies_per_s"] = N / t_copy
    res["copy_dups"] = m.get('idemproxy_outcomes_total{outcome="duplicate"}', 0)
    res["copy_commands"] = cstats
    res["copy_cmds_per_entry"] = sum(cstats.values()) / N
    log(f"  re-read of the done stream: {res['copies_per_s']:.0f} copies/s ({t_copy:.2f} s), "
        f"{res['copy_cmds_per_entry']:.2f} cmds/entry")
    return res


class OtlpSink:
    """A local OTLP/HTTP collector for the tracing rows: answers 'status' (200)
    to every POST (reading the body), counting requests and bytes; decodes nothing."""

    def __init__(self, status=200):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        import threading
        sink = self
        self.posts = self.bytes = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                self.rfile.read(n)
                sink.posts += 1
                sink.bytes += n
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def tracing_run(b, ratio, data, sink):
    """One TRACING_VARIANT run with tracing off ("off") or on at sample_ratio
    'ratio': N entries loaded before the start, as in the throughput rows (no
    re-read of copies). Proxy CPU per 1k entries read, keys/s, spans exported."""
    read, layout = TRACING_VARIANT.split("/")
    log(f"tracing {ratio}, {read} read, layout {layout}: {N} entries")
    w = b.worker(f"ipc://{b.tmp}/app.sock", expect=data["unique"])
    time.sleep(0.2)
    tracing = (None if ratio == "off" else (f"http://127.0.0.1:{free_port()}", "1.0") if ratio == "down"
               else (sink[500].url, "1.0") if ratio == "500" else (sink[200].url, ratio))
    p = b.proxy(layout, read=read, tracing=tracing)
    p.start()
    m = b.wait(lambda: p.finished(N), TIMEOUT, f"{N} entries done (tracing {ratio})")
    t_all = time.monotonic() - p.t0
    cpu = p.cpu()
    p.stop()
    wr = w.stop()
    t_keys = (wr["expect_mono"] / 1e6 - p.t0) if wr["expect_mono"] else float("nan")
    res = {"ratio": ratio, "cpu_s": cpu, "cpu_per_1k": cpu / (N / 1000), "keys_per_s": data["unique"] / t_keys,
           "entries_per_s": N / t_all, "spans_exported": m.get("idemproxy_spans_exported_total", 0),
           "spans_dropped": m.get("idemproxy_spans_dropped_total", 0), "load": loadavg()}
    log(f"  CPU {cpu:.2f} s ({res['cpu_per_1k']:.3f} s / 1k entries), keys/s {res['keys_per_s']:.0f}, "
        f"spans exported {res['spans_exported']:.0f} (at the last look), dropped {res['spans_dropped']:.0f}")
    return res


def tracing_rows(b):
    """The TRACING runs in REPEAT interleaved rounds; per setting, its median by CPU."""
    sink = {200: OtlpSink(), 500: OtlpSink(500)}
    runs = {r: [] for r in TRACING}
    try:
        for rnd in range(REPEAT):
            for i in range(len(TRACING)):       # the order shifts each round
                r = TRACING[(i + rnd) % len(TRACING)]
                runs[r].append(tracing_run(b, r, b.fresh(), sink))
    finally:
        for k in sink.values():
            k.close()
    out = []
    for r in TRACING:
        rs = sorted(runs[r], key=lambda x: x["cpu_per_1k"])
        med = dict(rs[(len(rs) - 1) // 2])
        med["cpu_range"] = [rs[0]["cpu_per_1k"], rs[-1]["cpu_per_1k"]]
        out.append(med)
    return out


def tracing_report(rows):
    off = next((r for r in rows if r["ratio"] == "off"), None)
    md = (f"\n### Tracing: proxy CPU per entry (issue 32)\n\n{TRACING_VARIANT}, {N} entries, "
          f"{REPEAT} rounds (median by CPU, min-max); spans POSTed as OTLP JSON to a local sink "
          "that answers 200 (or 500; \"down\": nothing listens); spans counted at the last look.\n\n"
          "| tracing | proxy CPU s / 1k entries | µs / entry | vs off | keys/s | keys/s vs off | spans exported "
          "| spans dropped |\n|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        lo, hi = r["cpu_range"]
        rel = f"{(r['cpu_per_1k'] / off['cpu_per_1k'] - 1) * 100:+.1f} %" if off and r is not off else ""
        krel = f"{(r['keys_per_s'] / off['keys_per_s'] - 1) * 100:+.1f} %" if off and r is not off else ""
        name = {"off": "off", "down": "1.0, collector down", "500": "1.0, collector answers 500"}.get(
            r["ratio"], "sample_ratio " + r["ratio"])
        md += (f"| {name} | {r['cpu_per_1k']:.3f} ({lo:.3f}–{hi:.3f}) | {r['cpu_per_1k'] * 1000:.1f} | {rel} | "
               f"{r['keys_per_s']:,.0f} | {krel} | {r['spans_exported']:,.0f} | {r['spans_dropped']:,.0f} |\n")
    return md


def session_cpu(sid):
    """utime + stime of every live process of session 'sid' (a worker started by
    `make example`: make, the runtime, its threads), in seconds."""
    total = 0.0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(f[3]) == sid:
                total += (int(f[11]) + int(f[12])) / CLK_TCK
    return total


def build_clients():
    """`make -C clients/<lang>` for each of CLIENTS: {lang: None, or why it failed}."""
    out = {}
    for lang in CLIENTS:
        log(f"building clients/{lang}")
        try:
            r = subprocess.run(["make", "-s", "-C", str(ROOT / "clients" / lang), *CLIENT_MAKE.get(lang, [])],
                               capture_output=True, text=True, timeout=1800)
            out[lang] = None if r.returncode == 0 else (r.stdout + r.stderr).strip()[-300:]
        except (OSError, subprocess.TimeoutExpired) as e:
            out[lang] = str(e)
        if out[lang]:
            log(f"  clients/{lang} did not build: {out[lang]}")
    return out


def client_run(b, lang):
    """One CLIENTS run: clients/<lang>'s example worker gets CLIENT_WARMUP
    deliveries, then CLIENT_N more, unique entries all (no copies: each one
    a delivery), XADDed while idemproxy runs. Its CPU over the CLIENT_N."""
    log(f"client {lang}: {CLIENT_WARMUP} warm-up, then {CLIENT_N} deliveries")
    b.r.flushall()
    b.load(n=CLIENT_WARMUP, copies=0, prefix="warm")
    ep = f"ipc://{b.tmp}/app.sock"
    env = dict(os.environ, WORKER_CONCURRENCY=str(CLIENT_CONCURRENCY))
    for k in [k for k in env if k.startswith("WORKER_")]:
        if k != "WORKER_CONCURRENCY":
            del env[k]
    errf = open(b.tmp / f"client-{lang}.err", "ab")
    w = spawn(["make", "-s", "--no-print-directory", "-C", str(ROOT / "clients" / lang), "example",
               f"ENDPOINT={ep}", *CLIENT_MAKE.get(lang, [])], stdout=subprocess.DEVNULL, stderr=errf, env=env,
              start_new_session=True)
    p = b.proxy("single", read="group")
    p.start()
    try:
        b.wait(lambda: p.finished(CLIENT_WARMUP), TIMEOUT, f"{lang}: {CLIENT_WARMUP} warm-up deliveries")
        c0, t0 = session_cpu(w.pid), time.monotonic()
        pc0 = p.cpu()
        b.load(n=CLIENT_N, copies=0, prefix="evt")
        b.wait(lambda: p.finished(CLIENT_WARMUP + CLIENT_N), TIMEOUT, f"{lang}: {CLIENT_N} deliveries")
        c1, t1 = session_cpu(w.pid), time.monotonic()
        pc1 = p.cpu()
    finally:
        p.stop()
        try:
            os.killpg(w.pid, signal.SIGTERM)
            w.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(w.pid, signal.SIGKILL)
            w.wait()
        errf.close()
    res = {"lang": lang, "cpu_s": c1 - c0, "cpu_per_1k": (c1 - c0) / (CLIENT_N / 1000),
           "per_s": CLIENT_N / (t1 - t0), "proxy_cpu_per_1k": (pc1 - pc0) / (CLIENT_N / 1000), "load": loadavg()}
    log(f"  worker CPU {res['cpu_s']:.2f} s ({res['cpu_per_1k']:.3f} s / 1k deliveries), "
        f"{res['per_s']:.0f} deliveries/s")
    return res


def client_rows(b):
    """The CLIENTS runs in REPEAT interleaved rounds; per client, its median by CPU."""
    built = build_clients()
    ok = [lang for lang in CLIENTS if not built[lang]]
    runs = {lang: [] for lang in ok}
    for rnd in range(REPEAT):
        for i in range(len(ok)):                 # the order shifts each round
            lang = ok[(i + rnd) % len(ok)]
            runs[lang].append(client_run(b, lang))
    out = []
    for lang in CLIENTS:
        if built[lang]:
            out.append({"lang": lang, "error": built[lang]})
            continue
        rs = sorted(runs[lang], key=lambda x: x["cpu_per_1k"])
        med = dict(rs[(len(rs) - 1) // 2])
        med["cpu_range"] = [rs[0]["cpu_per_1k"], rs[-1]["cpu_per_1k"]]
        out.append(med)
    return out


def client_report(rows):
    c = next((r for r in rows if r["lang"] == "c" and "error" not in r), None)
    md = (f"\n### Clients: the worker's CPU per 1k deliveries (issue 32)\n\nEach client's example worker "
          f"(`make example`, WORKER_CONCURRENCY={CLIENT_CONCURRENCY}; C's takes one at a time; Rust's "
          f"`PROFILE=release`) answering ACK, "
          f"{CLIENT_N} unique entries after {CLIENT_WARMUP} warm-up deliveries, idemproxy group/single; "
          f"{REPEAT} rounds (median by CPU, min-max). CPU: utime + stime of the worker's processes.\n\n"
          "| client | worker CPU s / 1k deliveries | µs / delivery | × C | deliveries/s | "
          "idemproxy CPU s / 1k |\n|---|---|---|---|---|---|\n")
    for r in rows:
        if "error" in r:
            md += f"| {r['lang']} | not built: {r['error'].splitlines()[-1] if r['error'] else ''} | | | | |\n"
            continue
        lo, hi = r["cpu_range"]
        rel = f"{r['cpu_per_1k'] / c['cpu_per_1k']:.1f}" if c and c["cpu_per_1k"] > 0 else ""
        md += (f"| {r['lang']} | {r['cpu_per_1k']:.3f} ({lo:.3f}–{hi:.3f}) | {r['cpu_per_1k'] * 1000:.1f} | "
               f"{rel} | {r['per_s']:,.0f} | {r['proxy_cpu_per_1k']:.3f} |\n")
    return md


AB_SHAPES = [(k, v) for k, v in (("c", f"1 worker of concurrency {AB_CONCURRENCY}, one connection"),
                                  ("w", f"{WORKERS} workers, one REP socket each (the default rows' shape)"))
             if k in AB_SHAPE_NAMES]


def ab_run(b, binary, shape, data):
    """One A/B run: keys/s of 'binary' with worker shape 'c' (one connection,
    AB_CONCURRENCY handlers) or 'w' (WORKERS one-socket workers)."""
    read, layout = AB_VARIANT.split("/")
    w = b.worker(f"ipc://{b.tmp}/app.sock", expect=data["unique"],
                 concurrency=AB_CONCURRENCY if shape == "c" else 0)
    time.sleep(0.2)                                      # let the worker's socket exist
    p = b.proxy(layout, read=read, binary=binary)
    p.start()
    seen = {"window": 0.0}

    def done():
        p.alive()
        m = p.metrics()
        seen["window"] = max(seen["window"], m.get("idemproxy_delivery_window", 0))
        return m if (m.get("idemproxy_entries_read_total", -1) >= N
                     and m.get("idemproxy_entries_pending", 1) == 0) else None

    m = b.wait(done, TIMEOUT, f"{N} entries done (A/B, {binary.name}, {shape})")
    t_all = time.monotonic() - p.t0
    cpu = p.cpu()
    p.stop()
    wr = w.stop()
    t_keys = (wr["expect_mono"] / 1e6 - p.t0) if wr["expect_mono"] else float("nan")
    return {"keys_per_s": data["unique"] / t_keys, "entries_per_s": N / t_all, "cpu_s": cpu,
            "extra": wr["deliveries"] - data["unique"], "redeliveries": wr["redeliveries"],
            "ack_timeouts": m.get("idemproxy_ack_timeouts_total", 0), "max_window": seen["window"],
            "load": loadavg()}


def ab(b):
    """Interleaved rounds of now and before (and now again, the control), per
    worker shape; each round's ratios. Each round shifts the order by one, so
    every binary runs first, second (and third) alike."""
    before = b.tmp / "idemproxy-before"
    shutil.copy2(AB_BIN, before)
    names = [("now", b.bin), ("before", before)] + ([("again", b.bin)] if AB_CONTROL else [])
    runs = {shape: {"now": [], "before": [], "again": [], "ratio": [], "control": []} for shape, _ in AB_SHAPES}
    for rnd in range(AB_REPEAT):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for shape, _ in AB_SHAPES:
            got = {}
            for name, binary in order:
                got[name] = ab_run(b, binary, shape, b.fresh())
                runs[shape][name].append(got[name])
            r = runs[shape]
            r["ratio"].append(got["now"]["keys_per_s"] / got["before"]["keys_per_s"])
            if AB_CONTROL:
                r["control"].append(got["again"]["keys_per_s"] / got["now"]["keys_per_s"])
            log(f"A/B round {rnd + 1} of {AB_REPEAT}, shape {shape}: now {got['now']['keys_per_s']:.0f} "
                f"keys/s (window up to {got['now']['max_window']:.0f}), before "
                f"{got['before']['keys_per_s']:.0f} keys/s: ratio {r['ratio'][-1]:.2f}"
                + (f"; now again {got['again']['keys_per_s']:.0f} keys/s: {r['control'][-1]:.2f}"
                   if AB_CONTROL else ""))
    return runs


def ab_report(meta, runs):
    def med(xs):
        xs = sorted(xs)
        return xs[(len(xs) - 1) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2

    def spr(xs, fmt):
        return f"{med(xs):{fmt}} ({min(xs):{fmt}}–{max(xs):{fmt}})"

    L = [f"## A/B: this idemproxy (now) against {meta['ab_bin']} (before)\n",
         f"{meta['date']}, {meta['machine']}; load average {meta['load_start']} at the start, "
         f"{meta['load_end']} at the end; CPU time stolen by the hypervisor {meta['steal_pct']:.1f} %; "
         f"now = idemproxy {meta['rev']}. {AB_VARIANT.replace('/', ' read, layout ')}, {N} entries, "
         f"{COPIES:.0%} copies, max_inflight {MAX_INFLIGHT}, ack_timeout_ms 30000; {AB_REPEAT} rounds, "
         f"now and before{' and now again' if AB_CONTROL else ''} interleaved (the order shifts "
         f"each round), a fresh stream for every run. Median of the rounds (min–max).\n",
         "| worker shape | now keys/s | before keys/s | now / before, keys/s "
         + ("| control: now again / now | " if AB_CONTROL else "| ")
         + "proxy CPU s / 1k entries, now / before | deliveries − unique keys, now / before | largest window now |",
         "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if AB_CONTROL else "")]
    for shape, label in AB_SHAPES:
        r = runs[shape]
        ks = {k: [x["keys_per_s"] for x in r[k]] for k in ("now", "before")}
        cpu = {k: med([x["cpu_s"] for x in r[k]]) / (N / 1000) for k in ("now", "before")}
        L.append(f"| {label} | {spr(ks['now'], ',.0f')} | {spr(ks['before'], ',.0f')} | "
                 f"**{spr(r['ratio'], '.2f')}** | " + (f"{spr(r['control'], '.2f')} | " if AB_CONTROL else "")
                 + f"{cpu['now']:.3f} / {cpu['before']:.3f} | "
                 f"{sum(x['extra'] for x in r['now'])} / {sum(x['extra'] for x in r['before'])} | "
                 f"{max(x['max_window'] for x in r['now']):.0f} |")
    L.append("")
    for shape, label in AB_SHAPES:
        L.append(f"Per-round ratios now / before, {label.split(',')[0]}: "
                 + ", ".join(f"{x:.2f}" for x in runs[shape]["ratio"])
                 + ("; control: " + ", ".join(f"{x:.2f}" for x in runs[shape]["control"]) if AB_CONTROL else "")
                 + ".")
    L.append("")
    if AB_CONTROL:
        L.append("The control runs this idemproxy twice in every round: the spread of its ratio is "
                 "what the machine's noise alone does to a ratio.\n")
    return "\n".join(L) + "\n"


def allocations(b, variant):
    """One more run of 'variant' with bench/alloc_count.c preloaded into the proxy:
    heap allocations (malloc, calloc, realloc) per entry read, by the library
    that called. Startup's few thousand are included. Not timed."""
    read, layout = variant.split("/")
    data = b.fresh()
    out = b.tmp / "alloc_count.txt"
    out.unlink(missing_ok=True)
    w = b.worker(f"ipc://{b.tmp}/app.sock", expect=data["unique"])
    time.sleep(0.2)
    p = b.proxy(layout, read=read)
    p.start(env=dict(os.environ, LD_PRELOAD=str(BIN_DIR / "alloc_count.so"), ALLOC_COUNT_OUT=str(out)))
    b.wait(lambda: p.finished(N), TIMEOUT, f"{N} entries done (allocations, {variant})")
    p.stop()
    w.stop()
    by_lib = {}
    for line in out.read_text().splitlines() if out.exists() else []:
        n, lib = line.split(" ", 1)
        lib = lib.split(".so")[0]
        by_lib[lib] = by_lib.get(lib, 0) + int(n)
    res = {"variant": variant, "entries": N, "by_lib": by_lib, "per_entry": sum(by_lib.values()) / N}
    log(f"  allocations per entry ({variant}): {res['per_entry']:.2f}: "
        + ", ".join(f"{k} {v / N:.2f}" for k, v in sorted(by_lib.items(), key=lambda kv: -kv[1])
                    if v / N >= 0.005))
    return res


def baseline(b, mode, layout, limit=0, read="plain"):
    data = b.fresh()
    b.reset_stats()
    cmd = [str(BIN_DIR / "bench_baseline"), "--port", str(b.port), "--stream", STREAM, "--mode", mode,
           "--layout", layout, "--batch", str(BATCH)]
    if limit:
        cmd += ["--limit", str(limit)]
    if read == "group":
        cmd += ["--group", GROUP]
    load = loadavg()
    rcpu0, io0 = b.redis_cpu(), b.io_events()
    res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    rcpu, io = b.redis_cpu() - rcpu0, b.io_events() - io0
    res["load"] = load
    own = ("script|load", "xgroup|create")
    stats = b.command_stats(skip=own)
    usec = b.command_stats("usec", skip=own)
    res["commands"] = stats
    res["cmds_per_key"] = sum(stats.values()) / max(res["keys"], 1)
    res.update(redis_usec=usec, redis_usec_per_key=sum(usec.values()) / max(res["keys"], 1),
               redis_usec_per_entry=sum(usec.values()) / max(res["entries"], 1),
               redis_cpu_us_per_key=rcpu * 1e6 / max(res["keys"], 1),
               redis_io_per_key=io / max(res["keys"], 1))
    log(f"baseline ({mode}) {read if mode == 'b' else ''} {layout}{' on ' + str(limit) + ' entries' if limit else ''}: "
        f"{res['keys_per_s']:.0f} keys/s, {res['entries_per_s']:.0f} entries/s, Redis µs/key "
        f"{res['redis_usec_per_key']:.2f} (redis-server CPU {res['redis_cpu_us_per_key']:.1f}, reads + writes "
        f"{res['redis_io_per_key']:.3f})")
    return res


def latency_floor(b, rate, seconds=RATE_SECONDS):
    """XADD -> a blocked XREAD, no proxy: what the same load costs without idemproxy."""
    b.r.flushall()
    n = int(rate * seconds)
    reader = spawn([str(BIN_DIR / "bench_baseline"), "--port", str(b.port), "--stream", STREAM,
                    "--mode", "l", "--limit", str(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader.stderr.readline()                              # "reading": its XREAD is on its way
    time.sleep(0.1)
    b.load(rate=rate, seconds=seconds, prefix=f"f{rate}", copies=LAT_COPIES)
    out, _ = reader.communicate(timeout=TIMEOUT)
    return json.loads(out)


def live_guard(b, rate):
    """Baseline (b) live: the same dedup done in one process, reading with
    XREADGROUP BLOCK as entries come at 'rate' (bench_baseline --block). Its CPU
    per 1k entries is what a service that guards itself pays at this rate, on
    this machine: the reference for idemproxy's own CPU per entry."""
    b.r.flushall()
    b.reset_stats()
    g = spawn([str(BIN_DIR / "bench_baseline"), "--port", str(b.port), "--stream", STREAM, "--mode", "b",
               "--layout", LAT_LAYOUT, "--group", GROUP, "--block", "2000", "--batch", str(BATCH)],
              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    b.wait(lambda: b.r.exists(STREAM) and b.r.xinfo_groups(STREAM), 10, "live guard's group")
    time.sleep(0.2)                                       # its first blocking read is out
    data = b.load(rate=rate, seconds=RATE_SECONDS, prefix=f"g{rate}", copies=LAT_COPIES)
    out, err = g.communicate(timeout=TIMEOUT)
    if g.returncode != 0:
        raise RuntimeError(f"bench_baseline --block: {err.strip()}")
    res = json.loads(out)
    usec = b.command_stats("usec", skip=("xadd", "xgroup|create", "script|load"))
    res.update(cpu_per_1k=res["cpu_s"] / (res["entries"] / 1000), produced=data["entries"],
               redis_usec_per_entry=sum(usec.values()) / max(res["entries"], 1))
    log(f"  live guard (b) at {rate}/s: CPU {res['cpu_per_1k'] * 1000:.0f} µs per entry, Redis "
        f"{res['redis_usec_per_entry']:.2f} µs per entry, {res['keys']} keys of {res['entries']} entries")
    return res


def loop_busy(m0, m1, n):
    """idemproxy_loop_busy_seconds between two scrapes: loop iterations per
    entry and the busy time per iteration at p50, p99, p99.9 and the largest,
    each as its bucket's upper bound in µs (None: a binary without the metric)."""
    name = "idemproxy_loop_busy_seconds"
    b = sorted((float(k.split('le="')[1].rstrip('"}').replace("+Inf", "inf")), m1[k] - m0.get(k, 0))
               for k in m1 if k.startswith(name + "_bucket{"))
    if not b or not b[-1][1]:
        return None
    total = b[-1][1]
    q = lambda x: next(le for le, c in b if c >= x * total) * 1e6
    top = next(le for le, c in b if c >= total) * 1e6
    return {"iterations_per_entry": total / n, "p50_us": q(0.5), "p99_us": q(0.99), "p999_us": q(0.999),
            "max_us": top, "busy_s": m1.get(name + "_sum", 0) - m0.get(name + "_sum", 0)}


def latency(b, rate, first, opts=None, seconds=None, floor=None, extras=True, guard=None):
    """A rate row: idemproxy with stream options 'opts' (None: the defaults)
    fed 'rate' entries/s for 'seconds'; with 'extras' (the default rows) also
    its system calls and the live guard (b) at the same rate ('guard': the
    guard alone, without the system calls). 'floor': one measured already,
    reused (the A/A control, the headline's later rounds)."""
    seconds = seconds or RATE_SECONDS
    floor = floor or latency_floor(b, rate, seconds)
    b.r.flushall()
    w = b.worker(f"ipc://{b.tmp}/app.sock")
    p = b.proxy(LAT_LAYOUT, stream_opts=opts)
    p.start()
    b.wait(p.ready, 30, "proxy ready")
    b.wait(lambda: p.metrics().get("idemproxy_workers_connected", 0) >= WORKERS, 10, "workers")
    time.sleep(1.0)
    res = {"rate": rate, "opts": opts or {}, "setting": setting(opts)}
    if first:
        res["rss_idle_kib"] = p.rss_kib()
    b.reset_stats()
    pid = p.proc.pid
    th0 = thread_stats(pid)
    lb0 = p.metrics()
    cpu0, all0, t0 = p.cpu(), run_cpu(b, p, w), time.monotonic()
    data = b.load(rate=rate, seconds=seconds, prefix=f"r{rate}", copies=LAT_COPIES)
    all1, t1 = run_cpu(b, p, w), time.monotonic()
    m = b.wait(lambda: p.finished(data["entries"]), TIMEOUT, f"rate {rate} drained")
    res["cpu_per_1k"] = (p.cpu() - cpu0) / (data["entries"] / 1000)
    res["run_cpu_share"] = (all1 - all0) / ((t1 - t0) * (os.cpu_count() or 1))   # while the producer ran
    th1 = thread_stats(pid)
    usec = b.command_stats("usec", skip=("xadd",))        # the producer's XADDs are the app's, not the proxy's
    n = data["entries"]
    res["threads"] = {thread_label(pid, tid, th1): {"cpu_us": (v[0] - th0.get(tid, [0, 0, 0])[0]) * 1e6 / n,
                                                    "voluntary": (v[1] - th0.get(tid, [0, 0, 0])[1]) / n,
                                                    "nonvoluntary": (v[2] - th0.get(tid, [0, 0, 0])[2]) / n}
                      for tid, v in sorted(th1.items())}
    res["redis_usec"] = usec
    res["redis_usec_per_entry"] = sum(usec.values()) / n
    res["commands"] = b.command_stats(skip=("xadd",))
    res["rss_kib"] = p.rss_kib()
    res["loop_busy"] = loop_busy(lb0, m, n)
    p.stop()
    wr = w.stop()
    res.update(achieved=data["rate"], entries=data["entries"], unique=data["unique"],
               delivered=wr["deliveries"], p50_us=wr["p50_us"], p99_us=wr["p99_us"],
               p999_us=wr["p999_us"], max_us=wr["max_us"], lat_n=wr["lat_n"],
               lock_busy=m.get("idemproxy_lock_busy_total", 0),
               ack_timeouts=m.get("idemproxy_ack_timeouts_total", 0), floor=floor)
    log(f"  floor (XADD -> XREAD, no proxy): p50 {floor['p50_us'] / 1000:.2f} ms, p99 {floor['p99_us'] / 1000:.2f} ms, "
        f"p99.9 {floor['p999_us'] / 1000:.2f} ms")
    log(f"latency at {rate}/s (achieved {data['rate']:.0f}/s): p50 {wr['p50_us'] / 1000:.2f} ms, "
        f"p99 {wr['p99_us'] / 1000:.2f} ms, p99.9 {wr['p999_us'] / 1000:.2f} ms, max {wr['max_us'] / 1000:.1f} ms")
    log(f"  per entry: proxy CPU {res['cpu_per_1k'] * 1000:.0f} µs; context switches (voluntary + not) "
        + ", ".join(f"{k} {v['voluntary']:.2f} + {v['nonvoluntary']:.2f}" for k, v in res["threads"].items())
        + f"; Redis {res['redis_usec_per_entry']:.2f} µs (commandstats, XADD left out); "
        f"the run's processes used {res['run_cpu_share'] * 100:.0f} % of all vCPUs")
    if res["loop_busy"]:
        lb = res["loop_busy"]
        log(f"  loop: {lb['iterations_per_entry']:.2f} iterations per entry; busy per iteration (bucket bounds) "
            f"p50 ≤ {lb['p50_us']:g} µs, p99 ≤ {lb['p99_us']:g} µs, p99.9 ≤ {lb['p999_us']:g} µs, "
            f"max ≤ {lb['max_us']:g} µs")
    if SYSCALLS and extras:
        res["syscalls"] = syscalls(b, rate)
    if extras if guard is None else guard:
        res["guard"] = live_guard(b, rate)
    return res


def head_round(r):
    """One round of the headline pair: idemproxy / the guard, CPU per entry
    and Redis µs per entry, and p99 over the floor."""
    g = r["guard"]
    return {"ratio": r["cpu_per_1k"] / g["cpu_per_1k"] if g["cpu_per_1k"] else float("nan"),
            "cpu_per_1k": r["cpu_per_1k"], "guard_cpu_per_1k": g["cpu_per_1k"],
            "p99_over_us": r["p99_us"] - r["floor"]["p99_us"],
            "redis_ratio": (r["redis_usec_per_entry"] / g["redis_usec_per_entry"]
                            if g.get("redis_usec_per_entry") else float("nan"))}


def setting(opts):
    return ", ".join(f"{k}: {v}" for k, v in (opts or {}).items()) or "the defaults"


def parse_perf_stat(path, pid):
    """perf stat --per-thread -x, output: {thread label: {syscall: count}}."""
    rows = []
    for line in Path(path).read_text().splitlines():
        f = line.split(",")
        if line.startswith("#") or len(f) < 4 or not f[1].strip().isdigit():
            continue
        rows.append((int(f[0].rsplit("-", 1)[1]), f[3].removeprefix("syscalls:sys_enter_"), int(f[1])))
    tids = {tid for tid, _, _ in rows}
    out = {}
    for tid, name, n in rows:
        if n:
            by = out.setdefault(thread_label(pid, tid, tids), {})
            by[name] = by.get(name, 0) + n
    return out


def parse_strace(path):
    """strace -c -f output: {"all threads": {syscall: calls}} (strace -c does not split threads)."""
    by = {}
    for line in Path(path).read_text().splitlines():
        f = line.split()
        if len(f) >= 5 and f[0].replace(".", "").isdigit() and f[3].isdigit() and f[-1] != "total":
            by[f[-1]] = int(f[3])
    return {"all threads": by} if by else {}


def syscalls(b, rate):
    """A second, untimed run at 'rate': the proxy's system calls by kind and by
    thread, counted by perf stat on the syscalls:sys_enter_* tracepoints (no
    hardware counters needed; they are not available in this VM), or by
    strace -c -f where perf cannot (BENCH_SYSCALLS=strace, or perf failed).
    A separate run, so the counting does not slow the timed one. The count
    includes about a second of idle proxy before the load and the /metrics
    requests that see it drained (tens of calls against thousands)."""
    b.r.flushall()
    w = b.worker(f"ipc://{b.tmp}/app.sock")
    p = b.proxy(LAT_LAYOUT)
    p.start()
    b.wait(p.ready, 30, "proxy ready")
    b.wait(lambda: p.metrics().get("idemproxy_workers_connected", 0) >= WORKERS, 10, "workers")
    pid = p.proc.pid
    res = None
    for tool in ([SYSCALLS] + (["strace"] if SYSCALLS == "perf" else [])):
        out = OUT / f"syscalls-{tool}-{rate}.txt"
        out.unlink(missing_ok=True)
        cmd = (["perf", "stat", "--per-thread", "-x", ",", "-e", "syscalls:sys_enter_*", "-o", str(out),
                "-p", str(pid)] if tool == "perf" else
               ["strace", "-c", "-f", "-q", "-o", str(out), "-p", str(pid)])
        try:
            counter = spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError as e:
            log(f"  syscalls: {tool} did not start ({e})")
            continue
        time.sleep(1.5)                                   # the counters are open
        if counter.poll() is not None:
            log(f"  syscalls: {tool} exited with {counter.returncode} (see {out})")
            continue
        data = b.load(rate=rate, seconds=RATE_SECONDS, prefix=f"s{rate}", copies=LAT_COPIES)
        b.wait(lambda: p.finished(data["entries"]), TIMEOUT, f"rate {rate} drained (syscall count)")
        counter.send_signal(signal.SIGINT)
        counter.wait(60)
        counts = parse_perf_stat(out, pid) if tool == "perf" else parse_strace(out)
        if counts:
            res = {"tool": tool, "entries": data["entries"], "achieved": data["rate"], "file": out.name,
                   "by_thread": counts}
        else:
            log(f"  syscalls: {tool} counted nothing (see {out})")
        break
    p.stop()
    w.stop()
    if res:
        n = res["entries"]
        tot = {}
        for by in res["by_thread"].values():
            for k, v in by.items():
                tot[k] = tot.get(k, 0) + v
        log(f"  syscalls per entry at {rate}/s ({res['tool']}): {sum(tot.values()) / n:.2f} = "
            + ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(tot.items(), key=lambda kv: -kv[1]) if v / n >= 0.01))
    return res


def hold(b):
    """RSS of an idle proxy, then with HOLD deliveries held by a worker that never
    answers. The stream holds exactly HOLD entries, written before that second proxy
    starts, and max_inflight leaves a reader batch of room above HOLD, so how the
    reader sizes its reads cannot leave a few entries unread."""
    b.r.flushall()
    w = b.worker(f"ipc://{b.tmp}/app.sock", hold=True)
    p = b.proxy(LAT_LAYOUT, max_inflight=HOLD_INFLIGHT, ack_timeout_ms=600000)
    p.start()
    b.wait(p.ready, 30, "proxy ready")
    time.sleep(1.0)
    res = {"hold": HOLD, "rss_idle_kib": p.rss_kib()}
    p.stop()
    b.load(n=HOLD, copies=0.0, prefix="hold")
    p = b.proxy(LAT_LAYOUT, max_inflight=HOLD_INFLIGHT, ack_timeout_ms=600000)
    p.start()
    seen = {"n": -1, "since": time.monotonic()}

    def settled():                  # all claimed, or no new claim for 2 s
        p.alive()
        n = p.metrics().get("idemproxy_inflight", 0)
        if n != seen["n"]:
            seen.update(n=n, since=time.monotonic())
        return n >= HOLD or (n > 0 and time.monotonic() - seen["since"] > 2.0)

    # Flow control sends a worker that never answers only its first window;
    # the rest stay claimed, waiting for it, their leases extended: in memory
    # all the same, which is what this measures.
    b.wait(settled, 60, f"{HOLD} entries claimed")
    b.reset_stats()
    t0 = time.monotonic()
    time.sleep(1.0)
    m = p.metrics()
    res.update(rss_kib=p.rss_kib(), held=w.count(), inflight=m.get("idemproxy_inflight", 0))
    time.sleep(6.0)                                       # rounds of lease extensions (lease_ms 5000)
    res.update(rss_later_kib=p.rss_kib(), hwm_kib=p.hwm_kib())
    res["held_cmds_per_s"] = sum(b.command_stats().values()) / (time.monotonic() - t0)
    p.stop()
    w.stop()
    log(f"hold: {res['inflight']:.0f} entries claimed, {res['held']} of them delivered: "
        f"RSS {res['rss_kib'] / 1024:.1f} MiB after 1 s, {res['rss_later_kib'] / 1024:.1f} MiB after 7 s, "
        f"peak {res['hwm_kib'] / 1024:.1f} MiB (idle {res['rss_idle_kib'] / 1024:.1f} MiB); "
        f"{res['held_cmds_per_s']:.0f} Redis commands/s while holding")
    return res


# --- report -------------------------------------------------------------------

def machine():
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) // 1024
    return f"{os.cpu_count()} cores, {model}, {mem} MiB, {platform.system()} {platform.release()}"


def git_rev():
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "proxy"],
                               capture_output=True, text=True).stdout.strip()
        return rev + (" + uncommitted changes in proxy/" if dirty else "")
    except OSError:
        return "?"


def ms(us):
    return f"{us / 1000:.2f}"


def ok(cond, value=0.0):
    if value != value:                                    # nan: that part did not run
        return "not run"
    return "met" if cond else "**missed**"


def breakdown(stats, per):
    items = sorted(stats.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v / per:.3g}" for k, v in items if v / per >= 0.0005)


CPU_TARGETS = {1000: 0.05, 5000: 0.03}          # issue 18: proxy CPU s per 1k entries at that rate
# Issue 18's own run (13:28 UTC, 2026-11-24, before any change for it), printed beside
# today's figures: rate -> (proxy CPU s per 1k entries, p99 ms, floor p99 ms, p99.9 ms).
ISSUE18_BASELINE = {1000: (0.152, 0.52, 0.34, 2.35), 5000: (0.092, 2.32, 0.30, 3.74),
                    20000: (0.029, 2.04, 0.88, 4.49)}


def pods_per_core(usec_per_entry, rate=1000):
    """Pods one Redis core serves when each sends 'rate' entries/s costing
    usec_per_entry of Redis CPU each."""
    return 1e6 / (usec_per_entry * rate) if usec_per_entry > 0 else float("inf")


def redis_cost_section(tp, base, a):
    """Issue 18: Redis CPU per unique key, idemproxy against (a) and (b), per
    read mode and layout, and the pods one Redis core could serve."""
    if not tp:
        return []
    L = ["Redis CPU per unique key, the cost every pod puts on the Redis they share: INFO commandstats "
         "`usec` summed over the run (time Redis spent executing the commands), and redis-server's own "
         "utime + stime over the same run (/proc, 10 ms ticks: also reading, parsing and replying, "
         "which commandstats leaves out), and Redis' read and reply-write events per key (INFO stats "
         "total_reads_processed + total_writes_processed: a pipeline that arrives in more pieces costs a "
         "read and a reply write per piece). Pods per Redis core: one core's 1,000,000 µs/s over what a pod "
         f"at 1,000 entries/s ({COPIES:.0%} copies, as here) costs per second, from these backlog runs "
         "(pipelined pages; entries that arrive one at a time cost more: see the per-entry table).\n",
         "| read, layout | Redis µs / key: idemproxy | (b) | idemproxy / (b), median of the rounds' ratios (min–max) | (a) | redis-server CPU µs / key: "
         "idemproxy / (b) | Redis reads + writes / key: idemproxy / (b) | pods per Redis core at 1k entries/s, "
         "commandstats: idemproxy / (b) | the same from redis-server CPU: idemproxy / (b) |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for t in tp:
        bb = base.get("b-" + t["variant"])
        aa = (f"{a['redis_usec_per_key']:.2f}" if a and t["layout"] == "split" else "")
        fr = t["unique"] / t["entries"]
        if bb:
            bfr = bb["keys"] / max(bb["entries"], 1)
            L.append(f"| {t['read']}, {t['layout']} | {t['redis_usec_per_key']:.2f} | {bb['redis_usec_per_key']:.2f} | "
                     f"{'{:.2f} ({:.2f}–{:.2f})'.format(*redis_ratio(t, bb))} | {aa} | "
                     f"{t['redis_cpu_us_per_key']:.1f} / {bb['redis_cpu_us_per_key']:.1f} | "
                     f"{t.get('redis_io_per_key', 0):.3f} / {bb.get('redis_io_per_key', 0):.3f} | "
                     f"{pods_per_core(t['redis_usec_per_entry']):,.0f} / {pods_per_core(bb['redis_usec_per_entry']):,.0f} | "
                     f"{pods_per_core(t['redis_cpu_us_per_key'] * fr):,.0f} / "
                     f"{pods_per_core(bb['redis_cpu_us_per_key'] * bfr):,.0f} |")
        else:
            L.append(f"| {t['read']}, {t['layout']}{', TLS' if t.get('tls') else ''} | {t['redis_usec_per_key']:.2f} | | | {aa} | "
                     f"{t['redis_cpu_us_per_key']:.1f} / | {t.get('redis_io_per_key', 0):.3f} / | {pods_per_core(t['redis_usec_per_entry']):,.0f} / | "
                     f"{pods_per_core(t['redis_cpu_us_per_key'] * fr):,.0f} / |")
    if a:
        L.append("")
        L.append(f"(a), the seeds' algorithm, has only the split form (done:k and lock:k); "
                 f"redis-server CPU {a['redis_cpu_us_per_key']:.1f} µs / key, pods per core at 1k entries/s "
                 f"{pods_per_core(a['redis_usec_per_entry']):,.0f} (commandstats).")
    L.append("")
    return L


def tax_section(lat):
    """Issue 18's table for today's code, its targets marked, then where an
    entry that arrives alone spends the proxy's CPU."""
    if not lat:
        return []
    L = [f"The sidecar tax at the rates pods run (issue 18's table; layout {LAT_LAYOUT}, {RATE_SECONDS:g} s "
         "per rate, the latency runs below). Targets: proxy CPU ≤ 0.05 s per 1k entries at 1k/s and "
         "≤ 0.03 s at 5k/s; p99 ≤ the floor's p99 + 0.5 ms and p99.9 ≤ the floor's p99.9 + 2 ms at "
         "every rate. The last column is issue 18's own run of the code before it (another hour on "
         "this machine, whose load moves these figures by a third: an A/B with IDEMPROXY_BIN says more).\n",
         "| entries/s | proxy CPU s per 1k entries | p99 ms (floor p99) | p99 over floor | p99.9 ms (floor p99.9) "
         "| p99.9 over floor | the dedup in-process, live (b): CPU s per 1k, idemproxy / it "
         "| issue 18's baseline: CPU, p99 (floor), p99.9 |",
         "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in lat:
        f, lim = r["floor"], CPU_TARGETS.get(r["rate"])
        o99, o999 = r["p99_us"] - f["p99_us"], r["p999_us"] - f["p999_us"]
        cpu = f"{r['cpu_per_1k']:.3f}" + (f" (≤ {lim}: {ok(r['cpu_per_1k'] <= lim)})" if lim else "")
        L.append(f"| {r['rate']:,} | {cpu} | {ms(r['p99_us'])} ({ms(f['p99_us'])}) | {ms(o99)} ({ok(o99 <= 500)}) | "
                 f"{ms(r['p999_us'])} ({ms(f['p999_us'])}) | {ms(o999)} ({ok(o999 <= 2000)}) | "
                 + (f"{r['guard']['cpu_per_1k']:.3f}, {r['cpu_per_1k'] / r['guard']['cpu_per_1k']:.2f} | "
                    if r.get("guard") else " | ")
                 + ("{:.3f}, {:.2f} ({:.2f}), {:.2f} |".format(*ISSUE18_BASELINE[r["rate"]])
                    if r["rate"] in ISSUE18_BASELINE else " |"))
    L.append("")
    if any(r.get("guard") for r in lat):
        L.append("The in-process column is baseline (b) reading live (bench_baseline --block: XREADGROUP BLOCK, "
                 "each page claimed, marked done and XACKed as it comes, no handler hop), fed by the same "
                 "producer at the same rate just after idemproxy's run: what a service that does this "
                 "dedup itself spends on the same Redis commands here. Where it is above a target, no "
                 "sidecar that sends those commands and also hands each entry to a worker meets that "
                 "target on this machine; the ratio is the sidecar's price over doing it in-process.\n")
    L.append("Per entry at those rates: the timed run's CPU and context switches (/proc/PID/task/*/stat "
             "and status: voluntary + involuntary switches, i.e. wake-ups and preemptions), Redis CPU "
             "(commandstats usec, the producer's XADD left out), and the proxy's system calls by kind "
             "from a second run at the same rate (" + syscall_tool(lat) + "):\n")
    rates = [r["rate"] for r in lat]
    L.append("| per entry | " + " | ".join(f"{x:,}/s" for x in rates) + " |")
    L.append("|---|" + "---:|" * len(rates))
    L.append("| proxy CPU µs (process) | " + " | ".join(f"{r['cpu_per_1k'] * 1000:.0f}" for r in lat) + " |")
    threads = []
    for r in lat:
        threads += [k for k in r.get("threads", {}) if k not in threads]
    for k in threads:
        L.append(f"| CPU µs, {k} | " + " | ".join(
            f"{r['threads'][k]['cpu_us']:.0f}" if k in r.get("threads", {}) else "" for r in lat) + " |")
    for k in threads:
        L.append(f"| context switches, {k} (voluntary + involuntary) | " + " | ".join(
            f"{r['threads'][k]['voluntary']:.2f} + {r['threads'][k]['nonvoluntary']:.2f}"
            if k in r.get("threads", {}) else "" for r in lat) + " |")
    sc = [r.get("syscalls") for r in lat]
    if any(sc):
        tot = [{} for _ in lat]
        for i, x in enumerate(sc):
            for by in (x["by_thread"].values() if x else []):
                for k, v in by.items():
                    tot[i][k] = tot[i].get(k, 0) + v / x["entries"]
        L.append("| system calls, all threads | " + " | ".join(
            f"**{sum(t.values()):.2f}**" if x else "" for t, x in zip(tot, sc)) + " |")
        kinds = sorted({k for t in tot for k, v in t.items() if v >= 0.02}, key=lambda k: -max(t.get(k, 0) for t in tot))
        for k in kinds:
            cells = []
            for t, x in zip(tot, sc):
                if not x:
                    cells.append("")
                    continue
                split = [f"{th} {by.get(k, 0) / x['entries']:.2f}" for th, by in x["by_thread"].items()
                         if by.get(k, 0) / x["entries"] >= 0.01]
                cells.append(f"{t.get(k, 0):.2f}" + (f" ({', '.join(split)})" if len(x["by_thread"]) > 1 else ""))
            L.append(f"| `{k}` | " + " | ".join(cells) + " |")
    lbs = [r.get("loop_busy") for r in lat]
    if any(lbs):
        L.append("| loop iterations (wake-ups of the main loop) | " + " | ".join(
            f"{x['iterations_per_entry']:.2f}" if x else "" for x in lbs) + " |")
        L.append("| loop busy µs per iteration, p50 / p99 / p99.9 / max (≤ bucket bound; "
                 "idemproxy_loop_busy_seconds) | " + " | ".join(
                     f"{x['p50_us']:g} / {x['p99_us']:g} / {x['p999_us']:g} / {x['max_us']:g}" if x else ""
                     for x in lbs) + " |")
    L.append("| share of all vCPUs the run used while the producer ran (producer, Redis, proxy and "
             "workers together) | " + " | ".join(
                 f"{r['run_cpu_share'] * 100:.0f} %" if "run_cpu_share" in r else "" for r in lat) + " |")
    L.append("| Redis µs (commandstats) | " + " | ".join(f"{r['redis_usec_per_entry']:.2f}" for r in lat) + " |")
    L.append("| pods per Redis core, each at this rate (commandstats) | " + " | ".join(
        f"{pods_per_core(r['redis_usec_per_entry'], r['rate']):,.0f}" for r in lat) + " |")
    L.append("")
    return L


GOAL_CPU = {1000: 1.0, 5000: 0.7}   # issue 34: idemproxy / the live guard (b), CPU per entry
GOAL_P99_OVER_US = {1000: 3000, 5000: 3000}
GOAL_SLOW_P99_OVER_US = 1000        # entries more than 50 ms apart
GOAL_REDIS = 1.1                    # Redis µs per entry, idemproxy / the guard


def headline_section(lat, slow, other):
    """Issue 34's goal, first: idemproxy with the defaults a user gets against
    the same dedup written in the service, side by side in this run, with the
    latency the defaults cost, and what batch_ms: 0 (no window) gives."""
    rows = [r for r in lat if r.get("guard")]
    if not rows and not slow:
        return []
    off = {r["rate"]: r for r in other if r["opts"] == {"batch_ms": 0}}
    over = lambda x, q: x[q] - x["floor"][q]
    L = ["### Headline: idemproxy's defaults against the guard a service writes for itself\n",
         "idemproxy with the configuration a user gets (the batch window `streams[].batch_ms` 2 ms) "
         "against the same dedup done in the service (baseline (b) live: `bench_baseline --block`), "
         f"one after the other at each rate in this run (layout {LAT_LAYOUT}, {RATE_SECONDS:g} s per rate), "
         f"in {HEAD_ROUNDS} rounds interleaved over the rates: the median round, with the range. "
         "Goals (issue 34): CPU per entry ≤ 1.0 × the guard's at 1k/s and ≤ 0.7 × at 5k/s; p99 from "
         "XADD to the worker ≤ the floor's + 3 ms at 1k and 5k/s and + 1 ms with entries more than "
         "50 ms apart; Redis µs per entry ≤ 1.1 × the guard's. The A/A column is idemproxy run again "
         "just after (again / first): the noise of the ratio.\n",
         "| entries/s | CPU per entry, idemproxy / guard | A/A | CPU s per 1k: idemproxy, guard | p99 over "
         "floor ms | p99.9 over floor ms | Redis µs per entry: idemproxy / guard | batch_ms: 0 "
         "(no window): CPU / guard, p99 over floor ms |",
         "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    med = lambda xs: statistics.median(xs)
    span = lambda xs: f" ({min(xs):.2f}–{max(xs):.2f})" if len(xs) > 1 else ""
    for r in rows:
        g = r["guard"]
        rounds = r.get("rounds") or [head_round(r)]
        qs = [x["ratio"] for x in rounds]
        q = med(qs)
        goal = GOAL_CPU.get(r["rate"])
        aa = (f"{r['again']['cpu_per_1k'] / r['cpu_per_1k']:.2f}" if r.get("again") and r["cpu_per_1k"]
              else "")
        o99s = [x["p99_over_us"] for x in rounds]
        o99, lim = med(o99s), GOAL_P99_OVER_US.get(r["rate"])
        rq = med([x["redis_ratio"] for x in rounds])
        o = off.get(r["rate"])
        L.append(f"| {r['rate']:,} | **{q:.2f}**{span(qs)}" + (f" (≤ {goal}: {ok(q <= goal, q)})" if goal else "")
                 + f" | {aa} | {med([x['cpu_per_1k'] for x in rounds]):.3f}, "
                 f"{med([x['guard_cpu_per_1k'] for x in rounds]):.3f} | {ms(o99)}"
                 + (f" ({ms(min(o99s))}–{ms(max(o99s))})" if len(o99s) > 1 else "")
                 + (f" (≤ {lim / 1000:g}: {ok(o99 <= lim)})" if lim else "")
                 + f" | {ms(over(r, 'p999_us'))} | {r['redis_usec_per_entry']:.1f} / "
                 f"{g['redis_usec_per_entry']:.1f}, median {rq:.2f} ({ok(rq <= GOAL_REDIS, rq)}) | "
                 + (f"{o['cpu_per_1k'] / g['cpu_per_1k']:.2f}, {ms(over(o, 'p99_us'))}" if o and g["cpu_per_1k"] else "")
                 + " |")
    if slow:
        o99 = over(slow, "p99_us")
        L.append(f"| {slow['rate']:g} (more than 50 ms apart, {slow['entries']} entries, {slow['delivered']} delivered) | | | | {ms(o99)} "
                 f"(≤ {GOAL_SLOW_P99_OVER_US / 1000:g}: {ok(o99 <= GOAL_SLOW_P99_OVER_US)}) | "
                 f"{ms(over(slow, 'p999_us'))} | | |")
    L.append("")
    return L


def settings_section(lat, other):
    """The rate rows again with other settings (batch_ms: 0, a fixed
    linger_ms), beside the default rows."""
    if not other:
        return []
    by = {r["rate"]: r for r in lat}
    L = ["The rate rows again with other settings, beside the default rows above: `batch_ms: 0` "
         "(no window: each page read at once, the default before issue 34) and a fixed `linger_ms` "
         "(a wait after every short page, quiet or not):\n",
         "| entries/s | setting | proxy CPU s per 1k entries: setting / default | main-loop iterations per "
         "entry: setting / default | p99 over floor ms: setting / default | p99.9 over floor ms: setting / "
         "default | deliveries / unique keys |",
         "|---:|---|---:|---:|---:|---:|---:|"]
    for r in other:
        o = by.get(r["rate"])
        if o is None:
            continue
        it = lambda x: f"{x['loop_busy']['iterations_per_entry']:.2f}" if x.get("loop_busy") else "-"
        over = lambda x, q: ms(x[q] - x["floor"][q])
        L.append(f"| {r['rate']:,} | `{r['setting']}` | {r['cpu_per_1k']:.3f} / {o['cpu_per_1k']:.3f} | "
                 f"{it(r)} / {it(o)} | {over(r, 'p99_us')} / {over(o, 'p99_us')} | "
                 f"{over(r, 'p999_us')} / {over(o, 'p999_us')} | {r['delivered']} / {r['unique']} |")
    L.append("")
    return L


def syscall_tool(lat):
    tools = {r["syscalls"]["tool"] for r in lat if r.get("syscalls")}
    if not tools:
        return "not counted: BENCH_SYSCALLS empty, or neither perf nor strace could count"
    return ("perf stat --per-thread on the syscalls:sys_enter_* tracepoints; this VM has no hardware "
            "counters, tracepoints work" if tools == {"perf"} else
            "strace -c -f, all threads together" if tools == {"strace"} else " and ".join(sorted(tools)))


def report(meta, tp, base, lat, mem, allocs=None, other=(), slow=None):
    L = []
    L.append(f"## Benchmark ({meta['date']})\n")
    L += headline_section(lat, slow, other)
    L.append(f"`make bench` on {meta['machine']}; load average {meta['load_start']} at the start, "
             f"{meta['load_end']} at the end; CPU time stolen by the hypervisor during the run "
             f"{meta['steal_pct']:.1f} %; {meta['redis']}; idemproxy {meta['rev']} (binary built {meta['binary']}). "
             f"{N} entries, {COPIES:.0%} copies (same seed, so the same keys, for every run), "
             f"JSON payloads with an eventId; idemproxy "
             + " and ".join({"group": "in group mode (XREADGROUP, XACK)",
                             "plain": "group-less (\"plain\": XREAD from 0, nothing acked)"}.get(x, x) for x in READS)
             + "; "
             f"max_inflight {MAX_INFLIGHT}, {WORKERS} C workers (one REP socket each) that ack at once; "
             f"one redis-server for everything, flushed and reloaded before each run. "
             f"Throughput rows: the median of {REPEAT} interleaved rounds (min–max of keys/s in brackets).\n")
    L.append("| run | unique keys | keys/s | entries/s | copies/s | proxy CPU s / 1k entries | Redis commands / key |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for t in tp:
        L.append(f"| idemproxy, {t['read']} read, layout {t['layout']}{', TLS' if t.get('tls') else ''}"
                 f"{FP_LABEL if t.get('fp') else ''}{', fencing' if t.get('fence') else ''} | "
                 f"{t['unique']} | {spread(t)} | "
                 f"{t['entries_per_s']:,.0f} | {t['copies_per_s']:,.0f} | {t['cpu_per_1k']:.3f} | "
                 f"{t['cmds_per_key']:.2f} |")
    a = base.get("a")
    if a:
        L.append(f"| (a) seeds' algorithm, 5 round trips per key, on the first {a['entries']} entries | "
                 f"{a['keys']} | {spread(a)} | {a['entries_per_s']:,.0f} | | | {a['cmds_per_key']:.2f} |")
    for v in VARIANTS:
        r = base.get("b-" + v)
        read, layout = v.split("/")
        if r:
            L.append(f"| (b) no proxy, pipelined ({BATCH}/batch), {read} read, layout {layout} | {r['keys']} | "
                     f"{spread(r)} | {r['entries_per_s']:,.0f} | | | {r['cmds_per_key']:.2f} |")
    if TLS_VARIANTS:
        L.append("| (b) over TLS | | not measured: bench_baseline is built on hiredis 0.14, which has no TLS | | | | |")
    L.append("")
    L.append("keys/s: unique keys / time from the proxy's start until the worker received the last one. "
             "entries/s: entries / time until every entry was done and XACKed (/metrics: read = N, "
             "pending = 0). copies/s: a second run over the same stream once every key is done "
             "(group: XGROUP SETID to 0; plain: a new proxy, which reads from 0): every entry a skipped copy. "
             "Baselines parse the JSON (json-c), and that time is included. (a) reads with XRANGE, no "
             "consumer group, as seed 000 does. (b) reads as idemproxy does in the same read mode: "
             "group, XREADGROUP and one XACK per page after its done marks; plain, XRANGE and no XACK. "
             "Redis commands counted by INFO commandstats, which also "
             "counts the GET/DEL a compare-and-delete script runs. TLS rows: idemproxy on rediss:// "
             "to a TLS port of the same redis-server (the proxy verifies the server's certificate; "
             "no client certificate), in the same rounds as the plain rows. Fingerprint rows: "
             "streams[].fingerprint \"#event\", the whole event canonicalised and hashed for every "
             "entry and compared with the done mark's on every copy.\n")

    by = {t["variant"]: t for t in tp}
    L.append("| ratio | " + " | ".join(v.replace("/", " read, ") for v in VARIANTS) + " |")
    L.append("|---|" + "---:|" * len(VARIANTS))

    def ratio(v, ref):
        t = by.get(v)
        return t["keys_per_s"] / ref["keys_per_s"] if t and ref and ref["keys_per_s"] else float("nan")

    def copy_ratio(v):
        t = by.get(v)
        return t["copies_per_s"] / t["keys_per_s"] if t else float("nan")

    L.append("| idemproxy / (b) in the same read mode, keys/s | "
             + " | ".join(f"{ratio(v, base.get('b-' + v)):.2f}" for v in VARIANTS) + " |")
    L.append("| idemproxy / (a), keys/s (no target: (a) is bound by the loopback round trip) | "
             + " | ".join(f"{ratio(v, a):.1f}" for v in VARIANTS) + " |")
    L.append("| copies/s / keys/s | " + " | ".join(f"{copy_ratio(v):.2f}" for v in VARIANTS) + " |")
    L.append("| idemproxy over TLS / over plain TCP, keys/s | "
             + " | ".join(f"{ratio(v + ' tls', by.get(v)):.2f}" if v in TLS_VARIANTS else ""
                          for v in VARIANTS) + " |")
    L.append("| idemproxy with fingerprint \"#event\" / without, keys/s | "
             + " | ".join(f"{ratio(v + ' fp', by.get(v)):.2f}" if v in FP_VARIANTS else ""
                          for v in VARIANTS) + " |")
    L.append("| idemproxy with fencing: true / without, keys/s | "
             + " | ".join(f"{ratio(v + ' fence', by.get(v)):.2f}" if v in FENCE_VARIANTS else ""
                          for v in VARIANTS) + " |")
    L.append("")

    L += redis_cost_section(tp, base, a)
    L += tax_section(lat)
    L += settings_section(lat, other)
    L.append(f"Latency from XADD to the worker (layout {LAT_LAYOUT}, {RATE_SECONDS:g} s per rate, "
             f"{LAT_COPIES:.0%} copies, idle proxy beforehand):\n")
    L.append("| entries/s asked | achieved | deliveries / unique keys | p50 ms | p99 ms | p99.9 ms | max ms | proxy CPU s / 1k entries "
             "| copies parked | floor p50 / p99 / p99.9 ms |")
    L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in lat:
        f = r["floor"]
        L.append(f"| {r['rate']:,} | {r['achieved']:,.0f} | {r['delivered']} / {r['unique']} | {ms(r['p50_us'])} | {ms(r['p99_us'])} | "
                 f"{ms(r['p999_us'])} | {ms(r['max_us'])} | {r['cpu_per_1k']:.3f} | {r['lock_busy']:.0f} | "
                 f"{ms(f['p50_us'])} / {ms(f['p99_us'])} / {ms(f['p999_us'])} |")
    L.append("")
    L.append("floor: the same producer at the same rate with no proxy, read by one blocked XREAD client "
             "(bench_baseline --mode l): the latency this machine adds at this load before idemproxy does "
             "anything. CPU seconds come from /proc in 10 ms ticks.\n")
    idle = lat[0].get("rss_idle_kib") if lat else None
    L.append("| memory (VmRSS) | MiB |")
    L.append("|---|---:|")
    if idle:
        L.append(f"| idle, max_inflight {MAX_INFLIGHT} | {idle / 1024:.1f} |")
    if mem:
        L.append(f"| idle, max_inflight {HOLD_INFLIGHT} | {mem['rss_idle_kib'] / 1024:.1f} |")
        L.append(f"| {mem['inflight']:.0f} entries claimed, {mem['held']} of them with a worker "
                 f"(max_inflight {HOLD_INFLIGHT}, a worker with {HOLD // 128 + 1} sockets that never "
                 f"answers), "
                 f"1 s after the last | {mem['rss_kib'] / 1024:.1f} |")
        L.append(f"| the same, 7 s after the last (after rounds of lease extensions: "
                 f"{mem['held_cmds_per_s']:,.0f} Redis commands/s while holding) | {mem['rss_later_kib'] / 1024:.1f} |")
        L.append(f"| the same, peak (VmHWM) | {mem['hwm_kib'] / 1024:.1f} |")
    for t in tp:
        L.append(f"| peak (VmHWM) in the throughput run, {t['read']} read, layout {t['layout']}"
                 f"{', TLS' if t.get('tls') else ''} | "
                 f"{t['vmhwm_kib'] / 1024:.1f} |")
    L.append("")

    if allocs and allocs["per_entry"]:
        per = sorted(allocs["by_lib"].items(), key=lambda kv: -kv[1])
        L.append(f"Heap allocations in the proxy (malloc, calloc, realloc; one more {allocs['variant']} "
                 f"run with bench/alloc_count.c preloaded, startup included): "
                 f"{allocs['per_entry']:.2f} per entry read = "
                 + ", ".join(f"{lib} {n / allocs['entries']:.2f}" for lib, n in per
                             if n / allocs['entries'] >= 0.005) + ".\n")
    L.append("Redis commands per unique key (INFO commandstats):\n")
    for t in tp:
        L.append(f"- idemproxy {t['variant']}: {t['cmds_per_key']:.2f} = {breakdown(t['commands'], t['unique'])}; "
                 f"re-read of done entries: {t['copy_cmds_per_entry']:.2f} per entry = "
                 f"{breakdown(t['copy_commands'], N)}")
    for k, r in base.items():
        L.append(f"- baseline ({k}): {r['cmds_per_key']:.2f} = {breakdown(r['commands'], max(r['keys'], 1))}")
    L.append("")
    L.append("Redis CPU per unique key (commandstats usec), by command:\n")
    for t in tp:
        L.append(f"- idemproxy {t['variant']}: {t['redis_usec_per_key']:.2f} µs = "
                 f"{breakdown(t['redis_usec'], t['unique'])}")
    for k, r in base.items():
        L.append(f"- baseline ({k}): {r['redis_usec_per_key']:.2f} µs = {breakdown(r['redis_usec'], max(r['keys'], 1))}")
    for r in lat:
        L.append(f"- idemproxy at {r['rate']:,} entries/s, per entry (XADD left out): "
                 f"{r['redis_usec_per_entry']:.2f} µs = {breakdown(r['redis_usec'], r['entries'])}"
                 + (f"; commands per entry: {breakdown(r['commands'], r['entries'])}" if r.get("commands") else ""))
    L.append("")
    L.append("What the runs saw (median round):\n")
    for t in tp:
        L.append(f"- idemproxy {t['variant']}: {t['deliveries']} deliveries for {t['unique']} unique keys "
                 f"({t['redeliveries']} with attempt > 1, {t['ack_timeouts']:.0f} ack timeouts), outcomes acked {t['acked']:.0f} + duplicate "
                 f"{t['duplicates']:.0f}; copies found busy and parked {t['lock_busy']:.0f}; "
                 f"keys done after {t['t_keys']:.2f} s, all entries after {t['t_all']:.2f} s; "
                 f"longest time between two deliveries {t['max_gap_s']:.2f} s.")
    L.append("")

    L.append("| target | measured | |")
    L.append("|---|---|---|")
    for v in VARIANTS:
        need = 0.8 if v.endswith("/single") else 0.5
        r = ratio(v, base.get("b-" + v))
        L.append(f"| {v}: idemproxy ≥ {need} × (b) keys/s | {r:.2f} | {ok(r >= need, r)} |")
    for v in VARIANTS:
        t, bb = by.get(v), base.get("b-" + v)
        if t and bb:
            r, lo, hi = redis_ratio(t, bb)
            L.append(f"| {v}: Redis CPU per unique key (commandstats usec) idemproxy ≤ (b), the median of "
                     f"each round's ratio | {r:.2f} ({lo:.2f}–{hi:.2f}); {t['redis_usec_per_key']:.2f} µs against "
                     f"{bb['redis_usec_per_key']:.2f} µs | {ok(r <= 1)} |")
        if by.get(v):
            q = copy_ratio(v)
            L.append(f"| {v}: copies skipped ≥ 2 × the rate of new keys | {q:.2f} | {ok(q >= 2)} |")
    for r in lat:
        lim = CPU_TARGETS.get(r["rate"])
        if lim:
            L.append(f"| proxy CPU ≤ {lim} s per 1k entries at {r['rate']:,} entries/s | {r['cpu_per_1k']:.3f} s | "
                     f"{ok(r['cpu_per_1k'] <= lim)} |")
    for r in lat:
        over99, over999 = r["p99_us"] - r["floor"]["p99_us"], r["p999_us"] - r["floor"]["p999_us"]
        L.append(f"| p99 over the floor's ≤ 0.5 ms at {r['rate']:,} entries/s | {ms(over99)} ms | {ok(over99 <= 500)} |")
        L.append(f"| p99.9 over the floor's ≤ 2 ms at {r['rate']:,} entries/s | {ms(over999)} ms | "
                 f"{ok(over999 <= 2000)} |")
    for r in lat:
        if r["rate"] == 5000:
            L.append(f"| p99 ≤ 2 ms at 5k entries/s (issue 5) | {ms(r['p99_us'])} ms | {ok(r['p99_us'] <= 2000)} |")
    runs = list(lat) + list(other) + [r["again"] for r in lat if r.get("again")] + ([slow] if slow else [])
    twice = meta.get("extra_deliveries", 0) + sum(r["delivered"] - r["unique"] for r in runs)
    L.append(f"| every unique key delivered once (every throughput round and latency run: "
             f"deliveries − unique keys) | {twice} | "
             f"{ok(twice == 0)} |")
    if mem:
        worst = max(mem["rss_kib"], mem["rss_later_kib"])
        L.append(f"| RSS ≤ 16 MiB with {mem['held']} deliveries in flight | {worst / 1024:.1f} MiB | "
                 f"{ok(worst <= 16 * 1024)} |")
    return "\n".join(L) + "\n"


def main():
    for prog in ("bench_worker", "bench_producer", "bench_baseline", "alloc_count.so"):
        if not (BIN_DIR / prog).exists():
            sys.exit(f"bench: {BIN_DIR / prog} is missing: run `make -C bench` first")
    OUT.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
            "load_start": loadavg(), "ticks_start": cpu_ticks(), "rev": git_rev(),
            "binary": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(
                Path(os.environ.get("IDEMPROXY_BIN", ROOT / "build" / "idemproxy")).stat().st_mtime)),
            "redis": subprocess.run(["redis-server", "--version"], capture_output=True,
                                    text=True).stdout.split(" sha=")[0]}
    log(f"N={N} copies={COPIES} rates={RATES} variants={VARIANTS} tls={TLS_VARIANTS} fp={FP_VARIANTS} fence={FENCE_VARIANTS}; "
        f"load average {meta['load_start']}")
    tmp = tempfile.mkdtemp(prefix="idemproxy-bench-")
    b = Bench(tmp)
    failed = True
    try:
        # Rounds interleave idemproxy and the baselines, so a change in the
        # machine's load hits them alike; each row reports its median round.
        tp_runs = {v: [] for v in VARIANTS}
        base_runs = {}
        for rnd in range(REPEAT if VARIANTS or TLS_VARIANTS or FP_VARIANTS or FENCE_VARIANTS or SAMPLE_A else 0):
            log(f"round {rnd + 1} of {REPEAT}")
            for v in VARIANTS:
                tp_runs[v].append(throughput(b, v, b.fresh(), perf=PERF if rnd == 0 else None))
            for v in TLS_VARIANTS:
                tp_runs.setdefault(v + " tls", []).append(throughput(b, v, b.fresh(), tls=True))
            for v in FP_VARIANTS:
                tp_runs.setdefault(v + " fp", []).append(throughput(b, v, b.fresh(), fp=True))
            for v in FENCE_VARIANTS:
                tp_runs.setdefault(v + " fence", []).append(throughput(b, v, b.fresh(), fence=True))
            if SAMPLE_A:
                base_runs.setdefault("a", []).append(baseline(b, "a", "split", limit=min(SAMPLE_A, N)))
            for v in VARIANTS:
                read, layout = v.split("/")
                base_runs.setdefault("b-" + v, []).append(baseline(b, "b", layout, read=read))
        meta["extra_deliveries"] = sum(r["deliveries"] - r["unique"] for runs in tp_runs.values() for r in runs)
        tp = [median_run(runs) for runs in tp_runs.values()]
        base = {k: median_run(runs) for k, runs in base_runs.items()}
        allocs = allocations(b, VARIANTS[0]) if VARIANTS else None
        # Per rate: the default row (with its floor, system calls and the live
        # guard), its A/A control, then the other settings, close together.
        lat, other = [], []
        for i, rate in enumerate(RATES):
            r = latency(b, rate, i == 0)
            lat.append(r)
            if LAT_CONTROL:
                r["again"] = latency(b, rate, False, floor=r["floor"], extras=False)
            for opts in ([{"batch_ms": 0}] if OFF_ROWS else []) + ([{"linger_ms": LINGER_MS}] if LINGER_MS else []):
                if rate <= 5000:
                    other.append(latency(b, rate, False, opts, floor=r["floor"], extras=False))
        # The headline pair again, round by round over the rates (each beside
        # the first round's floor): its ratio's median and range.
        for r in lat:
            r["rounds"] = [head_round(r)]
        for _ in range(1, HEAD_ROUNDS):
            for r in lat:
                r["rounds"].append(head_round(latency(b, r["rate"], False, floor=r["floor"], extras=False,
                                                      guard=True)))
        slow = latency(b, SLOW_RATE, False, seconds=SLOW_SECONDS, extras=False) if SLOW_RATE else None
        mem = hold(b) if HOLD else None
        clu = bench_cluster.measure(sys.modules[__name__], b, CLUSTER_N) if CLUSTER_N else []
        abr = ab(b) if AB_BIN else None
        trc = tracing_rows(b) if TRACING else []
        cli = client_rows(b) if CLIENTS else []
        failed = False
    finally:
        b.close()
        if failed:
            log(f"failed: configs and logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    meta["load_end"] = loadavg()
    (s0, t0), (s1, t1) = meta["ticks_start"], cpu_ticks()
    meta["steal_pct"] = 100.0 * (s1 - s0) / max(t1 - t0, 1)
    meta["ab_bin"] = AB_BIN
    md = (report(meta, tp, base, lat, mem, allocs, other, slow) if tp or base or lat or mem else "") \
        + bench_cluster.report(clu, spread) + (ab_report(meta, abr) if abr else "") \
        + (tracing_report(trc) if trc else "") + (client_report(cli) if cli else "")
    (OUT / "results.md").write_text(md)
    (OUT / "results.json").write_text(json.dumps({"meta": meta, "throughput": tp, "baselines": base,
                                                  "latency": lat, "latency_other": other, "latency_slow": slow,
                                                  "memory": mem, "cluster": clu,
                                                  "allocations": allocs, "ab": abr, "tracing": trc,
                                                  "clients": cli},
                                                 indent=1))
    print(md)
    log(f"written {OUT / 'results.md'} and results.json")


if __name__ == "__main__":
    main()
