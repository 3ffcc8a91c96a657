"""A remote runner whose engine call runs past ``generation_timeout_s`` fails its sampling call with
the clear ``GenerationTimeout`` and is then restarted in a fresh process by Ray (the hung engine
thread cannot be stopped otherwise; docs/design.md "Fault tolerance")."""
from __future__ import annotations

import os
import time

import pytest
import ray

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import GRPOConfig

from e2e_helpers import small_config


def _pid(actor) -> int:
    return ray.get(actor.apply.remote(lambda runner: os.getpid()), timeout=120)


def test_a_timed_out_engine_call_fails_the_call_and_restarts_the_runner(ray_session, tiny_model):
    # a limit no real generate call meets: every call "hangs" as far as the watchdog knows
    cfg = small_config(GRPOConfig, tiny_model).env_runners(generation_timeout_s=1e-3)
    algo = cfg.build_algo()
    try:
        (actor,) = algo.env_runner_group._worker_manager.actors().values()
        before = _pid(actor)
        tasks = [{"uid": "t0", "question": "who wrote hamlet?", "answers": ["shakespeare"]}]
        with pytest.raises(ray.exceptions.RayTaskError, match=r"GenerationTimeout.*generation_timeout_s=0\.001"):
            ray.get(actor.sample_groups.remote(tasks=tasks, group_size=2), timeout=120)
        deadline = time.monotonic() + 120
        after = None
        while time.monotonic() < deadline:  # the process ends ~2 s later; Ray starts a new one
            try:
                after = _pid(actor)
            except ray.exceptions.RayActorError:
                time.sleep(1)
                continue
            if after != before:
                break
            time.sleep(1)
        assert after is not None and after != before
    finally:
        algo.stop()
