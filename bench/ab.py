"""A/B of idemproxy builds at the headline rates, beside the live guard.

    .venv/bin/python bench/ab.py NAME=BINARY[@OPTION:VALUE] ... 

Each round runs, per rate: the floor (one blocked XREAD, no proxy), then every
build named (a copy of BINARY, with streams[].OPTION set to VALUE if given),
then the live guard (bench_baseline --block), so the builds meet the same hour
of the VM. Prints per rate and build the median CPU µs per entry (min-max),
its ratio to the guard of the same round, and the median p99 over the floor.
docs/performance.md's A/B tables were made with it. Builds with `make bench`'s
helpers first (`make -C bench`, as `make bench` does).

Environment: AB_ROUNDS (3), AB_SECONDS (6) per row of a build and the floor,
AB_RATES (1000,5000); the guard runs BENCH_RATE_SECONDS (bench/run.py).
"""
import json
import os
import shutil
import statistics as st
import sys
import tempfile

os.environ.setdefault("BENCH_SYSCALLS", "")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as R  # noqa: E402


def main(args):
    builds = []
    for a in args:
        name, _, path = a.partition("=")
        opts = None
        if "@" in path:
            path, opt = path.split("@", 1)
            k, v = opt.split(":", 1)
            opts = {k: int(v)}
        if not name or not path:
            sys.exit(__doc__)
        builds.append((name, path, opts))
    if not builds:
        sys.exit(__doc__)
    rounds = int(os.environ.get("AB_ROUNDS", "3"))
    secs = float(os.environ.get("AB_SECONDS", "6"))
    rates = [int(x) for x in os.environ.get("AB_RATES", "1000,5000").split(",")]
    tmp = tempfile.mkdtemp(prefix="idemproxy-ab-")
    b = R.Bench(tmp)
    copies = {}
    for name, path, _ in builds:
        copies[name] = os.path.join(tmp, "bin-" + name)
        shutil.copy2(path, copies[name])
    cpu = {r: {n: [] for n, _, _ in builds} for r in rates}
    over = {r: {n: [] for n, _, _ in builds} for r in rates}
    guard = {r: [] for r in rates}
    try:
        run_rounds(b, builds, copies, rounds, secs, rates, cpu, over, guard)
    finally:
        b.close()
    report(builds, rates, cpu, over, guard)


def run_rounds(b, builds, copies, rounds, secs, rates, cpu, over, guard):
    for rnd in range(rounds):
        for rate in rates:
            floor = R.latency_floor(b, rate, secs)
            for name, _, opts in builds:
                b.bin = copies[name]
                x = R.latency(b, rate, first=False, seconds=secs, floor=floor, extras=False, opts=opts)
                cpu[rate][name].append(x["cpu_per_1k"] * 1000)
                over[rate][name].append((x["p99_us"] - floor["p99_us"]) / 1000)
            guard[rate].append(R.live_guard(b, rate)["cpu_per_1k"] * 1000)
            print(f"round {rnd} at {rate}/s: guard {guard[rate][-1]:.1f} µs/entry; "
                  + ", ".join(f"{n} {cpu[rate][n][-1]:.1f}" for n, _, _ in builds), flush=True)


def report(builds, rates, cpu, over, guard):
    print(json.dumps({"cpu_us_per_entry": cpu, "p99_over_floor_ms": over, "guard_us_per_entry": guard}))
    for rate in rates:
        g = guard[rate]
        for name, _, _ in builds:
            v = cpu[rate][name]
            ratio = [a / c for a, c in zip(v, g)]
            print(f"{rate}/s {name}: CPU µs/entry {st.median(v):.1f} ({min(v):.1f}-{max(v):.1f}); "
                  f"/ guard {st.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f}); "
                  f"p99 over floor {st.median(over[rate][name]):.2f} ms "
                  f"({min(over[rate][name]):.2f}-{max(over[rate][name]):.2f})")
        print(f"{rate}/s guard: {st.median(g):.1f} µs/entry")


if __name__ == "__main__":
    main(sys.argv[1:])
