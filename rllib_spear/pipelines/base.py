"""The interface of a rollout pipeline, and the record it hands the algorithm each iteration.

A rollout pipeline (``.training(rollout_pipeline=...)``, docs/design.md "Rollout pipelining")
decides when the driver asks the env runners for samples relative to the learner update:
"sync" samples, then trains; "one_step_off" trains on the batch it launched last iteration while
the runners sample the next; "async" keeps the runners sampling without pause. The algorithm
(``GRPO.training_step``) knows none of this: once per iteration it calls
:meth:`RolloutPipeline.next_batch` with itself as the :class:`PipelineHost` and gets a
:class:`SampledBatch`: whole groups, the runners' stats, the weights version the batch is
measured against, and the pipeline's counters, which the algorithm logs as they are.

Around checkpoints the algorithm calls :meth:`~RolloutPipeline.drop` (a restore: what is in
flight belongs to the run being replaced), :meth:`~RolloutPipeline.checkpoint_sampler_state`
(the task sampler state to save, so that a restored run samples the tasks in flight again),
:meth:`~RolloutPipeline.get_state` and :meth:`~RolloutPipeline.set_state`.
``rllib_spear.testing.check_pipeline_contract`` runs every registered pipeline through the same
checks (whole groups, counters every iteration, the lag bound, a restore trains what the
original run would have trained next).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol

from ..core.trajectory import Trajectory

__all__ = ["RolloutPipeline", "PipelineHost", "SampledBatch", "resync_of", "draw_seed_key"]


@dataclass
class SampledBatch:
    """One iteration's batch, as a pipeline hands it to the algorithm.

    ``counts``: events of this collection (runner results lost, groups dropped), logged as sums
    every iteration, 0 included (in RLlib's metrics a sum that an iteration does not log reads
    NaN). ``gauges``: this iteration's values (lags, waits), logged with window 1. Keys are
    RLlib metrics-logger keys (a name, or a tuple path such as ``("env_runners",
    "policy_lag_max")``)."""

    trajectories: list[Trajectory]
    runner_stats: list[dict]
    #: the learners' weights version the batch's lag metrics count against
    sampled_version: int
    counts: dict[Hashable, int] = field(default_factory=dict)
    gauges: dict[Hashable, float] = field(default_factory=dict)


class PipelineHost(Protocol):
    """What a pipeline may use of the algorithm (``GRPO`` is one)."""

    #: the run's config: ``tasks_per_iteration``, ``group_size``, ``max_policy_lag``, ``seed``
    config: Any
    #: RLlib's EnvRunnerGroup of LLMEnvRunners
    env_runner_group: Any
    #: the checkpointed dataset position (``recipe.TaskSampler``)
    task_sampler: Any
    #: completed training iterations
    algo_step: int

    @property
    def policy_version(self) -> int:
        """The learners' weights version, on every runner since the last sync."""

    def sync_weights(self) -> None:
        """The learners' weights to every runner (restarted ones included), version-checked."""


def resync_of(host: PipelineHost) -> Callable[[], int]:
    """``resync()``: sync every runner to the learners' weights now and return that version
    (the runners' probe restarted some: they hold the initial weights)."""
    def resync() -> int:
        host.sync_weights()
        return host.policy_version

    return resync


def draw_seed_key(host: PipelineHost) -> tuple[int, int]:
    """(run seed, tasks served before the next draw): the key of the next draw's sampling seeds
    (``runner_requests.sampling_seed``). It is restored with the task sampler, so a restored run,
    or a runner restarted by fault tolerance, samples each draw with the original run's seeds."""
    return int(host.config.seed or 0), host.task_sampler.served


class RolloutPipeline(ABC):
    """One ``rollout_pipeline``: how the driver gets each iteration's batch from the runners.

    A subclass is registered with ``@register_pipeline(name)`` and built once per run with
    :meth:`from_config`. Its per-run state (requests in flight, the versions it saw) lives on
    the instance; what a checkpoint must hold is :meth:`get_state`."""

    #: the registered name (set by ``register_pipeline``)
    name: ClassVar[str] = ""
    #: whether the runners sample while the learners update. Then a batch is up to
    #: ``max_policy_lag`` updates behind the learners (truncated importance sampling is on by
    #: default, ``GRPOConfig.policy_loss_config``) and colocated engines cannot sleep during the
    #: update (``.resources(colocate=True)`` is refused).
    overlaps_update: ClassVar[bool] = False
    #: whether it takes groups as they finish from a rollout that streams them (a rollout_mode
    #: with ``streams_groups``); ``rollout_mode="auto"`` then picks the async agent loop
    needs_streamed_groups: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def from_config(cls, config: Any) -> "RolloutPipeline":
        """The pipeline of a run of ``config`` (a validated ``GRPOConfig``)."""

    @classmethod
    def config_problems(cls, config: Any) -> list[str]:
        """What this pipeline cannot run with in ``config``: one message per problem, naming the
        knob and the fix (``GRPOConfig.validate()`` raises the first); [] when it can run."""
        return []

    @abstractmethod
    def next_batch(self, host: PipelineHost) -> SampledBatch:
        """This iteration's batch of whole groups (``host.config.group_size`` trajectories each)."""

    def drop(self, env_runner_group: Any) -> int:
        """Discard everything in flight (a restore: the restored run samples fresh); returns the
        number of trajectories discarded."""
        return 0

    def checkpoint_sampler_state(self, sampler: Any) -> dict:
        """The task sampler state a checkpoint saves: by default the sampler's own."""
        return sampler.get_state()

    def get_state(self) -> dict:
        """What a checkpoint must hold beyond the sampler state."""
        return {}

    def set_state(self, state: dict) -> None:
        """Restore :meth:`get_state` (after :meth:`drop`)."""
