/* The example worker (example/worker.js) against test/req_peer.js: it must not be slower than the library. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { serve } from '../src/index.js';
import { ReqPeer } from './req_peer.js';

const dir = mkdtempSync(join(tmpdir(), 'idemproxy-node-example-'));
const WORKER = fileURLToPath(new URL('../example/worker.js', import.meta.url));
const N = 1500;

/** Seconds 'peer' takes to get N deliveries answered by the worker connected to it (one at a time). */
async function drain(peer) {
  await peer.until(() => peer.conns.length === 1 && peer.conns[0].header, 20000);
  const t0 = performance.now();
  for (let i = 1; i <= N; i++) peer.deliver(i, { key: `k${i}` });
  await peer.until(() => peer.replies.length === N, 60000);
  return (performance.now() - t0) / 1000;
}

test('the example worker answers about as fast as the library itself (no per-delivery sleep)', async (t) => {
  const lib = await ReqPeer.bind(`ipc://${join(dir, 'lib.sock')}`);
  const worker = serve({ endpoint: lib.endpoint }, async () => {});
  let libSecs;
  try {
    libSecs = await drain(lib);
  } finally {
    await worker.close();
    await lib.close();
  }

  const ex = await ReqPeer.bind(`ipc://${join(dir, 'example.sock')}`);
  const child = spawn(process.execPath, [WORKER, '--endpoint', ex.endpoint], { stdio: 'ignore' });
  let exSecs;
  try {
    exSecs = await drain(ex);
  } finally {
    child.kill('SIGTERM');
    await ex.close();
  }
  const libRate = Math.round(N / libSecs), exRate = Math.round(N / exSecs);
  t.diagnostic(`example ${exRate}/s, library ${libRate}/s`);
  // Generous for a loaded machine: the example only adds an env lookup and a stdout line per delivery.
  assert.ok(exRate >= libRate / 3, `example ${exRate}/s against the library's ${libRate}/s`);
});
