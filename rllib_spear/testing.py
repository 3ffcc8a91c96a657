"""Helpers for tests of this library and of user plugins (environments, rewards, estimators).

``make_stats(**fields)`` builds :class:`EpisodeStats` for hand-made trajectories: the required
fields default to an unsolved episode without tool calls (``success=False``,
``outcome_reward=0.0``, ``tool_calls=0``, ``queries_per_step=[]``, ``format_ok=True``,
``has_answer=True``), other keys go where :meth:`EpisodeStats.coerce` puts them. Only for tests:
environments report every required field themselves.
"""
from __future__ import annotations

from typing import Any, Callable

from .core.episode import EpisodeStats

__all__ = ["make_stats", "ContractError", "check_env_contract", "check_parser_contract",
           "check_estimator_contract", "check_loss_mode_contract", "check_engine_contract",
           "check_engine_weight_update", "check_reward_shaper_contract", "check_response_filter_contract",
           "check_replay_buffer_contract", "check_pipeline_contract", "check_rollout_mode_contract",
           "check_transport_contract", "check_endpoint_contract"]

_TEST_DEFAULTS: dict[str, Any] = {"success": False, "outcome_reward": 0.0, "tool_calls": 0,
                                  "queries_per_step": [], "format_ok": True, "has_answer": True}


def make_stats(**fields: Any) -> EpisodeStats:
    """EpisodeStats of a hand-made episode (see the module docstring for the defaults)."""
    return EpisodeStats.coerce({**_TEST_DEFAULTS, **fields}, "make_stats")


# ---------------------------------------------------------------------------------------------
# Contract checks (slime-style): one check per plugin kind, run by tests/contracts against every
# registered piece; call them on your own plugin to get the same verdict. Each raises
# ContractError naming the plugin and what is wrong.
# ---------------------------------------------------------------------------------------------
class ContractError(AssertionError):
    """A plugin breaks the contract of its kind."""


def _fail(who: str, what: str) -> None:
    raise ContractError(f"{who}: {what}")


#: Model output an environment must survive (never raise; at most an error observation).
HOSTILE_TURNS = ("", "hello", "<search>", "</answer><answer>", "<tool_call>{not json</tool_call>",
                 "<search>" * 500, "x" * 20000, "\ud800 lone surrogate", "<answer>42</answer>")


def check_env_contract(env: Any, task: dict, *, who: str | None = None, max_steps: int = 64) -> EpisodeStats:
    """A ``ToolEnv`` keeps the contract of ``rllib_spear.envs.base.ToolEnv``:

    - ``reset(task)`` returns chat messages (dicts with str ``role`` / ``content``);
    - ``step(text)`` never raises on model output and returns a ``StepResult`` (observation str
      or None, a finite float reward, a bool ``done``, a dict ``info``); an episode ends (``done``)
      within ``max_steps`` turns of bad output;
    - ``episode_stats()`` returns valid :class:`EpisodeStats` with one ``queries_per_step`` entry
      at most per turn, after every turn and at the end;
    - ``reset`` starts a fresh episode (the stats of a new episode show no tool calls yet);
    - an env with the window layout's hook (``ToolEnv.step_prompt``) returns chat messages from
      ``step_prompt(h)`` after ``reset`` and after every step that did not end the episode, for
      ``h`` in 0, 1, 2.

    Returns the final stats of the last episode.
    """
    import math

    from .envs.base import StepResult, supports_step_prompt

    def chat(messages: Any) -> bool:
        return isinstance(messages, list) and bool(messages) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages)

    def check_step_prompt(after: str) -> None:
        if not supports_step_prompt(env):
            return
        for h in (0, 1, 2):
            try:
                got = env.step_prompt(h)
            except Exception as e:  # noqa: BLE001 - named in the verdict
                _fail(who, f"step_prompt({h}) raised {type(e).__name__}: {e} {after}")
            if not chat(got):
                _fail(who, f"step_prompt({h}) must return a non-empty list of {{'role': str, 'content': str}} "
                           f"messages {after}, got {got!r:.200}")

    who = who or type(env).__name__
    stats = None
    for episode, turns in enumerate((HOSTILE_TURNS, ("<answer>x</answer>",))):
        messages = env.reset(task)
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            _fail(who, f"reset() must return a non-empty list of {{'role': str, 'content': str}} messages, got {messages!r:.200}")
        check_step_prompt("after reset()")
        if episode == 1:
            fresh = EpisodeStats.coerce(env.episode_stats(), who)
            if fresh.tool_calls != 0:
                _fail(who, f"reset() must start a fresh episode: tool_calls is {fresh.tool_calls} before any turn")
        done, n = False, 0
        while not done and n < max_steps:
            text = turns[n % len(turns)]
            try:
                res = env.step(text)
            except Exception as e:  # noqa: BLE001 - the contract is "never raises"
                _fail(who, f"step() raised {type(e).__name__}: {e} on model output {text[:60]!r}; malformed "
                           "output must become an error observation")
            n += 1
            if not isinstance(res, StepResult):
                _fail(who, f"step() must return StepResult, got {type(res).__name__}")
            if res.observation is not None and not isinstance(res.observation, str):
                _fail(who, f"StepResult.observation must be str or None, got {type(res.observation).__name__}")
            if isinstance(res.reward, bool) or not isinstance(res.reward, (int, float)) or not math.isfinite(res.reward):
                _fail(who, f"StepResult.reward must be a finite float, got {res.reward!r}")
            if not isinstance(res.done, bool):
                _fail(who, f"StepResult.done must be a bool, got {res.done!r}")
            if not isinstance(res.info, dict):
                _fail(who, f"StepResult.info must be a dict, got {type(res.info).__name__}")
            done = res.done
            if not done:
                check_step_prompt(f"after step {n}")
            stats = EpisodeStats.coerce(env.episode_stats(), who)
            if len(stats.queries_per_step) > n:
                _fail(who, f"queries_per_step has {len(stats.queries_per_step)} entries after {n} turns")
        if not done:
            _fail(who, f"the episode did not end within {max_steps} turns of bad output (max_turns not enforced?)")
    return stats


def check_parser_contract(parser: Any, *, who: str | None = None) -> None:
    """A parser (``rllib_spear.envs.parsers``) has a str ``tag``, and ``parse(text)`` returns a
    ``ParsedTurn`` on any model output without raising, with at most ``max_calls`` calls when it
    declares one, each a ``ToolCall``."""
    from .envs.parsers import ParsedTurn, ToolCall

    who = who or type(parser).__name__
    if not isinstance(getattr(parser, "tag", None), str):
        _fail(who, "a parser needs a str `tag` (the tag that wraps tool output)")
    cap = getattr(parser, "max_calls", None)
    for text in HOSTILE_TURNS + ("<search>a</search>" * 50, '<tool_call>{"name": "f", "arguments": {}}</tool_call>' * 50,
                                 "```python\nprint(1)\n```" * 50):
        try:
            out = parser.parse(text)
        except Exception as e:  # noqa: BLE001
            _fail(who, f"parse() raised {type(e).__name__}: {e} on {text[:60]!r}")
        if not isinstance(out, ParsedTurn):
            _fail(who, f"parse() must return ParsedTurn, got {type(out).__name__}")
        calls = list(getattr(out, "calls", []) or [])
        if not all(isinstance(c, ToolCall) for c in calls):
            _fail(who, "ParsedTurn.calls must hold ToolCall objects")
        if cap is not None and len(calls) > cap:
            _fail(who, f"parse() returned {len(calls)} calls, more than its max_calls={cap}")


#: The sample layouts every recipe-piece contract runs on (docs/design.md "Sample layouts: full
#: and window"): the same episodes, with per-step prompts in the window layout.
CONTRACT_LAYOUTS = ("full", "window")


def _contract_group(layout: str = "full") -> list:
    """Two groups of four episodes of 1-3 steps; ``layout="window"`` gives each step its own
    prompt (``Trajectory.step_prompts``), everything else equal."""
    import numpy as np

    from .core.trajectory import Segment, Trajectory

    rng = np.random.default_rng(0)
    out = []
    for g in range(2):
        for i in range(4):
            n_steps = 1 + (i % 3)
            segs, tok = [Segment("prompt", [1, 2, 3])], 10
            for k in range(n_steps):
                segs.append(Segment("assistant", [tok, tok + 1], logprobs=[-0.5, -0.7], step=k))
                tok += 2
                if k < n_steps - 1:
                    segs.append(Segment("observation", [tok]))
                    tok += 1
            stats = make_stats(tool_calls=n_steps - 1, queries_per_step=[1] * (n_steps - 1) + [0],
                               found_entities_per_step=[[k % 3] for k in range(n_steps)], num_gold_entities=3,
                               f1=float(rng.random()), success=bool(i % 2))
            prompts = None if layout == "full" else [[5, 6] + [7] * k for k in range(n_steps)]
            out.append(Trajectory(uid=f"g{g}", segments=segs, outcome_reward=float(rng.random()),
                                  step_rewards=[0.0] * n_steps, stats=stats, traj_id=f"g{g}-{i}",
                                  step_prompts=prompts))
    return out


def _check_step_samples(who: str, trajs: list, token_arrays: list) -> None:
    """Window layout: the per-token arrays of each episode cut into its learner samples
    (``core.step_samples``) are finite, of each sample's length, and 0 on the window prompts."""
    import numpy as np

    from .core.step_samples import step_samples

    for t, a in zip(trajs, token_arrays):
        try:
            samples = step_samples(t, np.asarray(a, np.float32), t.loss_mask())
        except ValueError as e:
            _fail(who, f"its arrays do not cut into the window layout's step samples: {e}")
        for s, adv, _mask, _ in samples:
            p = s.prompt_length
            if adv.shape != (s.length,) or not np.all(np.isfinite(adv)) or np.any(adv[:p] != 0):
                _fail(who, "a step sample's advantages must be finite, of its length and 0 on its window prompt")


def check_estimator_contract(name: str, cfg: Any) -> None:
    """An advantage estimator returns one finite per-token array per trajectory, aligned with its
    tokens and zero off assistant tokens, and an episode advantage that is R_i minus its group
    mean (sums to 0 per group); reordering the batch reorders the result and nothing else."""
    import numpy as np

    from .recipe import ADVANTAGE_ESTIMATORS

    est = ADVANTAGE_ESTIMATORS.get(name)
    who = f"advantage estimator {name!r}"
    full = None
    for layout in CONTRACT_LAYOUTS:
        adv = _check_estimator_on(est, who, cfg, layout)
        if full is None:
            full = adv
        elif not all(np.allclose(a, b, atol=1e-6) for a, b in zip(adv.token, full.token)):
            # estimators work on episodes: the window layout's step prompts change nothing
            _fail(who, "the advantages differ between the full and the window layout of the same episodes")


def _check_estimator_on(est: Any, who: str, cfg: Any, layout: str) -> Any:
    import numpy as np

    trajs = _contract_group(layout)
    who = who if layout == "full" else f"{who} (window layout)"
    adv = est(trajs, cfg)
    if len(adv.token) != len(trajs) or len(adv.episode) != len(trajs):
        _fail(who, "must return one token array and one episode advantage per trajectory")
    for t, a in zip(trajs, adv.token):
        a = np.asarray(a)
        if a.shape != (t.length,) or not np.all(np.isfinite(a)):
            _fail(who, f"token advantages must be finite with shape ({t.length},), got {a.shape}")
        if np.any(a[t.loss_mask() == 0] != 0):
            _fail(who, "token advantages must be 0 on prompt and observation tokens")
    for uid in {t.uid for t in trajs}:
        s = sum(float(e) for t, e in zip(trajs, adv.episode) if t.uid == uid)
        if abs(s) > 1e-9:
            _fail(who, f"episode advantages of group {uid!r} sum to {s}, not 0")
    perm = list(range(len(trajs)))[::-1]
    again = est([trajs[i] for i in perm], cfg)
    for j, i in enumerate(perm):
        if not np.allclose(again.token[j], adv.token[i], atol=1e-6):
            _fail(who, "the result depends on the order of the batch (groups must be found by uid)")
    if layout == "window":
        _check_step_samples(who, trajs, adv.token)
    return adv


def check_loss_mode_contract(name: str) -> None:
    """A policy-loss mode gives a finite scalar loss with finite gradients that reach the
    log-probs of unmasked tokens only, and 0 loss and gradients when every token is masked."""
    import torch

    from .core.losses import LossNormalizer, PolicyLossConfig, policy_loss

    who = f"loss mode {name!r}"
    torch.manual_seed(0)
    B, T = 3, 7
    cfg = PolicyLossConfig(loss_mode=name)
    old = -torch.rand(B, T)
    adv = torch.randn(B, T)
    for masked_out in (False, True):
        logp = (old + 0.1 * torch.randn(B, T)).requires_grad_(True)
        mask = torch.zeros(B, T) if masked_out else (torch.rand(B, T) > 0.3).float()
        norm = LossNormalizer(num_tokens=float(mask.sum()), num_seqs=float((mask.sum(1) > 0).sum()), t_norm=float(T))
        loss, _ = policy_loss(logp, old, adv, mask, config=cfg, normalizer=norm,
                              generator=torch.Generator().manual_seed(0))
        if not torch.is_tensor(loss) or loss.dim() != 0 or not torch.isfinite(loss):
            _fail(who, f"policy_loss must return a finite scalar loss, got {loss!r}")
        loss.backward()
        g = logp.grad
        if g is None or not torch.all(torch.isfinite(g)):
            _fail(who, "gradients must be finite")
        if torch.any(g[mask == 0] != 0):
            _fail(who, "masked tokens must get no gradient")
        if masked_out and float(loss.detach()) != 0.0:
            _fail(who, f"a fully masked batch must give loss 0, got {float(loss.detach())}")


def check_engine_contract(engine: Any, prompts: list[list[int]], *, who: str | None = None) -> None:
    """A ``GenerationEngine`` returns one output per prompt with one log-prob (finite, <= 0) per
    sampled token, never more than its ``max_new_tokens`` cap, per prompt caps included; and so
    does ``agenerate`` (the async agent loop's entry point), for concurrent requests awaited on
    the agent loop, each stamped with the engine's weights version when it stamps one."""
    import asyncio

    from .env_runners.engines.base import SamplingConfig
    from .env_runners.event_loop import run_on_agent_loop

    who = who or type(engine).__name__
    caps = [3 + i for i in range(len(prompts))]
    sampling = SamplingConfig(max_new_tokens=8, seed=0)
    outs = engine.generate(prompts, sampling, caps)
    if len(outs) != len(prompts):
        _fail(who, f"generate() returned {len(outs)} outputs for {len(prompts)} prompts")
    _check_outputs(who, "generate()", outs, caps)

    async def concurrently() -> list:
        return list(await asyncio.gather(*[engine.agenerate(p, sampling, cap, seed=i)
                                           for i, (p, cap) in enumerate(zip(prompts, caps))]))

    aouts = run_on_agent_loop(concurrently())
    _check_outputs(who, "agenerate()", aouts, caps)
    stamped = {o.policy_version for o in aouts} - {None}
    if stamped and stamped != {int(engine.version)}:
        _fail(who, f"agenerate() stamped versions {sorted(stamped)}, the engine serves {engine.version}")


def _check_outputs(who: str, call: str, outs: list, caps: list[int]) -> None:
    import math

    for o, cap in zip(outs, caps):
        if len(o.token_ids) != len(o.logprobs):
            _fail(who, f"{call}: each sampled token needs exactly one log-prob")
        if not 0 < len(o.token_ids) <= cap:
            _fail(who, f"{call}: generated {len(o.token_ids)} tokens with a per-prompt cap of {cap}")
        if not all(math.isfinite(x) and x <= 1e-6 for x in o.logprobs):
            _fail(who, f"{call}: log-probs must be finite and <= 0")


def check_engine_weight_update(engine: Any, state_dict: Any, *, who: str | None = None) -> None:
    """``update_weights(state, version)`` loads in place and sets ``engine.version``."""
    who = who or type(engine).__name__
    v = int(engine.version) + 1
    engine.update_weights(state_dict, v)
    if engine.version != v:
        _fail(who, f"update_weights(state, {v}) must set version to {v}, got {engine.version}")


def check_reward_shaper_contract(name: str, cfg: Any, step: int = 150) -> None:
    """A reward shaper runs on a valid group, returns {metric: float}, and leaves every
    trajectory with a finite total reward and one step reward per step at most."""
    import math

    from .recipe import REWARD_SHAPERS

    for layout in CONTRACT_LAYOUTS:
        who = f"reward shaper {name!r}" + ("" if layout == "full" else " (window layout)")
        trajs = _contract_group(layout)
        metrics = REWARD_SHAPERS.get(name)(trajs, step, cfg) or {}
        if not isinstance(metrics, dict) or not all(isinstance(v, (int, float)) for v in metrics.values()):
            _fail(who, f"must return a dict of float metrics, got {metrics!r:.200}")
        for t in trajs:
            if not math.isfinite(t.total_reward):
                _fail(who, f"left trajectory {t.traj_id} with total reward {t.total_reward}")
            if len(t.step_rewards) > max(t.num_steps, 1):
                _fail(who, f"wrote {len(t.step_rewards)} step rewards for {t.num_steps} steps")


def check_response_filter_contract(name: str, cfg: Any) -> None:
    """A response filter returns a bool for every trajectory of a valid group."""
    from .recipe import RESPONSE_FILTERS

    f = RESPONSE_FILTERS.get(name)
    verdicts = {}
    for layout in CONTRACT_LAYOUTS:
        verdicts[layout] = []
        for t in _contract_group(layout):
            v = f(t, cfg)
            if not isinstance(v, bool):
                _fail(f"response filter {name!r}", f"must return a bool, got {v!r} ({layout} layout)")
            verdicts[layout].append(v)
    if verdicts["window"] != verdicts["full"]:  # filters judge episodes, whatever the layout
        _fail(f"response filter {name!r}", "flags different episodes in the full and the window layout")


def _contract_sil_batches(steps: int) -> list:
    """One SILBatch per step 1..steps: the contract group (fresh traj_ids per step; the even
    steps in the window layout, so a buffer holds and replays both), its outcome advantages
    R_i - mean_g R and group stats, nothing filtered."""
    from .core.advantages import group_reward_stats
    from .recipe.sil_buffer import SILBatch

    out = []
    for t in range(1, steps + 1):
        trajs = _contract_group(CONTRACT_LAYOUTS[t % 2 == 0])
        for tr in trajs:
            tr.traj_id = f"step{t}-{tr.traj_id}"
        stats = group_reward_stats([tr.total_reward for tr in trajs], [tr.uid for tr in trajs])
        adv = [tr.total_reward - stats[tr.uid][0] for tr in trajs]
        out.append(SILBatch(trajs, adv, t, [m for m, _ in stats.values()], [sd for _, sd in stats.values()],
                            [False] * len(trajs)))
    return out


def _checked_sample(buf: Any, step: int, added: dict[str, str], who: str) -> list[tuple[str, float]]:
    """``buf.sample(step)`` checked; ``added``: traj_id -> layout of every trajectory added."""
    import math
    import numbers

    from .core.trajectory import Trajectory

    try:
        out = buf.sample(step=step)
    except Exception as e:  # noqa: BLE001 - named in the verdict
        _fail(who, f"sample(step={step}) raised {type(e).__name__}: {e}")
    if not isinstance(out, list):
        _fail(who, f"sample(step={step}) must return a list of (Trajectory, A~) pairs, got {type(out).__name__}")
    got = []
    for item in out:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Trajectory)
                and isinstance(item[1], numbers.Real) and not isinstance(item[1], bool) and math.isfinite(item[1])):
            _fail(who, f"sample(step={step}) must return (Trajectory, finite float A~) pairs, got {item!r:.200}")
        if item[0].traj_id not in added:
            _fail(who, f"sample(step={step}) replayed {item[0].traj_id!r}, which was never added")
        if item[0].layout != added[item[0].traj_id]:
            _fail(who, f"sample(step={step}) replayed {item[0].traj_id!r} in the {item[0].layout} layout; it was "
                       f"added in the {added[item[0].traj_id]} layout (keep Trajectory.step_prompts)")
        got.append((item[0].traj_id, float(item[1])))
    return got


def check_replay_buffer_contract(make_buffer: Callable[[], Any], *, who: str | None = None, steps: int = 6,
                                 restore_at: int = 3, expect_replay: bool = True) -> None:
    """A SIL replay buffer (``replay_buffer_config["type"]``, docs/algorithms.md 2.6) keeps the
    contract SPEAR relies on, over ``steps`` training steps of the contract group:

    - it is an RLlib ``ReplayBufferInterface`` and ``len()`` is an int >= 0;
    - each step, ``sample(step=t)`` (before the step's batch is added) returns a list of
      ``(Trajectory, finite float A~)`` pairs, each a trajectory added earlier; ``add(SILBatch)``
      takes the step's batch; with ``expect_replay``, some step replays something;
    - ``get_state()`` survives pickling, and a fresh ``make_buffer()`` given it with
      ``set_state`` (before step ``restore_at``) serves the same replays and length as the
      original from then on: an exact resume, sampling RNG included;
    - ``metrics()``, when the buffer has one, returns ``{str: number}``.

    ``make_buffer`` builds the buffer under test (the same configuration each call).
    """
    import copy
    import numbers
    import pickle

    from ray.rllib.utils.replay_buffers.base import ReplayBufferInterface

    from .recipe.sil_buffer import register_with_rllib

    register_with_rllib()
    buf = make_buffer()
    who = who or type(buf).__name__
    if not isinstance(buf, ReplayBufferInterface):
        _fail(who, "is not a ray.rllib.utils.replay_buffers.base.ReplayBufferInterface (subclass SILReplayBuffer "
                   "or ReplayBufferInterface)")
    added: dict[str, str] = {}  # traj_id -> layout
    clone, replayed = None, False
    for i, batch in enumerate(_contract_sil_batches(steps)):
        if i == restore_at:
            try:
                state = pickle.loads(pickle.dumps(buf.get_state()))
            except Exception as e:  # noqa: BLE001
                _fail(who, f"get_state() must return a picklable state, failed with {type(e).__name__}: {e}")
            clone = make_buffer()
            clone.set_state(state)
        got = _checked_sample(buf, batch.step, added, who)
        replayed = replayed or bool(got)
        if clone is not None:
            again = _checked_sample(clone, batch.step, added, who)
            if again != got:
                _fail(who, f"after set_state(get_state()) before step {restore_at + 1}, step {batch.step} replays "
                           f"{again[:4]}... instead of {got[:4]}... (the state must hold everything, RNG included)")
        added.update((tr.traj_id, tr.layout) for tr in batch.trajectories)
        buf.add(batch)
        if clone is not None:
            clone.add(copy.deepcopy(batch))
        n = len(buf)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            _fail(who, f"len() must be an int >= 0, got {n!r}")
        if clone is not None and len(clone) != n:
            _fail(who, f"after set_state(get_state()) the restored buffer holds {len(clone)} items, the original {n}")
    if expect_replay and not replayed:
        _fail(who, f"sample() replayed nothing in {steps} steps of positive-advantage batches; configure the "
                   "buffer to replay here (e.g. SILReplayBuffer(capacity=2)) or pass expect_replay=False")
    metrics = getattr(buf, "metrics", None)
    if callable(metrics):
        m = metrics()
        if not isinstance(m, dict) or not all(isinstance(k, str) and isinstance(v, numbers.Real) for k, v in m.items()):
            _fail(who, f"metrics() must return {{str: number}}, got {m!r:.200}")


# ---------------------------------------------------------------------------------------------
# Rollout pipelines (rllib_spear/pipelines/) and rollout modes (env_runners/rollout_modes.py)
# ---------------------------------------------------------------------------------------------
class _ContractRunner:
    """An LLMEnvRunner stand-in: one trajectory of one assistant turn per episode, on the weights
    version it holds; the stream (``rollout_pipeline="async"``) finishes every group at the next
    take. Records the sampling seed each task was sampled with."""

    def __init__(self, worker_index: int) -> None:
        self.worker_index, self.version = worker_index, 0
        self.streamed: list[dict] = []
        self.seeds: dict[str, int | None] = {}

    def _group(self, task: dict, group_size: int, seed: int | None) -> list:
        from .core.trajectory import Segment, Trajectory

        self.seeds[task["uid"]] = seed
        return [Trajectory(uid=task["uid"], task=dict(task), policy_version=self.version,
                           traj_id=f"{task['uid']}-{self.worker_index}-{k}",
                           segments=[Segment("prompt", [1, 2]),
                                     Segment("assistant", [3], logprobs=[-0.5], step=0, policy_version=self.version)],
                           step_rewards=[0.0], stats=make_stats())
                for k in range(group_size)]

    def sample_groups(self, *, tasks: list[dict], group_size: int, policy_version: int | None = None,
                      seed: int | None = None) -> dict:
        trajs = [t for task in tasks for t in self._group(task, group_size, seed)]
        return {"trajectories": trajs, "stats": {"worker_index": self.worker_index, "num_episodes": len(trajs)}}

    def stream_submit(self, requests: list[dict]) -> list[int]:
        self.streamed += [dict(r) for r in requests]
        return [int(r["key"]) for r in self.streamed]

    def stream_take(self, min_groups: int = 1, timeout_s: float = 0.0) -> dict:
        done, self.streamed = self.streamed, []
        return {"groups": [(r["key"], self._group(r["task"], r["group_size"], r["seed"])) for r in done],
                "failed": [], "in_flight_keys": [], "stats": {"worker_index": self.worker_index,
                                                              "num_episodes": sum(r["group_size"] for r in done)}}

    def stream_stop(self) -> int:
        n, self.streamed = sum(r["group_size"] for r in self.streamed), []
        return n


class _ContractRunnerGroup:
    """The EnvRunnerGroup calls a pipeline makes, over healthy ``_ContractRunner``s; an async
    request runs at once, on the weights the runner holds (a later sync queues behind it)."""

    def __init__(self, n: int = 2) -> None:
        self.runners = {i: _ContractRunner(i) for i in range(1, n + 1)}
        self._in_flight: list[tuple[int, Any, Any]] = []

    def num_remote_env_runners(self) -> int:
        return len(self.runners)

    def healthy_env_runner_ids(self) -> list[int]:
        return sorted(self.runners)

    def probe_unhealthy_env_runners(self) -> list[int]:
        return []

    def foreach_env_runner(self, func: Any, *, local_env_runner: bool = False,
                           remote_worker_ids: list[int] | None = None) -> list:
        ids = self.healthy_env_runner_ids() if remote_worker_ids is None else list(remote_worker_ids)
        funcs = func if isinstance(func, list) else [func] * len(ids)
        return [f(self.runners[i]) for i, f in zip(ids, funcs)]

    def foreach_env_runner_async(self, func: Any, tag: Any = None, *,
                                 remote_worker_ids: list[int] | None = None) -> int:
        ids = self.healthy_env_runner_ids() if remote_worker_ids is None else list(remote_worker_ids)
        funcs = func if isinstance(func, list) else [func] * len(ids)
        self._in_flight += [(i, f(self.runners[i]), tag) for i, f in zip(ids, funcs)]
        return len(ids)

    def num_in_flight_async_reqs(self, tag: Any = None) -> int:
        return sum(1 for _, _, t in self._in_flight if tag is None or t == tag)

    def fetch_ready_async_reqs(self, *, tags: Any = None, timeout_seconds: float | None = 0.0) -> list:
        mine = [r for r in self._in_flight if tags is None or r[2] == tags]
        self._in_flight = [r for r in self._in_flight if not (tags is None or r[2] == tags)]
        return [(i, out) for i, out, _ in mine]


class _ContractHost:
    """A ``PipelineHost``: one learner update per iteration, then the weight sync."""

    def __init__(self, config: Any, env_runner_group: _ContractRunnerGroup, task_sampler: Any) -> None:
        self.config, self.env_runner_group, self.task_sampler = config, env_runner_group, task_sampler
        self.algo_step = 0
        self._version = 0

    @property
    def policy_version(self) -> int:
        return self._version

    def sync_weights(self) -> None:
        for r in self.env_runner_group.runners.values():
            r.version = self._version

    def finish_iteration(self) -> None:
        self.algo_step += 1
        self._version += 1  # the update: version t after t iterations
        self.sync_weights()


def _contract_pipeline_config(name: str) -> Any:
    from .algorithms.grpo import GRPOConfig
    from .env_runners.rollout_modes import streaming_rollout_modes

    cfg = (GRPOConfig().training(rollout_pipeline=name, tasks_per_iteration=3, group_size=2, max_policy_lag=1)
           .env_runners(num_env_runners=2, rollout_mode=(streaming_rollout_modes() or ["turn_sync"])[0]))
    cfg.validate(check_files=False)
    return cfg


def _checked_batch(who: str, pipeline: Any, host: _ContractHost) -> list[str]:
    """One iteration's batch, checked; returns its group uids (sorted)."""
    from collections import Counter
    import numbers

    from .pipelines import SampledBatch

    cfg = host.config
    batch = pipeline.next_batch(host)
    step = host.algo_step
    if not isinstance(batch, SampledBatch):
        _fail(who, f"next_batch() must return a rllib_spear.pipelines.SampledBatch, got {type(batch).__name__}")
    sizes = Counter(t.uid for t in batch.trajectories)
    if len(sizes) != cfg.tasks_per_iteration or set(sizes.values()) != {cfg.group_size}:
        _fail(who, f"iteration {step + 1}: the batch must be tasks_per_iteration={cfg.tasks_per_iteration} whole "
                   f"groups of group_size={cfg.group_size} (nothing was lost), got {dict(sizes)}")
    for t in batch.trajectories:
        lag = step - int(t.policy_version)  # version v is current from iteration v + 1
        if not 0 <= lag <= cfg.max_policy_lag:
            _fail(who, f"iteration {step + 1}: a trajectory sampled on version {t.policy_version} is {lag} "
                       f"updates old; max_policy_lag is {cfg.max_policy_lag}")
        if lag and not type(pipeline).overlaps_update:
            _fail(who, f"iteration {step + 1}: overlaps_update is False, but a trajectory is {lag} update(s) old "
                       "(the batch must be sampled on the current weights)")
    v = batch.sampled_version
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= host.policy_version:
        _fail(who, f"sampled_version must be a version the runners held (0..{host.policy_version}), got {v!r}")
    for key in ("lost_env_runner_samples", "dropped_incomplete_groups"):
        # a sum an iteration does not log reads NaN in RLlib's metrics: every iteration, 0 included
        if batch.counts.get(key) != 0:
            _fail(who, f"counts must hold {key!r} every iteration (0 here: nothing was lost), got {batch.counts}")
    if not all(isinstance(n, numbers.Integral) and n >= 0 for n in batch.counts.values()):
        _fail(who, f"counts must be integers >= 0, got {batch.counts}")
    if not all(isinstance(x, numbers.Real) for x in batch.gauges.values()):
        _fail(who, f"gauges must be numbers, got {batch.gauges}")
    if not all(isinstance(s, dict) for s in batch.runner_stats):
        _fail(who, "runner_stats must be the runners' stats dicts")
    return sorted(sizes)


def check_pipeline_contract(name: str, *, iterations: int = 4, checkpoint_after: int = 2) -> None:
    """A rollout pipeline (``rllib_spear.pipelines.register_pipeline``), run on stand-in runners
    (one update and one weight sync per iteration, nothing lost):

    - every ``next_batch`` is ``tasks_per_iteration`` whole groups of ``group_size``, at most
      ``max_policy_lag`` updates old (on the current weights when ``overlaps_update`` is False),
      with ``lost_env_runner_samples`` and ``dropped_incomplete_groups`` counted every iteration;
    - a checkpoint after ``checkpoint_after`` iterations (``checkpoint_sampler_state``,
      ``get_state``: picklable) restored into a fresh pipeline, or after ``drop`` into the running
      one, trains the same tasks next as the run that went on, with the same sampling seeds.
    """
    import pickle

    from .pipelines import get_pipeline
    from .recipe import TaskSampler

    who = f"rollout pipeline {name!r}"
    cls = get_pipeline(name)
    if not isinstance(cls.overlaps_update, bool):
        _fail(who, f"overlaps_update must be True or False, got {cls.overlaps_update!r}")
    cfg = _contract_pipeline_config(name)
    tasks = [{"uid": f"task{k}", "question": f"q{k}"} for k in range(64)]

    def run(pipeline: Any, host: _ContractHost, n: int) -> list[list[str]]:
        out = []
        for _ in range(n):
            out.append(_checked_batch(who, pipeline, host))
            host.finish_iteration()
        return out

    def seeds(group: _ContractRunnerGroup, uids: list[list[str]]) -> dict:
        got = {u: s for r in group.runners.values() for u, s in r.seeds.items()}
        return {u: got.get(u) for batch in uids for u in batch}

    pipeline = cls.from_config(cfg)
    host = _ContractHost(cfg, _ContractRunnerGroup(), TaskSampler(tasks, seed=0))
    run(pipeline, host, checkpoint_after)
    try:
        saved = pickle.loads(pickle.dumps({"sampler": pipeline.checkpoint_sampler_state(host.task_sampler),
                                           "pipeline": pipeline.get_state()}))
    except Exception as e:  # noqa: BLE001
        _fail(who, f"checkpoint_sampler_state() / get_state() must be picklable, failed with {type(e).__name__}: {e}")
    went_on = run(pipeline, host, iterations - checkpoint_after)
    went_on_seeds = seeds(host.env_runner_group, went_on)

    def restore(into: Any, group: _ContractRunnerGroup, how: str) -> None:
        dropped = into.drop(group)
        if isinstance(dropped, bool) or not isinstance(dropped, int) or dropped < 0:
            _fail(who, f"drop() must return the number of trajectories discarded (int >= 0), got {dropped!r}")
        for r in group.runners.values():
            r.seeds.clear()
        sampler = TaskSampler(tasks, seed=0)
        sampler.set_state(saved["sampler"])
        into.set_state(saved["pipeline"])
        again = _ContractHost(cfg, group, sampler)
        again.algo_step = again._version = checkpoint_after  # the restored weights
        again.sync_weights()
        got = run(into, again, iterations - checkpoint_after)
        if got != went_on:
            _fail(who, f"restored after iteration {checkpoint_after} ({how}), it trains {got} next; the run that "
                       f"went on trained {went_on} (a checkpoint must hold what is in flight)")
        if seeds(group, got) != went_on_seeds:
            _fail(who, f"restored ({how}), it samples those tasks with other seeds than the original run "
                       "(sampling seeds must follow the draw: runner_requests.sampling_seed)")

    restore(cls.from_config(cfg), _ContractRunnerGroup(), "into a fresh pipeline")
    restore(pipeline, host.env_runner_group, "into the running pipeline, after drop()")


def _contract_prompt_engine(eos: int) -> Any:
    """A ``GenerationEngine`` whose completion is a function of its prompt and cap only."""
    import zlib

    import numpy as np

    from .env_runners.engines.base import GenerationEngine, GenerationOutput

    class PromptEngine(GenerationEngine):
        def generate(self, prompts, sampling, max_new_tokens=None):
            outs = []
            for i, p in enumerate(prompts):
                cap = sampling.max_new_tokens if max_new_tokens is None else min(sampling.max_new_tokens,
                                                                                  int(max_new_tokens[i]))
                rng = np.random.default_rng(zlib.crc32(np.asarray(list(p), np.int64).tobytes()))
                toks = ([int(t) for t in rng.integers(10, 400, size=int(rng.integers(1, 12)))] + [eos])[:cap]
                outs.append(GenerationOutput(toks, [float(-x) for x in rng.random(len(toks))],
                                             "stop" if toks[-1] == eos else "length"))
            return outs

        def update_weights(self, state_dict, version):
            self.version = version

    return PromptEngine()


def _contract_script_env() -> Any:
    """A ``ToolEnv`` of ``task["turns"]`` steps whose rewards depend on the text."""
    from .envs.base import StepResult, ToolEnv

    class ScriptEnv(ToolEnv):
        def reset(self, task):
            self.task, self.n = task, 0
            return [{"role": "system", "content": "You search."}, {"role": "user", "content": task["question"]}]

        def step(self, text):
            self.n += 1
            if self.n >= self.task["turns"]:
                return StepResult(None, float(len(text) % 3), True)
            return StepResult(f"<information>step {self.n}: {text[:12]}</information>", 0.0, False)

        def episode_stats(self):
            return {"tool_calls": self.n - 1, "queries_per_step": [1] * self.n, "success": False,
                    "format_ok": True, "has_answer": True, "outcome_reward": 0.0}

    return ScriptEnv


def _contract_agent_program_env() -> Any:
    """An ``AgentProgramEnv`` whose program chats ``task["turns"]`` calls (reward: the turns)."""
    from .envs.agent_program import AgentProgramEnv

    def program(task, client):
        messages = [{"role": "user", "content": task["question"]}]
        for _ in range(task["turns"]):
            reply = client.chat.completions.create(model="policy", messages=messages)
            messages += [reply.choices[0].message, {"role": "user", "content": "go on"}]
        return float(task["turns"])

    return lambda: AgentProgramEnv(program, episode_timeout_s=120.0)


def check_rollout_mode_contract(name: str, *, group_size: int = 2, env_factory: Callable[[], Any] | None = None,
                                tasks: list[dict] | None = None) -> None:
    """A rollout mode (``rllib_spear.env_runners.rollout_modes.register_rollout_mode``), on an
    engine whose output depends only on the prompt: its rollout returns ``group_size``
    trajectories per task, stamped with the call's ``policy_version``, with stats counting every
    generated token; ``engine_defaults`` is a dict; a mode that ``streams_groups`` has
    ``arun_group``. On the contract's scripted environment (``env_factory`` None) a mode changes
    when episodes run, never what they record: the same trajectories (all but their random ids)
    as the turn-synchronous reference loop. A mode that needs environments of its own passes
    ``env_factory`` and ``tasks`` (then the comparison is skipped); a mode that ``serves_openai``
    runs the contract's tasks as agent programs of as many chat calls (no comparison either)."""
    import dataclasses

    from transformers import AutoTokenizer

    from .env_runners.engines.base import SamplingConfig
    from .env_runners.rollout import RolloutConfig, RolloutStats
    from .env_runners.rollout_modes import RolloutMode, get_rollout_mode
    from .models.factory import tiny_model_path

    who = f"rollout mode {name!r}"
    mode = get_rollout_mode(name)
    if not isinstance(mode, RolloutMode):
        _fail(who, "must be a rllib_spear.env_runners.rollout_modes.RolloutMode subclass")
    for engine in ("hf", "vllm"):
        if not isinstance(mode.engine_defaults(engine), dict):
            _fail(who, f"engine_defaults({engine!r}) must return a dict of engine_kwargs")
    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    scripted = env_factory is None and not mode.serves_openai
    if env_factory is None:  # a mode of agent programs runs the same tasks as a program of that many calls
        env_factory = _contract_agent_program_env() if mode.serves_openai else _contract_script_env()
        tasks = [{"uid": u, "question": f"question {u}", "turns": n} for u, n in (("a", 1), ("b", 3), ("c", 2))]
    elif not tasks:
        _fail(who, "check_rollout_mode_contract: pass the tasks of your env_factory's environments")

    def run(rollout_mode: RolloutMode) -> tuple[Any, list, Any]:
        engine = _contract_prompt_engine(tok.eos_token_id)
        rollout = rollout_mode.build(step_timeout_s=60.0, tool_concurrency=None, engine=engine, tokenizer=tok,
                                     env_factory=env_factory,
                                     sampling=SamplingConfig(max_new_tokens=12, seed=7),
                                     config=RolloutConfig(max_turns=4, max_model_len=512, max_response_tokens=256))
        try:
            trajs, stats = rollout.run(tasks, group_size, policy_version=5)
        finally:
            engine.shutdown()
        return rollout, trajs, stats

    rollout, trajs, stats = run(mode)
    missing = [a for a in ("run", "sampling", "config", "env_factory") if not hasattr(rollout, a)]
    if missing:  # what the runner uses of a rollout (MultiTurnRollout has them all)
        _fail(who, f"build() must return a rollout with run(tasks, group_size, policy_version), sampling, config and "
                   f"env_factory (as MultiTurnRollout), got a {type(rollout).__name__} without {missing}")
    if mode.streams_groups and not hasattr(rollout, "arun_group"):
        _fail(who, "streams_groups is True, but its rollout has no arun_group (rollout_pipeline='async' streams with it)")
    counts = {u: sum(t.uid == u for t in trajs) for u in (t["uid"] for t in tasks)}
    if len(trajs) != len(tasks) * group_size or set(counts.values()) != {group_size}:
        _fail(who, f"run() must return group_size={group_size} trajectories per task, got {counts}")
    if any(t.policy_version != 5 for t in trajs):
        _fail(who, "every trajectory must carry the policy_version run() was called with (5)")
    if not isinstance(stats, RolloutStats):
        _fail(who, f"run() must return RolloutStats, got {type(stats).__name__}")
    generated = sum(len(s.token_ids) for t in trajs for s in t.segments if s.kind == "assistant")
    if stats.generated_tokens != generated:
        _fail(who, f"stats.generated_tokens is {stats.generated_tokens}; the trajectories hold {generated}")
    if name == "turn_sync" or not scripted:  # the reference itself; another environment
        return

    def same(ts: list) -> list:
        return sorted((dataclasses.replace(t, traj_id="") for t in ts), key=lambda t: (t.uid, repr(t)))

    _, reference, _ = run(get_rollout_mode("turn_sync"))
    if same(trajs) != same(reference):
        _fail(who, "its trajectories differ from the turn-synchronous loop's on an engine whose output depends only "
                   "on the prompt (a rollout mode may change when episodes run, not what they record)")


# ---------------------------------------------------------------------------------------------
# Weight-sync transports (rllib_spear/weight_streaming): every registered transport, built-in
# or a user's, goes through the same checks on a running algorithm.
# ---------------------------------------------------------------------------------------------
_INJECTED = "check_transport_contract: injected failure"
#: the tokens the engines score to compare their weights with the learner's (engines without an
#: HF model to read)
_CONTRACT_SEQ = list(range(3, 40))


def _rank0(results: Any) -> Any:
    """The one non-None value of a ``foreach_learner``'s results (raising the first error)."""
    errors = [r.get() for r in results.result_or_errors if not r.ok]
    if errors:
        raise errors[0]
    return next(v for v in (r.get() for r in results.result_or_errors) if v is not None)


def _contract_new_version(learner: Any, seed: int) -> int:
    """A new learner version with other weights (no training step needed; unsharded learners)."""
    import torch
    from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

    weights = learner.weight_senders.weights
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in weights.model()[1].parameters():
            p.add_(torch.randn(p.shape, generator=g).to(device=p.device, dtype=p.dtype) * 0.01)
    learner.set_state({WEIGHTS_SEQ_NO: weights.version() + 1})
    return weights.version()


def _contract_engine_view(runner: Any) -> tuple:
    """(the runner's version, its engine's, the engine's weight dtype, the engine's HF state dict
    or None, the engine's scores of ``_CONTRACT_SEQ`` when it has no HF model to read)."""
    engine = runner.engine
    model = getattr(engine, "model", None)
    sd = None
    if model is not None and hasattr(model, "state_dict"):
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    scores = engine.score([_CONTRACT_SEQ])[0] if sd is None else None
    return runner.weights_version, engine.version, runner.weight_receivers.weights.dtype(), sd, scores


def _contract_break_engine(runner: Any) -> None:
    """Every way a receiver changes the engine's weights raises from now on."""
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(_INJECTED)

    for name in ("update_weights", "load_weights_stream", "start_weight_update", "receive_weight_update"):
        if hasattr(runner.engine, name):
            setattr(runner.engine, name, broken)


def _contract_mend_engine(runner: Any) -> None:
    for name in ("update_weights", "load_weights_stream", "start_weight_update", "receive_weight_update"):
        runner.engine.__dict__.pop(name, None)


def _contract_zero_engine(runner: Any, zeros: dict) -> None:
    """The runner forgets its version and its engine holds other weights (all zero)."""
    runner.forget_weights_version()
    runner.engine.update_weights(zeros, version=-1)


def check_transport_contract(transport: Any, algo: Any, *, bucket_mb: float = 0.1, score_tol: float = 1e-3,
                             restart_timeout_s: float = 180.0, who: str | None = None) -> None:
    """A weight-sync transport (its registered name or class) keeps the contract of
    ``rllib_spear.weight_streaming.Transport`` on ``algo``: a built algorithm of this library with
    at least one remote runner, ``restart_failed_env_runners=True``, unsharded learners and the
    engine the transport needs (an engine narrower than the learner's weights, e.g.
    ``engine_kwargs={"dtype": "bfloat16"}``, makes the dtype check bite). Each sync gets a new
    learner version first (a seeded perturbation of the weights), through a ``WeightSync`` of
    this transport with ``bucket_mb`` buckets. Checks, in order:

    - **a sync lands**: the transport carries it, returns the learner's version, every runner
      and its engine report that version, and every engine holds exactly the learner's weights
      (an HF engine's tensors, in the engine's dtype) or scores like them (within ``score_tol``);
    - **dtype on the wire**: a transport whose ``wire_dtype`` is "engine" and whose sender counts
      its bytes (``WeightSender.sent_bytes``) sent the weights in the engine's dtype (at most 16
      bytes of alignment per tensor);
    - **the version is what was applied**: a runner that forgot its version (its engine holding
      other weights) gets the same version applied again, not skipped;
    - **a broken sync falls back**: with a ``fallback``, a sync of the transport that fails
      (injected) still lands through the fallback, and the transport carries the next one; without
      one, the sync fails and no runner takes the new version;
    - **version set only on success**: while every engine's weight loads fail, no runner that
      answers reports the new version;
    - **restarted runners rejoin**: once the runners that failed are restarted (RLlib's restore),
      the transport carries the next sync to every runner, the restarted ones included.
    """
    import itertools
    import time

    import torch

    from .weight_streaming import Placement, WeightSync
    from .weight_streaming.learner_side import wire_dtype_of
    from .weight_streaming.registry import TRANSPORTS, transport_class

    cls = transport_class(transport)
    who = who or f"transport {cls.name!r}"
    if not cls.name or cls.name not in TRANSPORTS or TRANSPORTS.get(cls.name) is not cls:
        _fail(who, "is not registered: rllib_spear.weight_streaming.register_transport(name)(cls) first")
    group, learners, cfg = algo.env_runner_group, algo.learner_group, algo.config
    if group is None or group.num_remote_env_runners() < 1 or not cfg.restart_failed_env_runners:
        raise ValueError("check_transport_contract needs an algorithm with num_env_runners >= 1 and "
                         ".fault_tolerance(restart_failed_env_runners=True)")
    if cls.requires_engine is not None and cfg.engine != cls.requires_engine:
        raise ValueError(f"{who} needs env_runners(engine={cls.requires_engine!r}); the algorithm has {cfg.engine!r}")
    own = WeightSync.from_config(cfg)
    sync = WeightSync(cls.name, bucket_mb=bucket_mb, sharding=own.settings.sharding,
                      transfer_backend=own.settings.transfer_backend)
    instance = sync.instance(cls.name)
    why = instance.unavailable(Placement(learners, group))
    if why:
        raise ValueError(f"{who} cannot run for this algorithm's learners and runners: {why}")
    carried, inject = [0], [0]
    original = instance.sync

    def counted(placement: Any) -> Any:
        if inject[0]:
            inject[0] -= 1
            raise RuntimeError(_INJECTED)
        out = original(placement)
        carried[0] += 1
        return out

    instance.sync = counted
    seeds = itertools.count(1)
    model_path = cfg.model_config["model_path"]

    def new_version() -> int:
        return _rank0(learners.foreach_learner(lambda l, s=next(seeds): _contract_new_version(l, s)))

    def learner_weights() -> dict:
        state = _rank0(learners.foreach_learner(lambda l: l.weight_senders.weights.state()))
        (sd,) = state["rl_module"].values()
        return {k: torch.as_tensor(v) for k, v in sd.items()}

    def check_engines(version: int, what: str) -> None:
        want = learner_weights()
        views = group.foreach_env_runner(_contract_engine_view, local_env_runner=False)
        if len(views) != group.num_remote_env_runners():
            _fail(who, f"{what}: {len(views)} of {group.num_remote_env_runners()} runners answered")
        for runner_version, engine_version, dtype, sd, scores in views:
            if runner_version != version or engine_version != version:
                _fail(who, f"{what}: a runner reports version {runner_version} (its engine {engine_version}), "
                           f"the learner's is {version}")
            engine_dtype = getattr(torch, dtype) if dtype else None
            if sd is not None:
                bad = [k for k, v in want.items() if k not in sd or sd[k].dtype != wire_dtype_of(v.dtype, engine_dtype)
                       or not torch.equal(sd[k], v.to(sd[k].dtype))]
                if bad:
                    _fail(who, f"{what}: the engine's weights are not the learner's (in the engine's dtype {dtype}): "
                               f"{bad[:5]}")
            else:
                ref = _contract_reference_scores(model_path, want, engine_dtype)
                gap = max(abs(a - b) for a, b in zip(scores[1:], ref[1:]))
                if gap > score_tol:
                    _fail(who, f"{what}: the engine scores {gap:.2e} away from the learner's weights (> {score_tol})")

    def through_transport(what: str) -> int:
        version, before = new_version(), carried[0]
        try:
            got = sync(learners, group)
        except Exception as e:  # noqa: BLE001
            _fail(who, f"{what}: the sync raised {type(e).__name__}: {e}")
        if carried[0] == before:
            _fail(who, f"{what}: the sync did not go through the transport (it fell back)")
        if got != version:
            _fail(who, f"{what}: the sync returned version {got}; the learner holds {version}")
        check_engines(version, what)
        return version

    # a sync lands, in the engine's dtype
    version = through_transport("a first sync")
    if cls.wire_dtype == "engine":
        sent = next((b for b in (r.get() for r in learners.foreach_learner(
            lambda l, t=cls: l.weight_senders.of(t).sent_bytes()).result_or_errors if r.ok) if b is not None), None)
        if sent is not None:
            want = learner_weights()
            (dtype,) = set(group.foreach_env_runner(lambda r: r.weight_receivers.weights.dtype(),
                                                    local_env_runner=False))
            engine_dtype = getattr(torch, dtype) if dtype else None
            payload = sum(v.numel() * wire_dtype_of(v.dtype, engine_dtype).itemsize for v in want.values())
            if not payload <= sent <= payload + 16 * len(want):
                _fail(who, f"its sender put {sent} bytes on the wire; the weights in the engine's dtype ({dtype}) "
                           f"are {payload} bytes")

    # the version is what each runner applied
    zeros = {k: torch.zeros_like(v) for k, v in learner_weights().items()}
    group.foreach_env_runner(lambda r, z=zeros: _contract_zero_engine(r, z), local_env_runner=False)
    before = carried[0]
    try:
        got = sync(learners, group)
    except Exception as e:  # noqa: BLE001
        _fail(who, f"a resync of version {version} to runners that forgot it raised {type(e).__name__}: {e}")
    if carried[0] == before or got != version:
        _fail(who, f"a resync of version {version} to runners that forgot it returned {got} "
                   f"({'through' if carried[0] > before else 'not through'} the transport)")
    check_engines(version, "a resync to runners that forgot their version")

    # a broken sync falls back
    inject[0] = 1
    version = new_version()
    if cls.fallback is not None:
        try:
            got = sync(learners, group)
        except Exception as e:  # noqa: BLE001
            _fail(who, f"a failed sync did not fall back to {cls.fallback!r}: {type(e).__name__}: {e}")
        if got != version:
            _fail(who, f"the fallback sync returned version {got}; the learner holds {version}")
        check_engines(version, f"a sync through the fallback {cls.fallback!r}")
        version = through_transport("the sync after a fallback")
    else:
        try:
            sync(learners, group)
        except RuntimeError as e:
            if _INJECTED not in str(e):
                _fail(who, f"a failed sync raised another error than its own: {e}")
        else:
            _fail(who, "a failed sync (no fallback) returned instead of raising")
        versions = group.foreach_env_runner(lambda r: r.weights_version, local_env_runner=False)
        if version in versions:
            _fail(who, f"a failed sync left runners at the new version {version}: {versions}")
    inject[0] = 0

    # version set only on success
    group.foreach_env_runner(_contract_break_engine, local_env_runner=False)
    version = new_version()
    try:
        sync(learners, group)
    except Exception:  # noqa: BLE001  (a receiver that fails may end its runner; RLlib restarts it)
        pass
    versions = group.foreach_env_runner(lambda r: r.weights_version, local_env_runner=False)
    if version in versions:
        _fail(who, f"runners whose engines failed to load report the new version {version}: {versions}")
    group.foreach_env_runner(_contract_mend_engine, local_env_runner=False)

    # restarted runners rejoin
    deadline = time.monotonic() + restart_timeout_s
    while group.num_healthy_remote_env_runners() < group.num_remote_env_runners():
        if time.monotonic() > deadline:
            raise TimeoutError(f"check_transport_contract: the runners did not restart in {restart_timeout_s} s")
        algo.restore_env_runners(group)
        time.sleep(0.5)
    through_transport("a sync after the runners restarted")
    instance.sync = original


def _contract_reference_scores(model_path: str, state: dict, dtype: Any) -> list[float]:
    """Log-probs of ``_CONTRACT_SEQ`` under an fp32 HF model holding ``state`` cast to ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    from .models.logprobs import token_logprobs

    ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    ref.load_state_dict({k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).float()
                         for k, v in state.items()}, strict=False)
    ref.tie_weights()
    ids = torch.tensor([_CONTRACT_SEQ])
    return token_logprobs(ref, ids, torch.ones_like(ids))[0].tolist()


# ---------------------------------------------------------------------------------------------
# The OpenAI endpoint (rllib_spear/env_runners/serving): any engine behind it, through the real openai client.
# ---------------------------------------------------------------------------------------------
def check_endpoint_contract(engine: Any, tokenizer: Any, *, rescore: Callable[[list[int]], Any] | None = None,
                            atol: float = 2e-4, turns: int = 3, who: str | None = None) -> None:
    """``engine`` served by an ``OpenAIEndpoint`` (docs/design.md "The OpenAI endpoint"), through
    the ``openai`` client (needs the ``serve`` extra): a chat loop of ``turns`` calls in one
    episode is captured with exactly the ids and log-probs the responses report
    (``return_token_ids``, ``logprobs``), which satisfy :func:`check_engine_contract`'s output
    checks; the calls chain token for token (one context); ``rescore(ids)`` (the learner's
    per-token log-probs of a sequence, ``x[t] = log p(ids[t] | ids[:t])``), when given, matches the
    engine's on every sampled token within ``atol``; a request without the key is refused (401)."""
    import numpy as np
    import openai

    from .core.call_layout import call_segments, calls_chain
    from .core.trajectory import Trajectory
    from .env_runners.engines.base import SamplingConfig
    from .env_runners.serving import OpenAIEndpoint
    from .env_runners.serving.protocol import SamplingPolicy

    who = who or f"{type(engine).__name__} behind the OpenAI endpoint"
    sampling = SamplingConfig(max_new_tokens=12, stop_token_ids=[tokenizer.eos_token_id])
    endpoint = OpenAIEndpoint(engine, tokenizer, sampling, max_model_len=512).start()
    try:
        capture = endpoint.open_episode(SamplingPolicy(sampling, max_model_len=512), seed=7)
        client = endpoint.client(capture)
        messages: list[Any] = [{"role": "user", "content": "Where is the lighthouse?"}]
        replies = []
        for turn in range(turns):
            reply = client.chat.completions.create(model="policy", messages=messages, logprobs=True,
                                                   extra_body={"return_token_ids": True})
            replies.append(reply)
            messages += [reply.choices[0].message, {"role": "user", "content": f"And then {turn}?"}]
        try:
            openai.OpenAI(base_url=endpoint.base_url(capture), api_key="not-the-key", max_retries=0).models.list()
            _fail(who, "a request with a wrong key was served; it must be a 401")
        except openai.AuthenticationError:
            pass
        records = endpoint.close_episode(capture)
    finally:
        endpoint.stop()
    if len(records) != turns:
        _fail(who, f"{turns} calls were made, {len(records)} captured")
    outs = []
    for reply, rec in zip(replies, records):
        choice = reply.choices[0]
        if list(rec.call.completion_ids) != choice.model_extra["token_ids"] or \
                list(rec.call.prompt_ids) != reply.model_extra["prompt_token_ids"]:
            _fail(who, "the captured prompt / completion ids are not the ones the response reported")
        if not np.allclose(rec.call.logprobs, [c.logprob for c in choice.logprobs.content]):
            _fail(who, "the captured log-probs are not the ones the response reported")
        outs.append(type("Out", (), {"token_ids": rec.call.completion_ids, "logprobs": rec.call.logprobs})())
    _check_outputs(who, "the endpoint", outs, [12] * turns)
    calls = [rec.call for rec in records]
    if not calls_chain(calls):
        _fail(who, "a chat loop's calls must chain token for token (each prompt starts with the previous prompt "
                   "and the sampled completion)")
    if rescore is not None:
        segments, prompts = call_segments(calls, [0])
        traj = Trajectory("contract", segments, step_prompts=prompts)
        lp = np.asarray(rescore(list(traj.input_ids())), np.float64)
        mask = traj.loss_mask() > 0
        gap = float(np.max(np.abs(lp[mask] - traj.behaviour_logprobs()[mask])))
        if gap > atol:
            _fail(who, f"the re-scored log-probs of the captured tokens differ from the engine's by {gap:.2e} "
                       f"(> {atol:g})")
