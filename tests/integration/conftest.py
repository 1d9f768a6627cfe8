"""pytest fixtures: see pxtest.py for the pieces."""
import pytest

from pxtest import Env, RedisServer


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
