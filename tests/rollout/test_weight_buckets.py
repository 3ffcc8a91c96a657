"""Unit tests of the weight-stream buckets, the runner's bucket stream and the engines' streamed
loads (no Ray: the object store is replaced by a dict; docs/design.md "Weight streaming")."""
from __future__ import annotations

import pytest
import torch

from rllib_spear.weight_streaming import BucketStream, iter_bucket_tensors, iter_buckets, put_bucket, unpack_bucket


def _named(sizes, dtypes=None):
    g = torch.Generator().manual_seed(0)
    out = []
    for i, n in enumerate(sizes):
        dt = (dtypes or [torch.float32] * len(sizes))[i]
        out.append((f"t{i}", torch.randn(n, generator=g).to(dt)))
    return out


def test_buckets_keep_order_names_and_bounds():
    named = _named([10, 20, 30, 5, 40, 1], [torch.float32, torch.bfloat16, torch.float32,
                                            torch.float16, torch.float32, torch.bfloat16])
    bound = 100  # bytes
    buckets = list(iter_buckets(iter(named), bound))
    # names in order, each once, across the buckets
    assert [n for b in buckets for n in b.meta.names] == [n for n, _ in named]
    assert [b.meta.index for b in buckets] == list(range(len(buckets)))
    for b in buckets:
        assert b.meta.nbytes <= bound or len(b.meta.tensors) == 1
        assert {dt: buf.numel() for dt, buf in b.buffers.items()} == b.meta.buffer_bytes
        assert all(buf.dtype == torch.uint8 for buf in b.buffers.values())
    # greedy: a bucket is closed only when the next tensor would not fit
    sizes = [t.numel() * t.element_size() for _, t in named]
    expect, cur, cur_n = [], [], 0
    for i, n in enumerate(sizes):
        if cur and cur_n + n > bound:
            expect.append(cur)
            cur, cur_n = [], 0
        cur.append(f"t{i}")
        cur_n += n
    expect.append(cur)
    assert [b.meta.names for b in buckets] == expect
    # exact round trip, dtypes and shapes kept
    got = dict(kv for b in buckets for kv in unpack_bucket(b.meta, b.buffers))
    for n, t in named:
        assert got[n].dtype == t.dtype and got[n].shape == t.shape
        assert torch.equal(got[n], t)


def test_tensor_larger_than_bucket_goes_alone():
    named = [("small", torch.ones(2)), ("big", torch.arange(100.0).reshape(10, 10)), ("s2", torch.zeros(3)),
             ("scalar", torch.tensor(7.0))]
    buckets = list(iter_buckets(named, 16))  # 4 float32
    assert [b.meta.names for b in buckets] == [["small"], ["big"], ["s2", "scalar"]]  # 12 + 4 bytes fit
    assert buckets[1].meta.nbytes == 400
    got = dict(kv for b in buckets for kv in unpack_bucket(b.meta, b.buffers))
    assert torch.equal(got["big"], named[1][1]) and got["scalar"].shape == ()


def test_none_tensors_are_consumed_and_bad_bound_raises():
    assert list(iter_buckets([("a", None), ("b", None)], 10)) == []
    with pytest.raises(ValueError):
        next(iter_buckets([("a", torch.ones(1))], 0))


def _store():
    """A stand-in object store: ``put`` keeps a serialised copy (as ray.put does), ``get`` reads it."""
    import pickle

    objects = {}

    def put(value):
        key = len(objects)
        objects[key] = pickle.loads(pickle.dumps(value, protocol=5))
        return key

    return objects, put, objects.__getitem__


class _RecordingEngine:
    version = 3

    def __init__(self):
        self.loaded = {}

    def load_weights_stream(self, pairs):
        for k, v in pairs:
            self.loaded[k] = v.clone()


class _FailingEngine(_RecordingEngine):
    def load_weights_stream(self, pairs):
        for k, v in pairs:
            raise RuntimeError("loader failed")


def _stream(engine, buckets, version, put, get, skip=()):
    """Put each bucket and add it to a BucketStream (except the indices in ``skip``); returns
    the stream (not finished) and the number of buckets."""
    stream = BucketStream(engine, version, fetch=get)
    n = 0
    for b in buckets:
        ref = put_bucket(b, put=put)
        if b.meta.index not in skip:
            stream.add(b.meta, ref)
        n += 1
    return stream, n


def test_stream_applies_every_bucket_then_sets_the_version():
    named = _named([8, 8, 8, 8])
    objects, put, get = _store()
    eng = _RecordingEngine()
    stream, n = _stream(eng, iter_buckets(named, 64), 7, put, get)
    assert n == 2 and len(objects) == 2
    assert stream.finish(n)
    assert eng.version == 7 and stream.applied == [0, 1]
    assert all(torch.equal(eng.loaded[n], t) for n, t in named)
    with pytest.raises(RuntimeError, match="already finished"):
        stream.add(None, None)


def test_stream_applies_a_bucket_before_the_next_is_sent():
    """The runner's copy of bucket k overlaps the sender's put of bucket k+1: a bucket is
    applied in the background as soon as it is added, before finish() and before the next."""
    import time

    named = _named([8, 8, 8])
    _, put, get = _store()
    eng = _RecordingEngine()
    stream = BucketStream(eng, 4, fetch=get)
    buckets = list(iter_buckets(named, 32, pack=False))
    for k, b in enumerate(buckets):
        stream.add(b.meta, put_bucket(b, put=put))
        deadline = time.monotonic() + 30
        while stream.applied != list(range(k + 1)) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert stream.applied == list(range(k + 1)), "bucket not applied before the next was sent"
        assert eng.version == 3  # the version moves only once all arrived
    assert stream.finish(len(buckets)) and eng.version == 4


@pytest.mark.parametrize("pack", [True, False])
def test_unpacked_and_packed_buckets_put_the_same_weights(pack):
    """The object store's sender puts unpacked buckets (no packing copy: each tensor's bytes are
    views of the tensor itself); what a runner reads back is the same either way, and a snapshot
    taken at put time."""
    named = _named([8, 3, 8, 1, 8]) + [("h", torch.randn(4, dtype=torch.float64)),
                                      ("b", torch.randn(5).to(torch.bfloat16))]
    buckets = list(iter_buckets(named, 64, pack=pack))
    if not pack:
        assert all(not b.buffers for b in buckets)
        views = [v for b in buckets for v in b.tensor_bytes()]
        assert [v.data_ptr() for v in views] == [t.data_ptr() for _, t in named]
    _, put, get = _store()
    refs = [(b.meta, put_bucket(b, put=put)) for b in buckets]
    snapshot = {n: t.clone() for n, t in named}
    for _, t in named:
        t.add_(1)  # the learner's next update: the sync holds the weights as they were
    eng = _RecordingEngine()
    stream = BucketStream(eng, 2, fetch=get)
    for meta, ref in refs:
        stream.add(meta, ref)
    assert stream.finish(len(refs)) and eng.version == 2
    assert list(eng.loaded) == [n for n, _ in named]
    for n, t in snapshot.items():
        assert eng.loaded[n].dtype == t.dtype and torch.equal(eng.loaded[n], t), n


def test_bucket_with_a_missing_tensor_fails_loudly():
    named = _named([8, 8])
    _, put, get = _store()
    (b,) = iter_buckets(named, 64, pack=False)
    ref = put_bucket(b, put=put)
    b.meta.tensors.append(b.meta.tensors[0])
    with pytest.raises(ValueError, match="2 arrays for 3 tensors"):
        list(iter_bucket_tensors([(b.meta, ref)], [], fetch=get))
    eng = _RecordingEngine()
    stream = BucketStream(eng, 5, fetch=get)
    stream.add(b.meta, ref)
    with pytest.raises(ValueError, match="2 arrays for 3 tensors"):  # the thread's error, on finish
        stream.finish(1)
    assert eng.version == 3


@pytest.mark.parametrize("skip", [{1}, {0}, {3}])
def test_dropped_bucket_keeps_the_old_version(skip):
    named = _named([8, 8, 8, 8, 8, 8, 8, 8])
    _, put, get = _store()
    eng = _RecordingEngine()
    stream, n = _stream(eng, iter_buckets(named, 64), 7, put, get, skip=skip)
    assert n == 4
    assert not stream.finish(n)
    assert eng.version == 3
    assert stream.applied == [i for i in range(n) if i not in skip]


def test_out_of_order_buckets_and_an_abandoned_stream_keep_the_old_version():
    named = _named([8, 8, 8, 8])
    _, put, get = _store()
    buckets = [(b.meta, put_bucket(b, put=put)) for b in iter_buckets(named, 64)]
    eng = _RecordingEngine()
    stream = BucketStream(eng, 7, fetch=get)
    for meta, ref in reversed(buckets):
        stream.add(meta, ref)
    assert not stream.finish(2) and eng.version == 3
    stream = BucketStream(eng, 8, fetch=get)
    stream.add(*buckets[0])
    stream.abort()
    assert eng.version == 3 and stream.applied == [0]


def test_loader_error_reaches_finish():
    named = _named([8, 8, 8])
    _, put, get = _store()
    eng = _FailingEngine()
    stream, n = _stream(eng, iter_buckets(named, 32), 9, put, get)
    with pytest.raises(RuntimeError, match="loader failed"):
        stream.finish(n)
    assert eng.version == 3


def test_hf_engine_streamed_load_matches_a_full_update(tmp_path):
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.models.factory import tiny_model_path

    path = tiny_model_path(tmp_path / "tiny")
    eng = HFEngine(path)
    new = {k: torch.randn_like(v) for k, v in eng.model.state_dict().items() if k != "lm_head.weight"}
    _, put, get = _store()
    biggest = max(v.numel() * v.element_size() for v in new.values())
    # some tensors alone; applied on the stream's thread, as on a runner
    stream, n = _stream(eng, iter_buckets(new.items(), biggest // 3, pack=False), 5, put, get)
    assert n > 1
    assert stream.finish(n) and eng.version == 5
    sd = eng.model.state_dict()
    assert all(torch.equal(sd[k], v) for k, v in new.items())
    if eng.model.config.tie_word_embeddings:
        assert torch.equal(sd["lm_head.weight"], new["model.embed_tokens.weight"])
    with pytest.raises(KeyError):
        eng.load_weights_stream(iter([("no.such.weight", torch.ones(1))]))
    # the full-dict update keeps its behaviour (unknown names raise before anything is copied)
    with pytest.raises(KeyError):
        eng.update_weights({"no.such.weight": torch.ones(1)}, version=6)
    assert eng.version == 5


def _run_group(n_receivers, sender_fn, receiver_fn, group_id="g"):
    """Run a sender and ``n_receivers`` receivers of one weight group in threads."""
    import threading

    from rllib_spear.weight_streaming.collective import join_group, open_store

    store, host, port = open_store(n_receivers + 1, timeout_s=60)
    out, errors = {}, []

    def member(rank):
        try:
            if rank == 0:
                out[0] = sender_fn(join_group(group_id, n_receivers + 1, store=store, timeout_s=60))
            else:
                g = join_group(group_id, n_receivers + 1, host=host, port=port, timeout_s=60)
                out[g.rank] = receiver_fn(g)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(n_receivers + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return out


def test_collective_broadcast_gives_every_receiver_the_weights():
    from rllib_spear.weight_streaming.collective import broadcast_buckets
    from rllib_spear.weight_streaming.receiver import receive_broadcast

    named = _named([8, 300, 8, 0, 1], [torch.float32, torch.bfloat16, torch.float16, torch.float32,
                                       torch.float32])
    engines = {1: _RecordingEngine(), 2: _RecordingEngine()}
    out = _run_group(2, lambda g: broadcast_buckets(g, iter_buckets(named, 40), version=9),
                     lambda g: receive_broadcast(engines[g.rank], g))
    assert out[0] > 1  # several buckets
    assert out[1] == out[2] == (True, 9)
    for eng in engines.values():
        assert eng.version == 9
        assert set(eng.loaded) == {n for n, _ in named}
        assert all(torch.equal(eng.loaded[n], t) and eng.loaded[n].dtype == t.dtype for n, t in named)


def test_collective_receiver_whose_loader_stops_early_stays_in_step_and_keeps_its_version():
    from rllib_spear.weight_streaming.collective import broadcast_buckets
    from rllib_spear.weight_streaming.receiver import receive_broadcast

    named = _named([8, 8, 8])
    failing, ok = _FailingEngine(), _RecordingEngine()

    def recv(g):
        eng = failing if g.rank == 1 else ok
        try:
            return receive_broadcast(eng, g)
        except RuntimeError as e:
            return str(e)

    out = _run_group(2, lambda g: broadcast_buckets(g, iter_buckets(named, 32), version=4), recv)
    assert out[1] == "loader failed" and failing.version == 3
    assert out[2] == (True, 4) and ok.version == 4


@pytest.mark.parametrize("learners, ok", [
    ({}, True),
    ({"weight_sync_transport": "collective", "weight_sync_bucket_mb": 0.5}, True),
    ({"weight_sync_transport": "driver"}, True),
    ({"weight_sync_transport": "shared_memory"}, True),
    ({"weight_sync_transport": "shared_memory", "sharding": "fsdp", "num_learners": 2}, False),
    ({"weight_sync_transport": "nccl"}, False),
    ({"weight_sync_bucket_mb": 0}, False),
    ({"weight_sync_bucket_mb": -3}, False),
    ({"weight_sync_bucket_mb": True}, False),
])
def test_weight_sync_knobs_validate(learners, ok):
    from rllib_spear.algorithms.grpo.config import GRPOConfig

    cfg = GRPOConfig().learners(**learners).rl_module(model_config={"model_path": "embedded"})
    for k, v in learners.items():
        assert getattr(cfg, k) == v and cfg.to_dict()[k] == v
    if ok:
        cfg.validate()
    else:
        with pytest.raises(ValueError, match=next(iter(learners))):
            cfg.validate()


@pytest.mark.parametrize("lora", [None, {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}])
def test_learner_stream_equals_its_inference_state(lora):
    """The learner's weight stream (no Ray: a local learner) is its module's inference state:
    same names in the same order, same tensors (LoRA: merged), tied head left out."""
    from rllib_spear import GRPOConfig
    from rllib_spear.algorithms.grpo.defaults import PLACEHOLDER_ACTION_SPACE, PLACEHOLDER_OBS_SPACE
    from rllib_spear.models.factory import tiny_model_path

    mc = {"model_path": tiny_model_path(), **({"lora": lora} if lora else {})}
    spaces = (PLACEHOLDER_OBS_SPACE, PLACEHOLDER_ACTION_SPACE)
    learner = GRPOConfig().rl_module(model_config=mc).build_learner(
        spaces={"default_policy": spaces, "__env__": spaces})
    rlm = learner.module["default_policy"].unwrapped()
    if lora:  # non-zero adapters, so that the merge matters
        with torch.no_grad():
            for n, p in rlm.model.named_parameters():
                if "lora_B" in n:
                    p.fill_(0.01)
    want = rlm.get_state(inference_only=True)
    got = list(learner.weight_senders.weights.iter())
    assert [k for k, _ in got] == list(want)
    assert "lm_head.weight" not in dict(got)
    assert all(torch.equal(v, want[k]) for k, v in got)
    assert learner.weight_senders.weights.version() == 0
    packed = dict(kv for b in iter_buckets(iter(got), 2**16) for kv in unpack_bucket(b.meta, b.buffers))
    assert all(torch.equal(packed[k], want[k]) for k in want)


def test_wire_dtype_narrows_floating_tensors_only():
    from rllib_spear.weight_streaming import wire_dtype_of

    assert wire_dtype_of(torch.float32, torch.bfloat16) == torch.bfloat16  # fp32 masters -> bf16 engine
    assert wire_dtype_of(torch.float32, torch.float16) == torch.float16
    assert wire_dtype_of(torch.bfloat16, torch.float32) == torch.bfloat16  # never widened
    assert wire_dtype_of(torch.float32, torch.float32) == torch.float32
    assert wire_dtype_of(torch.int64, torch.bfloat16) == torch.int64  # integers travel as they are
    assert wire_dtype_of(torch.float32, None) == torch.float32


@pytest.mark.parametrize("lora", [None, {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}])
def test_learner_stream_in_the_engine_dtype(lora):
    """``LearnerWeights.iter(engine_dtype=bf16)``: every fp32 tensor arrives as exactly its bf16
    cast (what the engine's own copy would give), half the bytes; a wider engine dtype changes
    nothing (no copy)."""
    from rllib_spear import GRPOConfig
    from rllib_spear.algorithms.grpo.defaults import PLACEHOLDER_ACTION_SPACE, PLACEHOLDER_OBS_SPACE
    from rllib_spear.models.factory import tiny_model_path

    spaces = (PLACEHOLDER_OBS_SPACE, PLACEHOLDER_ACTION_SPACE)
    mc = {"model_path": tiny_model_path(), **({"lora": lora} if lora else {})}
    learner = GRPOConfig().rl_module(model_config=mc).build_learner(
        spaces={"default_policy": spaces, "__env__": spaces})
    want = dict(learner.weight_senders.weights.iter())
    got = list(learner.weight_senders.weights.iter(engine_dtype=torch.bfloat16))
    assert [k for k, _ in got] == list(want)
    for k, v in got:
        assert v.dtype == torch.bfloat16 and want[k].dtype == torch.float32
        assert torch.equal(v, want[k].to(torch.bfloat16))
    fp32 = sum(v.numel() * v.element_size() for v in want.values())
    assert sum(b.meta.nbytes for b in iter_buckets(iter(got), 2**16)) * 2 == fp32
    if lora is None:  # the unmerged tensors themselves, uncopied
        wide = dict(learner.weight_senders.weights.iter(engine_dtype=torch.float64))
        assert all(wide[k].data_ptr() == want[k].data_ptr() for k in want)


def test_shared_memory_transport_refuses_lora_and_gpu_learners():
    from rllib_spear.algorithms.grpo.config import GRPOConfig

    lora = {"model_path": "embedded", "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}}
    cfg = GRPOConfig().learners(weight_sync_transport="shared_memory").rl_module(model_config=lora)
    with pytest.raises(ValueError, match="cannot share LoRA weights.*'object_store'"):
        cfg.validate()
    cfg = (GRPOConfig().learners(weight_sync_transport="shared_memory", num_gpus_per_learner=1)
           .rl_module(model_config={"model_path": "embedded"}))
    with pytest.raises(ValueError, match="GPUs"):
        cfg.validate()


@pytest.mark.parametrize("engine, learners, resources, error", [
    ("vllm", {}, {}, None),  # default: transport "vllm", gloo backend on CPU learners
    ("hf", {}, {}, None),  # default: transport "object_store"
    ("hf", {"weight_sync_transport": "vllm"}, {}, "needs engine='vllm'"),
    ("vllm", {"weight_transfer_backend": "nccl"}, {}, "num_gpus_per_learner is 0"),
    ("vllm", {"weight_transfer_backend": "ipc", "num_gpus_per_learner": 1}, {}, "colocate=True"),
    ("vllm", {"weight_transfer_backend": "tcp"}, {}, "must be 'auto' or one of"),
    ("vllm", {"weight_transfer_backend": "nccl", "num_gpus_per_learner": 1}, {}, None),
])
def test_vllm_transport_knobs_validate(engine, learners, resources, error):
    from rllib_spear.algorithms.grpo.config import GRPOConfig

    cfg = (GRPOConfig().env_runners(engine=engine).learners(**learners).resources(**resources)
           .rl_module(model_config={"model_path": "embedded"}))
    if error is None:
        cfg.validate()
    else:
        with pytest.raises(ValueError, match=error):
            cfg.validate()


def test_transport_and_backend_resolution():
    from rllib_spear.weight_streaming.selection import GLOO_BACKEND, resolve_transfer_backend, resolve_transport

    assert resolve_transport(None, "vllm") == "vllm"
    assert resolve_transport(None, "hf") == "object_store"
    assert resolve_transport("collective", "vllm") == "collective"
    assert resolve_transfer_backend("auto", learner_gpus=0, colocate=False) == GLOO_BACKEND
    assert resolve_transfer_backend("auto", learner_gpus=0, colocate=True) == GLOO_BACKEND
    assert resolve_transfer_backend("auto", learner_gpus=1, colocate=False) == "nccl"
    assert resolve_transfer_backend("auto", learner_gpus=0.5, colocate=True) == "ipc"
    assert resolve_transfer_backend("nccl", learner_gpus=0, colocate=False) == "nccl"


def test_runner_builds_its_engine_for_the_resolved_backend():
    from rllib_spear.algorithms.grpo.config import GRPOConfig
    from rllib_spear.env_runners.placement import runner_transfer_backend
    from rllib_spear.weight_streaming.selection import GLOO_BACKEND

    assert runner_transfer_backend(GRPOConfig().env_runners(engine="vllm")) == GLOO_BACKEND
    assert runner_transfer_backend(GRPOConfig().env_runners(engine="hf")) is None
    cfg = GRPOConfig().env_runners(engine="vllm").learners(weight_sync_transport="object_store")
    assert runner_transfer_backend(cfg) is None
    cfg = GRPOConfig().env_runners(engine="vllm").learners(num_gpus_per_learner=1)
    assert runner_transfer_backend(cfg) == "nccl"
