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
           "check_replay_buffer_contract"]

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
