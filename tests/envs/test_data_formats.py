"""The papers' released data layouts load as tasks (rllib_spear/envs/formats.py, loaders.py):
Search-R1 parquet, DAPO-Math-17k, AIME 2024 / 2025, QAMPARI JSONL; and the search envs' opening
messages from the dataset's ``prompt`` column (``prompt_source="dataset"``)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rllib_spear.envs import load_tasks, make_env
from rllib_spear.envs.formats import (FORMATS, RowError, dapo_problem, detect_formats, format_names,
                                      register_format)

_GEN = Path(__file__).resolve().parents[1] / "fixtures" / "formats" / "make_fixtures.py"
_spec = importlib.util.spec_from_file_location("format_fixtures", _GEN)
fx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fx)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return fx.write_all(tmp_path_factory.mktemp("formats"))


def _write(rows, path):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


# ----------------------------------------------------------------------------- search_r1
def test_search_r1_train_parquet(files):
    tasks = load_tasks(str(files["search_r1_train"]), env="search_qa")
    assert [t["uid"] for t in tasks] == ["train_0", "train_1", "train_2"]  # ids unique: kept as they are
    t = tasks[2]
    assert t["question"] == "who sang waiting for a girl like you?"
    assert t["golden_answers"] == ["Foreigner"] and t["data_source"] == "nq"
    assert t["prompt"] == [{"role": "user", "content": fx.SEARCH_R1_PREFIX + "who sang waiting for a girl like you?\n"}]
    assert t["ability"] == "fact-reasoning" and t["extra_info"] == {"split": "train", "index": 2}
    # the directory form finds <split>.parquet
    assert load_tasks(str(files["search_r1_train"].parent), "test")[0]["question"] == \
        "who got the first nobel prize in physics?"


def test_merged_test_ids_are_qualified_by_data_source(files):
    tasks = load_tasks(str(files["search_r1_test"]), "test", env="search_qa")
    assert [t["uid"] for t in tasks] == ["nq/test_0", "nq/test_1", "hotpotqa/test_0", "hotpotqa/test_1",
                                         "bamboogle/test_0"]
    assert [t["data_source"] for t in tasks] == ["nq", "nq", "hotpotqa", "hotpotqa", "bamboogle"]
    assert tasks[2]["golden_answers"] == ["Arthur's Magazine"]


def test_repeated_id_within_one_source_is_an_error(tmp_path):
    rows = [fx.search_r1_row("test_0", "a", ["x"], "nq", "test", 0), fx.search_r1_row("test_1", "b", ["y"], "hotpotqa", "test", 0),
            fx.search_r1_row("test_0", "c", ["z"], "nq", "test", 1)]
    p = _write(rows, tmp_path / "dup.parquet")
    with pytest.raises(ValueError, match=r"dup.parquet: row 2, column 'id': duplicate uid 'test_0' \(row 0 has it "
                                         r"too, with the same data_source 'nq'\)"):
        load_tasks(p)


def test_search_r1_question_from_the_prompt_without_a_question_column(tmp_path):
    rows = [{k: v for k, v in r.items() if k not in ("question", "golden_answers")} for r in fx.SEARCH_R1_TRAIN]
    tasks = load_tasks(_write(rows, tmp_path / "t.parquet"))
    assert tasks[1]["question"] == "big little lies season 2 how many episodes?"
    assert tasks[1]["golden_answers"] == ["seven"]  # from reward_model.ground_truth.target


def test_search_r1_bad_prompt_names_file_row_and_column(tmp_path):
    rows = [dict(r) for r in fx.SEARCH_R1_TRAIN]
    rows[1]["prompt"] = [{"role": "user", "content": ""}]
    with pytest.raises(ValueError, match=r"bad.parquet: row 1, column 'prompt': message 0: expected a chat list"):
        load_tasks(_write(rows, tmp_path / "bad.parquet"))


# ----------------------------------------------------------------------------- prompt_source
def test_prompt_source_dataset_uses_the_task_messages(files):
    task = load_tasks(str(files["search_r1_train"]))[0]
    env = make_env("search_qa", prompt_source="dataset")
    msgs = env.reset(task)
    assert msgs == [{"role": "user", "content": fx.SEARCH_R1_PREFIX + "total number of death row inmates in the us?\n"}]
    assert msgs[0] is not task["prompt"][0]  # a copy: the rollout may not change the task
    # the default is unchanged: the env's system prompt + "Question: ..."
    default = make_env("search_qa").reset(task)
    assert [m["role"] for m in default] == ["system", "user"]
    assert default[1]["content"] == "Question: total number of death row inmates in the us?"
    # the multi-answer env shares the option
    multi = make_env("multi_answer_search", prompt_source="dataset")
    assert multi.reset({"question": "q", "answers": [["a"]], "prompt": "List them."}) == [
        {"role": "user", "content": "List them."}]


def test_prompt_source_dataset_errors_name_the_column():
    env = make_env("search_qa", prompt_source="dataset")
    with pytest.raises(ValueError, match=r"task u1: prompt_source='dataset' reads the task's 'prompt' column, "
                                         r"and it has none.*prompt_source='env'"):
        env.reset({"uid": "u1", "question": "q", "golden_answers": ["a"]})
    with pytest.raises(ValueError, match=r"task u2: prompt_source='dataset', column 'prompt': message 0"):
        env.reset({"uid": "u2", "question": "q", "golden_answers": ["a"], "prompt": [{"role": "robot", "content": "x"}]})
    with pytest.raises(ValueError, match=r"prompt_source must be one of \('env', 'dataset'\), got 'file'"):
        make_env("search_qa", prompt_source="file")


# ----------------------------------------------------------------------------- dapo_math
def test_dapo_math_loads_as_code_math(files):
    tasks = load_tasks(str(files["dapo_math"]), env="code_math")
    t = tasks[0]
    assert t["uid"] == "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"  # extra_info.index
    assert t["prompt"] == fx.DAPO_PREFIX + "In triangle $ABC$, $AB = 13$, $BC = 14$ and $CA = 15$. Find the area " \
        "of the triangle." + fx.DAPO_SUFFIX  # the released user message, instruction included
    assert t["problem"] == "In triangle $ABC$, $AB = 13$, $BC = 14$ and $CA = 15$. Find the area of the triangle."
    assert t["answer"] == "84" and t["data_source"] == "math_dapo" and t["ability"] == "MATH"
    assert [x["answer"] for x in tasks] == ["84", "3", "33"]


def test_exactly_repeated_rows_load_once_with_a_warning(tmp_path):
    """The released DAPO-Math-17k holds each prompt 100 times (same extra_info.index): the copies
    are one task, said in a warning; the same id with other content is still an error."""
    p = _write([r for r in fx.DAPO for _ in range(100)], tmp_path / "dapo_x100.parquet")
    with pytest.warns(UserWarning, match=r"dapo_x100.parquet: 297 of 300 rows repeat an earlier row exactly "
                                         r"and were dropped \(3 distinct tasks\)"):
        tasks = load_tasks(p, env="code_math")
    assert [t["answer"] for t in tasks] == ["84", "3", "33"]
    clash = dict(fx.DAPO[1], reward_model={**fx.DAPO[1]["reward_model"], "ground_truth": "4"},
                 extra_info=fx.DAPO[0]["extra_info"])
    with pytest.raises(ValueError, match="duplicate uid"):
        load_tasks(_write([fx.DAPO[0], clash], tmp_path / "clash.parquet"), env="code_math")


def test_dapo_problem_strips_only_the_template():
    assert dapo_problem(fx.DAPO_PREFIX + "Find $x$.\n\nThen $y$." + fx.DAPO_SUFFIX) == "Find $x$.\n\nThen $y$."
    assert dapo_problem("  Just a problem.  ") == "Just a problem."  # not the DAPO template: kept whole


# ----------------------------------------------------------------------------- aime
def test_aime_2024_and_2025(files):
    a24 = load_tasks(str(files["aime24"]), env="code_math")
    assert [(t["uid"], t["answer"], t["data_source"]) for t in a24] == [("2024-I-1", "204", "aime_2024"),
                                                                        ("2024-II-4", "33", "aime_2024")]
    assert a24[0]["problem"] == a24[0]["prompt"] == fx.AIME_2024[0]["Problem"]
    assert a24[0]["Solution"].startswith("$s = 2.5$")  # extra columns kept
    a25 = load_tasks(str(files["aime25"]), env="code_math")
    assert [(t["uid"], t["answer"], t["data_source"]) for t in a25] == [("0", "70", "aime_2025"),
                                                                        ("1", "588", "aime_2025")]
    assert a25[1]["prompt"].startswith("On triangle $ABC$")


def test_aime_lowercase_layout_names_its_year_and_keeps_a_data_source(tmp_path):
    rows = [{"id": 60, "problem": "p?", "answer": "17", "year": "2024"}]
    assert load_tasks(_write(rows, tmp_path / "h4.parquet"))[0]["data_source"] == "aime_2024"
    rows = [{"problem": "p?", "answer": 5, "data_source": "my_set"}]
    assert load_tasks(_write(rows, tmp_path / "own.parquet"))[0]["data_source"] == "my_set"
    with pytest.raises(ValueError, match=r"bad.parquet: row 0, column 'Answer': expected the answer"):
        load_tasks(_write([{"ID": "x", "Problem": "p", "Answer": None}], tmp_path / "bad.parquet"))


# ----------------------------------------------------------------------------- qampari / jsonl
def test_qampari_jsonl(files):
    tasks = load_tasks(str(files["qampari"]), env="multi_answer_search")
    t = tasks[0]
    assert t["uid"] == "7631__wikidata_simple__dev" and t["data_source"] == "qampari"
    assert t["question"] == "What car models did Autozam produce?"
    # [answer_text, *aliases], repeats and blanks dropped, order kept
    assert t["answers"] == [["Autozam Scrum", "Scrum"], ["Autozam Clef", "Clef"], ["Mazda Carol"]]
    assert tasks[2]["answers"] == [["Leonard Rosenman"], ["Quincy Jones", "Quincy Delight Jones Jr."]]
    assert t["answer_list"][0]["proof"][0]["pid"] == "7631__wikidata_simple__dev__0__0"  # extra keys kept


def test_jsonl_json_and_directories(tmp_path, files):
    lines = Path(files["qampari"]).read_text().splitlines()
    d = tmp_path / "qampari"
    d.mkdir()
    (d / "test_data.jsonl").write_text("\n".join(lines[:2]) + "\n\n")  # QAMPARI's release name; a blank line
    (d / "dev.json").write_text(json.dumps([json.loads(x) for x in lines[2:]]))
    assert [t["uid"] for t in load_tasks(str(d), "test")] == ["7631__wikidata_simple__dev", "812__wikidata_simple__dev"]
    assert [t["uid"] for t in load_tasks(str(d), "dev")] == ["95__wikidata_comp__dev"]
    with pytest.raises(ValueError, match=r"no file for split 'train': expected one of \['train.parquet', "
                                         r"'train.jsonl', 'train.json', 'train_data.jsonl'\]"):
        load_tasks(str(d), "train")
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2: invalid JSON"):
        load_tasks(str(tmp_path / "bad.jsonl"))
    (tmp_path / "obj.json").write_text(json.dumps({"question": "q"}))
    with pytest.raises(ValueError, match=r"obj.json: a .json task file must hold a list"):
        load_tasks(str(tmp_path / "obj.json"))
    # our own schema in JSONL (SPADER's evaluation files: question_text + ground_truth alias lists)
    (tmp_path / "own.jsonl").write_text(json.dumps({"question_text": "q?", "ground_truth": [["A", "a"], ["B"]]}) + "\n")
    assert load_tasks(str(tmp_path / "own.jsonl"))[0]["answers"] == [["A", "a"], ["B"]]


def test_qampari_bad_answer_list(tmp_path):
    (tmp_path / "q.jsonl").write_text(json.dumps({"qid": "1", "question_text": "q?", "answer_list": [{"aliases": ["x"]}]}))
    with pytest.raises(ValueError, match=r"q.jsonl: row 0, column 'answer_list': answer 0: expected a dict with a "
                                         r"non-empty 'answer_text'.*'qampari' data format"):
        load_tasks(str(tmp_path / "q.jsonl"))


# ----------------------------------------------------------------------------- choosing a format
def test_detection_is_disjoint_and_legacy_tables_have_no_format(files, data_paths):
    for name, path in files.items():
        rows = load_rows(path)
        assert [f.name for f in detect_formats(list(rows[0]), rows[0])] == [
            {"search_r1_train": "search_r1", "search_r1_test": "search_r1"}.get(name, name)]
    for key in ("search_qa_train", "multi_answer_train", "code_math_train", "text_game_train"):
        rows = pq.read_table(data_paths[key]).to_pylist()
        assert detect_formats(list(rows[0]), rows[0]) == []
    assert {"search_r1", "dapo_math", "aime24", "aime25", "qampari"} <= set(format_names())


def load_rows(path):
    path = Path(path)
    if path.suffix == ".jsonl":
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return pq.read_table(path).to_pylist()


def test_forcing_a_format(tmp_path, files):
    # a lowercase problem/answer table with a prompt column is not auto-detected: force it
    rows = [{"problem": "Find $x$.", "answer": "2", "prompt": "ignored", "id": "a"}]
    p = _write(rows, tmp_path / "t.parquet")
    assert load_tasks(p)[0]["prompt"] == "ignored"  # legacy code_math
    assert load_tasks(p, dataset_format="aime25")[0]["prompt"] == "Find $x$."
    assert load_tasks(p, kind="aime25")[0]["prompt"] == "Find $x$."  # a format name as kind
    assert load_tasks({"path": p, "dataset_format": "aime25"})[0]["prompt"] == "Find $x$."  # .environment(dataset=...)
    with pytest.raises(ValueError, match=r"unknown data format 'aime26'; choose from \[.*'aime24', 'aime25'"):
        load_tasks(p, dataset_format="aime26")
    with pytest.raises(ValueError, match=r"dataset_format='aime25' holds code_math tasks, not kind='search_qa'"):
        load_tasks(p, kind="search_qa", dataset_format="aime25")
    with pytest.raises(ValueError, match=r"takes the keys 'path' \(required\), 'dataset_format' and 'kind'"):
        load_tasks({"file": p})
    # a list of rows in an upstream layout, for a built-in env
    assert load_tasks(fx.AIME_2024, env="code_math")[1]["answer"] == "33"


def test_a_file_of_another_kind_than_the_env_is_refused(files):
    with pytest.raises(ValueError, match=r"in the data format 'dapo_math' \(code_math tasks\), but the environment "
                                         r"takes search_qa tasks"):
        load_tasks(str(files["dapo_math"]), env="search_qa")


def test_custom_env_keeps_upstream_rows_unless_a_format_is_forced(files):
    raw = load_tasks(str(files["aime24"]), env="t_custom_env_not_registered")
    assert "problem" not in raw[0] and raw[0]["Answer"] == 204
    forced = load_tasks(str(files["aime24"]), env="t_custom_env_not_registered", dataset_format="aime24")
    assert forced[0]["problem"] == fx.AIME_2024[0]["Problem"]


def test_register_a_format(tmp_path):
    def detect(cols, first):
        return "q" in cols and "gold" in cols

    def convert(row):
        if not row.get("gold"):
            raise RowError("gold", "expected the gold answer; fill the 'gold' column")
        return {**row, "question": row["q"], "golden_answers": [row["gold"]]}

    register_format("t_my_qa", detect, convert, kind="search_qa")
    try:
        p = _write([{"q": "who?", "gold": "me"}, {"q": "what?", "gold": ""}], tmp_path / "mine.parquet")
        with pytest.raises(ValueError, match=r"mine.parquet: row 1, column 'gold': expected the gold answer; fill "
                                             r"the 'gold' column \(read as the 't_my_qa' data format\)"):
            load_tasks(p)
        assert load_tasks(_write([{"q": "who?", "gold": "me"}], tmp_path / "ok.parquet"))[0]["golden_answers"] == ["me"]
        with pytest.raises(ValueError, match="already registered"):
            register_format("t_my_qa", detect, convert, kind="search_qa")
        with pytest.raises(ValueError, match="unknown task kind 'qa'"):
            register_format("t_other", detect, convert, kind="qa")
    finally:
        FORMATS.unregister("t_my_qa")
