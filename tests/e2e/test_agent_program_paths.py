"""Agent programs through the library's other paths (``rollout_mode="agent_program"``): Dr.BoT with
GiGPO's step groups (the call prompts as anchors) and SIL on programs whose calls sometimes chain
and sometimes do not (both layouts in one batch), evaluation during training, a checkpoint
restored; and the fully asynchronous pipeline streaming agent-program groups."""
from __future__ import annotations

import pytest

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import DrBoTConfig, GRPOConfig

pytest.importorskip("openai")
pytest.importorskip("fastapi")


def _tasks(n, offset=0):
    return [{"uid": f"t{i}", "question": f"Name a city, {i}.", "answer": "Veloria", "rewrite": i % 2 == 1}
            for i in range(offset, offset + n)]


def _program():
    # made inside a function: cloudpickle ships it to the runners by value
    def program(task, client):
        messages = [{"role": "user", "content": task["question"]}]
        first = client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
        text = first.choices[0].message.content or ""
        if task["rewrite"]:  # a summarising agent: the second call starts afresh
            messages = [{"role": "user", "content": f"Earlier you said {text[:8]!r}. Name a city."}]
        else:
            messages += [first.choices[0].message, {"role": "user", "content": "Another one?"}]
        second = client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
        return 1.0 if task["answer"] in (second.choices[0].message.content or "") else 0.1 * (len(text) % 5)

    return program


def _config(cls, model_path, **training):
    return (cls().environment("agent_program", env_config={"program": _program(), "episode_timeout_s": 300},
                              dataset=_tasks(6), eval_dataset=_tasks(2, offset=10))
            .env_runners(num_env_runners=1, rollout_mode="agent_program", max_new_tokens=8, max_model_len=384,
                         max_response_tokens=256, num_cpus_per_env_runner=0.5)
            .training(**{"group_size": 4, "tasks_per_iteration": 2, "lr": 1e-4, **training})
            .rl_module(model_config={"model_path": model_path})
            .debugging(seed=0))


def test_drbot_gigpo_sil_evaluation_and_restore(ray_session, tiny_model, tmp_path):
    from ray.rllib.algorithms.algorithm import Algorithm

    from e2e_helpers import recorder, with_trajectory_hook

    hook, calls = recorder()
    # Dr.BoT's filters of the episode (an agent program's episode has an answer when the program
    # returned); "repetitive" and "unreadable" would read the untrained tiny model's random text
    cfg = _config(DrBoTConfig, tiny_model, advantage_estimator="gigpo", sil_enabled=True,
                  response_filters=("overlong", "incomplete"))
    cfg = with_trajectory_hook(cfg.evaluation(evaluation_interval=1, eval_max_new_tokens=8), hook)
    algo = cfg.build_algo()
    try:
        r = algo.train()
        trajs, _ = calls[-1]
        assert {t.layout for t in trajs} == {"full", "window"}, "chained and rewritten calls in one batch"
        assert all(t.num_steps == 2 and t.rollout.error is None for t in trajs)
        assert r["env_runners"]["learner_samples"] == sum(1 if t.layout == "full" else 2 for t in trajs)
        assert r["evaluation"]["num_tasks"] == 2 and "agent_program_errors" in r["env_runners"]
        assert r["filters"]["any_frac"] < 1.0, r["filters"]
        ckpt = algo.save_to_path(str(tmp_path / "ckpt"))
        step = algo.algo_step
    finally:
        algo.stop()
    restored = Algorithm.from_checkpoint(ckpt)
    try:
        assert restored.algo_step == step
        r = restored.train()
        assert restored.algo_step == step + 1 and r["env_runners"]["rollout_error_rate"] == 0.0
    finally:
        restored.stop()


def test_the_fully_async_pipeline_streams_agent_program_groups(ray_session, tiny_model):
    cfg = _config(GRPOConfig, tiny_model, rollout_pipeline="async", max_policy_lag=2)
    algo = cfg.resources(num_cpus_for_main_process=0.5).build_algo()
    try:
        results = [algo.train() for _ in range(2)]
        assert algo.algo_step == 2
        for r in results:
            m = r["env_runners"]
            assert m["turns_mean"] == 2.0 and m["agent_program_errors"] == 0, {k: v for k, v in m.items() if "agent" in k or "turn" in k or "error" in k}
            assert r["env_runners"]["policy_lag_max"] <= 2
    finally:
        algo.stop()
