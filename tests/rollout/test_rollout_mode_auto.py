"""``rollout_mode="auto"``, the default (docs/design.md "The agent loop"): multi-turn episodes run
on the async agent loop, single-turn ones on the turn-synchronous loop, agent programs on theirs;
a seeded run asks vLLM for per-request seeds; and a runner built from the defaults reproduces its
trajectories from a fixed seed whatever its tools' timing."""
from __future__ import annotations

import random
import time

import pytest

from agent_loop_stubs import ScriptEnv
from rllib_spear import GRPOConfig
from rllib_spear.env_runners.async_rollout import AsyncMultiTurnRollout
from rllib_spear.env_runners.rollout import MultiTurnRollout
from rllib_spear.env_runners.rollout_modes import AUTO, get_rollout_mode, resolve_rollout_mode


@pytest.mark.parametrize("name, max_turns, streams, program, expected", [
    ("auto", 4, False, False, "async"),           # multi-turn: the async loop
    ("auto", 2, False, False, "async"),
    ("auto", 1, False, False, "turn_sync"),       # single-turn: nothing to overlap
    ("auto", 1, True, False, "async"),            # the "async" pipeline streams groups
    ("auto", 1, False, True, "agent_program"),    # an AgentProgramEnv runs only on its loop
    ("auto", 4, True, True, "agent_program"),
    ("turn_sync", 4, False, False, "turn_sync"),  # a named mode is kept as it is
    ("async", 1, False, False, "async"),
])
def test_resolve_rollout_mode(name, max_turns, streams, program, expected):
    assert resolve_rollout_mode(name, max_turns=max_turns, streams_groups=streams,
                                runs_agent_program=program) == expected


def test_the_config_default_is_auto_and_resolves_from_max_turns_and_pipeline():
    cfg = GRPOConfig()
    assert cfg.rollout_mode == AUTO and cfg.max_turns == 4
    assert cfg.effective_rollout_mode == "async"
    assert GRPOConfig().env_runners(max_turns=1).effective_rollout_mode == "turn_sync"
    one_turn_async = GRPOConfig().env_runners(max_turns=1).training(rollout_pipeline="async")
    assert one_turn_async.effective_rollout_mode == "async"
    one_turn_async.validate(check_files=False)  # the "async" pipeline's streaming check passes on "auto"
    assert GRPOConfig().env_runners(rollout_mode="turn_sync").effective_rollout_mode == "turn_sync"
    with pytest.raises(ValueError, match="rollout_pipeline='async'.*rollout_mode='auto'"):
        GRPOConfig().env_runners(rollout_mode="turn_sync").training(rollout_pipeline="async").validate(
            check_files=False)


def test_an_agent_program_env_needs_no_rollout_mode():
    def program(task, client):  # never called: the config only
        return 0.0

    cfg = GRPOConfig().environment("agent_program", env_config={"program": program})
    assert cfg.effective_rollout_mode == "agent_program"
    with pytest.raises(ValueError, match="rollout_mode='agent_program'"):
        GRPOConfig().environment("agent_program", env_config={"program": program}).env_runners(
            rollout_mode="async").validate(check_files=False)


def test_a_seeded_run_asks_vllm_for_per_request_seeds():
    for name in ("async", "agent_program"):
        mode = get_rollout_mode(name)
        assert mode.engine_defaults("vllm", seeded=True) == {"async_engine": True, "per_request_seeds": True}
        assert mode.engine_defaults("vllm") == {"async_engine": True}  # unseeded: no per-request generators
        assert mode.engine_defaults("hf", seeded=True) == {}  # HF seeds its rows whatever (RowStreams)
    assert get_rollout_mode("turn_sync").engine_defaults("vllm", seeded=True) == {}


class _JitteryEnv(ScriptEnv):
    """ScriptEnv whose steps take a random time: another timing, so other batches of requests."""

    delays: random.Random = random.Random(0)

    def step(self, text):
        time.sleep(self.delays.random() * 0.03)
        return super().step(text)


def _sampled(timing: int, **env_runners) -> tuple[str, list]:
    from rllib_spear.env_runners.llm_env_runner import LLMEnvRunner

    _JitteryEnv.delays = random.Random(timing)
    cfg = (GRPOConfig().environment(_JitteryEnv)
           .env_runners(max_new_tokens=8, max_model_len=512, max_response_tokens=200, **env_runners)
           .rl_module(model_config={"model_path": "embedded"}).debugging(seed=3))
    runner = LLMEnvRunner(config=cfg)
    try:
        tasks = [{"uid": u, "question": f"question {u}", "turns": n} for u, n in (("a", 3), ("b", 2), ("c", 3))]
        out = runner.sample_groups(tasks=tasks, group_size=2, seed=11)
        kind = type(runner._rollout)
        return kind, sorted((t.uid, list(t.input_ids()), t.outcome_reward) for t in out["trajectories"])
    finally:
        runner.stop()


def test_a_default_runner_runs_the_async_loop_and_a_seed_reproduces_it():
    kind, first = _sampled(timing=0)
    assert kind is AsyncMultiTurnRollout
    assert _sampled(timing=1)[1] == first  # other tool timings, the same trajectories
    assert _sampled(timing=0, max_turns=1)[0] is MultiTurnRollout
