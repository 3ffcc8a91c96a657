"""What a run shows while it trains (``.debugging(log_samples=N, heartbeat_s=..., print_summary=...)``):
N sampled episodes per iteration on stdout and as TensorBoard text, a heartbeat during a long
sampling call, and ``algo.train()``'s one-line summary, the CLI's."""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from rllib_spear import GRPOConfig
from rllib_spear.config_keys import builder_keys
from rllib_spear.env_runners.heartbeat import heartbeat, heartbeat_line
from rllib_spear.progress import progress_line
from rllib_spear.sample_log import SampleLog, pick_samples
from rllib_spear.testing import _contract_group


def _text_events(logdir: str | Path) -> list[tuple[int, str]]:
    """(step, text) of every TensorBoard text entry tagged ``samples`` under ``logdir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = []
    for events in sorted(Path(logdir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"tensors": 0})
        acc.Reload()
        if "samples/text_summary" not in acc.Tags()["tensors"]:
            continue
        for ev in acc.Tensors("samples/text_summary"):
            out.append((ev.step, ev.tensor_proto.string_val[0].decode()))
    return out


class _Tokenizer:
    """Decodes token ids as ``<id>`` words."""

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(f"<{i}>" for i in ids)


# ------------------------------------------------------------------------------ config
def test_debugging_sets_and_validates_the_knobs():
    cfg = GRPOConfig().debugging(log_samples=2, heartbeat_s=5, print_summary=True, seed=3)
    assert (cfg.log_samples, cfg.heartbeat_s, cfg.print_summary, cfg.seed) == (2, 5, True, 3)
    assert (GRPOConfig().log_samples, GRPOConfig().heartbeat_s, GRPOConfig().print_summary) == (0, 30.0, False)
    assert {"log_samples", "heartbeat_s", "print_summary", "seed"} <= builder_keys(cfg, "debugging")  # the YAML's keys
    for key, bad in (("log_samples", -1), ("log_samples", 1.5), ("heartbeat_s", -2), ("heartbeat_s", "30"),
                     ("print_summary", "yes")):
        with pytest.raises(ValueError, match=f"`{key}` \\(debugging\\(\\)\\)"):
            GRPOConfig().debugging(**{key: bad}).validate(check_files=False)
    GRPOConfig().debugging(heartbeat_s=None, log_samples=0).validate(check_files=False)


# ------------------------------------------------------------------------------ samples
def test_pick_samples_spreads_over_the_batch():
    assert pick_samples(8, 2) == [0, 4] and pick_samples(8, 3) == [0, 2, 5]
    assert pick_samples(3, 5) == [0, 1, 2] and pick_samples(0, 2) == [] and pick_samples(8, 0) == []


def test_sample_log_prints_and_writes_tensorboard_text(tmp_path):
    trajs = _contract_group()
    trajs[4].rewards["tool_bonus"] = 0.25
    printed = []
    log = SampleLog(2, "unused", tmp_path, tokenizer=_Tokenizer(), emit=printed.append, prompt_chars=7)
    text = log.log(trajs, [False] * 4 + [True] * 4, iteration=3)
    assert printed == [text]
    lines = text.splitlines()
    assert lines[0].startswith(f"[rllib_spear] iteration 3, sample 1/2 (task {trajs[0].uid}): reward ")
    assert lines[0].endswith(", kept") and lines[3].endswith("masked by the filters")
    assert "tool_bonus 0.250" in lines[3]
    assert lines[1] == "  prompt (tail): '...<2> <3>'"  # the prompt's end, cut to 7 characters
    assert lines[2].startswith("  response: '<10> <11>")
    log.close()
    (step, markdown), = _text_events(tmp_path)
    assert step == 3 and "sample 2/2" in markdown and "----- response -----" in markdown
    assert log.log([], [], iteration=4) == ""  # an empty batch shows nothing


# ------------------------------------------------------------------------------ heartbeat
def test_heartbeat_prints_progress_while_the_block_runs():
    lines, done = [], [0]
    with heartbeat(lambda: (done[0], 8), 0.05, "local runner", emit=lines.append):
        for k in range(1, 5):
            time.sleep(0.06)
            done[0] = k
    assert len(lines) >= 2
    assert re.fullmatch(r"\[rllib_spear\] sampling \(local runner\): \d/8 episodes done, \d+ s", lines[0])
    assert lines[-1].split(": ")[1].split("/")[0] >= lines[0].split(": ")[1].split("/")[0]
    assert not any(t.name == "rllib_spear-heartbeat" for t in threading.enumerate())  # stopped with the block
    quiet = []
    for every in (None, 0):
        with heartbeat(lambda: (0, 1), every, "x", emit=quiet.append):
            time.sleep(0.05)
    assert quiet == []
    assert heartbeat_line("runner 2", 3, 16, 61.2) == "[rllib_spear] sampling (runner 2): 3/16 episodes done, 61 s"


def test_a_failing_progress_read_never_fails_the_sampling():
    def broken():
        raise RuntimeError("no episodes yet")

    with heartbeat(broken, 0.01, "x", emit=lambda line: None):
        time.sleep(0.05)


def test_summary_line_is_the_clis():
    from rllib_spear import cli

    assert cli.progress_line is progress_line
    line = progress_line({"training_iteration": 2, "env_runners": {"reward_total_mean": 0.5, "tool_call_rate": 1.0},
                          "time_this_iter_s": 3.25})
    assert line == "iter   2 | reward 0.500 | tool_rate 1.000 | time 3.2s"


# ------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def tiny():
    from rllib_spear.models.factory import tiny_model_path

    return tiny_model_path()


def test_train_shows_samples_heartbeat_and_summary(tiny, capfd):
    cfg = (GRPOConfig().environment("search_qa").env_runners(num_env_runners=0, max_new_tokens=8, max_turns=2)
           .training(tasks_per_iteration=2, group_size=2, lr=1e-5)
           .rl_module(model_config={"model_path": tiny})
           .debugging(log_samples=2, heartbeat_s=0.001, print_summary=True, seed=0))
    algo = cfg.build_algo()
    try:
        result = algo.train()
        logdir = algo.logdir
    finally:
        algo.stop()
    out = capfd.readouterr().out
    assert "[rllib_spear] iteration 1, sample 1/2 (task " in out and "[rllib_spear] iteration 1, sample 2/2" in out
    assert "  prompt (tail): '" in out and "  response: '" in out
    assert re.search(r"\[rllib_spear\] sampling \(local runner\): \d+/4 episodes done", out)
    assert progress_line(result) in out  # the CLI's line, printed by algo.train()
    (step, markdown), = _text_events(logdir)
    assert step == 1 and "sample 1/2" in markdown
