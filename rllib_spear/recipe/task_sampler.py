"""A checkpointable, seeded, epoch-based iterator over tasks (the dataset position)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["TaskSampler", "repeat_uid"]


def repeat_uid(task: dict[str, Any], k: int) -> str:
    """The group uid of the ``k``-th repeat (k >= 1) of ``task`` within one batch."""
    if "uid" not in task:
        raise ValueError("TaskSampler: a task drawn twice in one batch needs a 'uid' key to tell its groups apart "
                         "(load tasks with rllib_spear.envs.load_tasks, which adds one)")
    return f"{task['uid']}#{k}"


class TaskSampler:
    """Shuffles the task list each epoch (seeded) and hands out tasks in order.

    One ``next(n)`` call is one training batch, and groups are found by uid, so a batch never
    holds the same task twice:

    * when a batch crosses an epoch boundary, a task of the new epoch that the batch already
      holds is swapped with the first later task of the new order that it does not hold (the
      new epoch still serves every task once, and which batch a task falls in stays random);
    * when the dataset has fewer tasks than ``n``, every task is in the batch and the repeats
      are new groups of the same task: draw ``k >= 1`` of a task gets the uid ``<uid>#<k>``
      (:func:`repeat_uid`), so each of them is a group of its own.

    ``get_state`` / ``set_state`` capture the epoch, the position and the RNG, so a restored
    run continues with exactly the tasks the original would have drawn.
    """

    def __init__(self, tasks: Sequence[dict[str, Any]], seed: int = 0, shuffle: bool = True) -> None:
        if len(tasks) == 0:
            raise ValueError("TaskSampler: tasks is empty; check the dataset path/split")
        self.tasks = list(tasks)
        self.shuffle = shuffle
        self._rng = np.random.default_rng(seed)
        self.epoch = 0
        self.position = 0
        self._order = self._new_order()

    def _new_order(self) -> list[int]:
        idx = np.arange(len(self.tasks))
        if self.shuffle:
            self._rng.shuffle(idx)
        return idx.tolist()

    def next(self, n: int) -> list[dict[str, Any]]:
        """The next ``n`` tasks: distinct ones when the dataset has ``n`` or more (see class)."""
        out: list[dict[str, Any]] = []
        drawn: dict[int, int] = {}  # task index -> draws in this batch
        for _ in range(n):
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._new_order()
            if self._order[self.position] in drawn and len(drawn) < len(self.tasks):
                later = next(j for j in range(self.position + 1, len(self._order)) if self._order[j] not in drawn)
                self._order[self.position], self._order[later] = self._order[later], self._order[self.position]
            idx = self._order[self.position]
            task = self.tasks[idx]
            k = drawn.get(idx, 0)
            drawn[idx] = k + 1
            out.append(task if k == 0 else {**task, "uid": repeat_uid(task, k)})
            self.position += 1
        return out

    @property
    def served(self) -> int:
        """Tasks handed out so far, over all epochs: a key of the next draw that a restored
        sampler gives again (the runners' sampling seeds derive from it)."""
        return self.epoch * len(self.tasks) + self.position

    def get_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "order": list(self._order),
                "rng": self._rng.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = list(state["order"])
        self._rng.bit_generator.state = state["rng"]
