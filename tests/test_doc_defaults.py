"""docs/algorithms.md 3.4's table of SPADER defaults says what SPADERConfig() holds."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from rllib_spear.algorithms.spader import SPADERConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"


def _value(text: str):
    text = text.strip().strip("`")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string such as spa, cosine, k3


def spader_table_rows() -> list[tuple[str, object]]:
    """(config key, documented default) of every row of the 3.4 table whose keys and values
    pair up one to one (rows like ``clip_ratio_low/high`` are left to their own tests)."""
    section = DOC.read_text().split("### 3.4", 1)[1].split("\n\n**", 1)[0]
    out = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[1].startswith("`"):
            continue
        keys = re.findall(r"`([a-z_]+)`", cells[1])
        values = [v for v in re.split(r",\s*(?![^()]*\))", cells[2])]
        if len(keys) == len(values) and len(keys) == len(cells[1].split(",")):
            out.extend(zip(keys, (_value(v) for v in values)))
    return out


def test_spader_documented_defaults_match_the_config():
    rows = spader_table_rows()
    keys = {k for k, _ in rows}
    # the table's scalar rows are all checked (a parsing change that drops them would pass silently)
    assert {"advantage_estimator", "spa_gamma", "tool_round_cost", "cost_free_steps", "final_answer_weight",
            "format_error_reward", "kl_coeff", "kl_estimator", "tool_reward_schedule", "sil_enabled",
            "group_size", "tasks_per_iteration", "max_turns", "lr", "lr_warmup_steps"} <= keys
    cfg = SPADERConfig()
    wrong = {k: (v, getattr(cfg, k)) for k, v in rows if getattr(cfg, k) != v}
    assert not wrong, f"docs/algorithms.md 3.4 (documented, code): {wrong}"
