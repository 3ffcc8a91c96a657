"""What a learner rank's death does to a run (docs/design.md "Fault tolerance").

RLlib restarts failed env runners, never learners: a ``LearnerGroup`` keeps the actors it started.
A learner rank that dies (an OOM kill, a lost node) takes a shard of the model and of the optimizer
state with it, so the other ranks cannot go on either; under DDP or FSDP their next collective
fails (gloo at once: "Connection closed by peer"; NCCL at the process group's timeout). So the
iteration fails, loudly, and the trial is restarted by Tune from its last checkpoint when its
``FailureConfig(max_failures)`` allows (``rllib-spear train --max-failures N``; the GPU recipes
set 3). :func:`explain_learner_failure` turns the raw error of the update into one that says
which ranks died and what happens next.
"""
from __future__ import annotations

import re
from typing import Any

from ..rllib_private import learner_actor_ids

__all__ = ["LearnerRankDied", "dead_learner_ranks", "explain_learner_failure"]

#: How long a liveness probe of the learners may take (a live learner answers in milliseconds).
PROBE_TIMEOUT_S = 10.0


class LearnerRankDied(RuntimeError):
    """A learner actor died; the iteration (and the algorithm) cannot go on."""


def dead_learner_ranks(learner_group: Any, timeout_s: float = PROBE_TIMEOUT_S) -> list[int]:
    """The ranks of the remote learners that do not answer a no-op call (every one, healthy or
    not, is asked); [] for a local learner."""
    if learner_group is None or learner_group.is_local:
        return []
    results = learner_group.foreach_learner(lambda learner: True, healthy_only=False,
                                            timeout_seconds=timeout_s)
    answered = {r.actor_id for r in results if r.ok}
    ids = learner_actor_ids(learner_group)  # the ranks, in the order RLlib made them
    return [rank for rank, actor_id in enumerate(ids) if actor_id not in answered]


def explain_learner_failure(learner_group: Any, error: BaseException) -> BaseException:
    """``error`` from ``learner_group.update``, or a :class:`LearnerRankDied` naming the dead ranks
    and the way out when a learner died."""
    try:
        dead = dead_learner_ranks(learner_group)
    except Exception:  # the probe itself failed: keep the original error
        return error
    if not dead:
        return error
    # one line, without the terminal colours of Ray's task errors
    cause = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(error)).split())[:300]
    return LearnerRankDied(
        f"learner rank(s) {dead} died during the update ({type(error).__name__}: {cause}). RLlib "
        "does not restart learners and the other ranks cannot continue without their shard, so this "
        "iteration fails; Tune restarts the trial from its last checkpoint when "
        "tune.RunConfig(failure_config=tune.FailureConfig(max_failures=N)) allows (rllib-spear train "
        "--max-failures N; the GPU recipes set 3). Outside Tune, build the algorithm again and "
        "restore_from_path(<last checkpoint>).")
