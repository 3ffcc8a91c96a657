"""A Search-R1-format parquet trains GRPO in-process with no user code: ``.environment(dataset=PATH,
eval_dataset=PATH, env_config={"prompt_source": "dataset"})`` (rllib_spear/envs/formats.py)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import GRPOConfig

from e2e_helpers import recorder, small_config, with_trajectory_hook

_GEN = Path(__file__).resolve().parents[1] / "fixtures" / "formats" / "make_fixtures.py"


def _fixtures():
    spec = importlib.util.spec_from_file_location("format_fixtures", _GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_search_r1_parquet_with_its_prompts_trains_one_iteration(ray_session, tiny_model, tmp_path):
    from transformers import AutoTokenizer

    fx = _fixtures()
    paths = fx.write_all(tmp_path)
    hook, calls = recorder(synthetic_rewards=True)  # non-zero advantages: the update really moves
    cfg = with_trajectory_hook(
        small_config(GRPOConfig, tiny_model)
        .environment("search_qa", dataset=str(paths["search_r1_train"]), eval_dataset=str(paths["search_r1_test"]),
                     env_config={"prompt_source": "dataset"})
        .env_runners(num_env_runners=0, max_model_len=640, max_response_tokens=128), hook)
    algo = cfg.build_algo()
    try:
        result = algo.train()
        assert result["learners"]["default_policy"]["grad_norm"] > 0
        trajs = calls[0][0]
        assert len(trajs) == 2 * 4 and {t.uid for t in trajs} <= {"train_0", "train_1", "train_2"}
        tok = AutoTokenizer.from_pretrained(tiny_model)
        by_uid = {r["id"]: r for r in fx.SEARCH_R1_TRAIN}
        for t in trajs:
            # the episode opened with the dataset's own user message: Search-R1's instruction, no system prompt
            ids = tok.apply_chat_template(by_uid[t.uid]["prompt"], add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            assert t.segments[0].kind == "prompt" and t.segments[0].token_ids == [int(i) for i in ids]
        # the merged test file: nq/test_0, nq/test_1, hotpotqa/test_0 stay 3 tasks (unqualified, two
        # would share "test_0" and be scored as one group)
        metrics = algo.evaluate_tasks(num_tasks=3)
        assert metrics["num_tasks"] == 3.0
    finally:
        algo.stop()
