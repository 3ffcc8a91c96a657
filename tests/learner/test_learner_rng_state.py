"""The learner's random streams in its checkpoint state: one stream per rank, every rank's saved
by rank 0 and restored rank by rank (learner/state.py; single process, one RandomStreams per
rank)."""
from __future__ import annotations

import logging

import pytest
import torch

from rllib_spear.learner import state as learner_state
from rllib_spear.learner.state import RandomStreams, own_state, restore_own_state, seeded_generator
from rllib_spear.learner.steps import StepGuard


def _streams(rank: int, world: int, seed: int = 0) -> RandomStreams:
    return RandomStreams(seed, rank, world)


def _checkpoint(streams: RandomStreams) -> dict:
    """The learner's own entry, as rank 0's get_state writes it."""
    return own_state(streams, StepGuard(), None)


def _restore(streams: RandomStreams, own: dict) -> None:
    restore_own_state(own, streams, StepGuard())


def _draw(streams: RandomStreams, n: int) -> None:
    """Advance both streams (as Clip-Cov and the entropy sample do)."""
    torch.randperm(100, generator=streams.cov)[:n]
    torch.rand(n, generator=streams.entropy)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)


def test_rank_zero_keeps_the_single_learner_stream_and_ranks_differ():
    legacy = torch.Generator().manual_seed(0 + 7919)
    assert torch.equal(seeded_generator(0, "cov_rng", 0).get_state(), legacy.get_state())
    r0 = torch.rand(4, generator=seeded_generator(0, "cov_rng", 0))
    r1 = torch.rand(4, generator=seeded_generator(0, "cov_rng", 1))
    e0 = torch.rand(4, generator=seeded_generator(0, "entropy_rng", 0))
    assert not torch.equal(r0, r1) and not torch.equal(r0, e0)


def test_every_rank_restores_its_own_streams():
    ranks = [_streams(r, 2) for r in range(2)]
    assert not _same(ranks[0].state(), ranks[1].state())
    _draw(ranks[0], 3)
    _draw(ranks[1], 7)
    saved = [s.state() for s in ranks]
    # what the end of an update does (ranks.gather_objects): rank 0 learns every rank's states
    for s in ranks:
        s.remember_ranks(saved)
    own = _checkpoint(ranks[0])  # RLlib asks rank 0 only
    for r in range(2):
        _draw(ranks[r], 5)  # the run goes on, then restores
        _restore(ranks[r], own)
        assert _same(ranks[r].state(), saved[r]), r
    # a fresh 2-rank group restores the same
    for r in range(2):
        fresh = _streams(r, 2)
        _restore(fresh, own)
        assert _same(fresh.state(), saved[r])


def test_more_ranks_than_saved_reseed_with_a_warning(caplog):
    single = _streams(0, 1)
    _draw(single, 4)
    own = _checkpoint(single)
    saved = single.state()
    r1 = _streams(1, 2)
    _draw(r1, 2)
    with caplog.at_level(logging.WARNING, logger=learner_state.__name__):
        _restore(r1, own)
    assert "reseeds" in caplog.text
    assert _same(r1.state(), {s: seeded_generator(0, s, 1).get_state() for s in ("cov_rng", "entropy_rng")})
    r0 = _streams(0, 2)
    _restore(r0, own)
    assert _same(r0.state(), saved)
    # rank 0 now checkpoints rank 0's saved and rank 1's seeded states
    assert sorted(_checkpoint(r0)["rank_rng"]) == [0, 1]


def test_an_older_checkpoint_holds_rank_zero_only():
    single = _streams(0, 1)
    _draw(single, 4)
    old = {k: v for k, v in _checkpoint(single).items() if k not in ("rank_rng", "step_guard")}
    fresh = _streams(0, 1)
    _restore(fresh, old)
    assert _same(fresh.state(), single.state())


@pytest.mark.parametrize("world", [1, 3])
def test_initial_state_lists_every_rank(world):
    ranks = _checkpoint(_streams(0, world, seed=5))["rank_rng"]
    assert sorted(ranks) == list(range(world))
    last = {s: seeded_generator(5, s, world - 1).get_state() for s in ("cov_rng", "entropy_rng")}
    assert _same(ranks[world - 1], last)


def test_the_entry_carries_the_skip_counters_and_the_shards_folder():
    guard = StepGuard()
    guard.record(False)
    own = own_state(_streams(0, 2), guard, 2)
    assert own["step_guard"] == {"skipped": 1, "consecutive": 1}
    assert own["sharded_state"] == {"dir": learner_state.SHARDED_STATE_DIR,
                                    "format": "torch.distributed.checkpoint", "world_size": 2}
    fresh = StepGuard()
    restore_own_state(own, _streams(0, 2), fresh)
    assert fresh.get_state() == guard.get_state()
