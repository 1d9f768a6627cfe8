/*
 * deliver.h - deliveries to the workers over nanomsg (deliver.c).
 */
#ifndef PX_DELIVER_H
#define PX_DELIVER_H

#include "proxy.h"

int px_deliver_init(px_proxy *px);
void px_deliver_deinit(px_proxy *px);
void px_deliver_flush(px_proxy *px); /* send_q -> socket */
int px_deliver_workers(px_proxy *px);
void px_deliver_forget(px_proxy *px, px_entry *e); /* drop e's slot (shutdown) */
size_t px_deliver_size(px_proxy *px, px_entry *e); /* its Delivery's largest encoding */
size_t px_deliver_window(px_proxy *px);            /* unanswered deliveries allowed now */
/* A batch window opened in Redis, and one ended: while one is out, the
 * workers' answers wait in their sockets until one ends (sp.h, px_sp_hold). */
void px_deliver_hold(px_proxy *px);
void px_deliver_unhold(px_proxy *px);
extern unsigned long long px_protocol_errors;

#endif
