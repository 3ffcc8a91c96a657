"""Sampled episodes of every iteration, printed and written to TensorBoard: ``.debugging(log_samples=N)``.

What the model actually wrote is the first thing to look at when a run does not learn (a reward
stuck at 0, the filters masking the batch): TRL logs completions to its trackers, verl prints and
logs validation generations. :class:`SampleLog` does the same for the training batch: N episodes
per iteration, spread over its groups, each as::

    [rllib_spear] iteration 3, sample 1/2 (task 5f1c..): reward 1.000 (outcome 1.000, tool_bonus 0.100), kept
      prompt (tail): ...<|im_start|>user\\nWhich river flows through Veloria?<|im_end|>\\n<|im_start|>assistant\\n
      response: <tool_call>\\n{"name": "lookup_city", ...}\\n</tool_call><|im_end|>\\n<|im_start|>user\\n<tool_response>...

on stdout, and the same text as one TensorBoard text entry per iteration (tag ``samples``, one
code block per episode) in the run's logdir, where RLlib's / Tune's logger writes the scalars:
TensorBoard shows both in one run. The text is written by its own ``SummaryWriter``
(``torch.utils.tensorboard``, from the ``tensorboard`` dependency) because the result loggers
keep only numbers. The tokens are decoded with the policy's tokenizer (loaded from the model
folder on first use), special tokens kept, so the chat template and the observations show as
the model saw them. No Ray here.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from .core.trajectory import Trajectory

__all__ = ["SampleLog", "pick_samples"]


def pick_samples(num_trajectories: int, n: int) -> list[int]:
    """``n`` indices spread evenly over the batch (different groups first), in batch order."""
    n = min(int(n), int(num_trajectories))
    return [i * num_trajectories // n for i in range(n)] if n > 0 else []


def _tail(text: str, chars: int) -> str:
    return text if len(text) <= chars else "..." + text[-chars:]


def _head(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars] + f"... ({len(text) - chars} more characters)"


class SampleLog:
    """Prints and logs ``num`` episodes of each batch (module docstring).

    Args:
        num: episodes per iteration.
        model_path: the policy's model folder (its tokenizer decodes the tokens).
        logdir: the run's log folder (``Algorithm.logdir``); None = stdout only.
        prompt_chars / response_chars: how much of the prompt's end / the response's start to show.
        emit: where a printed block goes (default ``print`` to stdout).
        tokenizer: a tokenizer to use instead of loading ``model_path``'s.
    """

    def __init__(self, num: int, model_path: str, logdir: str | os.PathLike | None = None, *,
                 prompt_chars: int = 300, response_chars: int = 1500,
                 emit: Callable[[str], None] | None = None, tokenizer: Any = None) -> None:
        self.num = int(num)
        self.model_path = str(model_path)
        self.logdir = None if logdir is None else str(logdir)
        self.prompt_chars = int(prompt_chars)
        self.response_chars = int(response_chars)
        self.emit = emit or (lambda text: print(text, flush=True))
        self._tokenizer = tokenizer
        self._writer: Any = None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def describe(self, traj: Trajectory, masked: bool) -> tuple[str, str, str]:
        """(headline, prompt tail, response) of one episode."""
        parts = [f"outcome {traj.outcome_reward:.3f}"] + [f"{k} {v:.3f}" for k, v in sorted(traj.rewards.items())]
        state = "masked by the filters" if masked else "kept"
        headline = f"reward {traj.total_reward:.3f} ({', '.join(parts)}), {state}"
        prompt = _tail(self._decode(traj.segments[0].token_ids), self.prompt_chars)
        response = _head(self._decode([t for s in traj.segments[1:] for t in s.token_ids]), self.response_chars)
        return headline, prompt, response

    def log(self, trajs: Sequence[Trajectory], filtered: Sequence[bool], iteration: int) -> str:
        """Print ``num`` episodes of the batch and write them to TensorBoard at step ``iteration``;
        returns the printed text ('' when there is nothing to show)."""
        picked = pick_samples(len(trajs), self.num)
        if not picked:
            return ""
        lines, blocks = [], []
        for k, i in enumerate(picked):
            traj = trajs[i]
            headline, prompt, response = self.describe(traj, bool(filtered[i]) if i < len(filtered) else False)
            lines += [f"[rllib_spear] iteration {iteration}, sample {k + 1}/{len(picked)} (task {traj.uid}): {headline}",
                      f"  prompt (tail): {prompt!r}", f"  response: {response!r}"]
            blocks.append(f"**sample {k + 1}/{len(picked)}** (task `{traj.uid}`): {headline}\n\n"
                          + _code_block(f"{prompt}\n----- response -----\n{response}"))
        text = "\n".join(lines)
        self.emit(text)
        self._write(f"iteration {iteration}\n\n" + "\n\n".join(blocks), iteration)
        return text

    def _write(self, markdown: str, iteration: int) -> None:
        if self.logdir is None:
            return
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=self.logdir)
        self._writer.add_text("samples", markdown, global_step=int(iteration))
        self._writer.flush()  # readable at once: a run watched in TensorBoard, or one that crashes next

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _code_block(text: str) -> str:
    """``text`` as a Markdown code block (TensorBoard renders text entries as Markdown)."""
    return "\n".join("    " + line for line in text.splitlines() or [""])
