"""Start Ray lean for a run that keeps everything in the driver process.

RLlib's ``Algorithm`` and Tune start Ray on first use with ``ray.init()``'s defaults: the
dashboard (and its agent processes) and one CPU slot per core, even when the run has no env
runner and no learner actors (``num_env_runners=0``, ``num_learners=0``: the env runner and
the learner live in the driver, and Ray only carries the object store of the weight sync). For
such a run ``init_ray`` starts Ray without the dashboard and with ``LOCAL_NUM_CPUS`` CPU; any
other run gets the dashboard off and Ray's resource detection. A Ray already initialised (the
user's own ``ray.init``, which is how to ask for the dashboard or more resources), or a cluster
named by ``RAY_ADDRESS``, is left as it is.

``GRPOConfig.build_algo`` calls it; before ``tune.Tuner(...).fit()`` call it yourself
(``init_ray(config)``), since Tune's trainables build their Algorithm inside a Ray already started.
"""
from __future__ import annotations

import os
from typing import Any

__all__ = ["init_ray", "is_local_run", "LOCAL_NUM_CPUS"]

#: CPU slots of a local run's Ray: nothing is scheduled on them (no actors, no tasks), so one
#: keeps Ray from prestarting a worker process per core.
LOCAL_NUM_CPUS = 1


def is_local_run(config: Any) -> bool:
    """No env runner, evaluation runner or learner actors: the run lives in the driver."""
    return (int(getattr(config, "num_env_runners", 0) or 0) == 0
            and int(getattr(config, "evaluation_num_env_runners", 0) or 0) == 0
            and int(getattr(config, "num_learners", 0) or 0) == 0)


def init_ray(config: Any = None, **ray_init_kwargs: Any) -> bool:
    """``ray.init`` with the dashboard off (and ``num_cpus=LOCAL_NUM_CPUS`` for a local
    ``config``) unless Ray is already initialised or ``RAY_ADDRESS`` names a cluster.
    ``ray_init_kwargs`` override those defaults. Returns whether it started Ray."""
    import ray

    if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False}
    if config is not None and is_local_run(config):
        kwargs["num_cpus"] = LOCAL_NUM_CPUS
    kwargs.update(ray_init_kwargs)
    ray.init(**kwargs)
    return True
