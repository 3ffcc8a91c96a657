"""``validate()`` of the endpoint and agent-program settings (serving/config_checks.py): each
problem names the key and the fix."""
from __future__ import annotations

import pytest

from rllib_spear import GRPOConfig
from rllib_spear.env_runners.serving import check_serve_openai, serve_openai_options


def _program(task, client):
    return 1.0


def _cfg(**env_runners):
    return (GRPOConfig().environment("agent_program", env_config={"program": _program},
                                     dataset=[{"uid": "a", "question": "q"}])
            .env_runners(**{"num_env_runners": 0, "rollout_mode": "agent_program", **env_runners}))


def test_an_agent_program_config_validates():
    _cfg().validate(check_files=False)
    _cfg(serve_openai={"model_name": "gpt-4o-mini", "port": 0}).validate(check_files=False)


@pytest.mark.parametrize("cfg, match", [
    (lambda: _cfg(rollout_mode="async"), "rollout_mode='agent_program'"),
    (lambda: _cfg().environment("search_qa"), "runs agent programs"),
    (lambda: _cfg().environment("agent_program", env_config={}), "env_config\\['program'\\]"),
    (lambda: _cfg(step_context="window"), "the calls choose the layout"),
    (lambda: _cfg(serve_openai={"prot": 1}), "key 'prot' is unknown"),
    (lambda: _cfg(serve_openai="yes"), "must be True, False or a dict"),
    (lambda: _cfg(serve_openai={"tools": "xml"}), "tools"),
    (lambda: _cfg(serve_openai={"port": 8000}, num_env_runners=2), "same port"),
])
def test_a_bad_setting_is_refused_naming_the_key(cfg, match):
    with pytest.raises(ValueError, match=match):
        cfg().validate(check_files=False)


def test_serve_openai_options():
    assert serve_openai_options(False) is None
    assert serve_openai_options(True)["host"] == "127.0.0.1"
    assert serve_openai_options({"port": 8123})["port"] == 8123
    assert check_serve_openai({"port": 70000}) and not check_serve_openai(True)
