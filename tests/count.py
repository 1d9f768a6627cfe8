#!/usr/bin/env python3
"""Print "PASSED FAILED" for a test log, whatever runner wrote it: our plain
"N passed, N failed" line, pytest, node --test, go test -v, cargo test and
Maven Surefire. Prints nothing when the log holds no count at all."""
import re
import sys

text = open(sys.argv[1], errors="replace").read()
lines = text.splitlines()


def last(pattern):
    m = re.findall(pattern, text, re.M)
    return m[-1] if m else None


def main():
    plain = [l for l in lines if re.fullmatch(r"(\w+: )?\d+ passed, \d+ failed(, \d+ skipped)?", l.strip())]
    if plain:
        p, f = re.findall(r"\d+", plain[-1])[:2]
        return int(p), int(f)
    cargo = re.findall(r"test result: \w+\. (\d+) passed; (\d+) failed", text)
    if cargo:
        return sum(int(p) for p, _ in cargo), sum(int(f) for _, f in cargo)
    surefire = last(r"Tests run: (\d+), Failures: (\d+), Errors: (\d+)")
    if surefire:
        run, fail, err = map(int, surefire)
        return run - fail - err, fail + err
    node_pass, node_fail = last(r"^# pass (\d+)"), last(r"^# fail (\d+)")
    if node_pass is not None:
        return int(node_pass), int(node_fail or 0)
    go_pass = len(re.findall(r"^\s*--- PASS", text, re.M))
    go_fail = len(re.findall(r"^\s*--- FAIL", text, re.M))
    if go_pass or go_fail:
        return go_pass, go_fail
    summary = [l for l in lines if re.search(r"\d+ (passed|failed)", l)]
    if summary:
        l = summary[-1]
        num = lambda w: sum(int(x) for x in re.findall(rf"(\d+) {w}", l))
        return num("passed"), num("failed") + num("errors?")
    return None


res = main()
if res:
    print(*res)
