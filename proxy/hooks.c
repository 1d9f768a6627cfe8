/*
 * hooks.c - reads the test hooks (hooks.h) from the environment.
 */
#include "hooks.h"

#include <stdlib.h>

px_hooks px_hook;

static long long env_ms(const char *name)
{
    const char *v = getenv(name);
    return v ? atoll(v) : 0;
}

void px_hooks_init(void)
{
    px_hook.claim_pause_ms = (long)env_ms("IDEMPROXY_DEBUG_CLAIM_PAUSE_MS");
    px_hook.counts_delay_ms = (long)env_ms("IDEMPROXY_DEBUG_COUNTS_DELAY_MS");
    px_hook.idle_consumer_ms = env_ms("IDEMPROXY_DEBUG_IDLE_CONSUMER_MS");
    px_hook.xack_ride_ms = env_ms("IDEMPROXY_DEBUG_XACK_RIDE_MS");
}
