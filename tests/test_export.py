"""``rllib-spear export`` (rllib_spear/export.py) on a checkpoint laid out as RLlib writes it
(single learner: ``learner_group/learner/rl_module/<module>``), built here without Ray: the
metadata says how the policy was prompted (system prompt, tool format, observation template),
every exported file follows the umask, and the CLI takes a trial folder. The FSDP (sharded)
layout is exported in tests/e2e/test_fsdp_learner.py."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from rllib_spear.export import METADATA_FILE, export_checkpoint, prompt_metadata


@pytest.fixture(scope="module")
def tiny_model():
    from rllib_spear.models.factory import tiny_model_path

    return tiny_model_path()


def _config(tiny_model: str):
    from rllib_spear import SPEARConfig

    return (SPEARConfig().environment("search_qa", env_config={"max_turns": 3})
            .env_runners(observation_template="chatml", max_new_tokens=64)
            .rl_module(model_config={"model_path": tiny_model}))


def _write_checkpoint(path: Path, tiny_model: str, seq_no: int = 3) -> torch.Tensor:
    """The files export reads, as Algorithm.save_to_path writes them; returns the changed weight."""
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec

    from rllib_spear.models.rl_module import hf_rl_module_spec

    spec = hf_rl_module_spec(tiny_model)
    learner = path / "learner_group" / "learner"
    learner.mkdir(parents=True)
    module = spec.build()
    with torch.no_grad():
        module.model.model.norm.weight.add_(0.25)  # a trained weight, not the base model's
    module.save_to_path(learner / "rl_module" / "default_policy")
    with open(learner / "class_and_ctor_args.pkl", "wb") as f:
        pickle.dump({"ctor_args_and_kwargs": ((), {"module_spec": MultiRLModuleSpec(
            rl_module_specs={"default_policy": spec})})}, f)
    with open(learner / "state.pkl", "wb") as f:
        pickle.dump({"weights_seq_no": seq_no}, f)
    with open(path / "class_and_ctor_args.pkl", "wb") as f:
        pickle.dump({"class": None, "ctor_args_and_kwargs": ((_config(tiny_model).get_state(),), {})}, f)
    return module.model.model.norm.weight.detach().clone()


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_prompt_metadata_names_the_system_prompt_and_formats(tiny_model):
    from rllib_spear.envs import make_env

    meta = prompt_metadata(_config(tiny_model).get_state())
    env = make_env("search_qa", max_turns=3)
    assert meta["env"] == "search_qa" and meta["env_config"] == {"max_turns": 3}
    assert meta["env_class"] == "rllib_spear.envs.search_envs.SearchQAEnv"
    assert meta["system_prompt"] == env.system_prompt and "<search>" in meta["system_prompt"]
    assert meta["tool_parser"] == "search_r1" and meta["observation_template"] == "chatml"
    assert meta["example_messages"][0] == {"role": "system", "content": env.system_prompt}
    assert "{question}" in meta["example_messages"][1]["content"]
    assert meta["sampling"]["max_new_tokens"] == 64 and "apply_chat_template" in meta["chat_template"]
    json.dumps(meta)  # the file is plain JSON


def test_prompt_metadata_survives_an_env_that_cannot_be_built():
    meta = prompt_metadata({"env": "no_such_env_name", "env_config": {}, "observation_template": "chatml"})
    assert meta["system_prompt"] is None and meta["system_prompt_error"]


def test_export_writes_metadata_and_readable_files(tiny_model, tmp_path, umask_022):
    ckpt = tmp_path / "ckpt"
    trained = _write_checkpoint(ckpt, tiny_model)
    out = export_checkpoint(ckpt, tmp_path / "hf")
    info = json.loads((out / METADATA_FILE).read_text())
    assert info["weights_seq_no"] == 3 and info["source"].startswith("rl_module")
    assert info["system_prompt"] and info["tool_parser"] == "search_r1"
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir() if p.is_file()}
    assert "model.safetensors" in modes and set(modes.values()) == {"0o644"}, modes
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(model.model.norm.weight.float(), trained.float())


def test_export_keeps_the_mode_of_files_it_did_not_write(tiny_model, tmp_path, umask_022):
    ckpt = tmp_path / "ckpt"
    _write_checkpoint(ckpt, tiny_model)
    out = tmp_path / "hf"
    out.mkdir()
    private = out / "notes.txt"
    private.write_text("mine")
    private.chmod(0o600)
    export_checkpoint(ckpt, out)
    assert private.stat().st_mode & 0o777 == 0o600


def test_cli_export_takes_a_trial_folder(tiny_model, tmp_path, capsys, umask_022):
    from rllib_spear.cli import main

    trial = tmp_path / "SPEAR_x_00000"
    _write_checkpoint(trial / "checkpoint_000001", tiny_model, seq_no=1)
    _write_checkpoint(trial / "checkpoint_000002", tiny_model, seq_no=2)
    assert main(["export", str(trial), str(tmp_path / "hf")]) == 0
    assert "weights version 2" in capsys.readouterr().out


def test_documented_prompting_example_runs(tiny_model, tmp_path, monkeypatch):
    """docs/usage.md "Prompting an exported policy" on an exported folder: the messages it builds are
    the env's (system prompt first), and generation runs."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "usage.md").read_text()
    code = doc.split("## Prompting an exported policy")[1].split("```python\n")[1].split("```")[0]
    _write_checkpoint(tmp_path / "ckpt", tiny_model)
    export_checkpoint(tmp_path / "ckpt", tmp_path / "exported_model")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/usage.md", "exec"), scope)  # noqa: S102 - the documented snippet itself
    assert scope["messages"][0] == {"role": "system", "content": scope["meta"]["system_prompt"]}
    assert scope["messages"][1]["content"] == "Question: Which river flows through Veloria?"
    assert scope["out"].shape[1] > scope["inputs"]["input_ids"].shape[1]


def test_a_corrupted_checkpoint_is_refused_naming_the_file(tiny_model, tmp_path, capsys):
    """A checkpoint with a manifest (every save writes one, rllib_spear/checkpoint_io.py) whose
    weights file was cut short: the library raises naming the file; ``rllib-spear export`` and
    ``rllib-spear eval`` print that alone, with exit status 2 and no traceback."""
    from rllib_spear.checkpoint_io import CorruptCheckpointError, write_manifest
    from rllib_spear.cli import main

    ckpt = tmp_path / "ckpt"
    _write_checkpoint(ckpt, tiny_model)
    write_manifest(ckpt)
    (weights,) = [p for p in ckpt.rglob("*") if p.is_file() and p.parent.name == "default_policy"
                  and p.stat().st_size > 1000]
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    rel = weights.relative_to(ckpt).as_posix()
    with pytest.raises(CorruptCheckpointError, match=rel):
        export_checkpoint(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    for argv in (["export", str(ckpt), str(tmp_path / "hf")], ["eval", str(ckpt)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert rel in err and "Traceback" not in err, err


def test_prompt_metadata_reads_the_system_prompt_without_building_the_env():
    """An env whose resources are missing here (its constructor raises): the system prompt is
    still read, from env_config or from the class, without an instance."""
    from rllib_spear.envs import ToolEnv

    class NeedsCorpus(ToolEnv):
        def __init__(self, system_prompt: str = "Search with <search>q</search>.", corpus_path: str = "/nowhere"):
            raise FileNotFoundError(f"corpus {corpus_path} is missing")

        def reset(self, task):
            return []

        def step(self, assistant_text):
            raise NotImplementedError

        def episode_stats(self):
            raise NotImplementedError

    meta = prompt_metadata({"env": NeedsCorpus, "env_config": {}})
    assert meta["system_prompt"] == "Search with <search>q</search>."
    assert "is missing" in meta["system_prompt_error"]
    meta = prompt_metadata({"env": NeedsCorpus, "env_config": {"system_prompt": "Mine."}})
    assert meta["system_prompt"] == "Mine."
