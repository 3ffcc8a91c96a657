"""One RLlib learner update, built in process, on a given learner batch: the scalar metrics it
returns (shared by the learner tests that compare two configs' updates). Importable from any test
module: pytest puts tests/ on sys.path for tests/conftest.py."""
from __future__ import annotations

import numpy as np


def learner_update_metrics(cfg, batch: dict) -> dict[str, float]:
    """``cfg.build_learner()`` updated once on ``batch`` (a ``build_learner_batches`` item); its
    scalar metrics of the default module."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    learner = cfg.build_learner(env=None)
    mab = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=len(batch["input_ids"]))
    res = learner.update(batch=mab, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 1})
    res = res[0] if isinstance(res, list) else res
    peek = lambda v: v.peek() if hasattr(v, "peek") else v  # noqa: E731
    return {k: float(peek(v)) for k, v in res[DEFAULT_MODULE_ID].items() if np.ndim(peek(v)) == 0}
