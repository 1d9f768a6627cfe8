#!/usr/bin/env python3
"""Print "PASSED FAILED SKIPPED TESTS ROWS" for a test log, whatever runner
wrote it: our plain "N passed, N failed[, N skipped]" line, pytest, node
--test, go test -v, cargo test and Maven Surefire. Prints nothing when the log
holds no count at all.

TESTS is how many distinct tests ran and ROWS how many cases they ran in all
(a table of 262 cases checked by one test is 1 test and 262 rows):
  - a "N tests, N rows" line (tests/unit/test.h: distinct checks, checks run);
  - pytest with -rA/-rp: one summary line per node id; the id without its
    [parameters] is the test, each id a row;
  - go test -v: top-level tests, subtests as rows;
  - otherwise each counted test is one test and one row.

`count.py --self-test` checks the parsers on made-up logs."""
import re
import sys


def parse(text):
    lines = text.splitlines()

    def last(pattern):
        m = re.findall(pattern, text, re.M)
        return m[-1] if m else None

    def counts():
        plain = [l for l in lines
                 if re.fullmatch(r"(\w+: )?\d+ passed, \d+ failed(, \d+ skipped)?", l.strip())]
        if plain:
            n = [int(x) for x in re.findall(r"\d+", plain[-1])]
            return n[0], n[1], n[2] if len(n) > 2 else 0
        cargo = re.findall(r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", text)
        if cargo:
            return tuple(sum(int(c[i]) for c in cargo) for i in range(3))
        surefire = last(r"Tests run: (\d+), Failures: (\d+), Errors: (\d+)(?:, Skipped: (\d+))?")
        if surefire:
            run, fail, err = map(int, surefire[:3])
            skip = int(surefire[3] or 0)
            return run - fail - err - skip, fail + err, skip
        node_pass, node_fail = last(r"^# pass (\d+)"), last(r"^# fail (\d+)")
        if node_pass is not None:
            skip = int(last(r"^# skipped (\d+)") or 0) + int(last(r"^# todo (\d+)") or 0)
            return int(node_pass), int(node_fail or 0), skip
        go = [len(re.findall(rf"^\s*--- {w}", text, re.M)) for w in ("PASS", "FAIL", "SKIP")]
        if any(go):
            return tuple(go)
        summary = [l for l in lines if re.search(r"\d+ (passed|failed)", l)]
        if summary:
            l = summary[-1]
            num = lambda w: sum(int(x) for x in re.findall(rf"(\d+) {w}\b", l))
            return (num("passed") + num("xpassed"), num("failed") + num("errors?"),
                    num("skipped") + num("xfailed"))
        return None

    c = counts()
    if c is None:
        return None
    p, f, s = c
    # distinct tests and rows
    shape = re.findall(r"^(\d+) tests, (\d+) rows$", text, re.M)
    ids = re.findall(r"^(?:PASSED|FAILED|ERROR|XFAIL|XPASS) (\S+::[^\s\[]+)(\[.*?\])?(?: - .*)?$",
                     text, re.M)
    gotop = re.findall(r"^--- (?:PASS|FAIL|SKIP): (\S+)", text, re.M)
    if shape:
        tests, rows = sum(int(t) for t, _ in shape), sum(int(r) for _, r in shape)
    elif ids:
        rows = len(set(ids))
        tests = len({t for t, _ in ids})
    elif gotop:
        tests, rows = len(gotop), p + f + s
    else:
        tests = rows = p + f + s
    return p, f, s, tests, rows


def self_test():
    cases = [
        ("3 passed, 1 failed\n", (3, 1, 0, 4, 4)),
        ("2 tests, 10 rows\n10 passed, 0 failed\n", (10, 0, 0, 2, 10)),
        ("ok a\nskip chroot\n5 passed, 0 failed, 1 skipped\n", (5, 0, 1, 6, 6)),
        ("PASSED t.py::test_a[x]\nPASSED t.py::test_a[y z]\nFAILED t.py::test_b - boom\n"
         "SKIPPED [1] t.py:9: no java\n=== 2 passed, 1 failed, 1 skipped in 3s ===\n",
         (2, 1, 1, 2, 3)),
        ("== 4 passed, 2 skipped, 1 xfailed in 1.0s ==\n", (4, 0, 3, 7, 7)),
        ("# pass 7\n# fail 0\n# skipped 1\n# todo 0\n", (7, 0, 1, 8, 8)),
        ("Tests run: 12, Failures: 1, Errors: 0, Skipped: 2\n", (9, 1, 2, 12, 12)),
        ("test result: ok. 5 passed; 0 failed; 1 ignored; 0 measured\n", (5, 0, 1, 6, 6)),
        ("--- PASS: TestA\n    --- PASS: TestA/x\n--- SKIP: TestB\n", (2, 0, 1, 2, 3)),
        ("no count here\n", None),
    ]
    bad = 0
    for log, want in cases:
        got = parse(log)
        if got != want:
            bad += 1
            print(f"FAIL count.py on {log!r}: got {got}, want {want}")
    print(f"{len(cases) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    res = parse(open(sys.argv[1], errors="replace").read())
    if res:
        print(*res)
