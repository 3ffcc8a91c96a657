"""The window sample layout (``.env_runners(step_context="window")``, docs/design.md "Sample
layouts: full and window"): every environment step is sampled from its own prompt (the env's
``step_prompt``: the task, the last ``history_steps`` steps, the current observation) and is one
learner sample, as in the released agent tree (verl-agent's ALFWorld / WebShop runs)."""
from __future__ import annotations

import re

import numpy as np
import pytest
from transformers import AutoTokenizer

from agent_loop_stubs import ScriptEnv
from rllib_spear.core.step_samples import sample_lengths, step_samples
from rllib_spear.env_runners.rollout_modes import make_rollout
from rllib_spear.env_runners.engines.base import GenerationEngine, GenerationOutput, SamplingConfig
from rllib_spear.env_runners.rollout import MultiTurnRollout, ObservationTemplate, RolloutConfig
from rllib_spear.envs.base import supports_step_prompt
from rllib_spear.envs.text_game import STEP_TEMPLATE, STEP_TEMPLATE_NO_HIS, GymTextToolEnv, TextGameEnv
from rllib_spear.models.factory import tiny_model_path

_ADMISSIBLE = re.compile(r"admissible actions of the current situation are: \[(.*?)\]\.\n", re.S)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(tiny_model_path())


class GameEngine(GenerationEngine):
    """Plays the text game from the step prompt alone: reads the admissible actions the prompt
    lists and picks one by a hash of the prompt (deterministic), or (``bad_every``) writes no
    action. Records every prompt it was given; log-probs are -(i + 1) / 100 per token i."""

    def __init__(self, tok, bad_every: int = 0):
        self.tok, self.bad_every = tok, bad_every
        self.prompts: list[list[int]] = []
        self.caps: list[int] = []

    def generate(self, prompts, sampling, max_new_tokens=None):
        outs = []
        for i, p in enumerate(prompts):
            self.prompts.append(list(p))
            cap = sampling.max_new_tokens if max_new_tokens is None else int(max_new_tokens[i])
            self.caps.append(cap)
            text = self.tok.decode(list(p))
            found = _ADMISSIBLE.findall(text)
            acts = re.findall(r"'([^']*)'", found[-1]) if found else []
            h = sum(p) + len(p)
            if not acts or (self.bad_every and h % self.bad_every == 0):
                reply = "<think>hmm</think> I am not sure."
            else:
                reply = f"<think>step</think><action>{acts[h % len(acts)]}</action>"
            ids = [int(t) for t in self.tok.encode(reply, add_special_tokens=False)] + [int(self.tok.eos_token_id)]
            ids = ids[:cap]
            outs.append(GenerationOutput(ids, [-(j + 1) / 100 for j in range(len(ids))],
                                         "stop" if ids[-1] == self.tok.eos_token_id else "length"))
        return outs

    def update_weights(self, state_dict, version):
        self.version = version


TASKS = [{"uid": "g1", "seed": 1}, {"uid": "g2", "seed": 2}]


def _rollout(tok, mode="turn_sync", engine=None, env_turns=6, **cfg):
    engine = engine or GameEngine(tok)
    conf = {"max_turns": env_turns, "max_model_len": 1024, "max_response_tokens": 256, "step_context": "window",
            "history_steps": 2, "max_observation_tokens": 200, **cfg}
    ro = make_rollout(mode, engine=engine, tokenizer=tok, env_factory=lambda: TextGameEnv(max_turns=env_turns),
                      sampling=SamplingConfig(max_new_tokens=48, seed=5), config=RolloutConfig(**conf))
    return ro, engine


def _history_entries(text: str) -> list[tuple[int, str]]:
    return [(int(n), a) for n, a in re.findall(r"\[Observation (\d+): '.*?', Action \1: '(.*?)'\]", text, re.S)]


def _action(text: str) -> str:
    m = re.search(r"<action>(.*?)</action>", text, re.S)
    return m.group(1).lower() if m else text.lower()[-30:]


def test_one_prompt_per_step_holding_at_most_history_steps_earlier_steps(tok):
    ro, eng = _rollout(tok, env_turns=6)
    trajs, stats = ro.run(TASKS, 2)
    assert [t.uid for t in trajs] == ["g1", "g1", "g2", "g2"]
    seen = []
    for t in trajs:
        assert t.layout == "window" and len(t.step_prompts) == t.num_steps >= 3
        seen += t.step_prompts
        actions = [_action(x) for x in t.rollout.assistant_texts]
        for k, prompt in enumerate(t.step_prompts):
            text = tok.decode(prompt)
            entries = _history_entries(text)
            # the last min(k, 2) steps, numbered from 1, with the actions the model took there
            assert [n for n, _ in entries] == list(range(k - min(k, 2) + 1, k + 1))
            assert [a for _, a in entries] == actions[k - len(entries):k]
            if k == 0:
                assert "Prior to this step" not in text and "Your current observation is:" in text
            else:
                assert f"Prior to this step, you have already taken {k} step(s)." in text
                assert f"You are now at step {k + 1} and your current observation is:" in text
                assert "Your task is to: put the" in text
    # the engine saw exactly the step prompts, one request per step
    assert sorted(map(tuple, eng.prompts)) == sorted(map(tuple, seen))
    assert stats.engine_calls == max(t.num_steps for t in trajs)


def test_step_prompt_is_the_released_template(tok):
    env = TextGameEnv(max_turns=5)
    env.reset({"seed": 3})
    first = env.step_prompt(2)
    assert [m["role"] for m in first] == ["user"]
    obs = env.current_obs
    adm = "\n ".join(f"'{a}'" for a in env.admissible)
    assert first[0]["content"] == STEP_TEMPLATE_NO_HIS.format(environment=env.step_prompt_environment,
                                                             current_observation=obs, admissible_actions=adm)
    a0 = env.admissible[0]
    env.step(f"<think>x</think><action>{a0}</action>")
    env.step("no action at all, just words")
    got = env.step_prompt(1)[0]["content"]
    want = STEP_TEMPLATE.format(
        environment=env.step_prompt_environment, task_description=env.task_text, step_count=2, history_length=1,
        action_history=f"[Observation 2: '{env.step_history[1][0]}', Action 2: '{'no action at all, just words'[-30:]}']",
        current_step=3, current_observation=env.current_obs,
        admissible_actions="\n ".join(f"'{a}'" for a in env.admissible))
    assert got == want
    two = env.step_prompt(2)[0]["content"]
    assert f"Action 1: '{a0.lower()}'" in two and "most recent 2 observaitons" in two
    assert "Prior to this step" not in env.step_prompt(0)[0]["content"]  # history_length 0: the no-history template


def test_samples_carry_the_engine_logprobs_and_a_response_only_mask(tok):
    ro, _ = _rollout(tok, env_turns=5)
    trajs, _ = ro.run(TASKS[:1], 2)
    obs_t = ObservationTemplate.named("chatml")
    for t in trajs:
        # the episode's segments are the full layout's: prompt, then assistant / observation spans
        kinds = [s.kind for s in t.segments]
        assert kinds[0] == "prompt" and kinds[1::2] == ["assistant"] * t.num_steps
        assert all(k == "observation" for k in kinds[2::2])
        for s in t.segments[2::2]:
            assert tok.decode(s.token_ids).startswith(obs_t.prefix)
        adv = t.token_advantages(np.arange(1, t.num_steps + 1, dtype=np.float32))
        samples = step_samples(t, adv, t.loss_mask(), t.behaviour_logprobs())
        assert len(samples) == t.num_steps
        asst = [s for s in t.segments if s.kind == "assistant"]
        for k, (s, a, m, lp) in enumerate(samples):
            n = len(asst[k].token_ids)
            assert s.uid == t.uid and s.traj_id == f"{t.traj_id}:{k}"
            assert s.derived["episode_id"] == t.traj_id and s.derived["step"] == k
            assert s.outcome_reward == t.outcome_reward and s.stats is t.stats
            assert list(s.input_ids()) == t.step_prompts[k] + asst[k].token_ids
            P = len(t.step_prompts[k])
            assert (m[:P] == 0).all() and (m[P:] == 1).all() and len(m) == P + n
            assert np.allclose(lp[P:], [-(j + 1) / 100 for j in range(n)]) and (lp[:P] == 0).all()
            assert np.allclose(a[P:], k + 1) and (a[:P] == 0).all()


def test_async_loop_gives_the_turn_sync_trajectories(tok):
    def run(mode):
        ro, eng = _rollout(tok, mode=mode, engine=GameEngine(tok, bad_every=3), env_turns=6)
        trajs, _ = ro.run(TASKS, 2, policy_version=2)
        return trajs, eng

    sync, e_sync = run("turn_sync")
    asy, e_async = run("async")
    strip = lambda t: (t.uid, [(s.kind, s.token_ids, s.logprobs) for s in t.segments], t.step_prompts,  # noqa: E731
                       t.step_rewards, t.outcome_reward, t.truncated)
    assert [strip(t) for t in asy] == [strip(t) for t in sync]
    assert all(t.layout == "window" for t in asy)
    assert sorted(map(tuple, e_async.prompts)) == sorted(map(tuple, e_sync.prompts))


def test_budgets_cap_each_sample_and_a_long_prompt_ends_the_episode(tok):
    # each step prompt grows with the (up to 2 steps of) history; a tight prompt budget cuts episodes
    ro, eng = _rollout(tok, env_turns=8)
    lengths = [len(p) for t in ro.run(TASKS, 1)[0] for p in t.step_prompts]
    budget = sorted(lengths)[len(lengths) // 2]  # about half the prompts fit
    max_new, max_len = 40, budget + 40
    ro, eng = _rollout(tok, env_turns=8, max_prompt_tokens=budget, max_model_len=max_len)
    ro.sampling.max_new_tokens = max_new
    trajs, _ = ro.run(TASKS, 2)
    cut = [t for t in trajs if t.rollout.reached_max_length]
    assert cut, "some episode should hit the prompt budget"
    for t in cut:
        assert t.truncated and t.num_steps < 8 and t.rollout.error is None
    for t in trajs:
        assert all(len(p) <= budget for p in t.step_prompts)
        # a cut episode ends with an assistant turn: the observation of the step it could not take is dropped
        assert t.segments[-1].kind == "assistant"
    assert max(sample_lengths(trajs)) <= budget + max_new
    assert all(c <= min(max_new, max_len - len(p)) for c, p in zip(eng.caps, eng.prompts))
    # max_response_tokens is no episode budget in the window layout: many steps go past it
    ro, _ = _rollout(tok, env_turns=8, max_response_tokens=40)
    long = ro.run(TASKS[:1], 1)[0][0]
    assert long.response_length > 40 and not long.rollout.reached_max_length


def test_a_first_step_prompt_over_the_budget_is_an_error(tok):
    ro, _ = _rollout(tok, max_prompt_tokens=20)
    with pytest.raises(ValueError, match="first step prompt has .* max_prompt_tokens=20"):
        ro.run(TASKS[:1], 1)


def test_an_env_without_the_hook_is_refused(tok):
    assert not supports_step_prompt(ScriptEnv) and supports_step_prompt(TextGameEnv)
    assert supports_step_prompt(GymTextToolEnv)
    with pytest.raises(ValueError, match=r"ScriptEnv does not implement ToolEnv.step_prompt\(history_steps\)"):
        MultiTurnRollout(GameEngine(tok), tok, ScriptEnv, SamplingConfig(max_new_tokens=8),
                         RolloutConfig(step_context="window"))
    with pytest.raises(NotImplementedError, match="step_context='full'"):
        ScriptEnv().step_prompt(2)
    # the full layout runs it as before
    MultiTurnRollout(GameEngine(tok), tok, ScriptEnv, SamplingConfig(max_new_tokens=8), RolloutConfig())


@pytest.mark.parametrize("kw,match", [
    ({"step_context": "windows"}, "`step_context` must be 'full'"),
    ({"step_context": "window", "history_steps": -1}, r"`history_steps` .* integer >= 0"),
    ({"step_context": "window", "history_steps": 1.5}, "history_steps"),
    ({"step_context": "window", "max_prompt_tokens": 0}, r"`max_prompt_tokens` .* integer >= 1"),
    ({"step_context": "window", "max_prompt_tokens": 1020}, "leaves less than 8 tokens of `max_model_len`"),
    ({"max_prompt_tokens": 512}, "with step_context='full' it means nothing"),
])
def test_rollout_config_names_the_bad_knob(kw, match):
    with pytest.raises(ValueError, match=match):
        RolloutConfig(max_model_len=1024, **kw)


def test_full_layout_trajectories_are_unchanged(tok):
    ro = make_rollout("turn_sync", engine=GameEngine(tok), tokenizer=tok, env_factory=lambda: TextGameEnv(max_turns=4),
                      sampling=SamplingConfig(max_new_tokens=48, seed=5),
                      config=RolloutConfig(max_turns=4, max_model_len=2048, max_response_tokens=1500))
    t = ro.run(TASKS[:1], 1)[0][0]
    assert t.layout == "full" and t.step_prompts is None
    adv, mask = np.zeros(t.length, np.float32), t.loss_mask()
    (one,) = step_samples(t, adv, mask)
    assert one[0] is t and one[1] is adv and one[2] is mask and one[3] is None
    assert sample_lengths([t]) == [t.length]


@pytest.mark.parametrize("env,kw,match", [
    ("text_game", {"step_context": "windw"}, "`step_context` must be 'full'"),
    ("text_game", {"step_context": "window", "history_steps": -1}, "`history_steps`"),
    ("text_game", {"step_context": "window", "max_prompt_tokens": 900, "max_new_tokens": 128, "max_model_len": 1024},
     r"set \.env_runners\(max_model_len=1028\)"),
    ("text_game", {"max_prompt_tokens": 100}, "with step_context='full' it means nothing"),
    ("search_qa", {"step_context": "window"}, r"SearchQAEnv does not implement ToolEnv.step_prompt"),
])
def test_config_validate_names_the_layout_knob(env, kw, match):
    from rllib_spear.algorithms.grpo.config import GRPOConfig

    with pytest.raises(ValueError, match=match):
        GRPOConfig().environment(env).env_runners(**kw).validate(check_files=False)
    GRPOConfig().environment("text_game").env_runners(
        step_context="window", history_steps=2, max_prompt_tokens=896, max_new_tokens=128,
        max_model_len=1024).validate(check_files=False)


def test_the_planner_plans_a_window_run_by_its_sample_length():
    from pathlib import Path

    from rllib_spear import planning
    from rllib_spear.cli import build_config, load_experiment

    recipe = Path(__file__).resolve().parents[2] / "configs" / "spear_qwen2.5_1.5b_text_game.yaml"
    cfg = build_config(load_experiment(str(recipe)))
    assert (cfg.step_context, cfg.history_steps, cfg.max_prompt_tokens) == ("window", 2, 2048)
    assert planning.learner_sequence_length(cfg) == 2048 + 512
    p = planning.plan(cfg)
    assert p.max_model_len == 2560 and any("one sample per step" in n for n in p.notes)
    cfg.max_prompt_tokens = 1024  # a smaller prompt budget: shorter learner rows
    assert planning.learner_sequence_length(cfg) == 1536 and planning.plan(cfg).max_model_len == 1536
    cfg.step_context, cfg.max_prompt_tokens, cfg.max_model_len = "full", None, 32768
    assert planning.learner_sequence_length(cfg) == 32768  # the full layout: one episode
