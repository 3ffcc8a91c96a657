"""The engines' side of the learner update: who holds the GPU while the learners train.

``engine_cycle(config)`` gives the run's cycle, and ``GRPO.training_step`` calls it the same way
whether or not the run is colocated: :class:`AwakeEngines` (the default: each engine has a GPU of
its own and never sleeps, every call does nothing) or :class:`EngineSleepCycle` (colocated mode,
``.resources(colocate=True)``, docs/design.md "Cluster placement": each learner rank shares a GPU
with one env runner's engine, so the engines give the GPU to the learners while they train).

One training iteration of a colocated run (``GRPO.training_step``):

1. the runners sample (engines awake);
2. :meth:`EngineSleepCycle.sleep`: every engine sleeps at ``colocate_sleep_level`` (vLLM level 1:
   weights to pinned CPU memory, KV cache dropped; level 2: both dropped);
3. the learners train;
4. :meth:`EngineSleepCycle.wake_for_sync`: the learners return their cached, unused GPU blocks
   to the driver (``torch.cuda.empty_cache``: PyTorch's caching allocator keeps the backward's
   activations reserved otherwise), then every engine wakes its weights;
5. the weight sync (``GRPO.sync_weights``, unchanged: it runs on awake weights);
6. :meth:`EngineSleepCycle.wake_kv_cache`: every engine wakes its KV cache; the next iteration
   samples.

If the update fails, :meth:`EngineSleepCycle.wake_all` wakes the engines without a sync (the step
fails loudly; a level-2 engine then holds no valid weights and its runner reports version -1
until the next sync). Placement: :func:`check_colocated_placement` asks every actor where it
runs and pairs each runner with the learner rank on its GPU (``placement.colocated_pairs``).
"""
from __future__ import annotations

import time
from typing import Any, Protocol, Sequence

from ..env_runners.placement import ENGINE_MEMORY_TAGS, colocated_pairs

__all__ = ["EngineCycle", "AwakeEngines", "EngineSleepCycle", "engine_cycle", "actor_place",
           "check_colocated_placement", "release_learner_cache"]


class EngineCycle(Protocol):
    """The calls ``GRPO.training_step`` makes around the learner update (see the module doc)."""

    #: memory tags asleep on the engines now (empty: awake)
    asleep: tuple[str, ...]

    def sleep(self, env_runner_group: Any) -> None:
        """After sampling, before the update."""

    def wake_for_sync(self, learner_group: Any, env_runner_group: Any) -> None:
        """After the update, before the weight sync: the engines' weights are writable."""

    def wake_kv_cache(self, env_runner_group: Any) -> None:
        """After the weight sync: the engines can sample."""

    def wake_all(self, env_runner_group: Any) -> None:
        """A failed iteration: whatever is asleep wakes (no sync follows)."""

    def pop_seconds(self) -> dict[str, float]:
        """{"sleep" | "wake": seconds} since the last call (logged as ``colocate/engine_<k>_s``)."""


class AwakeEngines:
    """Engines with GPUs of their own: they stay awake through the update; nothing to do or log."""

    asleep: tuple[str, ...] = ()

    def sleep(self, env_runner_group: Any) -> None:
        pass

    def wake_for_sync(self, learner_group: Any, env_runner_group: Any) -> None:
        pass

    def wake_kv_cache(self, env_runner_group: Any) -> None:
        pass

    def wake_all(self, env_runner_group: Any) -> None:
        pass

    def pop_seconds(self) -> dict[str, float]:
        return {}


def actor_place() -> tuple[str, list[str]]:
    """(Ray node id, GPU ids Ray assigned) of the calling actor."""
    import ray

    ctx = ray.get_runtime_context()
    return ctx.get_node_id(), [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])]


def _learner_results(results: Any) -> list:
    errors = [r.get() for r in results.result_or_errors if not r.ok]
    if errors:
        raise errors[0]
    return [r.get() for r in results.result_or_errors]


def check_colocated_placement(learner_group: Any, env_runner_group: Any) -> dict[int, int]:
    """{runner index: learner rank on its GPU}; ValueError (naming the fix) when the actors did not
    land one learner and one runner per GPU."""
    ids = env_runner_group.healthy_env_runner_ids()
    places = env_runner_group.foreach_env_runner(lambda runner: actor_place(), local_env_runner=False,
                                                 remote_worker_ids=ids)
    learners = _learner_results(learner_group.foreach_learner(lambda learner: actor_place()))
    return colocated_pairs(dict(zip(ids, places)), learners)


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def release_learner_cache(learner_group: Any) -> None:
    """Every learner rank returns the GPU blocks its caching allocator holds but no tensor uses
    (the backward's activations), so that the engine beside it can wake into them."""
    _learner_results(learner_group.foreach_learner(lambda learner: _empty_cuda_cache()))


class EngineSleepCycle:
    """The sleep / wake calls of one colocated run's engines (see the module doc)."""

    def __init__(self, level: int) -> None:
        self.level = int(level)
        #: memory tags asleep on the engines now (empty: awake)
        self.asleep: tuple[str, ...] = ()
        self._seconds = {"sleep": 0.0, "wake": 0.0}

    def pop_seconds(self) -> dict[str, float]:
        """Seconds spent in sleep calls and in wake calls (the learners' cache release included)
        since the last call: the iteration's cost of sharing the GPUs."""
        out, self._seconds = self._seconds, {"sleep": 0.0, "wake": 0.0}
        return out

    def _on_runners(self, env_runner_group: Any, fn) -> list:
        if env_runner_group.num_remote_env_runners() == 0:
            return [fn(env_runner_group.local_env_runner)]
        return env_runner_group.foreach_env_runner(fn, local_env_runner=False)

    def sleep(self, env_runner_group: Any) -> None:
        """After sampling: every engine sleeps at ``level``."""
        t0 = time.perf_counter()
        self._on_runners(env_runner_group, lambda runner, lv=self.level: runner.sleep_engine(lv))
        self.asleep = ENGINE_MEMORY_TAGS
        self._seconds["sleep"] += time.perf_counter() - t0

    def _wake(self, env_runner_group: Any, tags: Sequence[str]) -> None:
        tags = tuple(t for t in tags if t in self.asleep)
        if tags:
            t0 = time.perf_counter()
            self._on_runners(env_runner_group, lambda runner, t=tags: runner.wake_engine(t))
            self.asleep = tuple(t for t in self.asleep if t not in tags)
            self._seconds["wake"] += time.perf_counter() - t0

    def wake_for_sync(self, learner_group: Any, env_runner_group: Any) -> None:
        """After the update, before the weight sync: the learners free their cached blocks, then
        the engines wake their weights (the sync writes into them)."""
        if "weights" in self.asleep:
            t0 = time.perf_counter()
            release_learner_cache(learner_group)
            self._seconds["wake"] += time.perf_counter() - t0
        self._wake(env_runner_group, ("weights",))

    def wake_kv_cache(self, env_runner_group: Any) -> None:
        """After the weight sync: the engines wake their KV cache (and can sample again)."""
        self._wake(env_runner_group, ("kv_cache",))

    def wake_all(self, env_runner_group: Any) -> None:
        """Whatever is still asleep wakes, weights first (a failed update: no sync follows)."""
        self._wake(env_runner_group, ENGINE_MEMORY_TAGS)


def engine_cycle(config: Any) -> EngineCycle:
    """The run's cycle: :class:`EngineSleepCycle` at ``colocate_sleep_level`` when colocated."""
    return EngineSleepCycle(config.colocate_sleep_level) if config.colocate else AwakeEngines()
