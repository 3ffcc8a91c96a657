"""The SmolLM2 search cold start's plumbing (``rllib_spear.coldstart.smollm2``), on a tiny base
model and a 4-demonstration recipe: keys, the cache record, rebuilds, the model_path name."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rllib_spear.coldstart import smollm2 as sm
from rllib_spear.coldstart.lookup import resolve_model_path

TINY = {**sm.SMOLLM2_SEARCH_RECIPE, "max_examples": 4,
        "sft": dict(epochs=1, lr=1e-3, seed=0, max_len=256, batch_size=2, warmup_frac=0.1, weight_decay=0.0)}


def test_key_covers_recipe_base_and_versions():
    k = sm.smollm2_search_key(TINY, "base-a")
    assert k == sm.smollm2_search_key(dict(TINY), "base-a")  # pure
    assert len(k) == 16
    assert sm.smollm2_search_key(TINY, "base-b") != k
    assert sm.smollm2_search_key({**TINY, "max_examples": 5}, "base-a") != k
    assert sm.smollm2_search_key({**TINY, "sft": {**TINY["sft"], "lr": 2e-3}}, "base-a") != k
    assert sm.smollm2_search_key({**TINY, "tool_use_rate": 0.3}, "base-a") != k


def test_bad_recipe_names_the_field():
    with pytest.raises(ValueError, match="max_examples"):
        sm.smollm2_search_key({**TINY, "max_examples": 0}, "b")
    with pytest.raises(ValueError, match="'sft'"):
        sm.smollm2_search_key({k: v for k, v in TINY.items() if k != "sft"}, "b")


def test_conversations_are_the_first_demonstrations_in_chat_form():
    convs = sm.smollm2_search_conversations(TINY)
    assert len(convs) == 4
    for c in convs:
        assert [m["role"] for m in c[:2]] == ["system", "user"]
        assert c[-1]["role"] == "assistant" and "<answer>" in c[-1]["content"]


def test_build_then_cache_hit_then_stale_data_rebuilds(tiny_path, tmp_path, monkeypatch):
    path = sm.smollm2_search_path(tmp_path, recipe=TINY, base=tiny_path)
    assert (Path(path) / "DONE").exists() and (Path(path) / "config.json").exists()
    meta = json.loads((Path(path) / "sft_meta.json").read_text())
    assert meta["examples"] == 4 and meta["steps"] == 2  # 4 demonstrations, batches of 2, 1 epoch
    key = sm.smollm2_search_key(TINY, sm.smollm2_base_hash(tiny_path))
    record = json.loads((tmp_path / f"smollm2-search-{key}.json").read_text())
    assert record["path"] == path and record["source"] == "built"

    import rllib_spear.models.sft as sft

    def no_training(*a, **k):
        raise AssertionError("a cached build was trained again")

    monkeypatch.setattr(sft, "cold_start_sft", no_training)
    assert sm.smollm2_search_path(tmp_path, recipe=TINY, base=tiny_path) == path  # the record, no SFT
    # a record of other demonstrations (same key) is not used: the build runs again
    (tmp_path / f"smollm2-search-{key}.json").write_text(json.dumps({**record, "trained_on": "stale"}))
    with pytest.raises(AssertionError, match="trained again"):
        sm.smollm2_search_path(tmp_path, recipe=TINY, base=tiny_path)


def test_model_path_name_resolves_to_the_build(monkeypatch):
    monkeypatch.setattr(sm, "smollm2_search_path", lambda: "/built/smollm2-search")
    assert resolve_model_path("smollm2-search") == "/built/smollm2-search"
    assert resolve_model_path("/some/folder") == "/some/folder"
