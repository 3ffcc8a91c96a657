"""A checkpointable, seeded, epoch-based iterator over tasks (the dataset position)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["TaskSampler"]


class TaskSampler:
    """Shuffles the task list each epoch (seeded) and hands out tasks in order.

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
        out = []
        for _ in range(n):
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._new_order()
            out.append(self.tasks[self._order[self.position]])
            self.position += 1
        return out

    def get_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "order": list(self._order),
                "rng": self._rng.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = list(state["order"])
        self._rng.bit_generator.state = state["rng"]
