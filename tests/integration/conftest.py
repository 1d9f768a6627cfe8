"""pytest fixtures: see pxtest.py for the pieces."""
from pxtest import env, redis_server  # noqa: F401 (fixtures)
