/*
 * sp.js - the REP side of nanomsg's scalability protocols (SP), on node:net.
 *
 * Just enough of the SP wire format for a worker to answer idemproxy's raw
 * NN_REQ socket (or any nanomsg, NNG or mangos REQ peer):
 *   - a connection starts with 8 bytes from each side: 00 'S' 'P' 00, the
 *     sender's 16-bit protocol id (we send REP = 49, and accept only REQ = 48)
 *     and 00 00;
 *   - then messages: tcp:// frames are a 64-bit big-endian length and the
 *     body; ipc:// (a UNIX socket) frames put a 0x01 type byte first;
 *   - a request body starts with its backtrace, 4-byte big-endian words of
 *     which the last (the request id) has the top bit set; the reply carries
 *     the same words in front of its own body, which routes it back.
 * One connection carries any number of requests; each comes with a reply()
 * bound to the connection it came on, so answers can go back in any order
 * (this is what NNG's REP contexts do). A message over 'maxMessageBytes' closes
 * the connection, as nanomsg and NNG do; the dialer then connects again.
 */
import net from 'node:net';
import { EventEmitter, once } from 'node:events';

export const SP_REQ = 48;
export const SP_REP = 49;
const MAX_HOPS = 8;               // backtrace words we accept, NNG's default max TTL
const HANDSHAKE_TIMEOUT_MS = 10000;

/** 'ipc:///path' → {ipc: true, path}; 'tcp://host:port' or 'tcp://[::1]:port' → {ipc: false, host, port}. */
export function parseEndpoint(endpoint) {
  let m = /^ipc:\/\/(.+)$/.exec(endpoint);
  if (m) return { ipc: true, path: m[1] };
  m = /^tcp:\/\/(?:\[([^\]]+)\]|([^:/[\]]+)):(\d{1,5})$/.exec(endpoint);
  if (m) return { ipc: false, host: m[1] ?? m[2], port: Number(m[3]) };
  throw new TypeError(`unsupported endpoint "${endpoint}": use ipc:///path or tcp://host:port`);
}

/** The 8-byte SP connection header for protocol 'proto'. */
export function spHeader(proto) {
  return Buffer.from([0, 0x53, 0x50, 0, proto >> 8, proto & 0xff, 0, 0]);
}

/** One SP message as it goes on the wire: [0x01 on ipc] length body. */
export function frame(ipc, body) {
  const head = Buffer.alloc(ipc ? 9 : 8);
  if (ipc) head[0] = 1;
  head.writeBigUInt64BE(BigInt(body.length), ipc ? 1 : 0);
  return Buffer.concat([head, body]);
}

/** Splits a request into {backtrace, body}; null if no word within MAX_HOPS has the top bit set. */
export function splitBacktrace(msg) {
  for (let off = 0; off + 4 <= msg.length && off < 4 * MAX_HOPS; off += 4) {
    if (msg[off] & 0x80) return { backtrace: msg.subarray(0, off + 4), body: msg.subarray(off + 4) };
  }
  return null;
}

/**
 * Keeps one REP connection to 'endpoint' open, dialing again with backoff
 * (100 ms doubling to 1 s) whenever it is refused or lost. Events:
 *   'request' ({backtrace, body, reply(buf) → bool, live → bool})
 *   'connect' (), 'disconnect' (err or undefined), 'warn' (err: a peer that
 *   broke the protocol, a request without a request id).
 */
export class RepDialer extends EventEmitter {
  #ep; #maxBytes; #sock = null; #backoff = 100; #timer = null; #paused = false; #closed = false;

  constructor(endpoint, { maxMessageBytes = 1 << 20 } = {}) {
    super();
    this.#ep = parseEndpoint(endpoint);
    this.#maxBytes = maxMessageBytes;
  }

  start() { if (!this.#sock && !this.#timer && !this.#closed) this.#dial(); }

  /** Stop / start reading from the connection (backpressure: the peer's sends then wait). */
  pause() { this.#paused = true; this.#sock?.pause(); }
  resume() { this.#paused = false; this.#sock?.resume(); }

  /** Stops dialing and ends the connection once the replies written are flushed; resolves when it is closed. */
  close() {
    this.#closed = true;
    clearTimeout(this.#timer);
    const sock = this.#sock;
    if (!sock) return Promise.resolve();
    const cut = setTimeout(() => sock.destroy(), 1000);   // a peer that never closes its side
    sock.end();
    // Read on, discarding, to the peer's close: nanomsg closes only once the deliveries it has
    // written are read, so a paused socket waited out the cut (and would reset the connection).
    sock.resume();
    return once(sock, 'close').then(() => clearTimeout(cut));
  }

  #dial() {
    this.#timer = null;
    const ep = this.#ep;
    const sock = ep.ipc ? net.connect({ path: ep.path }) : net.connect({ host: ep.host, port: ep.port });
    this.#sock = sock;
    let chunks = [], have = 0, shook = false, need = 8, len = -1;
    const take = (n) => {                     // the next n buffered bytes, or null
      if (have < n) return null;
      const all = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, have);
      chunks = n < have ? [all.subarray(n)] : [];
      have -= n;
      return all.subarray(0, n);
    };
    const broken = (why) => { this.emit('warn', new Error(`${why}; closing the connection`)); sock.destroy(); };
    let lastErr;
    const reply = (backtrace) => (body) => {
      if (sock.destroyed || !sock.writable) return false;
      sock.write(frame(ep.ipc, Buffer.concat([backtrace, body])));
      return true;
    };
    const shakeTimer = setTimeout(() => broken('no SP header from the peer in time'), HANDSHAKE_TIMEOUT_MS);

    sock.on('connect', () => {
      if (!ep.ipc) sock.setNoDelay(true);
      sock.setKeepAlive(true);
      sock.write(spHeader(SP_REP));
    });
    sock.on('data', (chunk) => {
      if (this.#closed) return;                // closing: what comes now is never answered
      chunks.push(chunk);
      have += chunk.length;
      for (let b; !sock.destroyed && (b = take(need)) !== null;) {
        if (!shook) {                          // the peer's SP header
          if (b.readUInt32BE(0) !== 0x00535000 || b.readUInt16BE(6) !== 0) return broken('not an SP peer');
          if (b.readUInt16BE(4) !== SP_REQ) return broken(`peer speaks SP protocol ${b.readUInt16BE(4)}, not REQ`);
          shook = true;
          clearTimeout(shakeTimer);
          this.#backoff = 100;
          this.emit('connect');
          need = ep.ipc ? 9 : 8;
        } else if (len < 0) {                  // a frame header: [type] length
          if (ep.ipc && b[0] !== 1) return broken(`ipc frame of type ${b[0]}`);
          const n = Number(b.readBigUInt64BE(ep.ipc ? 1 : 0));
          if (!(n <= this.#maxBytes)) return broken(`message of ${n} bytes over maxMessageBytes ${this.#maxBytes}`);
          len = need = n;
        } else {                               // a message body
          const req = splitBacktrace(b);
          len = -1;
          need = ep.ipc ? 9 : 8;
          if (req === null) { this.emit('warn', new Error('request without a request id, ignored')); continue; }
          this.emit('request', { ...req, reply: reply(req.backtrace), get live() { return !sock.destroyed; } });
        }
      }
    });
    sock.on('error', (err) => { lastErr = err; });   // 'close' follows; the dialer redials
    sock.on('close', () => {
      clearTimeout(shakeTimer);
      if (this.#sock === sock) this.#sock = null;
      if (shook) this.emit('disconnect', lastErr);
      if (this.#closed) return;
      this.#timer = setTimeout(() => this.#dial(), this.#backoff);
      this.#backoff = Math.min(this.#backoff * 2, 1000);
    });
    if (this.#paused) sock.pause();
  }
}
