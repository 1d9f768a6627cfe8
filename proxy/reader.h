/*
 * reader.h - reading the streams (reader.c).
 */
#ifndef PX_READER_H
#define PX_READER_H

#include "proxy.h"

void px_reader_init(void); /* once, before any link: the script it loads */
void px_reader_start(px_stream *st);
void px_reader_kick(px_stream *st);

/* Group mode: refresh now what this consumer tracks (keep_script), e.g. once
 * the command link is back: an entry another consumer took over while the
 * link was down is found before a claim or a backoff sends it again. */
void px_reader_refresh_now(px_stream *st);
void px_reader_stop(px_stream *st);     /* once stopped, again does nothing */
void px_reader_free(px_stream *st);     /* after the command link is destroyed */
bool px_reader_live(px_stream *st);     /* connected and reading */
bool px_reader_batching(px_stream *st); /* its batch window is open: a page is due soon */
void px_reader_delivering(px_entry *e); /* a delivery goes out: Redis counts it */
void px_reader_waiting(px_entry *e);    /* it waits undelivered: Redis' count set back */

#endif
