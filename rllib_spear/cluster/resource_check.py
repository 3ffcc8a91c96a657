"""Refuse a run whose actors can never start on the Ray cluster (docs/design.md "Fault tolerance").

Ray queues an actor whose CPUs or GPUs the cluster does not have, and RLlib waits for it without a
word: two FSDP learners and a runner on ``ray.init(num_cpus=2)`` sat for minutes without a first
iteration. ``GRPO.setup`` calls :func:`check_cluster_fits` before any actor starts; it compares
what the config's actors ask for (:func:`resource_demands`) with the cluster's totals
(``ray.cluster_resources()``) and raises, naming the knobs and the fix, when they cannot fit:

* env runners: ``num_env_runners`` x (``num_cpus_per_env_runner``, ``num_gpus_per_env_runner``,
  ``custom_resources_per_env_runner``); ``num_env_runners=0`` samples in the driver, no actor;
* learners: ``num_learners`` x (``num_cpus_per_learner``, "auto" = 1 CPU without a GPU, else 0;
  ``num_gpus_per_learner``; ``custom_resources_per_learner``); ``num_learners=0`` trains in the
  driver, no actor. Colocated mode needs no rule of its own: ``validate()`` already split each
  shared GPU (0.49 learner + 0.51 runner = 1 GPU per pair, env_runners/placement.py);
* every single actor must also fit on one node (a vLLM runner with ``tensor_parallel_size=4``
  needs 4 GPUs on one machine).

Not counted: the driver (``num_cpus_for_main_process``). Outside Tune it is a plain process, not
a Ray actor, and holds no Ray CPU. Under Tune it is the trial's actor, and the trial's placement
group (``GRPO.default_resource_request``: driver + runners + learners, the same config) was
reserved before ``setup`` ran, so the actors fit by construction: the check is skipped there
(Tune itself only warns, every minute and forever, about a trial whose placement group never
fits: ``rllib-spear train`` runs :func:`check_trial_fits` on that placement group before Tune
starts). A cluster with an autoscaler may grow into the demand: there the check only warns.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["ActorDemand", "resource_demands", "check_resources", "check_cluster_fits", "learner_cpus",
           "check_placement_group", "check_trial_fits"]

_EPS = 1e-9  # fractional GPU shares (0.49 + 0.51) must not fail on rounding


@dataclass(frozen=True)
class ActorDemand:
    """``count`` actors of one kind, each asking for ``per_actor`` (resource -> amount)."""

    kind: str  # "env runner" | "learner"
    count: int
    per_actor: Mapping[str, float]
    knobs: Mapping[str, str]  # resource -> the knob that sets it, e.g. "CPU" -> "num_cpus_per_learner"
    count_knob: str

    def total(self, resource: str) -> float:
        return self.count * float(self.per_actor.get(resource, 0) or 0)

    def describe(self, resource: str) -> str:
        """e.g. ``num_learners=2 x num_cpus_per_learner=1``."""
        knob = self.knobs.get(resource, f"custom resources of each {self.kind}")
        return f"{self.count_knob}={self.count} x {knob}={_g(self.per_actor.get(resource, 0))}"


def _g(x: Any) -> str:
    return f"{float(x or 0):g}"


def learner_cpus(config: Any) -> float:
    """``num_cpus_per_learner`` as RLlib's LearnerGroup resolves it ("auto": 1 without a GPU, else 0)."""
    cpus = getattr(config, "num_cpus_per_learner", "auto")
    if cpus == "auto":
        return 1.0 if not (config.num_gpus_per_learner or 0) else 0.0
    return float(cpus or 0)


def resource_demands(config: Any) -> list[ActorDemand]:
    """The remote actors ``config`` makes ``Algorithm.setup`` start, with what each asks Ray for."""
    out = []
    runners = int(config.num_env_runners or 0)
    if runners > 0:
        per = {"CPU": float(config.num_cpus_per_env_runner or 0), "GPU": float(config.num_gpus_per_env_runner or 0),
               **{k: float(v) for k, v in (config.custom_resources_per_env_runner or {}).items()}}
        out.append(ActorDemand("env runner", runners, per,
                               {"CPU": "num_cpus_per_env_runner", "GPU": "num_gpus_per_env_runner"},
                               "num_env_runners"))
    learners = int(config.num_learners or 0)
    if learners > 0:
        per = {"CPU": learner_cpus(config), "GPU": float(max(0, config.num_gpus_per_learner or 0)),
               **{k: float(v) for k, v in (config.custom_resources_per_learner or {}).items()}}
        out.append(ActorDemand("learner", learners, per,
                               {"CPU": "num_cpus_per_learner", "GPU": "num_gpus_per_learner"}, "num_learners"))
    return out


def _fix(resource: str) -> str:
    if resource == "CPU":
        return ("lower num_env_runners / num_learners or their CPUs (.env_runners(num_cpus_per_env_runner=...), "
                ".learners(num_cpus_per_learner=...)), or start Ray with more (ray.init(num_cpus=...))")
    if resource == "GPU":
        return ("lower num_env_runners / num_learners or their GPUs (.env_runners(num_gpus_per_env_runner=...), "
                ".learners(num_gpus_per_learner=...); .resources(colocate=True) shares one GPU between a learner "
                "and an engine), or run on a cluster with more GPUs")
    return f"lower the custom resource {resource!r} the actors ask for, or add it to the cluster"


def check_resources(config: Any, cluster: Mapping[str, float],
                    nodes: Sequence[Mapping[str, float]] | None = None) -> str | None:
    """Why the actors of ``config`` can never all start on a cluster with ``cluster`` totals (and,
    when given, the per-node totals ``nodes``), naming the knobs and the fix; None when they fit."""
    demands = resource_demands(config)
    problems = []
    for res in sorted({r for d in demands for r, v in d.per_actor.items() if v}):
        need = sum(d.total(res) for d in demands)
        have = float(cluster.get(res, 0) or 0)
        if need > have + _EPS:
            parts = " + ".join(d.describe(res) for d in demands if d.total(res))
            problems.append(f"{_g(need)} {res} ({parts}) but the Ray cluster has {_g(have)}: {_fix(res)}")
    for d in demands if nodes else ():
        for res, v in d.per_actor.items():
            biggest = max(float(n.get(res, 0) or 0) for n in nodes)
            if v and v > biggest + _EPS:
                problems.append(f"each {d.kind} needs {_g(v)} {res} on one node ({d.knobs.get(res, res)}) but the "
                                f"largest node has {_g(biggest)}: {_fix(res)}")
    return _refusal(problems)


def _refusal(problems: Sequence[str]) -> str | None:
    if not problems:
        return None
    return ("the actors of this config can never all start, so the run would wait for them forever: it needs "
            + "; and ".join(problems) + ".")


def _driver_demand(config: Any, bundle: Mapping[str, float]) -> ActorDemand:
    """The trial's own actor under Tune (the first bundle of the placement group), in the form of
    the other demands; without remote learners it also holds the local learner's resources."""
    knob = "num_cpus_for_main_process" if int(config.num_learners or 0) > 0 else \
        "max(num_cpus_for_main_process, num_cpus_per_learner)"
    return ActorDemand("trial driver", 1, {k: float(v or 0) for k, v in bundle.items()},
                       {"CPU": knob, "GPU": "num_gpus_per_learner"}, "")


def _describe(d: ActorDemand, resource: str) -> str:
    if d.kind == "trial driver":  # one per trial: "the trial's driver num_cpus_for_main_process=1"
        return f"the trial's driver {d.knobs.get(resource, resource)}={_g(d.per_actor.get(resource, 0))}"
    return d.describe(resource)


def check_placement_group(config: Any, bundles: Sequence[Mapping[str, float]], cluster: Mapping[str, float],
                          nodes: Sequence[Mapping[str, float]] | None = None) -> str | None:
    """:func:`check_resources` for a Tune trial: ``bundles`` is its placement group
    (``default_resource_request(config).bundles``: the trial's driver first, then runners and
    learners), which Tune waits to reserve whole, forever when the cluster can never hold it. The
    totals come from the bundles; the message names the knobs as :func:`check_resources` does, the
    driver's bundle counted too."""
    bundles = [{k: float(v or 0) for k, v in b.items()} for b in bundles]
    demands = [_driver_demand(config, bundles[0])] + resource_demands(config) if bundles else []
    problems, short = [], set()
    for res in sorted({r for b in bundles for r, v in b.items() if v}):
        need = sum(b.get(res, 0.0) for b in bundles)
        have = float(cluster.get(res, 0) or 0)
        if need > have + _EPS:
            short.add(res)
            parts = " + ".join(_describe(d, res) for d in demands if d.total(res))
            problems.append(f"{_g(need)} {res} ({parts}) but the Ray cluster has {_g(have)}: {_fix(res)}")
    for b in bundles if nodes else ():
        for res, v in b.items():
            biggest = max(float(n.get(res, 0) or 0) for n in nodes)
            if v and v > biggest + _EPS and res not in short:  # a shortfall of the totals says it already
                problems.append(f"a bundle of {_g(v)} {res} on one node but the largest node has {_g(biggest)}: "
                                f"{_fix(res)}")
    return _refusal(list(dict.fromkeys(problems)))


# ---------------------------------------------------------------------- the Ray side
def _in_placement_group() -> bool:
    """Inside a Tune trial (an actor of the trial's placement group)."""
    import ray.util

    return ray.util.get_current_placement_group() is not None


def _can_autoscale() -> bool:
    """Whether the cluster may add nodes (best effort). A Ray instance this process started
    (``ray.init()`` without an address) has no autoscaler; for a cluster it joined: the cluster
    launcher's bootstrap config (what Tune checks), autoscaler v2's flag in the GCS, or an
    autoscaler v1 report with configured node types (a cluster without an autoscaler reports only
    anonymous ``node_<id>`` types). When the private APIs this reads moved: assume it can (warn,
    never refuse a run that cannot be judged)."""
    try:
        from ..rllib_private import autoscaler_v1_status, autoscaler_v2_enabled, ray_started_by_this_process

        if ray_started_by_this_process():  # started here by ray.init()
            return False
        if Path("~/ray_bootstrap_config.yaml").expanduser().exists():
            return True
        if autoscaler_v2_enabled():
            return True
        status = autoscaler_v1_status()
        if status is None:  # no autoscaler monitor at all
            return False
        types = (status.get("autoscaler_report") or {}).get("node_type_mapping") or {}
        return any(not str(t).startswith("node_") for t in types.values())
    except Exception:
        return True


def _node_totals() -> list[dict[str, float]]:
    import ray

    return [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]


def check_trial_fits(algo_class: Any, config: Any) -> None:
    """The check of :func:`check_cluster_fits` for a run under Tune (``rllib-spear train``), made by
    the driver before Tune starts: Tune reserves the trial's whole placement group
    (``algo_class.default_resource_request(config)``) before ``setup`` runs, and waits forever,
    warning every minute, when the cluster can never hold it. ValueError with the message of
    :func:`check_resources`; only a warning when the cluster can autoscale."""
    import ray

    if not ray.is_initialized():
        return
    bundles = algo_class.default_resource_request(config).bundles
    _refuse_unless_autoscaling(check_placement_group(config, bundles, ray.cluster_resources(), _node_totals()))


def check_cluster_fits(config: Any) -> None:
    """``GRPO.setup``'s check, before any actor starts (see the module doc): raises ValueError when
    the config's actors cannot fit the running Ray cluster; only warns when it can autoscale."""
    import ray

    if not ray.is_initialized() or _in_placement_group():
        return
    _refuse_unless_autoscaling(check_resources(config, ray.cluster_resources(), _node_totals()))


def _refuse_unless_autoscaling(why: str | None) -> None:
    """ValueError(``why``) when the cluster cannot hold the run, only a warning when it can
    autoscale (it may add the nodes); nothing when ``why`` is None."""
    if why is None:
        return
    if _can_autoscale():
        logging.getLogger(__name__).warning("%s The cluster has an autoscaler: waiting for it to add nodes.", why)
        return
    raise ValueError(why)
