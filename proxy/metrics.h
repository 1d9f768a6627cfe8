/*
 * metrics.h - /metrics, /healthz and /readyz, and the histograms (metrics.c).
 */
#ifndef PX_METRICS_H
#define PX_METRICS_H

#include "proxy.h"

int px_metrics_start(px_proxy *px); /* PX_ERR: cannot listen */
void px_metrics_stop(px_proxy *px);
void px_metrics_render(px_proxy *px, px_buf *out);
bool px_metrics_ready(px_proxy *px);
void px_metrics_observe(const double *bounds, px_hist *h, double seconds);
extern const double px_ack_latency_bounds[PX_HIST_BUCKETS];
extern const double px_lock_wait_bounds[PX_HIST_BUCKETS];
extern const double px_dup_age_bounds[PX_HIST_BUCKETS];
extern const double px_loop_busy_bounds[PX_HIST_BUCKETS];

#endif
