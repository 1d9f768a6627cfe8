"""clients/node as the npm registry would receive it: `npm pack` of a clean
export (prepack generates gen/ from the package's own proto/), the tarball
installed into an empty project outside the repository together with
typescript and @types/node, `tsc --noEmit` of that project (a TypeScript file
and the worker program itself, checkJs) against the package's declarations,
and the worker program run against a real idemproxy and redis-server. A
handler that fails once must be an 'error' event in the program's output and
its entry be retried; a handler still running at the delivery's deadline sees
its AbortSignal abort."""
import json
import os
import subprocess
import tarfile
import time

import pytest

from conftest import ROOM, run
from pxtest import pending, publish, wait_for

WORKER = r'''// @ts-check
import { serve, HandlerError } from 'idemproxy-worker';

const endpoint = process.argv[2];
console.error(`resolved ${import.meta.resolve('idemproxy-worker')}`);
const worker = serve({ endpoint, concurrency: 2 }, async (d, { signal }) => {
  const n = JSON.parse(d.payload.toString('utf8')).n;
  process.stdout.write(`${d.key} attempt=${d.attempt} n=${n}\n`);
  if (d.key === 'fail-once' && d.attempt === 1) throw new Error('boom on first try');
  if (d.key === 'slow-once' && d.attempt === 1) {
    // Outlives the ack deadline: the signal must abort, and idemproxy delivers it again.
    await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
    process.stderr.write(`ABORT ${d.key} ${signal.reason.name} late_ms=${Date.now() - d.deadlineUnixMs}\n`);
    throw signal.reason;
  }
});
worker.on('error', (err) => {
  const cause = err.cause instanceof Error ? err.cause.message : String(err.cause);
  console.error(`ERROR ${err instanceof HandlerError} key=${err.delivery.key} cause=${cause}`);
});
worker.on('warn', (err) => console.error(`WARN ${err.message}`));
process.once('SIGTERM', () => worker.close().then(() => process.exit(0)));
'''

TYPES = r'''import { serve, Drop, NoReply, Status, HandlerError, DEFAULT_ENDPOINT,
         type Delivery, type HandlerContext, type WorkerOptions } from 'idemproxy-worker';

const options: WorkerOptions = { endpoint: DEFAULT_ENDPOINT, concurrency: 4, maxEntryBytes: Infinity };
const worker = serve(options, async (d: Delivery, { signal }: HandlerContext): Promise<void> => {
  const token: bigint = d.fencingToken;
  const aborted: boolean = signal.aborted;
  const source: Buffer | undefined = d.field('source');
  const when: number = d.deadlineUnixMs;
  // @ts-expect-error attempt is a number, not any
  d.attempt.toUpperCase();
  if (token === 0n || aborted || !source || when < 0) throw new Drop('no fencing');
  if (d.payload.length === 0) throw new NoReply();
});
worker.on('error', (err) => {
  const h: HandlerError = err;
  const key: string = h.delivery.key;
  void key;
});
// @ts-expect-error a misspelt option
serve({ endpont: 'ipc:///tmp/x.sock' }, () => undefined);
const ack: 1 | 2 | 3 = Status.ACK;
void ack;
const closed: Promise<void> = worker.close();
void closed;
'''

TSCONFIG = {"compilerOptions": {"strict": True, "noEmit": True, "target": "es2022", "module": "nodenext",
                                 "moduleResolution": "nodenext", "allowJs": True, "checkJs": True,
                                 "skipLibCheck": False, "types": ["node"]},
            "files": ["types.ts", "worker.mjs"]}

KEYS = ["k1", "k2", "fail-once", "slow-once"]
NPM = ["npm", "--no-audit", "--no-fund", "--loglevel=error"]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """A project outside the repository with the packed tarball installed."""
    from conftest import ROOT, export
    run(["make", "-s", "-C", str(ROOT / "clients" / "node"), "tools"], cwd=ROOT)   # node and npm, if missing
    tmp = tmp_path_factory.mktemp("node")
    src = export("clients/node", tmp / "export")
    run(NPM + ["ci"], cwd=src)
    res = run(NPM + ["pack", "--json", "--pack-destination", str(tmp)], cwd=src)
    tgz = tmp / json.loads(res.stdout)[0]["filename"]
    app = tmp / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "outside", "private": True, "type": "module"}))
    run(NPM + ["install", str(tgz), "typescript@5", "@types/node@20"], cwd=app)
    (app / "worker.mjs").write_text(WORKER)
    (app / "types.ts").write_text(TYPES)
    (app / "tsconfig.json").write_text(json.dumps(TSCONFIG))
    return app, tgz


def test_tarball_is_a_public_package_that_carries_its_schema(app):
    _, tgz = app
    with tarfile.open(tgz) as t:
        names = set(t.getnames())
        pkg = json.load(t.extractfile("package/package.json"))
        code = "".join(t.extractfile(n).read().decode() for n in names if n.endswith(".js"))
    assert {"package/src/index.js", "package/src/index.d.ts", "package/src/sp.js", "package/gen/idemproxy.js",
            "package/proto/idemproxy/v1/idemproxy.proto", "package/LICENSE"} <= names, sorted(names)
    assert "private" not in pkg and pkg["license"] == "Apache-2.0"
    assert pkg["exports"]["."]["types"] == "./src/index.d.ts"
    assert pkg["repository"]["url"] == "git+https://github.com/idemproxy/idemproxy.git"
    assert "../../" not in code          # nothing reaches outside the package


def test_tsc_accepts_the_outside_project(app):
    run(["npx", "--no-install", "tsc", "--noEmit", "-p", "."], cwd=app[0])


def test_installed_worker_against_idemproxy(env, app):
    app = app[0]
    ep = env.endpoint()
    out, err = app / "out.txt", app / "err.txt"
    w = subprocess.Popen(["node", "worker.mjs", ep], cwd=str(app), stdout=open(out, "w"),
                         stderr=open(err, "w"), start_new_session=True)
    try:
        env.proxy([ROOM],
                  endpoint=ep, ack_timeout_ms=2000)
        publish(env.r, "room", [{"eventId": k, "n": i} for i, k in enumerate(KEYS)])
        want = sorted([f"{k} attempt=1 n={i}" for i, k in enumerate(KEYS)] +
                      ["fail-once attempt=2 n=2", "slow-once attempt=2 n=3"])
        lines = lambda: sorted(l for l in out.read_text().splitlines() if "attempt=" in l)  # noqa: E731
        wait_for(lambda: len(lines()) >= len(want) and pending(env.r, "room", "g") == 0, timeout=60,
                 what=f"deliveries (worker stderr: {err.read_text()[-2000:]})")
        time.sleep(0.3)
        assert lines() == want
        for k in KEYS:
            assert (env.r.get("idem:" + k) or "")[:1] == "D", k
        assert pending(env.r, "room", "g") == 0 and env.r.xlen("dlq") == 0
        log = err.read_text().splitlines()
        assert any(l.startswith(f"resolved file://{app}/node_modules/idemproxy-worker/") for l in log), log
        errors = [l for l in log if l.startswith("ERROR ")]
        assert "ERROR true key=fail-once cause=boom on first try" in errors, log
        aborts = [l for l in log if l.startswith("ABORT ")]
        assert len(aborts) == 1 and aborts[0].startswith("ABORT slow-once TimeoutError late_ms="), log
        assert 0 < int(aborts[0].rsplit("=", 1)[1]) < 1500, log   # at the deadline, not long after
    finally:
        os.killpg(w.pid, 15)
        rc = w.wait(15)
    assert rc == 0, f"the worker did not stop cleanly on SIGTERM ({rc}): {err.read_text()[-2000:]}"
