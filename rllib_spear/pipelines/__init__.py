"""The driver's side of sampling: rollout pipelines, the requests to the env runners, and the
engines' sleep / wake around the learner update (docs/design.md "Rollout pipelining",
"Fully asynchronous training", "Cluster placement").

- ``base.py``: ``RolloutPipeline`` (the interface), ``PipelineHost`` (what a pipeline may use of
  the algorithm), ``SampledBatch`` (what it hands back);
- ``registry.py``: the one list of ``rollout_pipeline`` names (``register_pipeline``);
- ``sync.py`` ("sync"), ``one_step_off.py`` ("one_step_off"), ``fully_async.py`` ("async"): the
  built-in pipelines;
- ``runner_requests.py``: tasks dealt over the healthy runners, whole groups gathered, sampling
  seeds per draw (training and evaluation requests);
- ``colocation.py``: ``engine_cycle`` (the engines sleep while colocated learners train).

The algorithm (``GRPO.training_step``) asks the pipeline for its batch and the engine cycle for
its sleep / wake, without knowing which ones the config named.
"""
from __future__ import annotations

from .base import PipelineHost, RolloutPipeline, SampledBatch
from .registry import PIPELINES, get_pipeline, make_pipeline, pipeline_names, register_pipeline
# the built-ins register themselves, in this order: the order validate() lists the names in
from . import sync  # noqa: F401  isort: skip
from . import one_step_off  # noqa: F401  isort: skip
from . import fully_async  # noqa: F401  isort: skip

__all__ = ["RolloutPipeline", "PipelineHost", "SampledBatch", "PIPELINES", "register_pipeline", "get_pipeline",
           "pipeline_names", "make_pipeline"]
