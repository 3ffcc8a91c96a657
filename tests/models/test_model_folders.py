"""``model_path`` must be a local model folder: a hub id or a missing folder is refused with the
path and the fix (validate() for a hub id; GRPO.setup and every env runner for a missing folder)."""
from __future__ import annotations

import pytest

from rllib_spear.models.folders import looks_like_hub_id, require_model_folder


def test_hub_id_shape(tmp_path, monkeypatch):
    assert looks_like_hub_id("meta-llama/Llama-3.1-8B-Instruct")
    assert looks_like_hub_id("Qwen/Qwen3-8B")
    assert not looks_like_hub_id("/models/Llama-3.1-8B-Instruct")  # absolute: a (missing) folder
    assert not looks_like_hub_id("embedded") and not looks_like_hub_id("embedded:multi_answer_search")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "x").mkdir(parents=True)
    assert not looks_like_hub_id("models/x")  # an existing relative folder


def test_require_model_folder(tmp_path):
    with pytest.raises(ValueError) as e:
        require_model_folder("meta-llama/Llama-3.1-8B-Instruct")
    msg = str(e.value)
    assert "looks like a Hugging Face hub id" in msg and "nothing is downloaded" in msg
    assert "hf download meta-llama/Llama-3.1-8B-Instruct --local-dir /models/Llama-3.1-8B-Instruct" in msg
    assert "huggingface-cli" not in msg  # huggingface_hub 2.x ships only the `hf` command
    assert "--set rl_module.model_config.model_path=/models/Llama-3.1-8B-Instruct" in msg
    with pytest.raises(ValueError, match=r"'/models/Llama-3.1-8B-Instruct' is not a folder"):
        require_model_folder("/models/Llama-3.1-8B-Instruct")
    with pytest.raises(ValueError, match="is a folder without config.json"):
        require_model_folder(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert require_model_folder(str(tmp_path)) == str(tmp_path)
    # the name the user gave is the one reported (a resolved cold start is reported as given)
    with pytest.raises(ValueError, match="'embedded:x' is not a folder"):
        require_model_folder(str(tmp_path / "missing"), "embedded:x")


def test_validate_refuses_a_hub_id():
    from rllib_spear import SPADERConfig

    with pytest.raises(ValueError, match="looks like a Hugging Face hub id, not a local folder"):
        SPADERConfig().rl_module(model_config={"model_path": "meta-llama/Llama-3.1-8B-Instruct"}).validate()
    SPADERConfig().rl_module(model_config={"model_path": "/models/Llama-3.1-8B-Instruct"}).validate(check_files=False)
