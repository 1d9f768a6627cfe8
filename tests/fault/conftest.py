"""Fixtures for the fault suite: the integration harness (tests/integration/
pxtest.py) plus the checker of SPEC 5.7."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from pxtest import Env, RedisServer  # noqa: E402


@pytest.fixture
def redis_server(tmp_path):
    d = tmp_path / "redis"
    d.mkdir()
    srv = RedisServer(d)
    yield srv
    srv.stop()


@pytest.fixture
def env(tmp_path, redis_server):
    e = Env(tmp_path, redis_server)
    yield e
    e.close()
