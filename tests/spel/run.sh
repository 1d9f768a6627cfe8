#!/bin/sh
# Differential test of the key template language against real SpEL.
#
# Builds tests/spel (Maven; dependencies come from Maven Central on first use)
# and runs every case of tests/unit/template_cases.json through SpEL. The last
# line printed is "N passed, N failed"; the exit status is non-zero on failure.
# Extra arguments go to the test: --show prints what SpEL gives for each case.
set -e
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! mvn -q -B -Dstyle.color=never compile dependency:build-classpath \
        -Dmdep.outputFile=target/classpath.txt -Dmdep.includeScope=runtime >"$log" 2>&1; then
    cat "$log" >&2
    echo "tests/spel: the Maven build failed" >&2
    echo "0 passed, 1 failed"
    exit 1
fi
java -cp "target/classes:$(cat target/classpath.txt)" idemproxy.spel.SpelDiff \
    "$@" "$here/../unit/template_cases.json"
