"""GRPOConfig: the shared AlgorithmConfig of GRPO, Dr.BoT, SPEAR and SPADER.

Builder-style, as in RLlib: ``GRPOConfig().environment("search_qa").env_runners(engine="hf",
temperature=1.0).training(group_size=8, clip_ratio_high=0.28).rl_module(model_config={...})``.
Every knob of docs/algorithms.md sections 1 and 2 is a ``training()`` kwarg; ``validate()`` names the
key and the fix for every bad value.
"""
from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.util import log_once

from ...core.losses import PolicyLossConfig

# RLlib wants spaces to build RLModules; tokens are not gym observations, so these are
# placeholders (the learner never uses RLlib's action distributions).
PLACEHOLDER_OBS_SPACE = gym.spaces.Box(0, np.iinfo(np.int32).max, (1,), np.int64)
PLACEHOLDER_ACTION_SPACE = gym.spaces.Discrete(2)

EMBEDDED_MODEL = "embedded"  # resolved to the project's tiny SFT'd policy (models.default_policy_path)

_FILTERS = ("overlong", "incomplete", "repetitive", "unreadable")

# training() kwargs owned by this config (name -> default). Kept in one table so that
# training(), to_dict() and validate() cannot drift apart.
GRPO_TRAINING_DEFAULTS: dict[str, Any] = {
    # sampling shape
    "group_size": 8,
    "tasks_per_iteration": 32,
    # advantages
    "std_normalize_advantages": True,  # GRPO divides by the group std; Dr.GRPO/Dr.BoT do not
    "advantage_estimator": "grpo",  # "grpo" (outcome, 1.1) or "spa" (SPADER step-wise peer, 3.3)
    "spa_gamma": 0.9,
    # policy loss (1.2 - 1.4, 1.6)
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.2,
    "dual_clip_c": None,
    "loss_agg_mode": "token-mean",
    "loss_mode": "vanilla",
    "clip_cov_ratio": 2e-4,
    "clip_cov_lb": 1.0,
    "clip_cov_ub": 5.0,
    "kl_cov_ratio": 2e-4,
    "kl_cov_coef": 0.1,
    "tis_cap": None,  # truncated importance weight cap C (1.6); None = auto (2.0 for vllm), 0 = off
    "entropy_coeff": 0.0,
    "kl_coeff": 0.0,  # KL to the frozen reference model (SPADER option: 0.001)
    "kl_estimator": "k3",
    "t_norm": None,  # seq-mean-token-sum-norm constant; None = max_response_tokens
    # Dr.BoT filters (1.5)
    "response_filters": (),
    "filter_ngram_size": 20,
    "filter_ngram_repeats": 10,
    "group_filter_keep_fraction": None,  # e.g. 0.75; None = keep all groups
    # optimisation
    "weight_decay": 0.01,
    "adam_betas": (0.9, 0.999),
    "micro_batch_token_budget": 8192,
    "lr_warmup_steps": 0,
    "recompute_old_logprobs": False,  # trainer-side logp_old (needed with tis_cap on vLLM)
    # torch CPU threads in the learner and env-runner processes. None keeps Ray's setting
    # (OMP_NUM_THREADS = the actor's num_cpus, usually 1). Sampling and learning alternate, so on
    # a CPU-only machine each phase can use every core: set it to the core count there.
    "torch_num_threads": None,
}

SAMPLING_DEFAULTS: dict[str, Any] = {
    "engine": "hf",
    "engine_kwargs": {},
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_new_tokens": 128,
    "stop": [],
    "max_turns": 4,
    "max_model_len": 1024,
    "max_response_tokens": 512,
    "max_observation_tokens": 256,
    "observation_template": "chatml",
}


# learners() kwargs owned by this config (docs/design.md "Learner sharding"): how the policy is
# laid out over the learner ranks and in which precision it computes.
LEARNER_DEFAULTS: dict[str, Any] = {
    "sharding": "ddp",  # "ddp": a full replica per learner; "fsdp": FSDP2 fully_shard per block
    "mixed_precision": None,  # None: compute in the weights' dtype; "bf16": bf16 compute, fp32 master
    "cpu_offload": False,  # fsdp only: sharded parameters, gradients and Adam state live in CPU memory
    "activation_checkpointing": None,  # None: model_config["gradient_checkpointing"]; True / False
    "gpu_memory_gb": None,  # memory of one learner GPU; when set, validate() checks the plan fits
}

#: env_runners() kwargs about the engines' hardware (not sampling knobs).
ENGINE_RESOURCE_DEFAULTS: dict[str, Any] = {
    "engine_gpu_memory_gb": None,  # memory of one engine GPU; None = gpu_memory_gb of learners()
}

SHARDING_STRATEGIES = ("ddp", "fsdp")
#: What benchmarks/master_weights.py measured for one AdamW step at lr 1e-6 with bf16 weights and
#: state vs fp32 master weights (quoted by the warning of validate()).
LOW_PRECISION_MASTER_EFFECT = ("2.1% of the weights change at all and the mean applied step is 0.03x the "
                               "fp32-master step (lr 1e-5: 15.7%, 0.19x)")
MIXED_PRECISION = (None, "bf16")


class GRPOConfig(AlgorithmConfig):
    """Config of GRPO on tool-using LLM agents (and the base of Dr.BoT/SPEAR/SPADER)."""

    def __init__(self, algo_class: type | None = None) -> None:
        if algo_class is None:
            from .grpo import GRPO

            algo_class = GRPO
        super().__init__(algo_class=algo_class)
        for k, v in {**GRPO_TRAINING_DEFAULTS, **SAMPLING_DEFAULTS, **LEARNER_DEFAULTS,
                     **ENGINE_RESOURCE_DEFAULTS}.items():
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
        self._model_config = {"model_path": EMBEDDED_MODEL, "dtype": "float32"}
        self.add_default_connectors_to_learner_pipeline = False
        # A failed runner is restarted at once (tests and short jobs cannot wait 60 s).
        self.delay_between_env_runner_restarts_s = 1.0
        self.restart_failed_env_runners = True
        self.seed = 0

    # ------------------------------------------------------------------ builder methods
    def training(self, **kwargs: Any) -> "GRPOConfig":
        """RLlib's ``training()`` plus every GRPO/Dr.BoT knob (see GRPO_TRAINING_DEFAULTS)."""
        own = {k: kwargs.pop(k) for k in list(kwargs) if hasattr(type(self), "_own_training_keys")
               and k in self._own_training_keys()}
        super().training(**kwargs)
        for k, v in own.items():
            if v is not NotProvided:
                setattr(self, k, v)
        return self

    @classmethod
    def _own_training_keys(cls) -> set[str]:
        return set(GRPO_TRAINING_DEFAULTS)

    def env_runners(self, **kwargs: Any) -> "GRPOConfig":
        """RLlib's ``env_runners()`` plus the engine and sampling knobs:
        engine ("hf" | "vllm"), engine_kwargs, temperature, top_p, top_k, max_new_tokens (per
        turn), stop, max_turns, max_model_len, max_response_tokens, max_observation_tokens,
        observation_template ("chatml" | "llama3")."""
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
        * ``mixed_precision``: None (compute in the weights' dtype) or "bf16" (fp32 master weights
          and AdamW state, bf16 compute, fp32 gradient reduction);
        * ``cpu_offload``: fsdp only: the shards and the optimizer step live in CPU memory;
        * ``activation_checkpointing``: None = ``model_config["gradient_checkpointing"]``;
        * ``gpu_memory_gb``: memory of one learner GPU; when set, ``validate()`` refuses a config
          whose memory plan (``rllib-spear plan``) does not fit, naming the knob to change.
        """
        own = {k: kwargs.pop(k) for k in list(kwargs) if k in LEARNER_DEFAULTS}
        super().learners(**kwargs)
        for k, v in own.items():
            if v is not NotProvided:
                setattr(self, k, v)
        return self

    def environment(self, env: Any = NotProvided, *, dataset: Any = NotProvided,
                    eval_dataset: Any = NotProvided, **kwargs: Any) -> "GRPOConfig":
        """``env``: a tool-environment name of ``rllib_spear.envs.make_env`` ("search_qa",
        "multi_answer_search", "code_math", "text_game", "textworld"); ``env_config``: its
        options; ``dataset`` / ``eval_dataset``: a parquet path or a default-dataset name
        (None = the environment's embedded train / test split)."""
        if env is not NotProvided:
            self.env = env
        if dataset is not NotProvided:
            self.dataset = dataset
        if eval_dataset is not NotProvided:
            self.eval_dataset = eval_dataset
        if "env_config" in kwargs and kwargs["env_config"] is not NotProvided:
            self.env_config = dict(kwargs.pop("env_config"))
        rest = {k: v for k, v in kwargs.items() if v is not NotProvided}
        if rest:
            super().environment(**rest)
        return self

    # ------------------------------------------------------------------ derived values
    def policy_loss_config(self, replay: bool = False) -> PolicyLossConfig:
        """The core loss config of on-policy (or, with ``replay``, SIL) updates (not validated:
        ``validate()`` does that, naming the ``training()`` kwargs). ``tis_cap``: None = 2.0 on
        the vllm engine and off on hf; 0 = off on every engine."""
        tis = self.tis_cap
        if tis is None and self.engine == "vllm":
            tis = 2.0
        return PolicyLossConfig(
            clip_ratio_low=self.clip_ratio_low,
            clip_ratio_high=self.clip_ratio_high,
            dual_clip_c=self.dual_clip_c,
            loss_mode=self.loss_mode,
            loss_agg_mode=self.loss_agg_mode,
            clip_cov_ratio=self.clip_cov_ratio,
            clip_cov_lb=self.clip_cov_lb,
            clip_cov_ub=self.clip_cov_ub,
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
        return dict(self._LOSS_KWARGS)

    @property
    def loss_t_norm(self) -> float:
        return float(self.t_norm if self.t_norm is not None else self.max_response_tokens)

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
        from .learner import GRPOTorchLearner

        return GRPOTorchLearner

    @property
    def _model_config_auto_includes(self) -> dict[str, Any]:
        return {"temperature": self.temperature}

    def validate(self) -> None:
        # These algorithms exist only on RLlib's new API stack: its "you are running X on the new
        # API stack" notice (once per process: driver, every runner and learner) says nothing here.
        log_once(f"{self.algo_class.__name__}_on_new_api_stack")
        super().validate()
        err = self._value_error

        def pos_int(name: str, minimum: int = 1) -> None:
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < minimum:
                err(f"`{name}` must be an integer >= {minimum}, got {v!r}")

        pos_int("group_size")
        pos_int("tasks_per_iteration")
        pos_int("micro_batch_token_budget")
        if self.torch_num_threads is not None:
            pos_int("torch_num_threads")
        pos_int("max_turns")
        pos_int("max_new_tokens")
        pos_int("max_model_len", 16)
        pos_int("max_response_tokens")
        pos_int("lr_warmup_steps", 0)
        if self.advantage_estimator not in ("grpo", "spa"):
            err(f"`advantage_estimator` must be 'grpo' or 'spa', got {self.advantage_estimator!r}")
        if not isinstance(self.weight_decay, (int, float)) or self.weight_decay < 0:
            err(f"`weight_decay` must be a number >= 0, got {self.weight_decay!r}")
        tis = self.tis_cap
        if tis is not None and (isinstance(tis, bool) or not isinstance(tis, (int, float)) or tis < 0):
            err(f"`tis_cap` must be > 0, 0 (off) or None (auto: 2.0 on vllm, off on hf), got {tis!r}")
        # The loss knobs are checked by the core loss config itself, for the on-policy and the
        # replay loss alike: one source of truth, and what passes here cannot fail in the learner.
        for replay in (False, True):
            try:
                self.policy_loss_config(replay=replay).validate(
                    "training()" + (" (SIL replay loss)" if replay else ""), self.policy_loss_kwargs(replay))
            except ValueError as e:
                err(str(e))
        bad = [f for f in self.response_filters if f not in _FILTERS]
        if bad:
            err(f"`response_filters` has unknown entries {bad}; allowed: {_FILTERS}")
        kf = self.group_filter_keep_fraction
        if kf is not None and not (0 < kf <= 1):
            err(f"`group_filter_keep_fraction` must be in (0, 1] or None, got {kf!r}")
        if not 0 <= self.spa_gamma <= 1:
            err(f"`spa_gamma` must be in [0, 1], got {self.spa_gamma!r}")
        if self.engine not in ("hf", "vllm"):
            err(f"`engine` must be 'hf' or 'vllm' (set it with .env_runners(engine=...)), got {self.engine!r}")
        if self.temperature <= 0:
            err(f"`temperature` must be > 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            err(f"`top_p` must be in (0, 1], got {self.top_p!r}")
        if self.max_response_tokens > self.max_model_len:
            err(f"`max_response_tokens` ({self.max_response_tokens}) must be <= `max_model_len` ({self.max_model_len})")
        if self.minibatch_size is not None and self.minibatch_size < 1:
            err(f"`minibatch_size` (trajectories per optimizer step) must be >= 1 or None, got {self.minibatch_size!r}")
        if not isinstance(self.env, str):
            err(f"`env` must be a tool-environment name (e.g. 'search_qa'), got {self.env!r}")
        if "model_path" not in self.model_config:
            err("`model_config['model_path']` is required: .rl_module(model_config={'model_path': ...}) "
                "(a local HF model folder, or 'embedded' for the project's tiny model)")
        if "dtype" in self.model_config:
            from ...models.dtypes import torch_dtype

            try:
                torch_dtype(self.model_config["dtype"])
            except ValueError as e:
                err(f"`model_config['dtype']`: {e}")
        self._validate_learner_layout()
        self._warn_on_cold_start_call_format()

    def _validate_learner_layout(self) -> None:
        """sharding / mixed_precision / cpu_offload / model dtype (docs/design.md "Learner sharding")."""
        err = self._value_error
        if self.sharding not in SHARDING_STRATEGIES:
            err(f"`sharding` must be one of {SHARDING_STRATEGIES} (set it with .learners(sharding=...)), "
                f"got {self.sharding!r}")
        if self.mixed_precision not in MIXED_PRECISION:
            err(f"`mixed_precision` must be None or 'bf16' (.learners(mixed_precision=...)), got {self.mixed_precision!r}")
        if self.sharding == "fsdp" and self.num_learners < 1:
            err("`sharding='fsdp'` runs on remote learner ranks: set .learners(num_learners=N) with N >= 1 "
                f"(got num_learners={self.num_learners})")
        if self.sharding == "fsdp" and self.grad_clip is not None and self.grad_clip_by != "global_norm":
            err("`sharding='fsdp'` clips by the global norm over all shards: set .training(grad_clip_by="
                f"'global_norm') (got {self.grad_clip_by!r})")
        if self.cpu_offload and self.sharding != "fsdp":
            err("`cpu_offload=True` offloads FSDP shards: use it with .learners(sharding='fsdp')")
        if self.gpu_memory_gb is not None and (not isinstance(self.gpu_memory_gb, (int, float))
                                               or self.gpu_memory_gb <= 0):
            err(f"`gpu_memory_gb` must be a number > 0 or None, got {self.gpu_memory_gb!r}")
        from ...models.dtypes import dtype_name

        try:
            dtype = dtype_name((self.model_config or {}).get("dtype", "float32"))
        except ValueError:
            return  # reported by validate() already
        if self.mixed_precision == "bf16" and dtype != "float32":
            err(f"`mixed_precision='bf16'` keeps fp32 master weights and computes in bf16: set "
                f"model_config['dtype'] to 'float32' (or drop it), got {dtype!r}")
        if self.mixed_precision is None and dtype in ("bfloat16", "float16") and log_once("low_precision_master"):
            logging.getLogger(__name__).warning(
                "model_config['dtype']=%r trains %s weights with %s AdamW state: most updates round away "
                "(benchmarks/master_weights.py, one AdamW step at lr 1e-6: %s). Use "
                ".learners(mixed_precision='bf16') with float32 master weights instead.",
                dtype, dtype, dtype, LOW_PRECISION_MASTER_EFFECT)
        self._validate_memory_plan()

    def _validate_memory_plan(self) -> None:
        """With ``gpu_memory_gb`` (or ``engine_gpu_memory_gb``) declared, refuse a config whose memory
        plan (rllib_spear/planner.py, ``rllib-spear plan``) does not fit, naming the knob to change.
        Reads the model's config.json only (no weights, no torch); nothing to do when neither is set."""
        if self.gpu_memory_gb is None and self.engine_gpu_memory_gb is None:
            return
        g = self.engine_gpu_memory_gb
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or g <= 0):
            self._value_error(f"`engine_gpu_memory_gb` must be a number > 0 or None, got {g!r}")
        from ...planner import MEMORY_ERROR, check_fits

        try:
            msg = check_fits(self)
        except ValueError as e:  # no shape for the model, or a value the planner cannot size
            msg = (f"{MEMORY_ERROR} cannot check that the config fits gpu_memory_gb / engine_gpu_memory_gb: {e} "
                   "(or drop gpu_memory_gb to skip the check)")
        if msg:
            self._value_error(msg)

    def _warn_on_cold_start_call_format(self) -> None:
        """An "embedded:<task>" cold start knows one call format (``task_policy_env_config``);
        with another parser it never makes a valid call and the run learns nothing."""
        path = str(self.model_config.get("model_path", ""))
        if not path.startswith("embedded:") or path.split(":", 1)[1] != self.env:
            return
        from ...models.sft import task_policy_env_config

        want = task_policy_env_config(self.env).get("parser")
        env_config = self.env_config or {}
        if want and env_config.get("parser") != want:
            logging.getLogger(__name__).warning(
                "model_path %r was trained to call tools with parser %r, but env_config['parser'] is %r; "
                "use .environment(%r, env_config=rllib_spear.models.task_policy_env_config(%r))",
                path, want, env_config.get("parser"), self.env, self.env)


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
    cfg.response_filters = _FILTERS
    cfg.group_filter_keep_fraction = 0.75
    return cfg
