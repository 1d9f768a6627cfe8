#!/usr/bin/env bash
# bench/sp_transport.sh - sp_transport (sp_transport.c) for nanomsg and NNG,
# alternated RUNS times at each window, then the median of each column: a busy
# machine makes single runs vary by 2-3x.
#   make -C bench sp_transport && bench/sp_transport.sh [RUNS] [N]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
n=${2:-50000}
bin=build/bench/sp_transport
for window in 64 1; do
    out=$(for i in $(seq "$runs"); do for lib in nanomsg nng; do "$bin" "$lib" "$n" "$window"; done; done)
    for lib in nanomsg nng; do
        echo "$out" | awk -v lib="$lib" -v w="$window" -v runs="$runs" '
            $1 == lib { r[++k] = $8; d[k] = $11; c[k] = $15 }
            function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
                                                if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                            return a[int((n + 1) / 2)] }
            END { printf "%-7s window %2d: %7.0f req/s, daemon %5.2f us CPU/req, worker %5.2f us CPU/req (median of %d)\n",
                         lib, w, med(r, k), med(d, k), med(c, k), runs }'
    done
done
