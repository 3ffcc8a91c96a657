"""Advantage estimators: outcome group advantages (GRPO / Dr.GRPO, docs/algorithms.md 1.1),
SPADER's step-wise peer advantage (docs/algorithms.md 3.3) and GiGPO's anchor-state step groups
(docs/algorithms.md 3.5).

Pure numpy. Groups are always found by task uid (any hashable), never by batch position: the
released SPEAR math code assumed contiguous groups after the batch had been reordered, which
silently mixed tasks (docs/algorithms.md 2.5).
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

__all__ = [
    "group_indices",
    "group_advantages",
    "GROUP_STATS_OVER",
    "step_row_advantages",
    "group_reward_stats",
    "discounted_step_returns",
    "step_peer_advantages",
    "GIGPO_MODES",
    "gigpo_step_advantages",
    "gigpo_advantages",
    "broadcast_step_advantages",
]

#: Over what an outcome group's mean and std are taken (docs/algorithms.md 1.1): each trajectory
#: once (the papers), or each step row (the released agent tree: a trajectory of K steps counts K times).
GROUP_STATS_OVER = ("trajectories", "steps")

#: GiGPO normalizations (docs/algorithms.md 3.5): subtract the group mean, or also divide by its std.
GIGPO_MODES = ("mean_norm", "mean_std_norm")


def _as_rewards(rewards: Sequence[float] | np.ndarray, fn: str) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"{fn}: rewards must be 1-D, got shape {r.shape}")
    if r.size == 0:
        raise ValueError(f"{fn}: rewards is empty")
    if not np.all(np.isfinite(r)):
        raise ValueError(f"{fn}: rewards must be finite, got {r[~np.isfinite(r)][:3].tolist()}")
    return r


def _centered(g: np.ndarray, std_normalize: bool, eps: float) -> np.ndarray:
    """``g - mean(g)``, divided by ``std(g) + eps`` (unbiased) if ``std_normalize``; ``len(g) >= 2``.

    The mean and the squared deviations are summed with ``math.fsum`` (exactly rounded), so the
    result does not depend on the order of ``g``; a group whose values are all equal gets exactly
    0 (a rounded mean of equal values need not equal them: ``[0.1] * 3`` has a float mean
    ``0.1 + 1.4e-17``).
    """
    if np.all(g == g[0]):
        return np.zeros_like(g)
    mean = math.fsum(g) / len(g)
    d = g - mean
    if not std_normalize:
        return d
    std = math.sqrt(math.fsum(d * d) / (len(g) - 1))
    return d / (std + eps)


def group_indices(uids: Sequence[Hashable], n: int | None = None, fn: str = "group_indices"
                  ) -> dict[Hashable, list[int]]:
    """Map each uid to the batch positions holding it, in order of first appearance.

    ``n`` (if given) is the expected number of uids; a mismatch raises ValueError.
    """
    uids = list(uids)
    if n is not None and len(uids) != n:
        raise ValueError(f"{fn}: uids has {len(uids)} entries for {n} rewards")
    groups: dict[Hashable, list[int]] = {}
    for i, u in enumerate(uids):
        try:
            groups.setdefault(u, []).append(i)
        except TypeError as e:  # unhashable uid
            raise ValueError(f"{fn}: uids[{i}] is not hashable: {u!r}") from e
    return groups


def group_advantages(
    rewards: Sequence[float] | np.ndarray,
    uids: Sequence[Hashable],
    *,
    std_normalize: bool,
    eps: float = 1e-6,
) -> np.ndarray:
    """Outcome group advantage of each trajectory (docs/algorithms.md 1.1).

    With g the group of trajectory i (all trajectories sharing its uid):

    - GRPO (``std_normalize=True``):  ``A_i = (R_i - mean_g R) / (std_g R + eps)``, std unbiased (n-1);
    - Dr.GRPO / Dr.BoT / SPEAR (``std_normalize=False``): ``A_i = R_i - mean_g R``.

    A group of size 1 uses mean 0 and std 1 (released ``compute_grpo_outcome_advantage``), so its
    advantage is ``R_i / (1 + eps)`` (GRPO) or ``R_i`` (Dr.GRPO). A group whose rewards are all
    equal gets advantage exactly 0 (float rounding of the mean would leave about 1e-17, which SIL
    admission, ``A_i > 0``, would read as a positive advantage). The result does not depend on the
    order of the batch, to the last bit.

    Returns float64 array of shape [N].
    """
    r = _as_rewards(rewards, "group_advantages")
    if eps < 0:
        raise ValueError(f"group_advantages: eps must be >= 0, got {eps}")
    groups = group_indices(uids, len(r), "group_advantages")
    adv = np.empty_like(r)
    for idx in groups.values():
        g = r[idx]
        if len(idx) == 1:
            # Released convention: a singleton has no peers, mean 0 / std 1.
            adv[idx] = g / (1.0 + eps) if std_normalize else g
        else:
            adv[idx] = _centered(g, std_normalize, eps)
    return adv


def step_row_advantages(
    row_scores: Sequence[Sequence[float] | np.ndarray],
    uids: Sequence[Hashable],
    *,
    std_normalize: bool,
    eps: float = 1e-6,
) -> list[np.ndarray]:
    """Outcome group advantage with the group statistics over step rows (docs/algorithms.md 1.1,
    ``group_stats_over="steps"``: the released agent tree's ``compute_mean_std_cross_*=True``).

    Trajectory i contributes one row per step, with scores ``s_{i,k}`` (its episode score, less
    the penalty of that step where the caller splits one off, 3.5). The group g of a uid holds
    every row of its trajectories, ``n_g = sum_i K_i`` values:

        A_{i,k} = s_{i,k} - mean_g s                          (``std_normalize=False``)
                = (s_{i,k} - mean_g s) / (std_g s + eps)      (std unbiased over the n_g rows)

    so a trajectory of K steps weighs K times. As in :func:`group_advantages` (which this calls
    on the flattened rows), a group of one row uses mean 0, std 1, and an all-equal group gets
    exactly 0: "one row" counts rows, so a lone 1-step trajectory keeps its score while a lone
    3-step trajectory with equal rows gets 0.

    Returns one float64 array per trajectory, of the length of its ``row_scores``.
    """
    rows = [np.asarray(r, dtype=np.float64).reshape(-1) for r in row_scores]
    uids = list(uids)
    if len(uids) != len(rows):
        raise ValueError(f"step_row_advantages: uids has {len(uids)} entries for {len(rows)} trajectories")
    flat = np.concatenate(rows) if rows else np.zeros(0)
    if flat.size == 0:
        return [np.zeros(0) for _ in rows]
    flat_uids = [u for u, r in zip(uids, rows) for _ in range(len(r))]
    adv = group_advantages(flat, flat_uids, std_normalize=std_normalize, eps=eps)
    return np.split(adv, np.cumsum([len(r) for r in rows])[:-1])


def group_reward_stats(
    rewards: Sequence[float] | np.ndarray,
    uids: Sequence[Hashable],
    *,
    ddof: int = 0,
    weights: Sequence[int] | None = None,
) -> dict[Hashable, tuple[float, float]]:
    """Per-group ``(mean, std)`` of the rewards, keyed by uid (order of first appearance).

    ``mean_g = sum R / n``; ``std_g = sqrt(sum (R - mean_g)^2 / (n - ddof))``.

    ``weights`` (integers >= 0, one per reward): reward i counts ``w_i`` times, as the rows of a
    trajectory of ``w_i`` steps do with ``group_stats_over="steps"`` (docs/algorithms.md 1.1):
    ``mean_g = sum w R / n``, ``std_g = sqrt(sum w (R - mean_g)^2 / (n - ddof))``, ``n = sum w``.

    Used for the SIL baseline history (docs/algorithms.md 2.2, step 3). The default ``ddof=0``
    (population std) follows the released agent tree (verl-agent ``TrajectoryBufferBatch.update_batch`` uses
    ``np.std`` over uid groups); the math tree used ``torch.std`` (unbiased, ``ddof=1``). A group of
    size 1 has std 0 with ``ddof=0``; with ``ddof=1`` it raises (undefined).
    """
    r = _as_rewards(rewards, "group_reward_stats")
    if ddof not in (0, 1):
        raise ValueError(f"group_reward_stats: ddof must be 0 or 1, got {ddof}")
    w = np.ones(len(r), np.int64) if weights is None else np.asarray(weights)
    if w.shape != r.shape or (w.size and (not np.issubdtype(w.dtype, np.integer) or w.min() < 0)):
        raise ValueError(f"group_reward_stats: weights must be {len(r)} integers >= 0, got {weights!r:.80}")
    out: dict[Hashable, tuple[float, float]] = {}
    for u, idx in group_indices(uids, len(r), "group_reward_stats").items():
        n = int(w[idx].sum())
        if n <= ddof:
            raise ValueError(
                f"group_reward_stats: group {u!r} has {n} reward(s); ddof={ddof} needs more"
            )
        g = r[idx] if weights is None else np.repeat(r[idx], w[idx])
        out[u] = (float(g.mean()), float(g.std(ddof=ddof)))
    return out


def discounted_step_returns(step_rewards: Sequence[float] | np.ndarray, gamma: float) -> np.ndarray:
    """Reward-to-go of each step: ``G_k = sum_{j>=k} gamma^(j-k) r_j`` (docs/algorithms.md 3.3).

    Computed backwards, ``G_k = r_k + gamma * G_{k+1}``. An empty sequence gives an empty array.
    """
    r = np.asarray(step_rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"discounted_step_returns: step_rewards must be 1-D, got shape {r.shape}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"discounted_step_returns: gamma must be in [0, 1], got {gamma}")
    if not np.all(np.isfinite(r)):
        raise ValueError("discounted_step_returns: step_rewards must be finite")
    out = np.zeros_like(r)
    running = 0.0
    for k in range(len(r) - 1, -1, -1):
        running = r[k] + gamma * running
        out[k] = running
    return out


def step_peer_advantages(
    step_rewards: Sequence[Sequence[float]],
    uids: Sequence[Hashable],
    *,
    gamma: float = 0.9,
    eps: float = 1e-6,
) -> list[np.ndarray]:
    """SPADER step-wise peer advantage (docs/algorithms.md 3.3).

    For each group (same uid) of G trajectories and each step index k up to the group's longest
    trajectory, with ``G_k(i)`` the discounted return (``discounted_step_returns``) and
    ``G_k(i) = 0`` for a trajectory that has no step k (padded):

        mu_k  = (1/G) sum_i G_k(i)
        var_k = (1/G) sum_i (G_k(i) - mu_k)^2          (population variance)
        A_k(i) = (G_k(i) - mu_k) / sqrt(var_k + eps)

    Returns one float64 array per trajectory with exactly its own number of steps (the padded
    steps' advantages are 0 by definition and are not returned). A group of size 1 gets 0.
    """
    if len(step_rewards) == 0:
        raise ValueError("step_peer_advantages: step_rewards is empty")
    if eps < 0:
        raise ValueError(f"step_peer_advantages: eps must be >= 0, got {eps}")
    returns = [discounted_step_returns(r, gamma) for r in step_rewards]
    groups = group_indices(uids, len(returns), "step_peer_advantages")
    out: list[np.ndarray] = [np.zeros(0)] * len(returns)
    for idx in groups.values():
        k_max = max(len(returns[i]) for i in idx)
        # Padded matrix: missing steps stay 0 and still count in the peer mean ("baseline includes
        # zeros for stopped agents", released compute_masked_step_grpo_advantage).
        mat = np.zeros((len(idx), k_max))
        for row, i in enumerate(idx):
            mat[row, : len(returns[i])] = returns[i]
        mu = mat.mean(axis=0)
        var = mat.var(axis=0)  # ddof=0
        adv = (mat - mu) / np.sqrt(var + eps)
        for row, i in enumerate(idx):
            out[i] = adv[row, : len(returns[i])].copy()
    return out


def _check_mode(mode: str, fn: str) -> bool:
    """``mode`` is a GiGPO mode; returns whether it divides by the std."""
    if mode not in GIGPO_MODES:
        raise ValueError(f"{fn}: mode must be one of {list(GIGPO_MODES)}, got {mode!r}")
    return mode == "mean_std_norm"


def gigpo_step_advantages(
    step_returns: Sequence[Sequence[float] | np.ndarray],
    anchors: Sequence[Sequence[Hashable | None]],
    uids: Sequence[Hashable],
    *,
    mode: str = "mean_std_norm",
    eps: float = 1e-6,
) -> list[np.ndarray]:
    """GiGPO step relative advantage over anchor-state groups (docs/algorithms.md 3.5).

    Step k of trajectory i belongs to the step group keyed by ``(uids[i], anchors[i][k])``: every
    step of the same task whose anchor (the state it acted from) is equal, across trajectories
    and within one (a state revisited twice in one episode puts both steps in the group). Two
    uids never share a group. With ``G`` the values ``step_returns[i][k]`` of one step group S:

        mean_norm:      A_st = G - mean_S G
        mean_std_norm:  A_st = (G - mean_S G) / (std_S G + eps)       std unbiased (n-1)

    A step group of size 1 gets 0 (released ``step_norm_reward``: a singleton's mean is its own
    value), and so does a step whose anchor is ``None`` (no known state: a group of its own). A
    group whose values are all equal gets exactly 0, and the result does not depend on the order
    of the batch (the sums are exactly rounded). Float64 throughout; the released code computes
    in float32, where an all-equal group can come out non-zero (a float32 mean of equal values
    need not equal them, and ``mean_std_norm`` divides that residue by ``0 + eps``).

    Returns one float64 array per trajectory, of the length of its ``step_returns``.
    """
    fn = "gigpo_step_advantages"
    if len(step_returns) == 0:
        raise ValueError(f"{fn}: step_returns is empty")
    std_normalize = _check_mode(mode, fn)
    if eps < 0:
        raise ValueError(f"{fn}: eps must be >= 0, got {eps}")
    uids = list(uids)
    group_indices(uids, len(step_returns), fn)  # count and hashability of the uids
    if len(anchors) != len(step_returns):
        raise ValueError(f"{fn}: anchors has {len(anchors)} entries for {len(step_returns)} trajectories")
    rets = []
    for i, r in enumerate(step_returns):
        g = np.asarray(r, dtype=np.float64)
        if g.ndim != 1:
            raise ValueError(f"{fn}: step_returns[{i}] must be 1-D, got shape {g.shape}")
        if not np.all(np.isfinite(g)):
            raise ValueError(f"{fn}: step_returns[{i}] must be finite")
        if len(anchors[i]) != len(g):
            raise ValueError(f"{fn}: anchors[{i}] has {len(anchors[i])} entries for {len(g)} steps")
        rets.append(g)
    groups: dict[tuple[Hashable, Hashable], list[tuple[int, int]]] = {}
    for i, (u, keys) in enumerate(zip(uids, anchors)):
        for k, key in enumerate(keys):
            if key is None:
                continue
            try:
                groups.setdefault((u, key), []).append((i, k))
            except TypeError as e:  # unhashable anchor
                raise ValueError(f"{fn}: anchors[{i}][{k}] is not hashable: {key!r:.80}") from e
    out = [np.zeros_like(g) for g in rets]
    for members in groups.values():
        if len(members) < 2:
            continue  # singleton step group: 0
        adv = _centered(np.array([rets[i][k] for i, k in members]), std_normalize, eps)
        for (i, k), a in zip(members, adv):
            out[i][k] = a
    return out


def gigpo_advantages(
    episode_rewards: Sequence[float] | np.ndarray,
    step_rewards: Sequence[Sequence[float]],
    anchors: Sequence[Sequence[Hashable | None]],
    uids: Sequence[Hashable],
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    mode: str = "mean_std_norm",
    eps: float = 1e-6,
    step_penalties: Sequence[Sequence[float]] | None = None,
    group_stats_over: str = "trajectories",
) -> list[np.ndarray]:
    """GiGPO per-step advantage (docs/algorithms.md 3.5): episode part plus weighted step part.

    With g the group of trajectory i (its uid), ``R_i = episode_rewards[i]`` (the episode score:
    outcome, named bonus terms and environment rewards, without the step penalties),
    ``r = step_rewards[i]`` (what the environment paid per step, outcome on the last step, no
    bonus terms and no penalties) and ``p = step_penalties[i]`` (the penalty each step's action
    was charged, e.g. -0.1 for an invalid action; zeros when None):

        G_k(i)    = sum_{j>=k} gamma^(j-k) r_j(i) + p_k(i)        the penalty after discounting: its row only
        A_ep(i,k) = norm_g(R_i + sum_j p_j(i))                    ``group_stats_over="trajectories"``: each trajectory once
                  = norm_rows(R_i + p_k(i))                       ``"steps"``: over every step row of the group
        A_st_k(i) = gigpo_step_advantages(G, anchors, uids, mode)
        A_k(i)    = A_ep(i,k) + step_weight * A_st_k(i)

    ``norm`` is ``x - mean`` (mean_norm) or ``(x - mean) / (std + eps)`` (mean_std_norm, std
    unbiased); a group of one value uses mean 0, std 1 (:func:`group_advantages`,
    :func:`step_row_advantages`). ``"steps"`` is the released agent tree (a trajectory of K steps
    weighs K times, each row carries its own penalty); ``"trajectories"`` the paper's episode
    advantage. Float64, exact zeros for all-equal groups (see ``gigpo_step_advantages``).

    Returns one float64 array per trajectory, one entry per step reward.
    """
    fn = "gigpo_advantages"
    r = _as_rewards(episode_rewards, fn)
    std_normalize = _check_mode(mode, fn)
    if group_stats_over not in GROUP_STATS_OVER:
        raise ValueError(f"{fn}: group_stats_over must be one of {list(GROUP_STATS_OVER)}, got {group_stats_over!r}")
    if len(step_rewards) != len(r):
        raise ValueError(f"{fn}: step_rewards has {len(step_rewards)} entries for {len(r)} episode_rewards")
    if (isinstance(step_weight, bool) or not isinstance(step_weight, (int, float, np.integer, np.floating))
            or not math.isfinite(step_weight) or step_weight < 0):
        raise ValueError(f"{fn}: step_weight must be a finite number >= 0, got {step_weight!r}")
    pens = _step_penalties(step_penalties, step_rewards, fn)
    if group_stats_over == "steps":
        a_ep = step_row_advantages([r[i] + pens[i] for i in range(len(r))], uids,
                                   std_normalize=std_normalize, eps=eps)
    else:
        totals = np.array([r[i] + math.fsum(pens[i]) for i in range(len(r))])
        a_ep = list(group_advantages(totals, uids, std_normalize=std_normalize, eps=eps))
    returns = [discounted_step_returns(x, gamma) + p for x, p in zip(step_rewards, pens)]
    a_st = gigpo_step_advantages(returns, anchors, uids, mode=mode, eps=eps)
    return [a_ep[i] + step_weight * a_st[i] for i in range(len(r))]


def _step_penalties(step_penalties: Sequence[Sequence[float]] | None, step_rewards: Sequence[Sequence[float]],
                    fn: str) -> list[np.ndarray]:
    """One float64 array per trajectory, of its number of step rewards (zeros when None)."""
    if step_penalties is None:
        return [np.zeros(len(x)) for x in step_rewards]
    if len(step_penalties) != len(step_rewards):
        raise ValueError(f"{fn}: step_penalties has {len(step_penalties)} entries for {len(step_rewards)} trajectories")
    out = []
    for i, (p, x) in enumerate(zip(step_penalties, step_rewards)):
        a = np.asarray(p, dtype=np.float64)
        if a.shape != (len(x),) or not np.all(np.isfinite(a)):
            raise ValueError(f"{fn}: step_penalties[{i}] must be {len(x)} finite numbers (one per step), got {p!r:.80}")
        out.append(a)
    return out


def broadcast_step_advantages(token_steps: np.ndarray, step_advantages: Sequence[float] | np.ndarray
                              ) -> np.ndarray:
    """Per-token advantage from per-step advantages.

    ``out[t] = A[s_t]`` if ``0 <= s_t < len(A)``, else 0, where ``s_t = token_steps[t]`` (-1 on
    prompt and observation tokens). Steps beyond ``len(A)`` get 0 (a padded step has advantage 0).
    Works for any shape of ``token_steps``; returns float32 of the same shape (the dtype of
    ``TokenBatch.advantages``).
    """
    steps = np.asarray(token_steps)
    if steps.size and not np.issubdtype(steps.dtype, np.integer):
        raise ValueError(
            f"broadcast_step_advantages: token_steps must hold integers, got dtype {steps.dtype}"
        )
    adv = np.asarray(step_advantages, dtype=np.float64)
    if adv.ndim != 1:
        raise ValueError(
            f"broadcast_step_advantages: step_advantages must be 1-D, got shape {adv.shape}"
        )
    steps = steps.astype(np.int64, copy=False)
    out = np.zeros(steps.shape, dtype=np.float32)
    valid = (steps >= 0) & (steps < len(adv))
    out[valid] = adv[steps[valid]]
    return out
