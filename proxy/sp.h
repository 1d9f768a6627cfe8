/*
 * sp.h - the app socket's wire on the daemon's own loop: the listening side
 * of SP's request/reply protocol over ipc:// and tcp:// (docs/protocol.md),
 * what a raw NN_REQ socket of nanomsg does, without its thread.
 */
#ifndef PX_SP_H
#define PX_SP_H

#include <stddef.h>
#include <stdint.h>

#include <ev.h>

#include "spframe.h" /* PX_SP_RCVMAX, the largest frame a worker may send */

typedef struct px_sp px_sp;

/* Connections closed for breaking the wire (idemproxy_protocol_errors_total). */
extern unsigned long long px_sp_wire_errors;

/* A reply: its request id (the first 4 bytes of the frame, big-endian) and
 * the body after it. 'body' is valid during the call only. */
typedef void (*px_sp_reply_cb)(void *arg, uint32_t id, const unsigned char *body, size_t len);
/* A connection that had no room has room again. */
typedef void (*px_sp_room_cb)(void *arg);

/* Listen on 'endpoint' (ipc:///path or tcp://host:port). NULL with the
 * reason in 'err', and errno set, when it cannot. */
px_sp *px_sp_bind(struct ev_loop *loop, const char *endpoint, px_sp_reply_cb on_reply,
                  px_sp_room_cb on_room, void *arg, char *err, size_t errlen);
/* Send a request with id 'id' to the next worker in turn that has room: 0,
 * or -1 when none has (on_room says when one has again). */
int px_sp_send(px_sp *sp, uint32_t id, const void *body, size_t len);
/* Hold the replies (docs/performance.md): while px_sp_hold outnumbers
 * px_sp_unhold, a connection sent a request is taken out of the loop's
 * watch, so its worker's answer does not wake the loop; it waits in the
 * socket until px_sp_read_held, which each px_sp_unhold calls. A hold is
 * bounded by its caller (the batch window); NULL is ignored. */
void px_sp_hold(px_sp *sp);
void px_sp_unhold(px_sp *sp);
/* Read what the held connections hold; they stay held. */
void px_sp_read_held(px_sp *sp);
/* ... and put them back in the watch: the next answer wakes the loop (for
 * a caller that waits for one, not for the hold's end). */
void px_sp_release_held(px_sp *sp);
/* Connections held now. */
int px_sp_held(const px_sp *sp);
/* Workers connected (their handshake done). */
int px_sp_workers(const px_sp *sp);
/* Close every connection and the listening socket (an ipc socket file is
 * removed, unless another process has bound the path since). */
void px_sp_close(px_sp *sp);

#endif
