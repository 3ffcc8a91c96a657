import logging
import os
import time

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

_RAY_INIT = dict(num_cpus=2, include_dashboard=False,
                 runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "lo", "RAY_AUTH_MODE": "disabled"}})
#: How long the actors of a finished test may take to give their resources back.
_RELEASE_WAIT_S = 15.0


def _start_session_ray() -> None:
    """The e2e tests' own 2-CPU Ray. A Ray this process started earlier with other resources (a
    local build's ``init_ray``: 1 CPU) is replaced: the 2-learner tests would wait on it forever."""
    import ray

    if ray.is_initialized() and ray.cluster_resources().get("CPU", 0.0) != _RAY_INIT["num_cpus"]:
        logging.getLogger(__name__).warning("replacing the running Ray (%s) by the e2e tests' own",
                                            ray.cluster_resources())
        ray.shutdown()
    if not ray.is_initialized():
        ray.init(**_RAY_INIT)


@pytest.fixture(scope="session")
def ray_session():
    import ray

    _start_session_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def _fresh_ray_after_a_leak():
    """Every test starts on a free cluster: when the actors of the test that just ended still hold
    resources (a failed test whose ``algo.stop()`` could not reach a busy actor), the session's
    Ray instance is restarted, so that one failure cannot make every later test wait for CPUs
    (or be refused by the resource check) and hide what actually broke."""
    yield
    import ray

    if not ray.is_initialized():
        return
    total = ray.cluster_resources().get("CPU", 0.0)
    deadline = time.monotonic() + _RELEASE_WAIT_S
    while ray.available_resources().get("CPU", 0.0) < total and time.monotonic() < deadline:
        time.sleep(0.5)
    free = ray.available_resources().get("CPU", 0.0)
    if free < total:
        logging.getLogger(__name__).warning("a test left %.2f of %.2f CPUs held: restarting Ray", total - free, total)
        ray.shutdown()
        _start_session_ray()


@pytest.fixture(scope="session")
def tiny_model():
    from rllib_spear.models.factory import tiny_model_path

    return tiny_model_path()
