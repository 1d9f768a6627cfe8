/* The client against real nanomsg: nanocat (Debian's nanomsg-utils) as a REQ peer, over ipc and tcp. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { serve, Status } from '../src/index.js';
import { Delivery, Ack } from './req_peer.js';

const haveNanocat = spawnSync('nanocat', ['--help']).error === undefined;
const dir = mkdtempSync(join(tmpdir(), 'idemproxy-nanocat-'));

/** nanocat binds 'endpoint', sends one Delivery, prints the reply in hex; resolves with the decoded Ack. */
async function roundTrip(endpoint) {
  const file = join(dir, 'delivery.bin');
  writeFileSync(file, Delivery.encode({ stream: 'room', entryId: '5-1', key: 'k', attempt: 2, fencingToken: 9 }).finish());
  const nc = spawn('nanocat', ['--req', '--bind', endpoint, '-F', file, '--hex', '--recv-timeout', '5'],
                   { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  nc.stdout.on('data', (b) => { out += b; });
  let seen;
  const worker = serve({ endpoint }, async (d) => { seen = d; });
  await new Promise((resolve) => nc.on('exit', resolve));
  await worker.close();
  const hex = /^"((?:\\x[0-9a-f]{2})*)"/.exec(out);
  assert.ok(hex, `nanocat printed ${JSON.stringify(out)}`);
  assert.equal(seen.attempt, 2);
  assert.equal(seen.fencingToken, 9n);
  return Ack.decode(Buffer.from(hex[1].replaceAll('\\x', ''), 'hex'));
}

test('nanomsg REQ over ipc gets an ACK echoing stream and entry id', { skip: !haveNanocat && 'nanocat not installed' }, async () => {
  const ack = await roundTrip(`ipc://${join(dir, 'nc.sock')}`);
  assert.equal(ack.status, Status.ACK);
  assert.equal(ack.stream, 'room');
  assert.equal(ack.entryId, '5-1');
});

test('nanomsg REQ over tcp gets an ACK', { skip: !haveNanocat && 'nanocat not installed' }, async () => {
  const port = 20000 + (process.pid % 20000);
  const ack = await roundTrip(`tcp://127.0.0.1:${port}`);
  assert.equal(ack.status, Status.ACK);
});
