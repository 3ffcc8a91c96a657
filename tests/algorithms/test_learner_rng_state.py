"""The learner's random streams in its checkpoint state: one stream per rank, every rank's saved
by rank 0 and restored rank by rank (learner_state; single process, the rank faked)."""
from __future__ import annotations

import logging

import pytest
import torch

from rllib_spear.algorithms.grpo import learner_state
from rllib_spear.algorithms.grpo.learner_state import LEARNER_STATE_KEY, LearnerStateMixin, seeded_generator


class _Base:
    def get_state(self, components=None, *, not_components=None, **kwargs):
        return {}

    def set_state(self, state):
        pass


class _Learner(LearnerStateMixin, _Base):
    is_sharded = False


def _at(monkeypatch, rank: int, world: int) -> None:
    monkeypatch.setattr(learner_state, "rank", lambda: rank)
    monkeypatch.setattr(learner_state, "world_size", lambda: world)


def _learner(monkeypatch, rank: int, world: int, seed: int = 0) -> _Learner:
    _at(monkeypatch, rank, world)
    learner = _Learner()
    learner._seed_generators(seed)
    return learner


def _draw(learner: _Learner, n: int) -> None:
    """Advance both streams (as Clip-Cov and the entropy sample do)."""
    torch.randperm(100, generator=learner._cov_generator)[:n]
    torch.rand(n, generator=learner._entropy_generator)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)


def test_rank_zero_keeps_the_single_learner_stream_and_ranks_differ():
    legacy = torch.Generator().manual_seed(0 + 7919)
    assert torch.equal(seeded_generator(0, "cov_rng", 0).get_state(), legacy.get_state())
    r0 = torch.rand(4, generator=seeded_generator(0, "cov_rng", 0))
    r1 = torch.rand(4, generator=seeded_generator(0, "cov_rng", 1))
    e0 = torch.rand(4, generator=seeded_generator(0, "entropy_rng", 0))
    assert not torch.equal(r0, r1) and not torch.equal(r0, e0)


def test_every_rank_restores_its_own_streams(monkeypatch):
    ranks = [_learner(monkeypatch, r, 2) for r in range(2)]
    assert not _same(ranks[0]._rng_state(), ranks[1]._rng_state())
    _draw(ranks[0], 3)
    _draw(ranks[1], 7)
    saved = [lr._rng_state() for lr in ranks]
    # what the end of an update does (gather_objects): rank 0 learns every rank's states
    for lr in ranks:
        lr._remember_rank_rng_states(saved)
    _at(monkeypatch, 0, 2)
    state = ranks[0].get_state()  # RLlib asks rank 0 only
    for r in range(2):
        _draw(ranks[r], 5)  # the run goes on, then restores
        _at(monkeypatch, r, 2)
        ranks[r].set_state(state)
        assert _same(ranks[r]._rng_state(), saved[r]), r
    # a fresh 2-rank group restores the same
    for r in range(2):
        fresh = _learner(monkeypatch, r, 2)
        fresh.set_state(state)
        assert _same(fresh._rng_state(), saved[r])


def test_more_ranks_than_saved_reseed_with_a_warning(monkeypatch, caplog):
    single = _learner(monkeypatch, 0, 1)
    _draw(single, 4)
    state = single.get_state()
    saved = single._rng_state()
    r1 = _learner(monkeypatch, 1, 2)
    _draw(r1, 2)
    with caplog.at_level(logging.WARNING, logger=learner_state.__name__):
        r1.set_state(state)
    assert "reseeds" in caplog.text
    assert _same(r1._rng_state(), {s: seeded_generator(0, s, 1).get_state() for s in ("cov_rng", "entropy_rng")})
    r0 = _learner(monkeypatch, 0, 2)
    r0.set_state(state)
    assert _same(r0._rng_state(), saved)
    # rank 0 now checkpoints rank 0's saved and rank 1's seeded states
    assert sorted(r0.get_state()[LEARNER_STATE_KEY]["rank_rng"]) == [0, 1]


def test_an_older_checkpoint_holds_rank_zero_only(monkeypatch):
    single = _learner(monkeypatch, 0, 1)
    _draw(single, 4)
    old = {LEARNER_STATE_KEY: {k: v for k, v in single.get_state()[LEARNER_STATE_KEY].items() if k != "rank_rng"}}
    fresh = _learner(monkeypatch, 0, 1)
    fresh.set_state(old)
    assert _same(fresh._rng_state(), single._rng_state())


@pytest.mark.parametrize("world", [1, 3])
def test_initial_state_lists_every_rank(monkeypatch, world):
    learner = _learner(monkeypatch, 0, world, seed=5)
    ranks = learner.get_state()[LEARNER_STATE_KEY]["rank_rng"]
    assert sorted(ranks) == list(range(world))
    last = {s: seeded_generator(5, s, world - 1).get_state() for s in ("cov_rng", "entropy_rng")}
    assert _same(ranks[world - 1], last)
