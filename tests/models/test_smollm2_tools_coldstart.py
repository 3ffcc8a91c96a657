"""The SmolLM2 tool-use cold start (``model_path: "smollm2-tools"``): its synthetic episodes
(``coldstart.tool_episodes``: the Hermes format the parsers read, varied schemas, held-out names),
and its plumbing on a tiny base model and a 4-episode recipe (key, cache record, rebuilds, the
model_path name); the real build (minutes) is benchmarks/smollm2_tools_coldstart.py's."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rllib_spear.coldstart import smollm2_tools as st
from rllib_spear.coldstart.lookup import cold_start_name, resolve_model_path
from rllib_spear.coldstart.tool_episodes import synthetic_tool_episodes
from rllib_spear.envs.function_tools import TOOLS_PROMPT
from rllib_spear.envs.parsers.hermes import HermesParser

TINY = {**st.SMOLLM2_TOOLS_RECIPE, "episodes": 4,
        "sft": dict(epochs=1, lr=1e-3, seed=0, max_len=1024, batch_size=2, warmup_frac=0.1, weight_decay=0.0)}


@pytest.fixture(scope="module")
def episodes():
    return synthetic_tool_episodes(60, seed=0)


def test_episodes_are_deterministic_and_split(episodes):
    again = synthetic_tool_episodes(60, seed=0)
    assert [e.conversation for e in again] == [e.conversation for e in episodes]
    assert [e.conversation for e in synthetic_tool_episodes(60, seed=1)] != [e.conversation for e in episodes]
    held = synthetic_tool_episodes(60, seed=0, split="heldout")
    train_names = {t.name for e in synthetic_tool_episodes(300, seed=3) for t in e.tools}
    held_names = {t.name for e in held for t in e.tools}
    # held-out tools: names (and parameters, descriptions, requests) the train split never uses
    assert not train_names & held_names, sorted(train_names & held_names)
    with pytest.raises(ValueError, match="split"):
        synthetic_tool_episodes(1, split="test")
    with pytest.raises(ValueError, match="unknown families"):
        synthetic_tool_episodes(1, families={"weather": 1.0})


def test_schemas_vary(episodes):
    families = {e.family for e in episodes}
    assert families == {"record", "arithmetic", "convert", "text", "check", "chained"}
    types = {spec["type"] for e in episodes for t in e.tools
             for spec in _schema(e, t.name)["parameters"]["properties"].values()}
    assert {"string", "integer", "number"} <= types
    assert any("enum" in spec for e in episodes for t in e.tools
               for spec in _schema(e, t.name)["parameters"]["properties"].values())
    assert len({len(e.tools) for e in episodes}) >= 3  # 1..max_tools tools per prompt
    assert len({t.name for e in episodes for t in e.tools}) > 60
    assert any(not e.conversation[0]["content"].startswith(TOOLS_PROMPT[:40]) for e in episodes)  # custom prompts
    for e in episodes:  # no two tools of one topic in a prompt: the request names one of them
        assert len({t.topic for t in e.tools}) == len(e.tools)


def _schema(episode, name: str) -> dict:
    """The tool's schema as the system prompt lists it."""
    block = episode.conversation[0]["content"].split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    return next(s["function"] for s in map(json.loads, block.splitlines()) if s["function"]["name"] == name)


def test_conversation_is_the_function_tool_env_format(episodes):
    hermes_checked = 0
    for e in episodes:
        conv = e.conversation
        roles = [m["role"] for m in conv]
        assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
        assert roles[2:] == ["assistant", "user"] * len(e.calls) + ["assistant"]
        assert conv[0]["content"] == e.make_env().system_prompt  # exactly what FunctionToolEnv shows
        assert conv[1]["content"] == e.task["question"]
        calls = conv[2:-1:2]
        for turn, want in zip(calls, e.calls):
            assert re.fullmatch(r"<tool_call>\n\{.*\}\n</tool_call>", turn["content"], re.S)
            # the Hermes parser reads it (the tool name -> its call and a string argument)
            text_args = [k for k, v in want["arguments"].items() if isinstance(v, str)]
            if text_args:
                hermes_checked += 1
                parsed = HermesParser({want["name"]: (want["name"], text_args[0])}).parse(turn["content"])
                assert parsed.kind == "tool" and parsed.calls[0].name == want["name"] and not parsed.calls[0].error
            # and so does the environment, with every argument
            call = e.make_env().parse(turn["content"]).calls[0]
            assert (call.name, call.arguments, call.error) == (want["name"], want["arguments"], None)
        for obs in conv[3:-1:2]:
            assert obs["content"].startswith("<tool_response>\n") and "Error" not in obs["content"]
        assert conv[-1]["content"] == f"<answer>{e.task['answer']}</answer>"
    assert hermes_checked >= len(episodes) // 2


def test_every_episode_scores_one_when_replayed(episodes):
    for e in episodes[:20]:
        env = e.make_env()
        env.reset(e.task)
        for turn in e.conversation[2::2]:
            res = env.step(turn["content"])
        assert res.done and res.reward == 1.0


def test_key_covers_recipe_base_and_generator(monkeypatch):
    k = st.smollm2_tools_key(TINY, "base-a")
    assert k == st.smollm2_tools_key(dict(TINY), "base-a") and len(k) == 16
    assert st.smollm2_tools_key(TINY, "base-b") != k
    assert st.smollm2_tools_key({**TINY, "episodes": 5}, "base-a") != k
    assert st.smollm2_tools_key({**TINY, "sft": {**TINY["sft"], "lr": 2e-3}}, "base-a") != k
    import rllib_spear.coldstart.tool_episodes as te

    monkeypatch.setattr(te, "TOOL_EPISODES_VERSION", te.TOOL_EPISODES_VERSION + 1)
    assert st.smollm2_tools_key(TINY, "base-a") != k


def test_bad_recipe_names_the_field():
    with pytest.raises(ValueError, match="episodes"):
        st.smollm2_tools_key({**TINY, "episodes": 0}, "b")
    with pytest.raises(ValueError, match="'sft'"):
        st.smollm2_tools_key({k: v for k, v in TINY.items() if k != "sft"}, "b")


def test_build_then_cache_hit_then_stale_data_rebuilds(tiny_path, tmp_path, monkeypatch, capsys):
    path = st.smollm2_tools_path(tmp_path, recipe=TINY, base=tiny_path)
    assert "tool-use cold start" in capsys.readouterr().err  # the build says what it does on stderr
    meta = json.loads((Path(path) / "sft_meta.json").read_text())
    assert meta["examples"] == 4 and meta["steps"] == 2  # 4 episodes, batches of 2, 1 epoch
    key = st.smollm2_tools_key(TINY, st.smollm2_base_hash(tiny_path))
    record = json.loads((tmp_path / f"smollm2-tools-{key}.json").read_text())
    assert record["path"] == path and record["source"] == "built"
    assert cold_start_name(path, tmp_path) == "smollm2-tools"  # the warning knows the model in use

    import rllib_spear.models.sft as sft

    def no_training(*a, **k):
        raise AssertionError("a cached build was trained again")

    monkeypatch.setattr(sft, "cold_start_sft", no_training)
    assert st.smollm2_tools_path(tmp_path, recipe=TINY, base=tiny_path) == path  # the record, no SFT
    (tmp_path / f"smollm2-tools-{key}.json").write_text(json.dumps({**record, "trained_on": "stale"}))
    with pytest.raises(AssertionError, match="trained again"):
        st.smollm2_tools_path(tmp_path, recipe=TINY, base=tiny_path)


def test_model_path_name_resolves_to_the_build(monkeypatch):
    monkeypatch.setattr(st, "smollm2_tools_path", lambda: "/built/smollm2-tools")
    assert resolve_model_path("smollm2-tools") == "/built/smollm2-tools"
    assert cold_start_name("smollm2-tools") == "smollm2-tools"
    assert cold_start_name("/not/a/cold/start", "/nonexistent") is None
