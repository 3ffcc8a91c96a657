"""SPADER as an RLlib Algorithm: diversity-aware step rewards + step-wise peer advantage.

Rewards per trajectory i and step k (3.2): ``step_rewards[k]`` = the diversity reward of the
gold entities first found in step k's tool response (rarer within the group = more), minus the
scheduled tool cost per query; the outcome (``final_answer_weight * F1``, or
``format_error_reward`` on malformed output) is paid on the answer step. Advantages (3.3) are
computed per group and step index on the driver (``GRPO.compute_advantages`` with
``advantage_estimator="spa"``). Since SPADER extends SPEAR, SIL and the tool-call bonus can be
switched on too.
"""
from __future__ import annotations

import numpy as np

from ...core.diversity import diversity_step_details
from ...core.schedules import spader_tool_cost
from ...core.trajectory import Trajectory
from ..spear.spear import SPEAR
from .config import SPADERConfig

__all__ = ["SPADER"]


def _pad(seq: list, n: int, fill) -> list:
    return list(seq[:n]) + [fill] * max(0, n - len(seq))


class SPADER(SPEAR):
    """Step-wise Peer Advantage with Diversity-aware Exploration Rewards."""

    @classmethod
    def get_default_config(cls) -> SPADERConfig:
        return SPADERConfig()

    def shape_rewards(self, trajs: list[Trajectory], step: int) -> None:
        super().shape_rewards(trajs, step)  # SPEAR tool bonus (schedule "none" by default)
        cfg = self.config
        cost = spader_tool_cost(step, cfg.tool_round_cost, cfg.cost_free_steps, cfg.cost_rampup_steps)
        found, queries, gold = [], [], []
        for t in trajs:
            n = max(t.num_steps, 1)
            found.append(_pad(list(t.info.get("found_entities_per_step", [])), n, []))
            queries.append([int(q) for q in _pad(list(t.info.get("queries_per_step", [])), n, 0)])
            gold.append(int(t.info.get("num_gold_entities", 0)))
        details = diversity_step_details(
            found, queries, [t.uid for t in trajs], gold, alpha=cfg.diversity_alpha,
            beta=cfg.diversity_beta, lam=cfg.diversity_lambda, tool_cost=cost)
        for i, t in enumerate(trajs):
            t.step_rewards = [float(r) for r in details.rewards[i]][: max(t.num_steps, 1)]
            f1 = float(t.info.get("f1", t.outcome_reward))
            t.outcome_reward = (cfg.final_answer_weight * f1 if t.info.get("format_ok", True)
                                else float(cfg.format_error_reward))
            t.info["entities_found"] = int(sum(details.num_new[i]))
            t.info["rarity_weighted"] = float(sum(details.rarity_weighted[i]))
        # Metrics of 3.2 (per-step reward, discoveries, group coverage, queries, cost weight).
        uniq = {}
        for i, t in enumerate(trajs):
            uniq.setdefault(t.uid, set()).update(e for s in details.new_entities[i] for e in s)
        m = {
            "step_reward_mean": float(np.mean([r for rs in details.rewards for r in rs] or [0.0])),
            "entities_found_per_episode": float(np.mean([t.info["entities_found"] for t in trajs])),
            "unique_entities_per_group": float(np.mean([len(s) for s in uniq.values()])),
            "rarity_weighted_discoveries": float(np.mean([t.info["rarity_weighted"] for t in trajs])),
            "queries_per_step": float(np.mean([q for qs in queries for q in qs] or [0.0])),
            "tool_cost_weight": float(cost),
        }
        for k, v in m.items():
            self.metrics.log_value(("spader", k), v, window=1)
