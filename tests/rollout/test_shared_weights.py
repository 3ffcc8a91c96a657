"""Unit tests of the shared-memory weight transport (no Ray; docs/design.md "Weight
streaming"): the sender's tensors move into named shared memory and stay the same objects, a
reader sees every later in-place update, re-allocated tensors are noticed, blocks are unlinked."""
from __future__ import annotations

import pytest
import torch

from rllib_spear.weight_streaming.shared_memory import SharedWeights, SharedWeightsReader


def _model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Embedding(11, 4), torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    m.register_buffer("scale", torch.ones(2, dtype=torch.bfloat16))  # two dtypes: two blocks
    return m


def test_tensors_move_into_shared_memory_and_stay_the_same_objects():
    m = _model()
    named = list(m.state_dict(keep_vars=True).items())
    before = {k: v.detach().clone() for k, v in named}
    ptrs = {k: v.data_ptr() for k, v in named}
    params = list(m.parameters())
    shared = SharedWeights(named)
    try:
        assert sorted(shared.block_names) == ["bfloat16", "float32"]
        assert shared.nbytes == sum(v.numel() * v.element_size() for _, v in named)
        for k, v in m.state_dict(keep_vars=True).items():
            assert v.data_ptr() != ptrs[k] and torch.equal(v.detach(), before[k]) and v.dtype == before[k].dtype
        assert list(m.parameters()) == params and all(a is b for a, b in zip(m.parameters(), params))
        assert shared.holds(named)
        reader = SharedWeightsReader()
        handle = shared.handle(3, "node-a")
        assert handle.version == 3 and handle.node_id == "node-a"
        got = dict(reader.tensors(handle))
        assert list(got) == [k for k, _ in named]
        assert all(torch.equal(got[k], before[k]) for k in before)
        # an optimizer step updates the shared memory itself: the reader sees it
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        m(torch.tensor([1, 2])).sum().backward()
        opt.step()
        got = dict(reader.tensors(handle))
        changed = [k for k, v in m.state_dict().items() if not torch.equal(v, before[k])]
        assert changed and all(torch.equal(got[k], m.state_dict()[k]) for k in got)
        del got
        reader.close()
    finally:
        shared.unlink()


def test_tied_tensor_is_placed_once_and_a_reallocated_one_is_noticed():
    emb = torch.nn.Parameter(torch.randn(5, 2))
    other = torch.nn.Parameter(torch.randn(3))
    named = [("embed", emb), ("w", other), ("head", emb)]
    shared = SharedWeights(named)
    try:
        assert shared.meta.names == ["embed", "w"]
        assert shared.holds(named)
        other.data = other.data.clone()  # e.g. a .to() that re-allocated it
        assert not shared.holds(named)
    finally:
        shared.unlink()


def test_unlinked_blocks_leave_no_name_and_stay_readable_where_mapped():
    """After every runner mapped the blocks they are unlinked: /dev/shm has nothing left, the
    learner's tensors and the mapped reader keep working, a reader that mapped nothing is told
    what to do."""
    import os

    t = torch.nn.Parameter(torch.randn(8))
    shared = SharedWeights([("t", t)])
    names = list(shared.block_names.values())
    reader = SharedWeightsReader()
    assert torch.equal(dict(reader.tensors(shared.handle(1, "n")))["t"], t.detach())
    shared.unlink()
    assert not shared.linked and not shared.handle(2, "n").linked
    assert not any(os.path.exists(os.path.join("/dev/shm", n)) for n in names)
    with torch.no_grad():
        t.mul_(2)  # the learner's next step, on memory that has no name any more
    assert torch.equal(dict(reader.tensors(shared.handle(2, "n")))["t"], t.detach())
    assert reader.has_mapped(shared.handle(2, "n")) and reader.can_read(shared.handle(2, "n"))
    fresh = SharedWeightsReader()  # a runner that restarted after the unlink
    assert not fresh.can_read(shared.handle(2, "n"))
    with pytest.raises(RuntimeError, match="unlinked before this runner mapped it"):
        list(fresh.tensors(shared.handle(2, "n")))
    # the learner shares new blocks: both readers map them (the old mapping is dropped)
    new = SharedWeights([("t", t)])
    try:
        h = new.handle(2, "n")
        assert h.blocks != shared.handle(2, "n").blocks and fresh.can_read(h) and not reader.has_mapped(h)
        assert torch.equal(dict(fresh.tensors(h))["t"], t.detach())
        assert torch.equal(dict(reader.tensors(h))["t"], t.detach()) and reader.has_mapped(h)
    finally:
        new.unlink()


def test_gpu_or_meta_tensors_are_refused():
    with pytest.raises(ValueError, match="CPU tensors"):
        SharedWeights([("m", torch.empty(2, device="meta"))])
