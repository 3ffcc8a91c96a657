"""benchmarks/vs_trl.py runs end to end in its --quick form (TRL's GRPOTrainer and this library's
GRPO on the same small model and batch) and reports finite figures; the equal-work pieces (the
2000-token vocabulary, the shared reward, the single-turn env) hold. Skipped without TRL (an
optional benchmark dependency: pip install -e ".[bench-trl]")."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import vs_trl  # noqa: E402


def test_reward_and_pseudo_words_are_deterministic():
    assert [vs_trl.reward_of(t) for t in ("", "a", "abcd", "abcde")] == [0.0, 0.25, 1.0, 0.0]
    assert vs_trl.pseudo_words(3, seed=4) == vs_trl.pseudo_words(3, seed=4)
    assert vs_trl.pseudo_words(3, seed=4) != vs_trl.pseudo_words(3, seed=5)


def test_one_turn_env_ends_after_the_first_turn():
    env = vs_trl.single_turn_env_class()()
    msgs = env.reset({"question": "Bako tesu?"})
    assert msgs == [{"role": "user", "content": "Bako tesu?"}]
    res = env.step("abc")
    assert res.done and res.observation is None and res.reward == 0.75  # len 3 % 5 / 4
    assert env.episode_stats().outcome_reward == 0.75


def test_unknown_model_is_refused():
    with pytest.raises(ValueError, match="--models"):
        vs_trl.main(["--models", "7B"])


def test_precision_is_the_same_on_both_sides():
    assert vs_trl.resolve_precision("fp32", flags={"avx512_bf16"}) == "fp32"
    assert vs_trl.resolve_precision("bf16", flags={"avx2"}) == "bf16"
    assert vs_trl.resolve_precision("auto", flags={"avx2", "fma"}) == "fp32"  # emulated bf16: slower for both
    assert vs_trl.resolve_precision("auto", flags={"avx512_bf16"}) == "bf16"  # TRL's default, ours mixed bf16
    with pytest.raises(ValueError, match="--precision"):
        vs_trl.resolve_precision("fp8")


def test_quick_run_reports_every_ratio():
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(vs_trl.model_path("0.94M"))
    assert len(tok) == vs_trl.VOCAB  # every id the model samples decodes
    out = vs_trl.main(["--quick"])
    assert list(out) == ["0.94M"]
    figures = out["0.94M"]
    for key in ("ours_over_trl_generated_tok_s", "ours_over_trl_trained_tok_s", "ours_over_trl_end_to_end_tok_s",
                "ours_over_bare_trained", "trl_step_s", "ours_step_s"):
        assert math.isfinite(figures[key]) and figures[key] > 0, key
