"""Suite-wide settings."""
import os

import pytest

# Tune replaces the SIGINT handler on every fit() and restores it only when a signal arrives, so
# after a few Tune runs in one process Ctrl-C only peels one handler off per press: keep the
# default handler, so that Ctrl-C stops the suite at once (a build stops and leaves no cache entry).
os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")


@pytest.fixture(autouse=True, scope="module")
def _no_ray_left_behind(request):
    """Outside tests/e2e (which share one session Ray, see tests/e2e/conftest.py), a test module
    that started Ray in this process (a local ``build_algo()`` calls ``init_ray``: 1 CPU) shuts it
    down at its end, so no later test inherits a Ray with the wrong resources."""
    import sys

    was_running = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    yield
    if was_running or "e2e" in request.path.parts or "ray" not in sys.modules:
        return
    import ray

    if ray.is_initialized():
        ray.shutdown()
