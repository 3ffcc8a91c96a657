"""LLMEnvRunner: an RLlib EnvRunner that runs multi-turn tool episodes with an LLM engine.

It holds a generation engine (HF or vLLM), the tokenizer with its chat template, and a pool of
tool environments (see ``rollout.MultiTurnRollout``). The driver calls ``sample_groups`` with
the tasks of this runner. Weights arrive through the runner's side of the weight sync
(``weight_receivers``: one receiver per transport, weight_streaming/runner_side.py; transport
"driver" through RLlib's ``set_state``) as torch tensors (never RLlib's float32-numpy conversion)
with a version (WEIGHTS_SEQ_NO) that every trajectory records. ``evaluate_groups`` samples with per-call sampling parameters (validation,
docs/design.md "Validation") and leaves everything training depends on as it was.

Fully asynchronous training (``rollout_pipeline="async"``): ``stream_submit`` / ``stream_take`` /
``stream_stop`` drive a ``RolloutStream`` (env_runners/rollout_stream.py) that samples in the
background while this actor serves the weight syncs; every receiver opens the engine's update
gate (engines/update_gate.py) for the time the weights change.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Any, Mapping, Sequence

import numpy as np
import ray
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from ..core.trajectory import Trajectory
from ..coldstart.lookup import resolve_model_path
from ..models.folders import require_model_folder
from ..models.threads import apply_torch_threads
from .serving.endpoint import start_runner_endpoint
from ..weight_streaming.runner_side import EngineWeights, WeightReceivers
from .engines.base import DEFAULT_GENERATION_TIMEOUT_S, GenerationTimeout, SamplingConfig, with_generation_timeout
from .heartbeat import heartbeat
from .placement import runner_engine_kwargs, runner_transfer_backend
from .rollout import DEFAULT_STEP_TIMEOUT_S, MultiTurnRollout, RolloutConfig, resolve_step_timeout
from .rollout_modes import get_rollout_mode, make_rollout

__all__ = ["LLMEnvRunner", "resolve_model_path", "hf_state_dict_from_module_state", "EVAL_SAMPLING_KEYS"]

#: The sampling parameters an evaluation call may set (the rest stay the training ones: stop
#: strings and tokens, the end-of-turn token).
EVAL_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_new_tokens")
#: Separates the evaluation seed stream from the training one (any fixed number would do).
_EVAL_STREAM = 0x5EED_E7A1
#: How the runner's metrics combine ``RolloutStats.loop_metrics()`` over calls (else the mean).
_LOOP_METRIC_REDUCE = {"engine_idle_s": "sum", "tool_calls": "sum", "tool_timeouts": "sum",
                       "tool_calls_abandoned": "sum", "tool_latency_max_s": "max",
                       "concurrent_episodes_max": "max", "tool_calls_concurrent_max": "max",
                       "step_timeouts": "sum", "generation_timeouts": "sum",
                       "agent_program_errors": "sum", "agent_program_timeouts": "sum"}
#: A remote runner whose engine hung exits this long after its sampling call failed, so that the
#: call's GenerationTimeout reaches the driver first; Ray then restarts the process.
_HUNG_ENGINE_EXIT_DELAY_S = 2.0


def hf_state_dict_from_module_state(state: Any) -> dict:
    """Unwrap what RLlib's weight sync delivers into an HF ``state_dict`` of torch tensors."""
    if isinstance(state, ray.ObjectRef):
        state = ray.get(state)
    if isinstance(state, dict) and COMPONENT_RL_MODULE in state:
        state = state[COMPONENT_RL_MODULE]
    if isinstance(state, ray.ObjectRef):
        state = ray.get(state)
    if isinstance(state, dict) and DEFAULT_MODULE_ID in state:
        state = state[DEFAULT_MODULE_ID]
    from ..models.rl_module import HFCausalLMRLModule

    return HFCausalLMRLModule.hf_state_dict_from_state(state or {})


class LLMEnvRunner(EnvRunner, Checkpointable):
    """Samples groups of multi-turn tool-use trajectories."""

    def __init__(self, *, config, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.worker_index = int(kwargs.get("worker_index", 0))
        self._stream = None  # rollout_pipeline="async": the background sampling (stream_submit)
        self.metrics = MetricsLogger()
        self._rollout: MultiTurnRollout | None = None
        self.openai_endpoint = None  # serve_openai: the runner's OpenAI endpoint (serving/endpoint.py)
        self._build()

    # ------------------------------------------------------------------ construction
    def _build(self) -> None:
        from transformers import AutoTokenizer

        from ..envs import resolve_env
        from .engines import make_engine

        cfg = self.config
        apply_torch_threads(getattr(cfg, "torch_num_threads", None))
        # every runner node needs the folder too (a multi-node cluster): the same clear error
        model_path = require_model_folder(resolve_model_path(cfg.model_config["model_path"]),
                                          cfg.model_config["model_path"])
        self.model_path = model_path
        seed = int(cfg.seed or 0) * 1000 + self.worker_index
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        engine_kwargs = runner_engine_kwargs(cfg.engine, cfg.engine_kwargs, num_gpus=cfg.num_gpus_per_env_runner,
                                             colocate=bool(getattr(cfg, "colocate", False)))  # placement.py
        if cfg.engine == "hf":
            engine_kwargs.setdefault("dtype", cfg.model_config.get("dtype", "float32"))
        else:  # vLLM sizes its context (and KV cache) by it; its own default is 4096 tokens
            engine_kwargs.setdefault("max_model_len", int(cfg.max_model_len))
            backend = runner_transfer_backend(cfg)
            if backend is not None:  # transport "vllm": the engine gets vLLM's transfer engine
                engine_kwargs.setdefault("weight_transfer_backend", backend)
        # the agent loop (docs/design.md "The agent loop"): the registered mode rollout_mode names, or
        # for "auto" the one it picks (GRPOConfig.effective_rollout_mode); one per runner
        self.rollout_mode = cfg.effective_rollout_mode
        for k, v in get_rollout_mode(self.rollout_mode).engine_defaults(cfg.engine, seeded=cfg.seed is not None).items():
            engine_kwargs.setdefault(k, v)  # e.g. "async": vLLM's async engine (requests join the running batch)
        self.engine = make_engine(cfg.engine, model_path, **engine_kwargs)
        # the weight sync's runner side: the engine's weights version and one receiver per transport
        actor = None if self.worker_index == 0 else (lambda: ray.get_runtime_context().current_actor)
        self.weight_receivers = WeightReceivers(EngineWeights(self.engine, actor=actor))
        sampling = SamplingConfig(
            temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
            max_new_tokens=cfg.max_new_tokens, stop=list(cfg.stop), seed=seed,
        )
        sampling.validate()
        # The env spec (name, class or import path) is resolved here, in the runner's process
        # (rllib_spear/envs/registry.py says how each form reaches a remote runner).
        env, env_config = resolve_env(cfg.env), dict(cfg.env_config or {})
        # One turn limit for the loop and the environment (envs keep their own counters): a class
        # that takes max_turns gets it; a factory reads what it wants from env_config.
        if "max_turns" not in env_config and env.accepts("max_turns"):
            env_config["max_turns"] = cfg.max_turns
        env.make(env_config)  # fail here, naming the env, rather than in the first episode
        # the agent loop's env-step watchdog is one knob (docs/design.md "Fault tolerance"):
        # step_timeout_s, or tool_timeout_s, its older async name
        step_timeout = resolve_step_timeout(getattr(cfg, "step_timeout_s", DEFAULT_STEP_TIMEOUT_S), cfg.tool_timeout_s)
        loop_kw = {"tool_concurrency": None if cfg.tool_concurrency is None else int(cfg.tool_concurrency),
                   "step_timeout_s": step_timeout}
        # the rollouts' engine calls are watched (generation_timeout_s); weight syncs use self.engine
        gen_timeout = getattr(cfg, "generation_timeout_s", DEFAULT_GENERATION_TIMEOUT_S)
        loop_kw["engine"] = with_generation_timeout(self.engine, gen_timeout, on_timeout=self._engine_hung)
        # the OpenAI endpoint (docs/design.md "The OpenAI endpoint"): with serve_openai, or for a mode
        # whose episodes are agent programs (handed the endpoint); stopped in stop()
        mode = get_rollout_mode(self.rollout_mode)
        self.openai_endpoint = start_runner_endpoint(cfg, loop_kw["engine"], self.tokenizer, sampling, mode.serves_openai)
        if mode.serves_openai:
            loop_kw["endpoint"] = self.openai_endpoint
        self._rollout = make_rollout(
            self.rollout_mode, **loop_kw,
            tokenizer=self.tokenizer,
            env_factory=lambda: env.make(env_config),
            sampling=sampling,
            config=RolloutConfig(
                max_turns=cfg.max_turns, max_model_len=cfg.max_model_len,
                max_response_tokens=cfg.max_response_tokens,
                max_observation_tokens=cfg.max_observation_tokens,
                observation_template=cfg.observation_template,
                # the sample layout (docs/design.md "Sample layouts: full and window"); evaluation
                # shares this config, so it samples in the same layout
                step_context=getattr(cfg, "step_context", "full"),
                history_steps=int(getattr(cfg, "history_steps", 2)),
                max_prompt_tokens=getattr(cfg, "max_prompt_tokens", None),
            ),
        )
        self._sample_calls = 0
        # Evaluation: its own rollout (own env pool and sampling parameters, same engine and
        # limits) and its own call counter, so that it changes nothing training samples with.
        self._eval_rollout = make_rollout(
            self.rollout_mode, **loop_kw,
            tokenizer=self.tokenizer, env_factory=self._rollout.env_factory,
            sampling=dataclasses.replace(self._rollout.sampling), config=self._rollout.config)
        self._eval_calls = 0

    def _engine_hung(self, exc: GenerationTimeout) -> None:
        """An engine call ran past ``generation_timeout_s`` (docs/design.md "Fault tolerance"):
        count it and, in a remote runner that RLlib restarts, end the process shortly after the
        failing call returns, so that Ray starts a fresh one (a hung engine thread cannot be
        stopped, and RLlib would otherwise put the same process back into service)."""
        self.metrics.log_value("generation_timeouts", 1, reduce="sum")
        restart = self.worker_index > 0 and bool(getattr(self.config, "restart_failed_env_runners", False))
        logging.getLogger(__name__).error("env runner %d: %s%s", self.worker_index, exc,
                                          "; restarting this runner" if restart else "")
        if restart:
            threading.Timer(_HUNG_ENGINE_EXIT_DELAY_S, os._exit, (1,)).start()

    # ------------------------------------------------------------------ EnvRunner API
    def assert_healthy(self) -> None:
        assert self._rollout is not None, "LLMEnvRunner: engine not built"

    def get_spaces(self) -> dict:
        spaces = (self.config.observation_space, self.config.action_space)
        return {INPUT_ENV_SPACES: spaces, DEFAULT_MODULE_ID: spaces}

    def sample_groups(self, *, tasks: Sequence[dict], group_size: int,
                      policy_version: int | None = None, seed: int | None = None) -> dict[str, Any]:
        """Run ``group_size`` episodes for each task; returns trajectories and stats.

        ``seed``: this call's sampling seed. The algorithm derives it from the run seed, the
        draw and this runner's index (``pipelines/runner_requests.sampling_seed``), so a restarted
        runner or a restored run reuses no seed. Without one (a direct call), the seed comes
        from this runner's call counter, which restarts with the runner."""
        assert self._rollout is not None
        self.weight_receivers.weights.settle()
        if seed is not None:
            self._rollout.sampling.seed = int(seed)
        elif self._rollout.sampling.seed is not None:
            # Distinct sampling seeds per call (still reproducible from the run seed).
            self._rollout.sampling.seed = (int(self.config.seed or 0) * 1000 + self.worker_index) \
                * 100003 + self._sample_calls
        self._sample_calls += 1
        label = f"runner {self.worker_index}" if self.worker_index else "local runner"
        with heartbeat(self._rollout.episodes_done, getattr(self.config, "heartbeat_s", None), label):
            trajs, stats = self._rollout.run(tasks, group_size, policy_version=self.weights_version)
        self._log_sampling(len(trajs), stats)
        return self._result(trajs, stats)

    def _log_sampling(self, num_episodes: int, stats) -> None:
        # logged every call, 0 included: in RLlib's metrics a "sum" that an iteration does not
        # log reads NaN (after a first timeout, every later iteration would report NaN)
        self.metrics.log_value("generation_timeouts", 0, reduce="sum")
        self.metrics.log_value("generated_tokens", stats.generated_tokens, reduce="sum")
        self.metrics.log_value("generation_time_s", stats.generation_time_s, reduce="sum")
        self.metrics.log_value("env_time_s", stats.env_time_s, reduce="sum")
        self.metrics.log_value("num_episodes", num_episodes, reduce="sum")
        self.metrics.log_value("rollout_errors", stats.rollout_errors, reduce="sum")
        for k, v in stats.loop_metrics().items():  # the agent loop's counters (RolloutStats)
            self.metrics.log_value(k, v, reduce=_LOOP_METRIC_REDUCE.get(k, "mean"))

    # ------------------------------------------------------------------ rollout_pipeline="async"
    def stream_submit(self, requests: Sequence[Mapping[str, Any]]) -> list[int]:
        """Start sampling groups in the background (each request: ``key``, ``task``,
        ``group_size``, ``seed``; the stream starts on the first call); returns the keys of
        the groups in flight."""
        from .rollout_stream import GroupRequest, RolloutStream

        if self._stream is None:
            if not hasattr(self._rollout, "arun_group"):
                raise ValueError("LLMEnvRunner.stream_submit needs the async agent loop: "
                                 ".env_runners(rollout_mode='async')")
            cfg = self.config
            # one env step per episode the driver may keep in flight (rollout_pipeline="async":
            # (max_policy_lag + 1) batches), unless tool_concurrency bounds it
            width = int(cfg.group_size) * int(cfg.tasks_per_iteration) * (int(cfg.max_policy_lag) + 1)
            self._stream = RolloutStream(self._rollout, int(cfg.tool_concurrency or min(width, 256)),
                                         version=lambda: self.weights_version)
        self._stream.submit([GroupRequest(int(r["key"]), dict(r["task"]), int(r["group_size"]),
                                          None if r.get("seed") is None else int(r["seed"])) for r in requests])
        return self._stream.in_flight_keys()

    def stream_take(self, min_groups: int = 1, timeout_s: float = 0.0) -> dict[str, Any]:
        """The groups finished since the last take (waiting up to ``timeout_s`` for
        ``min_groups``): ``groups`` [(key, trajectories)], ``failed`` [(key, error)], the keys
        still in flight, and the window's stats (as ``sample_groups``' ``stats``)."""
        if self._stream is None:
            return {"groups": [], "failed": [], "in_flight_keys": [], "worker_index": self.worker_index,
                    "stats": None}
        done, stats = self._stream.take(int(min_groups), float(timeout_s))
        groups = [(g.key, g.trajectories) for g in done if g.error is None]
        self._log_sampling(sum(len(t) for _, t in groups), stats)
        out = self._result([], stats)
        out.update(groups=groups, failed=[(g.key, g.error) for g in done if g.error is not None],
                   in_flight_keys=self._stream.in_flight_keys())
        del out["trajectories"]
        return out

    def stream_stop(self) -> int:
        """Stop the background sampling; returns the groups dropped (in flight or not taken)."""
        stream, self._stream = self._stream, None
        return 0 if stream is None else stream.stop()

    def evaluate_groups(self, *, tasks: Sequence[dict], group_size: int,
                        sampling: Mapping[str, Any] | None = None, eval_key: int | None = None) -> dict[str, Any]:
        """Run ``group_size`` (n) episodes for each task with the training sampling parameters
        overridden by ``sampling`` (keys of ``EVAL_SAMPLING_KEYS``, None = the training value;
        ``temperature=0`` is greedy);
        returns trajectories and stats like ``sample_groups``.

        Evaluation only: the training rollout, its env pool, its seed sequence (``sample_groups``
        seeds from a call counter this does not advance) and the runner metrics stay as they
        were, so a run trains the same with or without evaluations in between. The seed is drawn
        from (run seed, worker index, ``eval_key``), apart from the training stream. The algorithm
        passes its own evaluation counter as ``eval_key`` (checkpointed with it), so a restarted
        runner does not repeat the seeds of earlier evaluations; without one (a direct call), this
        runner's call counter, which restarts with the runner."""
        self.weight_receivers.weights.settle()
        sampling = {k: v for k, v in (sampling or {}).items() if v is not None}  # None: the training value
        unknown = sorted(set(sampling) - set(EVAL_SAMPLING_KEYS))
        if unknown:
            raise ValueError(f"evaluate_groups: unknown sampling keys {unknown}; allowed: {list(EVAL_SAMPLING_KEYS)}")
        key = self._eval_calls if eval_key is None else int(eval_key)
        seed = int(np.random.SeedSequence(
            [int(self.config.seed or 0), self.worker_index, key, _EVAL_STREAM]).generate_state(1)[0])
        self._eval_calls += 1
        params = dataclasses.replace(self._rollout.sampling, **sampling, seed=seed)
        params.validate()
        self._eval_rollout.sampling = params
        trajs, stats = self._eval_rollout.run(tasks, group_size, policy_version=self.weights_version)
        return self._result(trajs, stats)

    def _result(self, trajs: list[Trajectory], stats) -> dict[str, Any]:
        """What a sampling call returns to the driver: trajectories, worker index, stats."""
        return {
            "trajectories": trajs,
            "worker_index": self.worker_index,
            "stats": {
                "generation_time_s": stats.generation_time_s,
                "env_time_s": stats.env_time_s,
                "generated_tokens": stats.generated_tokens,
                "engine_calls": stats.engine_calls,
                "rollout_errors": stats.rollout_errors,
                "weights_seq_no": self.weights_version,
                **stats.loop_metrics(),
            },
        }

    def sample(self, *, tasks: Sequence[dict] | None = None, group_size: int | None = None,
               **kwargs: Any) -> list[Trajectory]:
        """RLlib's sampling entry point: tasks must be given (the driver owns the dataset)."""
        if tasks is None:
            raise ValueError("LLMEnvRunner.sample needs tasks=...; the algorithm's training_step "
                             "draws them from its dataset and calls sample_groups")
        return self.sample_groups(tasks=tasks, group_size=group_size or self.config.group_size)[
            "trajectories"]

    def get_metrics(self) -> dict:
        return self.metrics.reduce()

    @property
    def weights_version(self) -> int:
        """The version of the weights the engine holds (-1: none valid)."""
        return self.weight_receivers.weights.version

    def forget_weights_version(self) -> None:
        """The next weight sync is applied whatever version it carries. A restore can bring other
        weights under the version this runner holds (another run's checkpoint of the same
        iteration), which the version check alone would skip (GRPO.set_state calls this)."""
        weights = self.weight_receivers.weights
        weights.settle()
        weights.version = -1

    def stop(self) -> None:
        self.stream_stop()
        if self.openai_endpoint is not None:  # no endpoint outlives its runner
            self.openai_endpoint.stop()
        if self._rollout is not None:
            self.weight_receivers.close()
            self.engine.shutdown()

    # ------------------------------------------------------------------ Checkpointable
    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict:
        return {WEIGHTS_SEQ_NO: self.weights_version}

    def set_state(self, state: Any) -> None:
        """Apply new weights (RLlib's weight sync; transport "driver"). States without module
        weights (RLlib also syncs connector/metrics states through here) leave the weights and
        version alone."""
        if isinstance(state, ray.ObjectRef):
            state = ray.get(state)
        if COMPONENT_RL_MODULE not in state:
            return
        weights = self.weight_receivers.weights
        weights.settle()
        seq = int(state.get(WEIGHTS_SEQ_NO, 0))
        # Apply on any version change (a restore may go back to an older version).
        if seq == 0 or seq != weights.version:
            sd = hf_state_dict_from_module_state(state[COMPONENT_RL_MODULE])
            if sd:
                with weights.updating():
                    self.engine.update_weights(sd, version=seq)
        weights.version = seq

    def weight_receiver_call(self, transport: str | type, method: str, *args: Any) -> Any:
        """``method(*args)`` of this runner's receiver of ``transport``: how a sender in another
        process (learner rank 0's vLLM ``RunnerClient``) reaches it, as a plain actor call (an
        error is returned to the caller; RLlib's ``foreach_env_runner`` would end this runner)."""
        return getattr(self.weight_receivers.of(transport), method)(*args)

    # ------------------------------------------------------------------ colocated mode
    # (docs/design.md "Cluster placement"; the driver's calls: pipelines/colocation.py)
    def sleep_engine(self, level: int = 1) -> int:
        """Colocated runs, after sampling: the engine gives its GPU memory to the learner beside
        it (``GenerationEngine.sleep``). When the engine drops its weights (vLLM level 2), the
        runner's version becomes -1 (no valid weights) until the next sync, so that a sync of the
        version it held before is applied, not skipped, and a missing sync fails the version
        check. Returns the weights version."""
        weights = self.weight_receivers.weights
        weights.settle()
        if self.engine.sleep(int(level)):
            weights.version = -1
            self.engine.version = -1
        return weights.version

    def wake_engine(self, tags: Sequence[str] | None = None) -> int:
        """Colocated runs: reallocate the engine's ``tags`` ("weights" before the weight sync,
        "kv_cache" after it; None = both). Returns the weights version."""
        self.engine.wake_up(list(tags) if tags is not None else None)
        return self.weights_version

    def get_ctor_args_and_kwargs(self):
        return ((), {"config": self.config})

    def get_checkpointable_components(self):
        return []
