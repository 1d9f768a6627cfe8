"""bench/cluster.py - the Redis Cluster rows of `make bench` (issue 7): keys/s
with 1, 2 and 3 idemproxy replicas in one group against a local 3-master
cluster (no replicas: every node's CPU goes to serving), so the scaling curve
on this machine is measured, not claimed.

Data: BENCH_CLUSTER_N entries over 8 streams bench:{0}..bench:{7}, which the
3 masters share; each stream gets N/8 entries from bench_producer with its own
key prefix and the same copy ratio, XADDed to the stream's master before the
proxies start. Each replica reads all 8 streams as its own consumer and has its
own bench_worker. keys/s = unique keys / time from the proxies' start until
every entry is done and XACKed (the sum of the replicas' entries_read = N and
nothing pending).
"""
import json
import subprocess
import time
from pathlib import Path

import redis as redis_lib

STREAMS = [f"bench:{{{i}}}" for i in range(8)]


class Cluster:
    def __init__(self, m, tmp, masters=3):
        self.ports = [m.free_port() for _ in range(masters)]
        for port in self.ports:
            d = Path(tmp) / f"cluster-{port}"
            d.mkdir()
            m.spawn(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
                     "--cluster-enabled", "yes", "--cluster-port", str(m.free_port()),
                     "--cluster-config-file", "nodes.conf", "--save", "", "--appendonly", "no"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port in self.ports:
            m.Bench.wait(lambda: self._ping(port), 10, f"redis-server {port}")
        subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                        "--cluster-yes"], check=True, stdout=subprocess.DEVNULL, timeout=60)
        m.Bench.wait(self._ok, 30, "cluster state ok")
        self.client = redis_lib.RedisCluster(host="127.0.0.1", port=self.ports[0], decode_responses=True)

    def node(self, port):
        return redis_lib.Redis(port=port, decode_responses=True)

    def _ping(self, port):
        try:
            return self.node(port).ping()
        except redis_lib.exceptions.ConnectionError:
            return False

    def _ok(self):
        return all("cluster_state:ok" in self.node(p).execute_command("CLUSTER", "INFO") for p in self.ports)

    def owner(self, key):
        slot = self.client.keyslot(key)
        for start, end, master, *_ in self.node(self.ports[0]).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(master[1])
        raise RuntimeError(f"no master for {key}")

    def flush(self):
        for p in self.ports:
            self.node(p).flushall()


def load(m, cl, n):
    unique = 0
    for i, s in enumerate(STREAMS):
        out = subprocess.run([str(m.BIN_DIR / "bench_producer"), "--port", str(cl.owner(s)), "--stream", s,
                              "--entries", str(n // len(STREAMS)), "--copies", str(m.COPIES),
                              "--seed", str(m.SEED + i), "--prefix", f"evt{i}-"],
                             check=True, capture_output=True, text=True).stdout
        unique += json.loads(out)["unique"]
    return unique


def config(m, tmp, name, cl, endpoint, mport, layout):
    cfg = Path(tmp) / f"{name}.yaml"
    streams = "".join(f"""  - stream: '{s}'
    group: bench
    consumer: {name}
    payload_field: payload
    key: "#event.eventId"
    layout: {layout}
""" for s in STREAMS)
    cfg.write_text(f"""redis:
  cluster: [{', '.join(f'127.0.0.1:{p}' for p in cl.ports)}]
app:
  endpoint: {endpoint}
  max_inflight: {m.MAX_INFLIGHT}
metrics:
  listen: 127.0.0.1:{mport}
log:
  level: warn
shutdown_grace_ms: 2000
streams:
{streams}""")
    return cfg


def run(m, b, cl, replicas, n, layout="single"):
    """One measurement: 'replicas' proxies, each with its own worker, over freshly loaded data."""
    cl.flush()
    unique = load(m, cl, n)
    n_total = (n // len(STREAMS)) * len(STREAMS)
    threads = max(1, m.WORKERS // replicas)
    workers, proxies = [], []
    for i in range(replicas):
        workers.append(m.spawn([str(m.BIN_DIR / "bench_worker"), "--endpoint",
                                f"ipc://{b.tmp}/cluster{i}.sock", "--threads", str(threads)],
                               stdout=subprocess.PIPE, text=True))
    time.sleep(0.2)
    for i in range(replicas):
        mport = m.free_port()
        cfg = config(m, b.tmp, f"cluster-px{i}", cl, f"ipc://{b.tmp}/cluster{i}.sock", mport, layout)
        proxies.append(m.Proxy(b.bin, cfg, Path(b.tmp) / f"cluster-px{i}.log", mport, None))
    t0 = time.monotonic()
    for p in proxies:
        p.start()

    def done():
        read = pending = 0
        for p in proxies:
            p.alive()
            for line in p.get("/metrics")[1].splitlines():
                if line.startswith("idemproxy_entries_read_total{"):
                    read += float(line.rsplit(" ", 1)[1])
                elif line.startswith("idemproxy_entries_pending{"):
                    pending += float(line.rsplit(" ", 1)[1])
        return read >= n_total and pending == 0
    b.wait(done, m.TIMEOUT, f"{n_total} entries done on the cluster with {replicas} replica(s)")
    t = time.monotonic() - t0
    cpu = sum(p.cpu() for p in proxies)
    for p in proxies:
        p.stop()
    deliveries = 0
    for w in workers:
        w.send_signal(15)
        out, _ = w.communicate(timeout=15)
        deliveries += json.loads(out.strip().splitlines()[-1])["deliveries"]
    res = {"replicas": replicas, "entries": n_total, "unique": unique, "seconds": t,
           "keys_per_s": unique / t, "entries_per_s": n_total / t, "deliveries": deliveries,
           "cpu_per_1k": cpu / (n_total / 1000), "worker_threads": threads, "load": m.loadavg()}
    m.log(f"  cluster, {replicas} replica(s): {res['keys_per_s']:.0f} keys/s ({t:.2f} s), "
          f"{deliveries} deliveries for {unique} keys")
    return res


def measure(m, b, n, counts=(1, 2, 3)):
    """The cluster rows: a median of m.REPEAT interleaved rounds per replica count."""
    cl = Cluster(m, b.tmp)
    m.log(f"cluster: 3 masters, {n} entries over {len(STREAMS)} streams")
    runs = {k: [] for k in counts}
    for _ in range(m.REPEAT):
        for k in counts:
            runs[k].append(run(m, b, cl, k, n))
    out = []
    for k in counts:
        rs = sorted(runs[k], key=lambda r: r["keys_per_s"])
        med = dict(rs[(len(rs) - 1) // 2])
        med["keys_range"] = [rs[0]["keys_per_s"], rs[-1]["keys_per_s"]]
        out.append(med)
    return out


def report(rows, spread):
    if not rows:
        return ""
    base = rows[0]["keys_per_s"]
    lines = ["", f"Redis Cluster: 3 masters (no replicas), one redis-server each on this machine; "
             f"{rows[0]['entries']} entries over {len(STREAMS)} streams bench:{{0}}..bench:{{7}}, "
             "50% copies, layout single; each idemproxy replica reads all 8 streams in one group and "
             "has its own bench_worker; keys/s = unique keys / time until every entry is done and XACKed. "
             "Median of the rounds (min–max).", "",
             "| idemproxy replicas | keys/s | entries/s | × 1 replica | deliveries / unique keys | "
             "proxy CPU s / 1k entries (all replicas) |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['replicas']} | {spread(r)} | {r['entries_per_s']:,.0f} | "
                     f"{r['keys_per_s'] / base:.2f} | {r['deliveries']} / {r['unique']} | "
                     f"{r['cpu_per_1k']:.3f} |")
    return "\n".join(lines) + "\n"
