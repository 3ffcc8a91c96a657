"""The knob tables of the algorithm configs (name -> default), one per builder method."""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

# RLlib wants spaces to build RLModules; tokens are not gym observations, so these are
# placeholders (the learner never uses RLlib's action distributions).
PLACEHOLDER_OBS_SPACE = gym.spaces.Box(0, np.iinfo(np.int32).max, (1,), np.int64)
PLACEHOLDER_ACTION_SPACE = gym.spaces.Discrete(2)

EMBEDDED_MODEL = "embedded"  # resolved to the project's tiny SFT'd policy (coldstart.default_policy_path)

# training() kwargs owned by the configs (name -> default). Kept in tables so that training(),
# to_dict() and validate() cannot drift apart. The knobs of the recipe pieces (estimators, reward
# shapers, filters, SIL) live next to each piece in rllib_spear/recipe and join these in
# training_defaults().
GRPO_TRAINING_DEFAULTS: dict[str, Any] = {
    # sampling shape
    "group_size": 8,
    "tasks_per_iteration": 32,
    # the recipe: which registered pieces run (rllib_spear/recipe)
    # "grpo" (outcome, 1.1), "spa" (SPADER step-wise peer, 3.3), "gigpo" (GiGPO, 3.5), or registered
    "advantage_estimator": "grpo",
    # the outcome group's mean and std (docs/algorithms.md 1.1): over "trajectories" (each once,
    # the papers) or over "steps" (each step row, the released agent tree); grpo, gigpo and SIL
    "group_stats_over": "trajectories",
    "reward_shapers": (),  # e.g. ("tool_call_bonus",) (SPEAR 2.1), ("spader_diversity",) (3.2)
    "reward_fns": (),  # user reward functions fn(task, response, stats) -> float, or registered names
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
    "tis_cap": None,  # truncated importance weight cap C (1.6); None = auto (2.0 for vllm or one_step_off), 0 = off
    "entropy_coeff": 0.0,
    # entropy metric when entropy_coeff == 0: a uniform sample of at most this many loss tokens
    # per update (unbiased for the token mean); 0 = no entropy metric
    "entropy_metric_tokens": 1024,
    "kl_coeff": 0.0,  # KL to the frozen reference model (SPADER option: 0.001)
    "kl_estimator": "k3",
    "t_norm": None,  # seq-mean-token-sum-norm constant; None = max_response_tokens
    # Dr.BoT filters (1.5): registered response filters, and the group-std filter
    "response_filters": (),
    # what a response filter masks: the whole episode, or ("step") only the steps it flags
    # (the released agent tree, where every step is a sample; recipe/filters.py)
    "filter_scope": "episode",
    "group_filter_keep_fraction": None,  # e.g. 0.75; None = keep all groups
    # optimisation
    "weight_decay": 0.01,
    "adam_betas": (0.9, 0.999),
    "micro_batch_token_budget": 8192,
    "lr_warmup_steps": 0,
    "recompute_old_logprobs": False,  # trainer-side logp_old (needed with tis_cap on vLLM)
    # bad steps (docs/design.md "Fault tolerance"): an optimizer step whose loss or gradient is
    # non-finite on any learner rank is skipped on every rank and counted (`skipped_steps`);
    # this many skipped steps in a row stop the run with an error; 0 or None = never stop
    "max_consecutive_skipped_steps": 10,
    # rollout pipelining (docs/design.md "Rollout pipelining"): "sync" samples, then trains;
    # "one_step_off" samples the next batch while the learners train on this one (lag 1 update);
    # "async" samples without pause and trains on groups as they finish (partial rollouts; needs
    # rollout_mode="async"; docs/design.md "Fully asynchronous training").
    "rollout_pipeline": "sync",
    "max_policy_lag": 1,  # one_step_off / async: groups with a segment sampled more than this many iterations ago are dropped
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
    "max_new_tokens": 128,  # per-turn budget: the most tokens one assistant turn writes
    "stop": [],
    "max_turns": 4,
    "max_model_len": 1024,  # per-episode budget: prompt + every turn and observation (the context)
    "max_response_tokens": 512,  # per-episode budget: every token after the prompt (docs/recipes.md)
    "max_observation_tokens": 256,
    "observation_template": "chatml",
    # the sample layout (docs/design.md "Sample layouts: full and window"): "full" = one context per
    # episode; "window" = every step is one sample, its prompt the env's step_prompt(history_steps)
    # (the task, the last history_steps steps, the current observation) of at most max_prompt_tokens
    "step_context": "full",
    "history_steps": 2,
    "max_prompt_tokens": None,  # window: per-step prompt budget; None = max_model_len - the step's room
    # the agent loop (docs/design.md "The agent loop"): "turn_sync" generates every live episode's
    # turn in one batch, then steps the envs one after another; "async" runs each episode at its
    # own pace (continuous batching, env steps on tool_concurrency threads, tool_timeout_s);
    # "auto" runs "async" when episodes can take several turns (max_turns > 1) or the pipeline is
    # "async", "agent_program" for an AgentProgramEnv, "turn_sync" otherwise
    "rollout_mode": "auto",
    "tool_concurrency": None,  # async: env steps at once; None = one per episode of the call
    "tool_timeout_s": 300.0,  # async: a longer env step becomes a timeout observation; None = no limit
    # watchdogs (docs/design.md "Fault tolerance"): an env step past step_timeout_s ends its episode
    # as an error in turn_sync (in async it is the tool timeout above: set one of the two); an engine
    # call past generation_timeout_s fails the sampling call and restarts the runner. None = no limit
    "step_timeout_s": 300.0,
    "generation_timeout_s": 3600.0,
    # the OpenAI endpoint (docs/design.md "The OpenAI endpoint"): True (or a dict of host, port,
    # model_name, tools) serves each runner's engine on /v1/chat/completions and /v1/completions;
    # rollout_mode="agent_program" serves it whatever this says
    "serve_openai": False,
}


# learners() kwargs owned by this config (docs/design.md "Learner sharding"): how the policy is
# laid out over the learner ranks and in which precision it computes.
LEARNER_DEFAULTS: dict[str, Any] = {
    "sharding": "ddp",  # "ddp": a full replica per learner; "fsdp": FSDP2 fully_shard per block
    "mixed_precision": None,  # None: compute in the weights' dtype; "bf16": bf16 compute, fp32 master
    "cpu_offload": False,  # fsdp only: sharded parameters, gradients and Adam state live in CPU memory
    "activation_checkpointing": None,  # None: model_config["gradient_checkpointing"]; True / False
    # the body runs over the real tokens of a micro-batch packed into one row with a per-row
    # causal mask, no padding (docs/design.md "Packed micro-batches"); False: padded rows
    "packed_microbatches": False,
    "gpu_memory_gb": None,  # memory of one learner GPU; when set, validate() checks the plan fits
    # learner -> engine weight sync (docs/design.md "Weight streaming"): None = "vllm" for vLLM
    # engines, "object_store" for the HF engine; "vllm" (vLLM's own weight-transfer API, the
    # backend below), "object_store" (one Ray object per bucket, put by learner rank 0),
    # "shared_memory", "collective" (learner rank 0 broadcasts each bucket over a gloo group with
    # the runners), "auto" (shared memory, else collective, else object_store), "driver" (the
    # whole state through the driver: the old path)
    "weight_sync_transport": None,
    # transport "vllm": "auto" = "rllib_spear_gloo" for CPU learners, "ipc" when colocated,
    # else "nccl" (weight_streaming/selection.py)
    "weight_transfer_backend": "auto",
    "weight_sync_bucket_mb": 256,  # bucket size bound in MB (a larger tensor goes alone)
}

#: env_runners() kwargs about the engines' hardware (not sampling knobs).
ENGINE_RESOURCE_DEFAULTS: dict[str, Any] = {
    "engine_gpu_memory_gb": None,  # memory of one engine GPU; None = gpu_memory_gb of learners()
}

#: resources() kwargs owned by this config (docs/design.md "Cluster placement", colocated mode).
COLOCATE_DEFAULTS: dict[str, Any] = {
    # each learner rank shares a GPU (one placement-group bundle) with one env runner's engine,
    # which sleeps while the learners train (env_runners/placement.py)
    "colocate": False,
    # vLLM sleep level while the learners train: 1 = weights backed up to pinned CPU memory and
    # the KV cache discarded; 2 = weights discarded too (the weight sync that follows every update
    # writes them back; no host copy of the weights)
    "colocate_sleep_level": 1,
}

#: evaluation() kwargs owned by this config (docs/design.md "Validation"), next to RLlib's
#: ``evaluation_interval`` (evaluate every N training iterations; None = never). What the
#: validation samples and on which split; the dataset is environment(eval_dataset=...).
EVALUATION_DEFAULTS: dict[str, Any] = {
    "eval_before_train": False,  # also evaluate once before the first iteration (verl's val_before_train)
    "eval_split": "test",
    "eval_num_tasks": None,  # the first K tasks of the split; None = all
    "eval_samples": 1,  # n episodes per task; n > 1 adds mean@n and pass@k
    "eval_temperature": 0.0,  # 0 = greedy
    "eval_top_p": 1.0,
    "eval_top_k": -1,  # -1 = off
    "eval_max_new_tokens": None,  # per turn; None = env_runners(max_new_tokens=...)
}

#: debugging() kwargs owned by this config: what a run shows on the console while it trains.
DEBUGGING_DEFAULTS: dict[str, Any] = {
    "log_samples": 0,  # N sampled episodes per iteration to stdout and TensorBoard (sample_log.py); 0 = off
    "heartbeat_s": 30.0,  # a sampling call this long prints a line every heartbeat_s (env_runners/heartbeat.py)
    "print_summary": False,  # algo.train() prints the CLI's one-line summary of the iteration (progress.py)
}

SHARDING_STRATEGIES = ("ddp", "fsdp")
#: What benchmarks/master_weights.py measured for one AdamW step at lr 1e-6 with bf16 weights and
#: state vs fp32 master weights (quoted by the warning of validate()).
LOW_PRECISION_MASTER_EFFECT = ("2.1% of the weights change at all and the mean applied step is 0.03x the "
                               "fp32-master step (lr 1e-5: 15.7%, 0.19x)")
#: ``.learners(mixed_precision=...)``: None, "bf16", or "auto" (bf16 where the learner's device computes
#: it in hardware; models/precision.py).
MIXED_PRECISION = (None, "bf16", "auto")


def training_defaults() -> dict[str, Any]:
    """Every ``training()`` knob: this table, SIL's, and the knobs of every registered recipe piece
    (estimators, reward shapers, filters; a piece registered later adds its own)."""
    from ...recipe import SIL_DEFAULTS, piece_knobs

    return {**GRPO_TRAINING_DEFAULTS, **SIL_DEFAULTS, **piece_knobs()}
