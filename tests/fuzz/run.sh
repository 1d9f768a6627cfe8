#!/usr/bin/env bash
# Build the libFuzzer targets (tests/fuzz/Makefile, into build/fuzz) and run
# each for FUZZ_SECONDS (default 60). Ends with one line "N passed, N failed",
# one count per target, and exits non-zero when a target failed.
#
#   tests/fuzz/run.sh [TARGET...]        fuzz (all of template event ack config
#                                        cluster replies sentinel traceparent spframe)
#   tests/fuzz/run.sh merge [TARGET...]  fold what earlier runs found into the
#                                        committed corpus, minimised (-set_cover_merge=1)
#
# Per target: first the reproducers in tests/fuzz/crashes/TARGET/ run once
# (regressions), then libFuzzer runs with the committed corpus
# tests/fuzz/corpus/TARGET/ (read only) and TARGET.dict. New inputs go to the
# scratch dir build/fuzz/corpus/TARGET/, crashes to build/fuzz/artifacts/TARGET/,
# the full output to build/fuzz/logs/TARGET.log. A target fails on a crash,
# a leak, undefined behaviour, a broken contract check, a timeout (an input
# slower than FUZZ_TIMEOUT s, default 10) or running out of memory.
#
# Environment: FUZZ_SECONDS, FUZZ_TIMEOUT, FUZZ_CC (default clang),
# PX_FUZZ_KNOWN (checks for known bugs to let pass, see fuzz.h).
# Needs clang with libFuzzer; on Debian 12 the packages clang,
# libclang-rt-14-dev and llvm (llvm-symbolizer), installed here when missing.
set -uo pipefail
cd "$(dirname "$0")/../.."

ALL="template event ack config cluster replies sentinel traceparent spframe"

# Bounds on every run (issue 37): an input is at most max_len bytes (per
# target, below: several times the largest input the target's seeds need,
# small enough that 10 s still runs thousands of inputs), the process at most
# 2048 MB (-rss_limit_mb) and one allocation at most 256 MB (-malloc_limit_mb):
# either limit hit is a failure, as a leak or a crash is. Recursion is bounded
# in the code under test, not here: templates nest at most
# PX_TEMPLATE_MAX_DEPTH (128), JSON payloads and dotted field names at most
# 31 levels (event.c, jscan.c), hiredis' reader at most 7 levels of arrays;
# the RESP targets feed hiredis no aggregate declaring more than 4096
# elements (resp.h: hiredis allocates the array from the header, which the
# daemon caps itself, reply.h). Config, ack and the SP frames have no
# recursion.
max_len() {
    case $1 in
        event) echo 65536 ;;     # payloads and dotted names up to the depth limit and past it
        config) echo 16384 ;;    # a few stream blocks of YAML
        cluster|replies) echo 8192 ;;
        spframe) echo 2048 ;;    # a header and a few frames; each input is read again split at every point
        *) echo 4096 ;;          # template, ack, sentinel
    esac
}
B=build/fuzz
SECONDS_EACH=${FUZZ_SECONDS:-60}
TIMEOUT=${FUZZ_TIMEOUT:-10}
export FUZZ_CC=${FUZZ_CC:-clang}

mode=fuzz
if [ "${1:-}" = merge ]; then mode=merge; shift; fi
targets=${*:-$ALL}

# libFuzzer present? Install Debian's packages when it is not.
fuzzer_works() {
    local t
    t=$(mktemp -d) || return 1
    printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$t/f.c"
    "$FUZZ_CC" -fsanitize=fuzzer,address,undefined -o "$t/f" "$t/f.c" >/dev/null 2>&1
    local rc=$?
    rm -rf "$t"
    return $rc
}
if ! fuzzer_works; then
    echo "fuzz: $FUZZ_CC cannot build a libFuzzer target; installing clang libclang-rt-14-dev llvm" >&2
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-14-dev llvm >/dev/null
    if ! fuzzer_works; then
        echo "fuzz: still no libFuzzer"
        echo "0 passed, 1 failed"
        exit 1
    fi
fi
for s in llvm-symbolizer llvm-symbolizer-14; do
    if command -v $s >/dev/null 2>&1; then export ASAN_SYMBOLIZER_PATH; ASAN_SYMBOLIZER_PATH=$(command -v $s); break; fi
done

if ! make -s -f tests/fuzz/Makefile -j"$(nproc)" B="$PWD/$B" $(printf "$PWD/$B/fuzz_%s " $targets); then
    echo "fuzz: the build failed"
    echo "0 passed, $(wc -w <<<"$targets") failed"
    exit 1
fi

# Stop on the first error, keep the stack symbolized, and catch leaks.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ $mode = merge ]; then
    for t in $targets; do
        new=tests/fuzz/corpus/$t.new
        rm -rf "$new"; mkdir -p "$new" "$B/corpus/$t"
        "$B/fuzz_$t" -set_cover_merge=1 "$new" "tests/fuzz/corpus/$t" "$B/corpus/$t" >"$B/merge-$t.log" 2>&1 &&
            rm -rf "tests/fuzz/corpus/$t" && mv "$new" "tests/fuzz/corpus/$t" &&
            echo "merge $t: $(ls "tests/fuzz/corpus/$t" | wc -l) files, $(du -sb --apparent-size "tests/fuzz/corpus/$t" | cut -f1) bytes" ||
            { echo "merge $t: failed, see $B/merge-$t.log"; rm -rf "$new"; }
    done
    exit 0
fi

# The first lines of the report of whatever stopped a run.
show_failure() {
    grep -a -m1 -A40 -E '^FUZZ CHECK FAILED|^==[0-9]+==ERROR|runtime error:|ERROR: libFuzzer' "$1" |
        grep -av '^ *#[0-9]* 0x[0-9a-f]* in fuzzer::' | head -40 | sed 's/^/    | /'
}

pass=0
fail=0
for t in $targets; do
    bin=$B/fuzz_$t
    log=$B/logs/$t.log
    mkdir -p "$B/logs" "$B/corpus/$t" "$B/artifacts/$t"
    dict=(); [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")

    # Regressions: every saved reproducer must pass now.
    repro=()
    [ -d "tests/fuzz/crashes/$t" ] && mapfile -t repro < <(find "tests/fuzz/crashes/$t" -type f | sort)
    if [ ${#repro[@]} -gt 0 ]; then
        if ! "$bin" -timeout="$TIMEOUT" "${repro[@]}" >"$B/logs/$t-repro.log" 2>&1; then
            echo "fuzz $t: FAILED: a reproducer in tests/fuzz/crashes/$t crashes ($B/logs/$t-repro.log)"
            grep -a '^Running: ' "$B/logs/$t-repro.log" | tail -1 | sed 's/^/    | /'
            show_failure "$B/logs/$t-repro.log"
            fail=$((fail + 1))
            continue
        fi
    fi

    before=$(find "$B/corpus/$t" -type f | wc -l)
    "$bin" -max_total_time="$SECONDS_EACH" -timeout="$TIMEOUT" -rss_limit_mb=2048 \
        -malloc_limit_mb=256 -max_len="$(max_len "$t")" -print_final_stats=1 -artifact_prefix="$B/artifacts/$t/" "${dict[@]}" \
        "$B/corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    after=$(find "$B/corpus/$t" -type f | wc -l)
    runs=$(grep -aEo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$')
    speed=$(grep -aEo 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -Eo '[0-9]+$')
    last=$(grep -aE '^#[0-9]+' "$log" | tail -1)
    cov=$(grep -Eo 'cov: [0-9]+' <<<"$last")
    ft=$(grep -Eo 'ft: [0-9]+' <<<"$last")
    corp=$(grep -Eo 'corp: [0-9]+/[0-9]+[a-zA-Z]*' <<<"$last")
    stats="${runs:-?} runs, ${speed:-?} exec/s, $cov $ft $corp, $((after - before)) new inputs"
    if [ $rc -eq 0 ]; then
        echo "fuzz $t: ok: $stats"
        pass=$((pass + 1))
    else
        art=$(grep -aEo "Test unit written to .*" "$log" | tail -1 | sed 's/Test unit written to //')
        echo "fuzz $t: FAILED (exit $rc): $stats; input: ${art:-none}; log: $log"
        show_failure "$log"
        fail=$((fail + 1))
    fi
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
