"""Stand-ins for the agent-loop tests: an engine whose output is a function of the prompt, and
scripted environments (slow, stuck, raising, counting concurrent calls)."""
from __future__ import annotations

import threading
import time
import zlib

import numpy as np

from rllib_spear.env_runners.engines.base import GenerationEngine, GenerationOutput
from rllib_spear.envs.base import StepResult, ToolEnv


class PromptFnEngine(GenerationEngine):
    """Deterministic: each completion is a function of its prompt ids and its cap only, so the
    batch it shares (and the seed) changes nothing. Records every ``generate`` call's size."""

    def __init__(self, eos: int, vocab: tuple[int, int] = (10, 400)):
        self.eos, self.vocab = eos, vocab
        self.batches: list[int] = []
        self.on_generate = None  # a hook called with the prompts of every call (tests)

    def generate(self, prompts, sampling, max_new_tokens=None):
        self.batches.append(len(prompts))
        if self.on_generate is not None:
            self.on_generate(prompts)
        outs = []
        for i, p in enumerate(prompts):
            cap = sampling.max_new_tokens if max_new_tokens is None else min(sampling.max_new_tokens,
                                                                              int(max_new_tokens[i]))
            rng = np.random.default_rng(zlib.crc32(np.asarray(list(p), np.int64).tobytes()))
            n = int(rng.integers(1, 14))
            toks = [int(t) for t in rng.integers(*self.vocab, size=n)] + [self.eos]
            toks = toks[:cap]
            lps = [float(-x) for x in rng.random(len(toks))]
            outs.append(GenerationOutput(toks, lps, "stop" if toks[-1] == self.eos else "length"))
        return outs

    def update_weights(self, state_dict, version):
        self.version = version


def _messages(task):
    return [{"role": "system", "content": "You search."}, {"role": "user", "content": task["question"]}]


class ScriptEnv(ToolEnv):
    """``task["turns"]`` steps; observations and rewards depend on the text; ``task["mode"]``
    "raise" makes the second step raise."""

    def reset(self, task):
        self.task, self.n, self.paid = task, 0, 0.0
        return _messages(task)

    def step(self, text):
        self.n += 1
        if self.task.get("mode") == "raise" and self.n == 2:
            raise KeyError("tool crashed")
        if self.n >= self.task["turns"]:
            self.paid = float(len(text) % 3)
            return StepResult(None, 0.25 + self.paid, True)
        return StepResult(f"<information>step {self.n}: {text[:12]}</information>", 0.25 * (len(text) % 2), False)

    def episode_stats(self):
        return {"tool_calls": self.n - 1, "queries_per_step": [1] * self.n, "success": self.paid > 1,
                "format_ok": True, "has_answer": self.paid > 0, "outcome_reward": self.paid}


class ConcurrencyEnv(ToolEnv):
    """Every step sleeps ``delay`` s and counts the calls running at the same moment (shared by
    all instances through ``counter``)."""

    def __init__(self, counter: dict, delay: float = 0.2, turns: int = 2):
        self.counter, self.delay, self.turns = counter, delay, turns

    def reset(self, task):
        self.n = 0
        return _messages(task)

    def step(self, text):
        c = self.counter
        with c["lock"]:
            c["now"] += 1
            c["max"] = max(c["max"], c["now"])
        try:
            time.sleep(self.delay)
        finally:
            with c["lock"]:
                c["now"] -= 1
        self.n += 1
        if self.n >= self.turns:
            return StepResult(None, 1.0, True)
        return StepResult("<information>ok</information>", 0.0, False)

    def episode_stats(self):
        return {"tool_calls": self.n, "queries_per_step": [1] * self.n, "success": True,
                "format_ok": True, "has_answer": True, "outcome_reward": 1.0}


def new_counter() -> dict:
    return {"lock": threading.Lock(), "now": 0, "max": 0}


class StuckEnv(ToolEnv):
    """For ``task["stuck"]``: the first step blocks until ``release`` is set (then pays
    ``late_reward``); other steps answer at once. ``turns`` steps per episode."""

    def __init__(self, release: threading.Event, turns: int = 3, late_reward: float = 0.5):
        self.release, self.turns, self.late_reward = release, turns, late_reward
        self.entered = 0  # calls that started (the rollout must never run two at once)
        self.overlap = False
        self._busy = threading.Lock()

    def reset(self, task):
        self.task, self.n = task, 0
        return _messages(task)

    def step(self, text):
        if not self._busy.acquire(blocking=False):
            self.overlap = True  # two steps on one env at once: the rollout broke its promise
            self._busy.acquire()
        try:
            self.entered += 1
            self.n += 1
            if self.task.get("stuck") and self.n == 1:
                self.release.wait(60)
                return StepResult("<information>late</information>", self.late_reward, False)
            if self.n >= self.turns:
                return StepResult(None, 1.0, True)
            return StepResult("<information>fast</information>", 0.0, False)
        finally:
            self._busy.release()

    def episode_stats(self):
        return {"tool_calls": self.n, "queries_per_step": [1] * self.n, "success": True,
                "format_ok": True, "has_answer": True, "outcome_reward": 1.0}
