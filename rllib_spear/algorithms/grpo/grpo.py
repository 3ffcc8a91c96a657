"""GRPO and Dr.BoT as RLlib Algorithms (the base that SPEAR and SPADER extend).

One ``training_step``:
 1. draw ``tasks_per_iteration`` tasks (checkpointed position) and split them over the
    healthy LLMEnvRunners; each returns G trajectories per task;
 2. ``shape_rewards``: algorithm-specific rewards (SPEAR tool bonus, SPADER step rewards);
 3. ``compute_advantages`` on the driver, grouped by uid;
 4. Dr.BoT response filters zero masks; the group-std filter drops the flattest groups;
 5. ``learner_group.update`` with whole groups per learner and global normalizers;
 6. ``after_update`` (SPEAR: SIL replay + buffer update), metrics, weight sync (versioned).
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Sequence

import numpy as np
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS, EPISODE_LEN_MEAN, EPISODE_RETURN_MEAN, LEARNER_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME, NUM_EPISODES_LIFETIME, TIMERS,
)

from ...core.advantages import group_advantages, step_peer_advantages
from ...core.filters import group_std_filter, response_filter_reasons
from ...core.trajectory import Trajectory
from .batching import LearnerRow, build_learner_batches
from .config import DrBoTConfig, GRPOConfig
from .task_sampler import TaskSampler

__all__ = ["GRPO", "DrBoT"]

_STATE_KEY = "rllib_spear"


def step_rewards_with_outcome(t: Trajectory) -> list[float]:
    """Per-step rewards r_k with the episode-level reward terms added on the last step, so that
    sum_k r_k == t.total_reward."""
    r = [float(x) for x in t.step_rewards] or [0.0]
    r = r + [0.0] * max(0, t.num_steps - len(r))
    r[-1] += float(t.outcome_reward + sum(t.rewards.values()))
    return r


class GRPO(Algorithm):
    """Group Relative Policy Optimization for multi-turn tool-using LLM agents."""

    @classmethod
    def get_default_config(cls) -> GRPOConfig:
        return GRPOConfig()

    # ------------------------------------------------------------------ setup
    def setup(self, config: GRPOConfig) -> None:
        from ...models.rl_module import resolve_model_path
        from ...envs import load_tasks

        # Resolve "embedded" once on the driver (builds and caches the tiny SFT policy), so that
        # learners and runners load the same folder instead of racing to build it.
        path = config.model_config["model_path"]
        resolved = resolve_model_path(path)
        if resolved != path:
            for c in {id(config): config, id(self.config): self.config}.values():
                frozen = c._is_frozen
                c._is_frozen = False
                c._model_config = {**c._model_config, "model_path": resolved}
                c._is_frozen = frozen
        super().setup(config)
        tasks = load_tasks(config.dataset or config.env, "train")
        self.task_sampler = TaskSampler(tasks, seed=config.seed or 0)
        self.algo_step = 0  # t of docs/algorithms.md (completed training steps)
        self._rng = np.random.default_rng((config.seed or 0) + 17)
        self._policy_version = 0  # number of learner updates = the learners' WEIGHTS_SEQ_NO
        self._sync_weights()

    @property
    def pad_token_id(self) -> int:
        return 0

    # ------------------------------------------------------------------ hooks for subclasses
    def shape_rewards(self, trajs: list[Trajectory], step: int) -> None:
        """Add algorithm-specific reward terms to ``traj.rewards`` / ``traj.step_rewards``."""

    def compute_advantages(self, trajs: list[Trajectory]) -> tuple[list[np.ndarray], np.ndarray]:
        """Per-token advantages of each trajectory and a scalar episode advantage.

        ``grpo``: outcome advantage of R_i (1.1) on every assistant token. ``spa``: SPADER's
        step-wise peer advantage (3.3) over per-step rewards, where the episode-level terms
        (outcome, named components such as SPEAR's tool bonus) are paid on the last step.
        The scalar episode advantage (R_i - group mean, for SIL admission) is returned either way.
        """
        cfg = self.config
        rewards = np.array([t.total_reward for t in trajs], np.float64)
        uids = [t.uid for t in trajs]
        if cfg.advantage_estimator == "spa":
            per_step = [step_rewards_with_outcome(t) for t in trajs]
            step_adv = step_peer_advantages(per_step, uids, gamma=cfg.spa_gamma)
            token_adv = [t.token_advantages(a) for t, a in zip(trajs, step_adv)]
            for t, a in zip(trajs, step_adv):
                t.info["step_advantages"] = [float(x) for x in a]
            episode_adv = group_advantages(rewards, uids, std_normalize=False)
            return token_adv, episode_adv
        adv = group_advantages(rewards, uids, std_normalize=cfg.std_normalize_advantages)
        return [t.token_advantages(float(a)) for t, a in zip(trajs, adv)], adv

    def replay_rows(self, step: int) -> tuple[list[LearnerRow], bool]:
        """Replayed rows for this step and whether they join the on-policy batch (SPEAR)."""
        return [], False

    def after_update(self, trajs: list[Trajectory], episode_adv: np.ndarray,
                     filtered: list[bool], step: int) -> None:
        """Called after the on-policy update (SPEAR: self-imitation)."""

    # ------------------------------------------------------------------ training step
    def training_step(self) -> None:
        cfg: GRPOConfig = self.config
        step = self.algo_step + 1
        t_start = time.perf_counter()
        tasks = self.task_sampler.next(cfg.tasks_per_iteration)
        trajs, runner_stats = self._sample(tasks, step)
        t_sample = time.perf_counter() - t_start
        if not trajs:
            self.metrics.log_value("lost_all_samples", 1, reduce="sum")
            return
        self.shape_rewards(trajs, step)
        token_adv, episode_adv = self.compute_advantages(trajs)
        masks, filtered, filter_counts = self._apply_filters(trajs)
        rows = [LearnerRow(t, a, m) for t, a, m, f in zip(trajs, token_adv, masks, filtered)]
        replay_rows, joint = self.replay_rows(step)
        t0 = time.perf_counter()
        if replay_rows and joint:
            self._update_learners(list(rows) + list(replay_rows), step)
        else:
            self._update_learners(rows, step)
            if replay_rows:  # sequential SIL: its own optimizer steps after the on-policy ones
                self._update_learners(replay_rows, step)
        t_train = time.perf_counter() - t0
        self.after_update(trajs, episode_adv, filtered, step)
        self.algo_step = step
        self._sync_weights()
        self._log_rollout_metrics(trajs, runner_stats, filter_counts, t_sample)
        trained_tokens = sum(int(r.traj.length) for r in rows) + sum(
            int(r.traj.length) for r in replay_rows)
        self.metrics.log_value("train_tokens_per_s", trained_tokens / max(t_train, 1e-9), window=1)
        self.metrics.log_value("algo_step", step, window=1)

    # ------------------------------------------------------------------ pieces
    def _sample(self, tasks: list[dict], step: int, group_size: int | None = None
                ) -> tuple[list[Trajectory], list[dict]]:
        cfg = self.config
        G = int(group_size or cfg.group_size)
        group = self.env_runner_group
        version = self._policy_version
        self._sampled_version = version
        if group.num_remote_env_runners() == 0:
            local = group.local_env_runner
            out = local.sample_groups(tasks=tasks, group_size=G, policy_version=version)
            return list(out["trajectories"]), [out["stats"]]
        ids = group.healthy_env_runner_ids()
        if not ids:
            restored = group.probe_unhealthy_env_runners()
            if restored:
                # A restarted runner holds the initial weights: bring it to the current version
                # before it samples (else it would sample with a stale policy).
                self._sync_weights()
                version = self._sampled_version = self._policy_version
            ids = group.healthy_env_runner_ids()
        if not ids:
            return [], []
        shares = [tasks[i::len(ids)] for i in range(len(ids))]
        funcs = [
            (lambda r, s=s: r.sample_groups(tasks=s, group_size=G, policy_version=version))
            for s in shares
        ]
        ids, funcs = zip(*[(i, f) for i, f, s in zip(ids, funcs, shares) if s])
        results = group.foreach_env_runner(list(funcs), local_env_runner=False,
                                           remote_worker_ids=list(ids))
        lost = len(ids) - len(results)
        if lost:
            self.metrics.log_value("lost_env_runner_samples", lost, reduce="sum")
        trajs = [t for r in results for t in r["trajectories"]]
        # Keep whole groups only (a group split by a failure would bias its baseline).
        counts: dict[str, int] = defaultdict(int)
        for t in trajs:
            counts[t.uid] += 1
        trajs = [t for t in trajs if counts[t.uid] == G]
        return trajs, [r["stats"] for r in results]

    def _apply_filters(self, trajs: list[Trajectory]):
        cfg = self.config
        counts: dict[str, int] = defaultdict(int)
        masks, filtered = [], []
        kept_groups = None
        if cfg.group_filter_keep_fraction is not None:
            kept_groups = group_std_filter([t.total_reward for t in trajs], [t.uid for t in trajs],
                                           keep_fraction=cfg.group_filter_keep_fraction)
        for t in trajs:
            reasons = []
            if cfg.response_filters:
                ids = [tok for seg in t.assistant_token_ids() for tok in seg]
                text = "".join(t.info.get("assistant_texts", []))
                reasons = [r for r in response_filter_reasons(
                    ids, text, reached_max_length=bool(t.info.get("reached_max_length")),
                    has_valid_answer=bool(t.info.get("has_answer", True)),
                    n=cfg.filter_ngram_size, min_count=cfg.filter_ngram_repeats)
                    if r in cfg.response_filters]
            if kept_groups is not None and t.uid not in kept_groups:
                reasons.append("group_std")
            for r in reasons:
                counts[r] += 1
            mask = t.loss_mask()
            if reasons:
                mask = np.zeros_like(mask)
            masks.append(mask)
            filtered.append(bool(reasons))
        counts["any"] = sum(filtered)
        return masks, filtered, {k: v / len(trajs) for k, v in counts.items()}

    def _update_learners(self, rows: Sequence[LearnerRow], step: int) -> list[dict]:
        cfg = self.config
        batches = build_learner_batches(
            rows, num_learners=cfg.num_learners, minibatch_size=cfg.minibatch_size,
            t_norm=cfg.loss_t_norm, pad_token_id=self.pad_token_id,
            seed=int(self._rng.integers(2**31)),
        )
        mabs = [MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(b)}, env_steps=len(b["input_ids"]))
                for b in batches]
        timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: step}
        if cfg.num_learners <= 1 and len(mabs) == 1:
            res = self.learner_group.update(batch=mabs[0], timesteps=timesteps)
        else:
            res = self.learner_group.update(batches=mabs, timesteps=timesteps)
        self.metrics.aggregate(res, key=LEARNER_RESULTS)
        return res

    def restore_env_runners(self, env_runner_group) -> list[int]:
        """RLlib's restore, then the version-checked weight sync of the restored runners."""
        restored = super().restore_env_runners(env_runner_group)
        if restored and env_runner_group is self.env_runner_group and hasattr(self, "task_sampler"):
            self._sync_weights()
        return restored

    def _sync_weights(self) -> None:
        """Push the learner's weights to every runner and check each runner's version.

        RLlib's ``sync_weights`` is fire-and-forget with a cap on requests in flight, so a sync
        can be silently dropped; here each runner applies the state (torch tensors, never
        RLlib's float32-numpy conversion) synchronously and returns its WEIGHTS_SEQ_NO.
        """
        import ray
        from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE
        from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

        group = self.env_runner_group
        if group is None:
            return
        if self.config.sharding == "fsdp":
            # Every rank gathers its shards one tensor at a time; rank 0 returns the weights.
            results = self.learner_group.foreach_learner(lambda learner: learner.engine_state())
            states = [r.get() for r in results.result_or_errors if r.ok]
            errors = [r.get() for r in results.result_or_errors if not r.ok]
            if errors:
                raise errors[0]
            state = next(s for s in states if s is not None)
        else:
            state = self.learner_group.get_state(
                components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE, inference_only=True
            )[COMPONENT_LEARNER]
        payload = {COMPONENT_RL_MODULE: state[COMPONENT_RL_MODULE],
                   WEIGHTS_SEQ_NO: int(state.get(WEIGHTS_SEQ_NO, 0))}
        expected = payload[WEIGHTS_SEQ_NO]
        if group.num_remote_env_runners() == 0:
            group.local_env_runner.set_state(payload)
            versions = [group.local_env_runner.weights_version]
        else:
            ref = ray.put(payload)

            def apply(runner, ref=ref):
                runner.set_state(ray.get(ref))
                return runner.weights_version

            versions = group.foreach_env_runner(apply, local_env_runner=False)
        stale = [v for v in versions if v != expected]
        if stale:
            raise RuntimeError(f"weight sync: runners report versions {versions}, expected {expected}")
        self._policy_version = expected

    def _log_rollout_metrics(self, trajs: list[Trajectory], runner_stats: list[dict],
                             filter_counts: dict[str, float], t_sample: float) -> None:
        from ...metrics import rollout_metrics

        key = ENV_RUNNER_RESULTS
        m = rollout_metrics(trajs, runner_stats, expected_version=self._sampled_version)
        for k, v in m.items():
            self.metrics.log_value((key, k), v, window=1)
        for k, v in filter_counts.items():
            self.metrics.log_value(("filters", f"{k}_frac"), v, window=1)
        self.metrics.log_value((key, EPISODE_RETURN_MEAN), m["reward_total_mean"], window=1)
        self.metrics.log_value((key, EPISODE_LEN_MEAN), m["response_length_mean"], window=1)
        self.metrics.log_value((key, NUM_EPISODES_LIFETIME), len(trajs), reduce="lifetime_sum")
        self.metrics.log_value((key, NUM_ENV_STEPS_SAMPLED_LIFETIME), m["generated_tokens"],
                               reduce="lifetime_sum")
        self.metrics.log_value((key, "sample_time_s"), t_sample, window=1)

    # ------------------------------------------------------------------ evaluation
    def evaluate_tasks(self, split: str = "test", num_tasks: int | None = None,
                       group_size: int = 1) -> dict[str, float]:
        """Sample ``group_size`` episodes per task of a dataset split with the current policy
        and return task metrics: success / EM / F1 means and, for multi-answer tasks, macro
        precision / recall / F1 (per question, averaged over its samples, then over questions)."""
        from ...envs import load_tasks
        from ...metrics import rollout_metrics

        tasks = load_tasks(self.config.eval_dataset or self.config.dataset or self.config.env, split)
        if num_tasks:
            tasks = tasks[:num_tasks]
        trajs, stats = self._sample(tasks, step=self.algo_step, group_size=group_size)
        m = rollout_metrics(trajs, stats)
        by_q: dict[str, list[Trajectory]] = defaultdict(list)
        for t in trajs:
            by_q[t.uid].append(t)
        for key in ("precision", "recall", "f1", "em", "success"):
            vals = [np.mean([float(t.info.get(key, 0.0)) for t in ts]) for ts in by_q.values()
                    if any(key in t.info for t in ts)]
            if vals:
                m[f"macro_{key}"] = float(np.mean(vals))
        m["num_tasks"] = float(len(by_q))
        keep = ("num_tasks", "num_episodes", "reward_outcome_mean", "success_rate",
                "tool_call_rate", "tool_calls_per_episode", "turns_mean", "response_length_mean")
        return {k: v for k, v in m.items() if k in keep or k.startswith("macro_") or k.endswith("_mean")}

    # ------------------------------------------------------------------ checkpoint state
    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False) -> str:
        """RLlib's checkpoint; under FSDP every learner rank first writes its shards
        (torch.distributed.checkpoint) into ``learner_group/learner/sharded_state`` of the same
        folder, where the learners' ``restore_from_path`` finds them (with any number of ranks)."""
        if self.config.sharding == "fsdp" and state is None:
            import tempfile
            from pathlib import Path

            from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_LEARNER_GROUP

            from .learner import SHARDED_STATE_DIR

            if filesystem is not None or (path is not None and "://" in str(path)):
                raise ValueError("sharding='fsdp' checkpoints are written by every learner rank: save to a "
                                 "local or shared-filesystem path (no pyarrow filesystem / URI)")
            path = str(path) if path is not None else tempfile.mkdtemp()
            shard_dir = str(Path(path).absolute() / COMPONENT_LEARNER_GROUP / COMPONENT_LEARNER / SHARDED_STATE_DIR)
            results = self.learner_group.foreach_learner(lambda learner, d=shard_dir: learner.save_sharded_state(d))
            errors = [r.get() for r in results.result_or_errors if not r.ok]
            if errors:
                raise errors[0]
        return super().save_to_path(path, state=state, filesystem=filesystem, use_msgpack=use_msgpack)

    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict[str, Any]:
        state = super().get_state(components, not_components=not_components, **kwargs)
        state[_STATE_KEY] = self._extra_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if _STATE_KEY in state:
            self._set_extra_state(state[_STATE_KEY])
        if hasattr(self, "task_sampler"):
            self._sync_weights()  # restored learner weights -> runners, version-checked

    def _extra_state(self) -> dict[str, Any]:
        return {
            "algo_step": self.algo_step,
            "task_sampler": self.task_sampler.get_state(),
            "rng": self._rng.bit_generator.state,
            "policy_version": self._policy_version,
        }

    def _set_extra_state(self, s: dict[str, Any]) -> None:
        self.algo_step = int(s["algo_step"])
        self.task_sampler.set_state(s["task_sampler"])
        self._rng.bit_generator.state = s["rng"]
        self._policy_version = int(s["policy_version"])


class DrBoT(GRPO):
    """GRPO with the Dr.BoT bag of tricks (docs/algorithms.md 1.5)."""

    @classmethod
    def get_default_config(cls) -> DrBoTConfig:
        return DrBoTConfig()
