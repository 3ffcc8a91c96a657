"""Shared pieces of the endpoint tests: a scripted engine whose completions are token sequences a
tokenizer would not produce from their text, and an endpoint over an engine."""
from __future__ import annotations

from rllib_spear.env_runners.engines.base import GenerationEngine, GenerationOutput, SamplingConfig


def non_canonical_pair(tok, lo: int = 100, hi: int = 400) -> list[int]:
    """Two ids whose decoded text re-encodes to other ids (``[259, 269]`` "arch" -> ``[282]`` in
    the tiny tokenizer): what a re-tokenizing server would train on instead of the sampled ids."""
    for a in range(lo, hi):
        for b in range(lo, hi):
            text = tok.decode([a, b])
            if text.isalpha() and tok.encode(text, add_special_tokens=False) != [a, b]:
                return [a, b]
    raise AssertionError("no non-canonical pair in the tokenizer")


class ScriptedEngine(GenerationEngine):
    """Every completion is ``reply + [eos]``, with log-prob -0.25 per token; records each prompt."""

    def __init__(self, reply: list[int], eos: int) -> None:
        self.reply, self.eos = list(reply), eos
        self.prompts: list[list[int]] = []

    def generate(self, prompts, sampling: SamplingConfig, max_new_tokens=None):
        self.prompts += [list(p) for p in prompts]
        ids = self.reply + [self.eos]
        return [GenerationOutput(list(ids), [-0.25] * len(ids), "stop") for _ in prompts]

    def update_weights(self, state_dict, version):
        self.version = version
