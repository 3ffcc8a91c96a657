"""An agent program trained through RLlib and Tune (``AgentProgramEnv``, ``rollout_mode=
"agent_program"``): a plain ``openai``-client chat loop against each env runner's endpoint, on the
tiny model, for 2 iterations of GRPO and of SPEAR (its tool bonus counted from the captured
replies, its SIL buffer); every episode's calls are one trajectory, its reward the program's."""
from __future__ import annotations

import pytest

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import GRPOConfig, SPEARConfig

pytest.importorskip("openai")
pytest.importorskip("fastapi")


def _tasks(n=6):
    return [{"uid": f"t{i}", "question": f"What is {i} plus {i}?", "answer": str(2 * i)} for i in range(n)]


def _config(cls, model_path):
    # made here, so cloudpickle ships the program to the runner by value (test modules are not
    # importable there); a user passes an importable "pkg.module:function" or a function of __main__
    def program(task, client):
        messages = [{"role": "system", "content": "Answer with a number."},
                    {"role": "user", "content": task["question"]}]
        reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=12)
        messages += [reply.choices[0].message, {"role": "user", "content": "Are you sure?"}]
        reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=12)
        text = reply.choices[0].message.content or ""
        return 1.0 if task["answer"] in text else 0.1 * (len(text) % 4)  # varied: non-zero advantages

    return (cls().environment("agent_program", env_config={"program": program, "episode_timeout_s": 300},
                              dataset=_tasks())
            .env_runners(num_env_runners=1, rollout_mode="agent_program", max_new_tokens=12, max_model_len=512,
                         max_response_tokens=256, num_cpus_per_env_runner=0.5)
            .training(group_size=4, tasks_per_iteration=2, lr=1e-4, response_filters=(),
                      group_filter_keep_fraction=None)
            .rl_module(model_config={"model_path": model_path})
            .debugging(seed=0))


@pytest.mark.parametrize("cls, name", [(GRPOConfig, "GRPO-LLM"), (SPEARConfig, "SPEAR")])
def test_tune_run_trains_an_agent_program(ray_session, tiny_model, tmp_path, cls, name):
    from ray import tune

    from rllib_spear.registration import register_all

    register_all()  # with this session's Ray (another test may have restarted it since the import)
    cfg = _config(cls, tiny_model)
    analysis = tune.run(name, config=cfg.to_dict(), stop={"training_iteration": 2},
                        storage_path=str(tmp_path / "run"), verbose=0)
    trial = analysis.trials[0]
    assert trial.status == "TERMINATED", trial.error_file
    r = trial.last_result
    assert r["training_iteration"] == 2
    runners = r["env_runners"]
    assert runners["agent_program_errors"] == 0 and runners["agent_program_timeouts"] == 0
    assert runners["turns_mean"] == 2.0 and runners["rollout_error_rate"] == 0.0
    assert r["learners"]["default_policy"]["grad_norm"] >= 0
    if name == "SPEAR":
        assert "reward_tool_bonus_mean" in runners and "sil_size" in r["spear"]
