"""Fixtures for the fault suite: those of the integration harness
(tests/integration/pxtest.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from pxtest import env, redis_server  # noqa: E402,F401 (fixtures)
