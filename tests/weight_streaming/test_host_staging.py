"""The host staging buffer of the weight sync's host path (``weight_streaming/staging.py``;
docs/design.md "Weight streaming", the host path): a staged bucket unpacks to the same bytes,
the buffer is reused and grows only for a larger bucket, pinning is asked for only with CUDA,
and reusing it never lets a sync deliver stale or overwritten weights (the object store's
``ray.put`` and the collective's broadcast are done with the bytes before the next bucket is
staged)."""
from __future__ import annotations

import pickle
import threading

import pytest
import torch

from rllib_spear.weight_streaming import HostStaging, iter_buckets, unpack_bucket, wire_dtype_of
from rllib_spear.weight_streaming import staging as staging_module
from rllib_spear.weight_streaming.staging import SECTION_ALIGN, on_host, pin_for


def _mixed(seed: int = 0, scale: float = 1.0) -> list[tuple[str, torch.Tensor]]:
    """Tensors of every kind a state dict holds: float32/bf16/fp16/fp64 matrices and vectors,
    integers, a bool mask, a 0-d scalar, an empty tensor and a non-contiguous (transposed) one."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) * scale

    return [("embed", r(7, 5)), ("norm.bf16", r(5).to(torch.bfloat16)), ("proj.fp16", r(3, 4).to(torch.float16)),
            ("ids", torch.randint(-9, 9, (6,), generator=g)), ("mask", torch.rand(4, generator=g) > 0.5),
            ("scale", r(1).reshape(())), ("empty", torch.empty(0, 3)), ("wide", r(3).double()),
            ("transposed", r(4, 6).t())]


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _assert_bitwise(got: dict, want: list[tuple[str, torch.Tensor]]) -> None:
    assert list(got) == [n for n, _ in want]
    for name, t in want:
        g = got[name]
        assert g.dtype == t.dtype and g.shape == t.shape, name
        assert _bytes(g) == _bytes(t), name


def _staged(staging: HostStaging, named, bucket_bytes: int = 2**20):
    """Stage every bucket, unpacking (and copying out) each before the next reuses the buffer."""
    out = {}
    for b in iter_buckets(iter(named), bucket_bytes, pack=False):
        staged = staging.pack(b)
        out.update({k: v.clone() for k, v in unpack_bucket(staged.meta, staged.buffers)})
    return out


def test_mixed_dtype_bucket_round_trips_bitwise():
    named = _mixed()
    staging = HostStaging()
    (bucket,) = iter_buckets(iter(named), 2**20, pack=False)
    staged = staging.pack(bucket)
    assert staged.meta is bucket.meta and not staged.items
    assert set(staged.buffers) == set(bucket.meta.buffer_bytes)
    base = staging.buffer.data_ptr()
    for dt, buf in staged.buffers.items():  # views of the one host buffer, one aligned section per dtype
        assert buf.numel() == bucket.meta.buffer_bytes[dt]
        assert buf.untyped_storage().data_ptr() == staging.buffer.untyped_storage().data_ptr()
        assert (buf.data_ptr() - base) % SECTION_ALIGN == 0
    # the unpacked tensors are views of the staged bytes, bitwise the originals
    _assert_bitwise(dict(unpack_bucket(staged.meta, staged.buffers)), named)
    # several buckets, each unpacked before the next is staged
    _assert_bitwise(_staged(HostStaging(), named, bucket_bytes=40), named)


def test_staged_wire_cast_equals_the_per_tensor_cast():
    """The sender casts each tensor to the wire dtype on its device (``LearnerWeights.iter``);
    staged, the bytes are those of the per-tensor cast (bf16 engines: float32 and float64 narrow,
    half / integer / bool tensors travel as they are)."""
    engine = torch.bfloat16
    named = _mixed(seed=1)
    wire = [(k, v.to(wire_dtype_of(v.dtype, engine))) for k, v in named]
    got = _staged(HostStaging(), wire, bucket_bytes=64)
    _assert_bitwise(got, [(k, v.to(wire_dtype_of(v.dtype, engine))) for k, v in named])
    assert got["embed"].dtype == got["wide"].dtype == torch.bfloat16
    assert got["proj.fp16"].dtype == torch.float16 and got["ids"].dtype == torch.int64


def test_the_buffer_is_reused_and_grows_only_for_a_larger_bucket():
    staging = HostStaging()
    assert staging.capacity == 0 and staging.buffer is None
    ptrs = []
    for sync in range(2):  # two syncs of the same sizes, new values
        named = _mixed(seed=sync)
        got = _staged(staging, named, bucket_bytes=64)
        _assert_bitwise(got, named)
        ptrs.append(staging.buffer.data_ptr())
    assert ptrs[0] == ptrs[1]
    size = staging.capacity
    small = [("a", torch.randn(3))]
    staged = staging.pack(next(iter_buckets(iter(small), 64, pack=False)))
    assert staging.capacity == size and staging.buffer.data_ptr() == ptrs[0]  # not shrunk, not moved
    assert staged.buffers["float32"].data_ptr() == ptrs[0]
    big = [("b", torch.randn(10 * size))]
    staging.pack(next(iter_buckets(iter(big), 64, pack=False)))
    assert staging.capacity == 40 * size  # grown to the larger bucket, exactly
    staging.release()
    assert staging.capacity == 0


def test_a_packed_bucket_is_refused():
    (packed,) = iter_buckets(iter([("a", torch.ones(2))]), 64)
    with pytest.raises(ValueError, match="pack=False"):
        HostStaging().pack(packed)


def test_pinned_only_for_cuda_tensors_with_cuda_available(monkeypatch):
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pin_for([cpu, cuda]) is True and pin_for([cpu]) is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pin_for([cuda]) is False
    # CPU tensors with CUDA "available": the buffer is allocated unpinned (pin_memory is never
    # asked for without a CUDA tensor, so this runs on a machine without CUDA)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    asked = []
    real = staging_module._host_buffer
    monkeypatch.setattr(staging_module, "_host_buffer", lambda n, pin: asked.append(pin) or real(n, False))
    staging = HostStaging()
    named = _mixed()
    _assert_bitwise(_staged(staging, named), named)
    assert asked == [False] and staging.pinned is False


def test_on_host_tells_cpu_buckets():
    (bucket,) = iter_buckets(iter(_mixed()), 2**20, pack=False)
    assert on_host(bucket)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the pinned device-to-host path")
def test_cuda_bucket_is_packed_on_the_device_into_a_pinned_buffer():
    named = [(k, v.cuda()) for k, v in _mixed()]
    staging = HostStaging()
    (bucket,) = iter_buckets(iter(named), 2**20, pack=False)
    assert not on_host(bucket)
    staged = staging.pack(bucket)
    assert staging.pinned and staging.buffer.is_pinned()
    _assert_bitwise(dict(unpack_bucket(staged.meta, staged.buffers)), [(k, v.cpu()) for k, v in named])


# ---------------------------------------------------------------------------------------- no stale bytes
class _Weights:
    """A learner's inference weights as the senders read them (``LearnerWeights``'s calls)."""

    def __init__(self, named: list[tuple[str, torch.Tensor]]) -> None:
        self.named = named
        self.seq = 1
        self.is_sharded = False

    @staticmethod
    def rank() -> int:
        return 0

    def version(self) -> int:
        return self.seq

    def iter(self, placeholders: bool = False, engine_dtype=None):
        yield from self.named

    def step(self) -> None:
        """The learner's next update: new values in place, a new version."""
        with torch.no_grad():
            for _, t in self.named:
                if t.is_floating_point():
                    t.add_(1.0)
                else:
                    t.copy_(~t if t.dtype == torch.bool else t + 1)
        self.seq += 1


def _snapshot(named) -> list[tuple[str, torch.Tensor]]:
    return [(k, v.clone()) for k, v in named]


@pytest.fixture(scope="module")
def ray_local():
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray


@pytest.mark.parametrize("keeps_reference", [False, True])
def test_object_store_syncs_through_a_reused_buffer_deliver_each_versions_weights(ray_local, monkeypatch,
                                                                                   keeps_reference):
    """Two syncs of the object-store sender, staged (as device tensors are) through one reused
    buffer: each sync's objects hold that version's weights, because ``ray.put`` copied them out
    of the buffer before it was reused. A put that kept a reference to the buffer instead
    (``keeps_reference``) is caught: the first sync's objects would hold the second's bytes."""
    from rllib_spear.weight_streaming import iter_bucket_tensors, put_bucket
    from rllib_spear.weight_streaming.transports import object_store as transport

    monkeypatch.setattr(transport, "on_host", lambda bucket: False)  # stage the CPU tensors as device ones
    if keeps_reference:
        monkeypatch.setattr(transport, "put_bucket", lambda b: put_bucket(b, put=lambda arrays: arrays))
    # the kept reference is read (serialised) only when fetched, after both syncs
    fetch = (lambda ref: pickle.loads(pickle.dumps(ref, protocol=5))) if keeps_reference else ray_local.get
    weights = _Weights(_mixed(seed=3))
    sender = transport.ObjectStoreSender(weights)

    def sync() -> list:
        out, last, start = [], False, True
        while not last:
            version, meta, ref, last = sender.put_next(64, start=start)
            out.append((meta, ref))
            start = False
        assert version == weights.version() and len(out) > 1  # several buckets through one buffer
        return out

    def received(refs) -> dict:
        return {k: v.clone() for k, v in iter_bucket_tensors(refs, [], fetch=fetch)}

    first_want = _snapshot(weights.named)
    first = sync()
    buffer = sender._staging.buffer.data_ptr()
    weights.step()
    second_want = _snapshot(weights.named)
    second = sync()
    assert sender._staging.buffer.data_ptr() == buffer  # the same buffer carried both syncs
    if keeps_reference:
        with pytest.raises(AssertionError):
            _assert_bitwise(received(first), first_want)
        return
    _assert_bitwise(received(first), first_want)
    _assert_bitwise(received(second), second_want)
    assert sender.sent_bytes() == sum(m.nbytes for m, _ in second)


def test_collective_syncs_through_a_reused_buffer_deliver_each_versions_weights():
    """Two broadcasts of the collective sender over a real gloo group: the receiver gets each
    version's weights bitwise, every bucket of both syncs staged in the same buffer."""
    from rllib_spear.weight_streaming.collective import join_group, open_store
    from rllib_spear.weight_streaming.receiver import receive_broadcast
    from rllib_spear.weight_streaming.transports.collective import CollectiveSender

    class Engine:
        version = 0

        def __init__(self):
            self.loaded = {}

        def load_weights_stream(self, pairs):
            for k, v in pairs:
                self.loaded[k] = v.clone()

    weights = _Weights(_mixed(seed=4))
    sender, engine = CollectiveSender(weights), Engine()
    store, host, port = open_store(2, timeout_s=60)
    groups, errors = {}, []

    def join(rank):
        try:
            groups[rank] = (join_group("staging", 2, store=store, timeout_s=60) if rank == 0 else
                            join_group("staging", 2, host=host, port=port, timeout_s=60))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def both(send, recv):
        out = {}

        def run(key, fn):
            try:
                out[key] = fn()
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=("send", send)), threading.Thread(target=run, args=("recv", recv))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        return out

    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    sender._group = groups[0]
    ptrs = []
    for _ in range(2):
        want = _snapshot(weights.named)
        out = both(lambda: sender.broadcast(64), lambda: receive_broadcast(engine, groups[1]))
        assert out["send"][0] == weights.version() and out["send"][1] > 1  # several buckets
        assert out["recv"] == (True, weights.version())
        _assert_bitwise({k: engine.loaded[k] for k, _ in want}, want)
        ptrs.append(sender._staging.buffer.data_ptr())
        weights.step()
    assert ptrs[0] == ptrs[1]
