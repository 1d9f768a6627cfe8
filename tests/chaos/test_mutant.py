"""The database sink can fail: with the helper's fence statement skipped
(--mutant skip-fence, the inbox kept), the search reports a stale write on
the fixed --db seeds that refuse stale holders (seeds 2 and 9: lock_key, a
lease lost while a worker stalls). Run by the suite chaos-db-mutant."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_skipping_the_fence_is_found_as_a_stale_write():
    found = []
    for attempt in range(3):       # a timing search: seed 2 was red in 3 runs of 3
        res = subprocess.run([sys.executable, str(ROOT / "tests" / "chaos" / "chaos.py"), "--fixed", "--db",
                              "--mutant", "skip-fence", "--jobs", "2"],
                             capture_output=True, text=True, timeout=300, cwd=ROOT, env=dict(os.environ))
        out = res.stdout + res.stderr
        found = [ln for ln in out.splitlines() if "db-stale-write" in ln]
        if found:
            break
    assert found, "the skip-fence mutant survived three runs of the fixed --db seeds:\n" + out
    assert res.returncode != 0, out
    others = [ln for ln in out.splitlines() if "db-effect-twice" in ln or "db-inbox" in ln]
    assert not others, ("the mutant keeps the inbox: nothing but stale writes", others)
