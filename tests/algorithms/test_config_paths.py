"""Paths in a config mean what they meant where the config was built (a Tune trial runs in its
own folder), and a missing file stops validate() before any actor starts."""
from __future__ import annotations

import os

import pytest

from rllib_spear import SPEARConfig
from rllib_spear.cli import build_config, load_experiment
from rllib_spear.envs import load_tasks


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    tasks = load_tasks("search_qa")[:4]
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "data").mkdir()
    pq.write_table(pa.Table.from_pylist([{k: t[k] for k in ("question", "golden_answers")} for t in tasks]),
                   tmp_path / "data" / "train.parquet")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_relative_dataset_is_resolved_when_the_config_is_built(data_dir, tmp_path_factory):
    cfg = SPEARConfig().environment(dataset="data/train.parquet", eval_dataset={"path": "data/train.parquet"})
    assert cfg.dataset == str(data_dir / "data" / "train.parquet")
    assert cfg.eval_dataset["path"] == str(data_dir / "data" / "train.parquet")
    cfg.validate()
    # a Tune trial actor runs in the trial folder: the config (through its dict) still finds the file
    os.chdir(tmp_path_factory.mktemp("trial"))
    restored = SPEARConfig.from_dict(cfg.to_dict())
    assert len(load_tasks(restored.dataset, "train", env=restored.env)) == 4


def test_cli_set_dataset_from_the_folder_holding_it(data_dir, tmp_path):
    yaml_path = tmp_path / "exp.yaml"
    yaml_path.write_text("algorithm: SPEAR\nconfig: {environment: {env: search_qa}}\n")
    cfg = build_config(load_experiment(str(yaml_path), ["environment.dataset=data/train.parquet"]))
    assert os.path.isabs(cfg.dataset) and os.path.exists(cfg.dataset)


def test_names_are_not_paths(data_dir):
    cfg = SPEARConfig().environment(dataset="search_qa").rl_module(model_config={"model_path": "embedded"})
    assert cfg.dataset == "search_qa" and cfg.model_config["model_path"] == "embedded"
    cfg = SPEARConfig().rl_module(model_config={"model_path": "embedded:multi_answer_search"})
    assert cfg.model_config["model_path"] == "embedded:multi_answer_search"


def test_relative_model_folder_and_corpus_are_resolved(data_dir):
    (data_dir / "models" / "m").mkdir(parents=True)
    cfg = (SPEARConfig().rl_module(model_config={"model_path": "models/m", "dtype": "float32"})
           .environment(env_config={"corpus_path": "data/train.parquet", "top_k": 3}))
    assert cfg.model_config["model_path"] == str(data_dir / "models" / "m")
    assert cfg.env_config == {"corpus_path": str(data_dir / "data" / "train.parquet"), "top_k": 3}


@pytest.mark.parametrize("build, field", [
    (lambda c: c.environment(dataset="data/missing.parquet"), "`dataset`"),
    (lambda c: c.environment(eval_dataset="data/missing.parquet"), "`eval_dataset`"),
    (lambda c: c.environment(env_config={"corpus_path": "wiki.parquet"}), "env_config\\['corpus_path'\\]"),
    (lambda c: c.rl_module(model_config={"model_path": "./no_such_model"}), "model_config\\['model_path'\\]"),
])
def test_a_missing_file_fails_validate_naming_the_field(data_dir, build, field):
    cfg = build(SPEARConfig())
    with pytest.raises(ValueError, match=field + ".*does not exist|" + field + ".*is not a folder"):
        cfg.validate()
    cfg.validate(check_files=False)  # a plan for another machine's folders
