#!/usr/bin/env bash
# The source format (.clang-format, Debian 12's clang-format 14): each file of
# HELD must be left unchanged by clang-format. Ends with "N passed, N failed".
#
# Every C file of the daemon (proxy/*.c, proxy/*.h) holds to it: run
# `clang-format -i proxy/*.[ch]` before a commit. Where a hand-aligned table
# reads better, // clang-format off / on around it says so.
set -uo pipefail
cd "$(dirname "$0")/.."
HELD=$(ls proxy/*.c proxy/*.h)
pass=0 fail=0
ok() { echo "-- $1"; pass=$((pass + 1)); }
bad() { echo "!! $1"; fail=$((fail + 1)); }

if ! command -v clang-format >/dev/null 2>&1; then
    bad "clang-format is not installed (tests/deps.sh installs it)"
    echo "$pass passed, $fail failed"
    exit 1
fi
# The check can fail: a line of log.c joined to the next is reported.
if sed '/^void px_log_setup/{N;s/\n/ /}' proxy/log.c |
    clang-format --dry-run --Werror --assume-filename=proxy/log.c >/dev/null 2>&1; then
    bad "canary: a misformatted copy of proxy/log.c passed"
else
    ok "canary: a misformatted copy of proxy/log.c is reported"
fi
for f in $HELD; do
    if out=$(clang-format --dry-run --Werror "$f" 2>&1); then
        ok "$f"
    else
        bad "$f: not as .clang-format has it (clang-format -i $f):"
        echo "$out" | head -20
    fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
