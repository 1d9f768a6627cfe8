/*
 * req_peer.js - a stand-in for idemproxy in the tests: it binds an endpoint
 * and speaks raw SP REQ to whoever connects. Written from the wire format
 * alone (not with ../src/sp.js), so the two are checked against each other;
 * test/interop.test.js checks the client against real nanomsg too.
 */
import net from 'node:net';
import { once } from 'node:events';
import { idemproxy } from '../gen/idemproxy.js';

export const { Delivery, Ack } = idemproxy.v1;

export class ReqPeer {
  /** Binds 'endpoint' (ipc:///path or tcp://127.0.0.1:0); 'proto' is the SP protocol id to announce. */
  static async bind(endpoint, { proto = 48 } = {}) {
    const peer = new ReqPeer(endpoint, proto);
    const m = /^ipc:\/\/(.+)$/.exec(endpoint);
    peer.server.listen(m ? { path: m[1] } : { host: '127.0.0.1', port: 0 });
    await once(peer.server, 'listening');
    if (!m) peer.endpoint = `tcp://127.0.0.1:${peer.server.address().port}`;
    return peer;
  }

  constructor(endpoint, proto) {
    this.endpoint = endpoint;
    this.ipc = endpoint.startsWith('ipc://');
    this.conns = [];
    this.replies = [];        // {conn, id, body} in arrival order
    this.waiters = [];
    this.server = net.createServer((sock) => this.#accept(sock, proto));
  }

  #accept(sock, proto) {
    const conn = { sock, header: null, closed: false };
    this.conns.push(conn);
    sock.write(Buffer.from([0, 0x53, 0x50, 0, proto >> 8, proto & 0xff, 0, 0]));
    let buf = Buffer.alloc(0);
    sock.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      if (!conn.header) {
        if (buf.length < 8) return;
        conn.header = buf.subarray(0, 8);
        buf = buf.subarray(8);
      }
      const hl = this.ipc ? 9 : 8;
      while (buf.length >= hl) {
        const len = Number(buf.readBigUInt64BE(hl - 8));
        if (buf.length < hl + len) break;
        const msg = buf.subarray(hl, hl + len);
        buf = buf.subarray(hl + len);
        this.replies.push({ conn, id: msg.readUInt32BE(0), body: msg.subarray(4), at: Date.now() });
      }
      this.#wake();
    });
    sock.on('error', () => {});
    sock.on('close', () => { conn.closed = true; this.#wake(); });
    this.#wake();
  }

  #wake() {
    for (const w of this.waiters.splice(0)) w();
  }

  /** Resolves once 'pred()' is true; rejects after 'ms'. */
  async until(pred, ms = 3000) {
    const end = Date.now() + ms;
    while (!pred()) {
      if (Date.now() > end) throw new Error('timed out waiting');
      await new Promise((resolve) => {
        this.waiters.push(resolve);
        setTimeout(resolve, 20);
      });
    }
  }

  /** Sends a request with request id 'id' (top bit set here) and body 'body' on connection 'i'. */
  send(id, body, i = this.conns.length - 1) {
    const msg = Buffer.concat([Buffer.from([0, 0, 0, 0]), body]);
    msg.writeUInt32BE((id | 0x80000000) >>> 0, 0);
    this.sendRaw(msg, i);
  }

  /** Sends 'msg' as one SP message, backtrace included, on connection 'i'. */
  sendRaw(msg, i = this.conns.length - 1) {
    const head = Buffer.alloc(this.ipc ? 9 : 8);
    if (this.ipc) head[0] = 1;
    head.writeBigUInt64BE(BigInt(msg.length), this.ipc ? 1 : 0);
    this.conns[i].sock.write(Buffer.concat([head, msg]));
  }

  /** Sends an idemproxy.v1.Delivery built from 'fields' with request id 'id'. */
  deliver(id, fields) {
    this.send(id, Buffer.from(Delivery.encode({ stream: 's', entryId: `${id}-0`, attempt: 1, ...fields }).finish()));
  }

  /** The reply to request 'id', decoded as an Ack (waits for it). */
  async ack(id) {
    await this.until(() => this.replies.some((r) => (r.id & 0x7fffffff) === id));
    const r = this.replies.find((x) => (x.id & 0x7fffffff) === id);
    const a = Ack.decode(r.body);
    return { status: a.status, reason: a.reason, stream: a.stream, entryId: a.entryId, raw: r };
  }

  async close() {
    for (const c of this.conns) c.sock.destroy();
    this.server.close();
    await once(this.server, 'close');
  }
}
