"""GRPO and Dr.BoT as RLlib Algorithms; SPEAR and SPADER are this training step with other recipes.

One ``training_step`` (docs/algorithms.md 1-3; the pieces are registered in rllib_spear/recipe and
named by the config):
 1. draw ``tasks_per_iteration`` tasks (checkpointed position), sample G trajectories per task
    on the healthy LLMEnvRunners, as the registered ``rollout_pipeline`` schedules it
    (rllib_spear/pipelines/: "sync" samples now; "one_step_off" collects the batch launched last
    iteration and launches the next one; "async" takes the groups the runners finished while
    sampling without pause); ``TrajectoryCallback.on_trajectories`` sees the batch;
 2. reward shapers (SPEAR tool bonus, SPADER diversity reward, user reward functions);
 3. the advantage estimator, grouped by uid (GRPO outcome / SPADER step-wise peer);
 4. response filters zero masks; the group-std filter drops the flattest groups;
 5. SIL replay rows, when on (sampled before this batch is admitted);
 6. ``learner_group.update`` with whole groups per learner and global normalizers (replay
    joined or in its own optimizer steps);
 7. SIL admission, the version-checked weight sync, metrics.

The engine cycle (pipelines/colocation.py) is called around 6 and 7 in every run; it acts in
colocated mode (``.resources(colocate=True)``): the engines sleep between 5 and 6 (after
sampling), and the weight sync of 7 runs between their two wakes: weights, sync, KV cache.
Any failure after the sleep (update, SIL step, sync) wakes every engine and leaves the sync owed:
the next sampling (training or evaluation) first syncs, and fails if that sync fails, so nothing
is sampled on weights the runners do not hold (none at all after a level-2 sleep).

Validation (``evaluate``, docs/design.md "Validation") runs on the same runners between
iterations, every ``evaluation_interval`` iterations through RLlib's ``Algorithm.step``, and
once before the first with ``eval_before_train``.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import numpy as np
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS, EPISODE_LEN_MEAN, EPISODE_RETURN_MEAN, LEARNER_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME, NUM_EPISODES_LIFETIME,
)

from ...callbacks import run_trajectory_callbacks
from ...core.step_samples import sample_lengths
from ...core.trajectory import Trajectory
from ...recipe import LearnerRow, Recipe, TaskSampler, build_learner_batches
from ...recipe.recipe import Metrics
from ...rllib_private import AlgorithmAdapter, user_model_config
from ...pipelines import SampledBatch, make_pipeline
from ...pipelines.colocation import EngineCycle, check_colocated_placement, engine_cycle
from ...pipelines.sync import sample_tasks
from ...weight_streaming.sync import WeightSync
from .config import DrBoTConfig, GRPOConfig

__all__ = ["GRPO", "DrBoT", "EVALUATION_BEFORE_TRAIN"]

logger = logging.getLogger(__name__)

_STATE_KEY = "rllib_spear"
#: The result key of the ``eval_before_train`` evaluation (in the first result only).
EVALUATION_BEFORE_TRAIN = "evaluation_before_train"


def _with_model_path(config: GRPOConfig, model_path: str) -> GRPOConfig:
    """A frozen copy of the frozen ``config`` whose ``model_config['model_path']`` is
    ``model_path`` (RLlib's public copy / ``rl_module`` / freeze: a frozen config takes no
    setting)."""
    copy = config.copy(copy_frozen=False)
    copy.rl_module(model_config={**user_model_config(config), "model_path": model_path})
    copy.freeze()
    return copy


class GRPO(AlgorithmAdapter):
    """Group Relative Policy Optimization for multi-turn tool-using LLM agents."""

    _warned_filtered_out = False  # the nearly-all-filtered warning is logged once per run
    _sample_log = None  # debugging(log_samples=N): made on first use (sample_log.py)

    @classmethod
    def get_default_config(cls) -> GRPOConfig:
        return GRPOConfig()

    @classmethod
    def default_resource_request(cls, config: Any) -> Any:
        """RLlib's placement group (what Tune reserves for a trial); with ``colocate=True`` each
        runner's bundle and one learner's are one bundle, one GPU per pair
        (``placement.colocated_bundles``, docs/design.md "Cluster placement")."""
        from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
        from ray.tune.execution.placement_groups import PlacementGroupFactory

        from ...env_runners.placement import colocated_bundles

        pgf = super().default_resource_request(config)
        cfg = cls.get_default_config().update_from_dict(
            config.to_dict() if isinstance(config, AlgorithmConfig) else config)
        if not cfg.colocate:
            return pgf
        cfg.validate()  # the resolved GPU shares
        return PlacementGroupFactory(bundles=colocated_bundles(cfg, pgf.bundles), strategy=pgf.strategy)

    # ------------------------------------------------------------------ setup
    def setup(self, config: GRPOConfig) -> None:
        from ...coldstart import resolve_model_path
        from ...envs import load_tasks
        from ...models.folders import require_model_folder
        from ...cluster.resource_check import check_cluster_fits

        # Actors the cluster can never hold would be waited for forever: refuse now, naming the
        # knobs (docs/design.md "Fault tolerance"), before any actor starts or a model is built.
        check_cluster_fits(config)
        # Resolve "embedded" once on the driver (builds and caches the tiny SFT policy), so that
        # learners and runners load the same folder instead of racing to build it.
        path = config.model_config["model_path"]
        resolved = resolve_model_path(path)
        require_model_folder(resolved, path)  # a clear error here, not a failed download in an actor
        if config.evaluation_interval or config.eval_before_train:
            from .evaluation import eval_source

            # A missing or malformed eval set fails now, before any actor starts, not at the first
            # evaluation (step 50 of a recipe).
            # Kept: every evaluation of the run reads this split (a 21M-row parquet is not re-read).
            self._eval_tasks = {config.eval_split: load_tasks(eval_source(config), config.eval_split, env=config.env)}
        if resolved != path:  # RLlib froze the config: learners and runners get a frozen copy
            config, self.config = (_with_model_path(c, resolved) for c in (config, self.config))
        super().setup(config)
        tasks = load_tasks(config.env if config.dataset is None else config.dataset, "train", env=config.env)
        self.task_sampler = TaskSampler(tasks, seed=config.seed or 0)
        self.recipe = Recipe(config)
        self.local_replay_buffer = self.recipe.replay_buffer  # RLlib's name for SIL's buffer (None without SIL)
        self.algo_step = 0  # t of docs/algorithms.md (completed training steps)
        self._rng = np.random.default_rng((config.seed or 0) + 17)
        self._policy_version = 0  # number of learner updates = the learners' WEIGHTS_SEQ_NO
        self._pipeline = make_pipeline(config)  # rollout_pipeline (rllib_spear/pipelines/registry.py)
        self._sleep_cycle = engine_cycle(config)  # the engines' sleep / wake around the update
        self.weight_sync = WeightSync.from_config(config)  # learners -> runners, version-checked
        self._sync_owed = False  # a sync failed or was skipped after an update (see sync_if_owed)
        #: colocated runs on GPUs: {runner index: learner rank on the same GPU}
        self.colocated_pairs: dict[int, int] = {}
        if config.colocate and (config.num_gpus_per_learner or 0) > 0:
            self.colocated_pairs = check_colocated_placement(self.learner_group, self.env_runner_group)
        self.sync_weights()

    @property
    def pad_token_id(self) -> int:
        return 0

    @property
    def policy_version(self) -> int:
        """The learners' weights version (WEIGHTS_SEQ_NO: one per ``learner_group.update``)."""
        return self._policy_version

    # ------------------------------------------------------------------ training step
    def training_step(self) -> None:
        cfg: GRPOConfig = self.config
        step = self.algo_step + 1
        # event counters are logged every iteration, 0 included: in RLlib's metrics a "sum" that
        # an iteration does not log reads NaN, so one event would turn every later iteration NaN
        for counter in ("lost_all_samples", "dropped_in_flight_trajectories"):
            self.metrics.log_value(counter, 0, reduce="sum")
        self.sync_if_owed()  # a failed iteration before: never sample on weights the runners lack
        t0 = time.perf_counter()
        trajs, runner_stats = self.next_batch()
        run_trajectory_callbacks(self, trajs, runner_stats, step)
        t_sample = time.perf_counter() - t0
        if not trajs:
            self.metrics.log_value("lost_all_samples", 1, reduce="sum")
            return
        self._log(self.recipe.shape_rewards(trajs, step))
        adv = self.recipe.advantages(trajs)
        kept = self.recipe.filter(trajs)
        self._warn_if_filtered_out(trajs, kept)
        self._log_samples(trajs, kept.filtered, step)
        rows = self.recipe.learner_rows(trajs, adv, kept)
        replay = self.recipe.replay(step)
        cycle = self._sleep_cycle
        cycle.sleep(self.env_runner_group)  # colocated: the engines give the GPU to the learners
        t0 = time.perf_counter()
        try:
            if replay.joint:
                self.update_learners(rows + replay.rows, step)
            else:
                self.update_learners(rows, step)
                if replay.rows:  # sequential SIL: its own optimizer steps after the on-policy ones
                    self.update_learners(replay.rows, step)
            t_train = time.perf_counter() - t0
            self._log(self.recipe.after_update(trajs, adv, kept, step, replay))
            self.algo_step = step
            self.sync_weights()
        except BaseException:
            self._after_failed_step(cycle)
            raise
        for k, v in cycle.pop_seconds().items():  # what sharing the GPUs cost this iteration (colocated)
            self.metrics.log_value(("colocate", f"engine_{k}_s"), v, window=1)
        self._log_rollout_metrics(trajs, runner_stats, kept.fractions, t_sample)
        trained_tokens = sum(sample_lengths([r.traj for r in rows + replay.rows]))  # per step sample in window
        self.metrics.log_value("train_tokens_per_s", trained_tokens / max(t_train, 1e-9), window=1)
        self.metrics.log_value("learner_update_s", t_train, window=1)
        self.metrics.log_value("algo_step", step, window=1)

    # ------------------------------------------------------------------ pieces
    def next_batch(self) -> tuple[list[Trajectory], list[dict]]:
        """This iteration's batch from the run's rollout pipeline (``rollout_pipeline``,
        rllib_spear/pipelines/), its counters logged."""
        return self._take_batch(self._pipeline.next_batch(self))

    def sample(self, tasks: list[dict], group_size: int | None = None,
               seed_key: tuple[int, int] | None = None) -> tuple[list[Trajectory], list[dict]]:
        """G = ``group_size`` (default ``config.group_size``) trajectories per task, sampled now,
        whole groups only. ``seed_key``: the sampling seeds (``runner_requests.sampling_seed``);
        None: each runner's own."""
        return self._take_batch(sample_tasks(self, tasks, int(group_size or self.config.group_size), seed_key))

    def _take_batch(self, batch: SampledBatch) -> tuple[list[Trajectory], list[dict]]:
        """(trajectories, runner stats) of ``batch``, its counters logged: the counts every
        iteration, 0 included (a curve with gaps reads as "not measured", and a "sum" metric
        with no value in an iteration reads NaN)."""
        self._sampled_version = batch.sampled_version
        for key, n in batch.counts.items():
            self.metrics.log_value(key, n, reduce="sum")
        for key, v in batch.gauges.items():
            self.metrics.log_value(key, v, window=1)
        return batch.trajectories, batch.runner_stats

    def update_learners(self, rows: Sequence[LearnerRow], step: int) -> list[dict]:
        """One ``learner_group.update`` over ``rows``: whole groups per learner, global normalizers,
        ``num_epochs`` passes of shuffled mini-batches (the learner runs them all in this call)."""
        cfg = self.config
        batches = build_learner_batches(
            rows, num_learners=cfg.num_learners, minibatch_size=cfg.minibatch_size,
            t_norm=cfg.loss_t_norm, pad_token_id=self.pad_token_id,
            seed=int(self._rng.integers(2**31)), num_epochs=int(cfg.num_epochs),
        )
        mabs = [MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(b)}, env_steps=len(b["input_ids"]))
                for b in batches]
        timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: step}
        try:
            if cfg.num_learners <= 1 and len(mabs) == 1:
                res = self.learner_group.update(batch=mabs[0], timesteps=timesteps)
            else:
                res = self.learner_group.update(batches=mabs, timesteps=timesteps)
        except Exception as exc:  # a learner rank that died fails the iteration, saying so
            from ...learner.failure import explain_learner_failure

            explained = explain_learner_failure(self.learner_group, exc)
            if explained is exc:  # no learner died: the error as it was (never its own cause)
                raise
            raise explained from exc
        self.metrics.aggregate(res, key=LEARNER_RESULTS)
        return res

    def _after_failed_step(self, cycle: EngineCycle) -> None:
        """An iteration failed after its sampling (update, SIL step or sync): the runners may hold
        no valid weights (a level-2 sleep, a half-applied sync) and the learners may be ahead of
        them, so the sync is owed (``sync_if_owed`` pays it before anything samples); colocated
        engines wake as they are, whatever is still asleep (a failing wake is logged: the
        iteration's own error is the one raised)."""
        self._sync_owed = True
        if not cycle.asleep:
            return
        try:
            cycle.wake_all(self.env_runner_group)
        except Exception as e:  # noqa: BLE001 - the step's own error is raised; the sync retries the wake
            logger.warning("colocated engines did not wake after a failed iteration (%s: %s); the next "
                           "iteration wakes them before its weight sync", type(e).__name__, e)

    def sync_if_owed(self) -> None:
        """Sync the runners now if the last sync failed or was skipped after an update (or an
        engine is still asleep): called before any sampling. A sync that fails again raises here,
        so the iteration fails loudly before it samples on invalid weights."""
        if getattr(self, "_sync_owed", False) or self._sleep_cycle.asleep:
            logger.warning("the runners' weights are not the learners' (the last iteration failed after its "
                           "sampling): syncing them before sampling")
            self.sync_weights()

    def sync_weights(self) -> None:
        """The learners' weights to every runner, version-checked (rollouts run on the new version).
        Colocated engines asleep after an update wake their weights first and their KV cache
        after (pipelines/colocation.py). Until it returns, the sync is owed (``sync_if_owed``)."""
        if self.env_runner_group is not None:
            cycle = self._sleep_cycle
            self._sync_owed = True
            cycle.wake_for_sync(self.learner_group, self.env_runner_group)
            try:
                self._policy_version = self.weight_sync(self.learner_group, self.env_runner_group)
            finally:
                cycle.wake_kv_cache(self.env_runner_group)
            self._sync_owed = False

    def restore_env_runners(self, env_runner_group) -> list[int]:
        """RLlib's restore, then the version-checked weight sync of the restored runners."""
        restored = super().restore_env_runners(env_runner_group)
        if restored and env_runner_group is self.env_runner_group and hasattr(self, "task_sampler"):
            self.sync_weights()
        return restored

    def _warn_if_filtered_out(self, trajs: list[Trajectory], kept: Any) -> None:
        """Filters that mask (nearly) the whole batch leave nothing to train: say so once per run
        in the log, quoting one masked response and never recommending the model in use, and
        every iteration in ``filters/nearly_all_filtered`` (the CLI's iteration line shows it).
        ``kept``: the batch's ``FilterResult``."""
        from ...coldstart.lookup import cold_start_name
        from ...recipe.filters import NEARLY_ALL_FILTERED, filtered_batch_warning, masked_response

        nearly_all = kept.fractions.get("any", 0.0) >= NEARLY_ALL_FILTERED
        self.metrics.log_value(("filters", "nearly_all_filtered"), float(nearly_all), window=1)
        if nearly_all and not self._warned_filtered_out:
            self._warned_filtered_out = True
            model = str(self.config.model_config.get("model_path", ""))
            warning = filtered_batch_warning(kept.fractions, sample=masked_response(trajs, kept.filtered),
                                             model=cold_start_name(model) or model)
            logger.warning("iteration %d: %s", self.algo_step + 1, warning)

    def _log_samples(self, trajs: list[Trajectory], filtered: Sequence[bool], step: int) -> None:
        """``.debugging(log_samples=N)``: N of the iteration's episodes to stdout and to
        TensorBoard in the run's logdir (sample_log.py)."""
        if not self.config.log_samples:
            return
        if self._sample_log is None:
            from ...sample_log import SampleLog

            self._sample_log = SampleLog(self.config.log_samples, self.config.model_config["model_path"],
                                         getattr(self, "logdir", None))
        self._sample_log.log(trajs, filtered, step)

    def log_result(self, result: dict) -> None:
        """RLlib's (the ``on_train_result`` callbacks, then the loggers); with
        ``.debugging(print_summary=True)``, then the one-line summary ``rllib-spear train``
        prints (progress.py), so that ``algo.train()`` shows it too."""
        super().log_result(result)
        if self.config.print_summary:
            from ...progress import progress_line

            print(progress_line(result), flush=True)

    def _log(self, metrics: Metrics) -> None:
        for key, v in metrics.items():
            self.metrics.log_value(key, v, window=1)

    def _log_rollout_metrics(self, trajs: list[Trajectory], runner_stats: list[dict],
                             filter_fractions: dict[str, float], t_sample: float) -> None:
        from ...metrics import rollout_metrics

        key = ENV_RUNNER_RESULTS
        m = rollout_metrics(trajs, runner_stats, expected_version=self._sampled_version)
        for k, v in m.items():
            self.metrics.log_value((key, k), v, window=1)
        for k, v in filter_fractions.items():
            self.metrics.log_value(("filters", f"{k}_frac"), v, window=1)
        self.metrics.log_value((key, EPISODE_RETURN_MEAN), m["reward_total_mean"], window=1)
        self.metrics.log_value((key, EPISODE_LEN_MEAN), m["response_length_mean"], window=1)
        self.metrics.log_value((key, NUM_EPISODES_LIFETIME), len(trajs), reduce="lifetime_sum")
        self.metrics.log_value((key, NUM_ENV_STEPS_SAMPLED_LIFETIME), m["generated_tokens"],
                               reduce="lifetime_sum")
        self.metrics.log_value((key, "sample_time_s"), t_sample, window=1)

    # ------------------------------------------------------------------ evaluation
    def step(self) -> dict[str, Any]:
        """RLlib's iteration (training, then ``evaluate`` every ``evaluation_interval``); with
        ``eval_before_train``, the first one evaluates first and reports it under
        ``EVALUATION_BEFORE_TRAIN``."""
        before = self.evaluate() if self.config.eval_before_train and self.iteration == 0 else None
        result = super().step()
        if before is not None:
            result[EVALUATION_BEFORE_TRAIN] = before
        return result

    def evaluate(self, parallel_train_future: Any = None) -> dict[str, float]:
        """The validation of RLlib's ``Algorithm.step`` (``result["evaluation"]``): the
        ``evaluation()`` settings through :meth:`evaluate_tasks`, between RLlib's
        ``on_evaluate_start`` / ``on_evaluate_end`` callbacks. A ``custom_evaluation_function``
        replaces it (RLlib's own ``evaluate``)."""
        if self.config.custom_evaluation_function:
            return super().evaluate(parallel_train_future)
        from ray.rllib.callbacks.utils import make_callback

        make_callback("on_evaluate_start", callbacks_objects=self.callbacks,
                      callbacks_functions=self.config.callbacks_on_evaluate_start,
                      kwargs=dict(algorithm=self, metrics_logger=self.metrics))
        metrics = self.evaluate_tasks()
        make_callback("on_evaluate_end", callbacks_objects=self.callbacks,
                      callbacks_functions=self.config.callbacks_on_evaluate_end,
                      kwargs=dict(algorithm=self, metrics_logger=self.metrics, evaluation_metrics=metrics))
        return metrics

    def evaluate_tasks(self, split: str | None = None, num_tasks: int | None = None, samples: int | None = None,
                       *, dataset: Any = None, temperature: float | None = None, top_p: float | None = None,
                       top_k: int | None = None, max_new_tokens: int | None = None) -> dict[str, float]:
        """Evaluate the current policy: ``samples`` (n) episodes per task of the first
        ``num_tasks`` tasks of ``split`` of ``dataset``, sampled at ``temperature`` (0 = greedy)
        / ``top_p`` / ``top_k`` with ``max_new_tokens`` per turn, on the training env runners.
        Every None is the ``evaluation()`` setting (dataset: ``environment(eval_dataset=...)``,
        else the training dataset's or the environment's embedded split).

        Returns :func:`rllib_spear.metrics.task_metrics` (``<source>/<metric>`` per
        ``data_source``, ``avg/<metric>``, mean@n and pass@k when n > 1) plus ``eval_time_s``,
        ``policy_version`` (the weights evaluated) and ``lost_env_runner_samples``. Nothing
        training depends on changes (docs/design.md "Validation")."""
        from ...envs import load_tasks
        from ...metrics import task_metrics
        from ...pipelines.runner_requests import sample_for_evaluation
        from .evaluation import dataset_label, eval_settings, eval_source

        cfg = self.config
        t0 = time.perf_counter()
        run = eval_settings(cfg, split=split, num_tasks=num_tasks, samples=samples, temperature=temperature,
                            top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens)
        source = eval_source(cfg, dataset)
        cached = getattr(self, "_eval_tasks", {})  # the config's eval set, loaded in setup
        tasks = (cached[run.split] if dataset is None and run.split in cached
                 else load_tasks(source, run.split, env=cfg.env))
        if run.num_tasks:
            tasks = tasks[:run.num_tasks]

        def resync() -> int:  # every runner restarted: they need the current weights first
            self.sync_weights()
            return self._policy_version

        self.sync_if_owed()  # a failed iteration before: evaluate the learners' weights, not none
        # the runners' seed key: a driver-held, checkpointed count (a runner's own restarts with it)
        key = self._eval_count = getattr(self, "_eval_count", 0) + 1
        trajs, stats, lost = sample_for_evaluation(self.env_runner_group, tasks, run.samples, run.sampling, resync,
                                                   eval_key=key)
        out = task_metrics(trajs, stats, default_source=dataset_label(source))
        out["policy_version"] = float(self._policy_version)
        out["lost_env_runner_samples"] = float(lost)
        out["eval_time_s"] = time.perf_counter() - t0
        return out

    # ------------------------------------------------------------------ checkpoint state
    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False) -> str:
        """RLlib's checkpoint, written atomically (docs/design.md "Atomic checkpoints"): into a
        temporary sibling folder, with a manifest of every file's size and CRC-32, fsynced, then
        renamed (or swapped) into place, so that a kill or a full disk mid-save leaves the
        previous checkpoint at ``path`` (a ``CheckpointWriteError`` names the path and the fix).
        Under FSDP every learner rank first writes its shards (torch.distributed.checkpoint) into
        ``learner_group/learner/sharded_state`` of that folder, where the learners'
        ``restore_from_path`` finds them (with any number of ranks). A URI or pyarrow filesystem
        (no atomic rename there) gets RLlib's plain save."""
        import tempfile
        import uuid
        from pathlib import Path

        from ...checkpoint_io import atomic_folder, is_local_path

        fsdp = self.config.sharding == "fsdp" and state is None
        if not is_local_path(path, filesystem):
            if fsdp:
                raise ValueError("sharding='fsdp' checkpoints are written by every learner rank: save to a "
                                 "local or shared-filesystem path (no pyarrow filesystem / URI)")
            logger.debug("checkpoint %s: not a local path, written in place (not atomically)", path)
            return super().save_to_path(path, state=state, filesystem=filesystem, use_msgpack=use_msgpack)
        target = Path(path if path is not None else Path(tempfile.gettempdir()) / uuid.uuid4().hex).absolute()
        with atomic_folder(target) as tmp:
            if fsdp:
                self._save_sharded_state(tmp)
            super().save_to_path(tmp.as_posix(), state=state, use_msgpack=use_msgpack)
        return str(target)

    def _save_sharded_state(self, folder) -> None:
        """Every FSDP learner rank writes its shards into ``folder``'s learner state folder."""
        from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_LEARNER_GROUP

        from ...learner.state import SHARDED_STATE_DIR

        shard_dir = str(folder / COMPONENT_LEARNER_GROUP / COMPONENT_LEARNER / SHARDED_STATE_DIR)
        results = self.learner_group.foreach_learner(lambda learner, d=shard_dir: learner.save_sharded_state(d))
        errors = [r.get() for r in results.result_or_errors if not r.ok]
        if errors:
            raise errors[0]

    def restore_from_path(self, path, *args, **kwargs) -> None:
        """RLlib's restore, after the checkpoint's manifest checked every file's size and CRC-32
        (``checkpoint_io.verify_checkpoint``: a truncated or corrupted file is refused by name
        before RLlib reads anything; a checkpoint without a manifest, from an older version,
        loads as it is)."""
        import os

        from ...checkpoint_io import is_local_path, verify_checkpoint

        if isinstance(path, (str, os.PathLike)) and is_local_path(path, kwargs.get("filesystem")):
            verify_checkpoint(path)
        return super().restore_from_path(path, *args, **kwargs)

    @classmethod
    def from_checkpoint(cls, path, filesystem=None, **kwargs):
        """RLlib's ``from_checkpoint``, after the manifest check of :meth:`restore_from_path`: a
        damaged checkpoint is refused before the algorithm and its actors are built."""
        import os

        from ...checkpoint_io import is_local_path, verify_checkpoint

        if isinstance(path, (str, os.PathLike)) and is_local_path(path, filesystem):
            verify_checkpoint(path)  # restore_from_path's check of the unchanged files only stats
        return super().from_checkpoint(path, filesystem, **kwargs)

    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict[str, Any]:
        state = super().get_state(components, not_components=not_components, **kwargs)
        state[_STATE_KEY] = self._extra_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        dropped = None
        if getattr(self, "_pipeline", None) is not None:  # (set up: there is a run to replace)
            dropped = self._pipeline.drop(self.env_runner_group)  # the restored run samples fresh
        super().set_state(state)
        if dropped is not None:  # after RLlib restored the metrics logger, which would erase it
            self.metrics.log_value("dropped_in_flight_trajectories", int(dropped or 0), reduce="sum")
        if _STATE_KEY in state:
            self._set_extra_state(state[_STATE_KEY])
        if hasattr(self, "task_sampler"):
            # restored learner weights -> runners, applied even where a runner holds the same
            # version number (the restored weights may still differ: another run's checkpoint)
            group = self.env_runner_group
            if group is not None:  # the runners the sync reaches: the remote ones, else the local one
                remote = group.num_remote_env_runners() > 0
                group.foreach_env_runner(lambda r: r.forget_weights_version(), local_env_runner=not remote)
            self.sync_weights()

    def _extra_state(self) -> dict[str, Any]:
        return {
            "algo_step": self.algo_step,
            "task_sampler": self._pipeline.checkpoint_sampler_state(self.task_sampler),
            "rng": self._rng.bit_generator.state,
            "policy_version": self._policy_version,
            "eval_count": getattr(self, "_eval_count", 0),
            "pipeline": self._pipeline.get_state(),
            **self.recipe.get_state(),
        }

    def _set_extra_state(self, s: dict[str, Any]) -> None:
        self.algo_step = int(s["algo_step"])
        self.task_sampler.set_state(s["task_sampler"])
        self._rng.bit_generator.state = s["rng"]
        self._policy_version = int(s["policy_version"])
        self._eval_count = int(s.get("eval_count", 0))  # (older checkpoints: none)
        self._pipeline.set_state(s.get("pipeline", {}))  # (none in a "sync" run's older checkpoints)
        self.recipe.set_state(s)


class DrBoT(GRPO):
    """GRPO with the Dr.BoT bag of tricks (docs/algorithms.md 1.5)."""

    @classmethod
    def get_default_config(cls) -> DrBoTConfig:
        return DrBoTConfig()
