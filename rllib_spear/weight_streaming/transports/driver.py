"""Transport "driver": the whole inference state through the driver, one Ray object for all
runners, applied by RLlib's ``set_state`` on each runner (the path before weight streaming;
docs/design.md "Weight streaming"). The driver holds every weight at once: kept for comparison
(``benchmarks/weight_sync.py``) and as the plainest reference of a transport."""
from __future__ import annotations

from typing import Any

from ..registry import register_transport
from ..transport import Placement, Transport, WeightSender

__all__ = ["DriverTransport", "DriverSender"]


class DriverSender(WeightSender):
    def state(self) -> dict | None:
        """The learner's inference state with its version (rank 0; every rank gathers under FSDP)."""
        return self.weights.state()


@register_transport("driver")
class DriverTransport(Transport):
    """The runner's side is its ``set_state`` (RLlib's Checkpointable API): no receiver object."""

    sender = DriverSender
    wire_dtype = "learner"  # RLlib's module state, as the learner holds it

    def sync(self, placement: Placement) -> tuple[list[int], int]:
        import ray
        from ray.rllib.core import COMPONENT_RL_MODULE
        from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

        state = self._learner_state(placement)
        payload = {COMPONENT_RL_MODULE: state[COMPONENT_RL_MODULE], WEIGHTS_SEQ_NO: int(state.get(WEIGHTS_SEQ_NO, 0))}
        if placement.local_runner_only:
            runner = placement.env_runner_group.local_env_runner
            runner.set_state(payload)
            return [runner.weights_version], payload[WEIGHTS_SEQ_NO]
        ref = ray.put(payload)

        def apply(runner: Any, ref=ref) -> int:
            runner.set_state(ray.get(ref))
            return runner.weights_version

        return placement.on_runners(apply, remote_only=True), payload[WEIGHTS_SEQ_NO]

    def _learner_state(self, placement: Placement) -> dict:
        from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

        if self.settings.sharding == "fsdp":
            # every rank gathers its shards one tensor at a time; rank 0 returns the weights
            return placement.on_senders(type(self), lambda s: s.state())
        return placement.learner_group.get_state(components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE,
                                                 inference_only=True)[COMPONENT_LEARNER]
