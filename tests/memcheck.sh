#!/usr/bin/env bash
# The daemon under the sanitizers and under valgrind: the integration suite
# runs against an ASan+UBSan build, then a subset runs with the binary inside
# valgrind; every daemon log is then searched for a report. Ends with one line
# "N passed, N failed" (the pytest counts plus one check per scan).
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
pass=0 fail=0

count() {   # add up pytest's summary line from file $1
    local line p f
    line=$(grep -E '[0-9]+ (passed|failed)' "$1" | tail -1)
    p=$(grep -Eo '[0-9]+ passed' <<<"$line" | grep -Eo '[0-9]+' || echo 0)
    f=$(grep -Eo '[0-9]+ (failed|error)' <<<"$line" | grep -Eo '[0-9]+' | paste -sd+ | bc 2>/dev/null || echo 0)
    [ -n "$line" ] || f=1
    pass=$((pass + p)); fail=$((fail + f))
}

scan() {    # scan NAME DIR PATTERN: one check, failed if any log matches
    local hits
    hits=$(grep -rlE "$3" "$2" --include='*.log' 2>/dev/null | head -5)
    if [ -n "$hits" ]; then
        echo "!! $1: reports in:"; echo "$hits"; grep -hE -A20 "$3" $hits | head -60
        fail=$((fail + 1))
    else
        echo "-- $1: no reports"; pass=$((pass + 1))
    fi
}

echo "== ASan + UBSan build"
make -s B=build-asan SANITIZE=address,undefined build-asan/idemproxy >/dev/null || { echo "sanitized build failed"; echo "0 passed, 1 failed"; exit 1; }
rm -rf build/asan-run
IDEMPROXY_BIN=$PWD/build-asan/idemproxy UBSAN_OPTIONS=print_stacktrace=1 \
    $py -m pytest -q -p no:cacheprovider tests/integration -k "not test_clients.py" \
    --basetemp=build/asan-run 2>&1 | tee build/asan-run.out | tail -3
count build/asan-run.out
scan "sanitizers" build/asan-run "ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer"

echo "== valgrind (a subset: timing-tolerant tests)"
cat > build/idemproxy-valgrind <<VG
#!/bin/sh
exec valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
    $PWD/build/idemproxy "\$@"
VG
chmod +x build/idemproxy-valgrind
rm -rf build/valgrind-run
IDEMPROXY_BIN=$PWD/build/idemproxy-valgrind $py -m pytest -q -p no:cacheprovider \
    tests/integration/test_core.py tests/integration/test_metrics.py tests/integration/test_cli.py \
    -k "copies_skipped or retry_then_ack or drop_goes or restart_rereads or every_metric or numbers_add_up or key_command or check_valid or socket_mode" \
    --basetemp=build/valgrind-run 2>&1 | tee build/valgrind-run.out | tail -3
count build/valgrind-run.out
scan "valgrind" build/valgrind-run "ERROR SUMMARY: [1-9]|definitely lost: [1-9]|Invalid (read|write)|uninitialised"

echo
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
