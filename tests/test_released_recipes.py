"""The GPU recipes match the released settings row by row (configs/released/*.yaml), and
docs/recipes.md is what scripts/released_table.py writes from those rows.

Per recipe and per config it describes: every row's key is written in the experiment YAML with
the row's value; the value is the released one unless the row says why not; the YAML builds
through the CLI's loader (``load_experiment`` + ``build_config``) and passes ``validate()``
(no model weights needed: the recipes' placeholder folders are sized by their names), and every
key of a builder section reaches the built config with that value.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from rllib_spear.cli import build_config, load_experiment

ROOT = Path(__file__).resolve().parents[1]


def _table_module():
    spec = importlib.util.spec_from_file_location("released_table", ROOT / "scripts" / "released_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rt = _table_module()
SPECS = rt.released_specs()
CASES = [(s, c) for s in SPECS for c in s["configs"]]
IDS = [f"{s['recipe']}:{Path(c).name}" for s, c in CASES]
#: The four recipes of docs/recipes.md (a table for each).
RECIPES = {"spear_qwen2.5_7b_search", "spear_qwen2.5_32b_code_math", "spear_qwen2.5_1.5b_text_game",
           "spader_qampari_llama8b"}


def _config_value(cfg: Any, key: str) -> tuple[bool, Any]:
    """(applies, value) of a dotted recipe key on a built config: ``section.attr[.item...]`` for a
    builder section (attr on the config, then dict items); top-level keys do not apply."""
    parts = key.split(".")
    if parts[0] not in rt.BUILDER_SECTIONS:
        return False, None
    node = getattr(cfg, parts[1])
    for p in parts[2:]:
        node = node[p]
    return True, node


def test_every_recipe_has_a_table():
    assert {s["recipe"] for s in SPECS} == RECIPES
    for s in SPECS:
        for c in s["configs"]:
            assert (ROOT / c).is_file(), c


@pytest.mark.parametrize("spec,config", CASES, ids=IDS)
def test_rows_match_the_yaml(spec, config):
    exp = load_experiment(str(ROOT / config))
    assert rt.row_problems(spec, exp, config) == []


@pytest.mark.parametrize("spec,config", CASES, ids=IDS)
def test_rows_reach_the_built_config(spec, config):
    cfg = build_config(load_experiment(str(ROOT / config)))
    cfg.validate(check_files=False)  # the recipes name a cluster's folders
    for row in spec["rows"]:
        for key, value in rt.keys_and_values(row, config):
            applies, got = _config_value(cfg, key)
            if applies:
                assert rt.same(list(got) if isinstance(got, tuple) else got, value), (key, got, value)


def test_text_game_recipe_is_drbot_gigpo_spear():
    """The text-game recipe follows the released GiGPO script (SPEAR's strongest ALFWorld row),
    not the GRPO one: the estimator and its knobs reach the built config, and every row read from
    an ALFWorld script cites the GiGPO one."""
    spec = next(s for s in SPECS if s["recipe"] == "spear_qwen2.5_1.5b_text_game")
    cfg = build_config(load_experiment(str(ROOT / spec["configs"][0])))
    assert type(cfg).__name__ == "SPEARConfig"
    assert (cfg.advantage_estimator, cfg.gigpo_gamma, cfg.gigpo_step_weight, cfg.gigpo_mode) == (
        "gigpo", 0.95, 1.0, "mean_std_norm")
    scripts = {r["source"] for r in spec["rows"] if r["source"].endswith("run_alfworld_spear.sh")}
    assert scripts == {"TencentYoutuResearch/SPEAR@7e84315:verl-agent/examples/gigpo_trainer/run_alfworld_spear.sh"}


def test_docs_are_what_the_generator_writes():
    doc = rt.DOCS.read_text()
    assert rt.with_tables(doc, rt.render_tables(SPECS)) == doc, "run: python scripts/released_table.py"
    for s in SPECS:
        assert f"### {s['title']}" in doc


# ---- the checker itself, on hand-made rows ------------------------------------------------
def _spec(*rows):
    return {"recipe": "r", "configs": ["a.yaml", "b.yaml"], "rows": list(rows)}


def _row(**kw):
    return {"setting": "s", "released": 512, "source": "o/r@abc1234:f.sh", "key": "env_runners.max_new_tokens",
            "value": 512, **kw}


EXP = {"algorithm": "SPEAR", "stop": {"training_iteration": 550},
       "config": {"env_runners": {"max_new_tokens": 512, "max_turns": 4}, "environment": {"env_config": {"max_turns": 4}},
                  "training": {"sil_enabled": True, "response_filters": ["overlong"]}}}


def test_checker_accepts_matching_rows():
    spec = _spec(_row(), _row(key="stop.training_iteration", released="1 epoch", value=550, deviation="why"),
                 _row(key=["env_runners.max_turns", "environment.env_config.max_turns"], released=4, value=[4, 4]),
                 _row(key="training.response_filters", released=["overlong"], value=["overlong"]),
                 _row(key=None, value=None, released="Faiss", deviation="not shipped"))
    assert rt.row_problems(spec, EXP, "a.yaml") == []


def test_checker_reports_each_kind_of_mismatch():
    spec = _spec(_row(value=256, released=256),                         # table vs YAML
                 _row(key="training.lr", value=1e-6, released=1e-6),    # key not written
                 _row(released=1024),                                   # differs from released, no why
                 _row(key="training.sil_enabled", released=1, value=1),  # a bool is not 1
                 _row(per_config={"b.yaml": 1024}))                     # per-config value
    assert rt.row_problems(spec, EXP, "a.yaml") == [
        "a.yaml: s: env_runners.max_new_tokens is 512 in the YAML, the table says 256",
        "a.yaml: s: key 'training.lr' is not in the YAML (write it explicitly)",
        "r: s: value 512 differs from the released 1024 and the row gives no deviation",
        "a.yaml: s: training.sil_enabled is True in the YAML, the table says 1",
    ]
    assert rt.row_problems(_spec(_row(per_config={"b.yaml": 1024})), EXP, "b.yaml") == [
        "b.yaml: s: env_runners.max_new_tokens is 512 in the YAML, the table says 1024"]


@pytest.mark.parametrize("row,match", [
    (_row(source="verl run.sh"), "owner/repo@commit:path"),
    (_row(key=None, value=None), "a deviation"),
    (_row(key=["a.b", "c.d"], value=[1]), "as many values"),
    (_row(per_config={"c.yaml": 1}), "not one of the recipe's configs"),
    ({"setting": "s", "released": 1}, "a row has the fields"),
])
def test_loader_rejects_bad_rows(tmp_path, row, match):
    import yaml

    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({"recipe": "r", "title": "t", "summary": "s", "configs": ["a.yaml"], "run": "x",
                                 "provide": [], "rows": [row]}))
    with pytest.raises(ValueError, match=match):
        rt.load_released(f)


def test_markers_are_required():
    with pytest.raises(ValueError, match="marker"):
        rt.with_tables("# no markers\n", "tables")
    doc = f"head\n{rt.BEGIN}\nold\n{rt.END}\ntail\n"
    assert rt.with_tables(doc, "T\n") == f"head\n{rt.BEGIN}\n\nT\n\n{rt.END}\ntail\n"
