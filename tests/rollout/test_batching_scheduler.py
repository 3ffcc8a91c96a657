"""The continuous-batching scheduler behind ``GenerationEngine.agenerate`` (engines/batching.py):
concurrent requests share one ``generate`` call, a request arriving while a batch decodes goes in
the next one, seeds, errors, and the worker thread's shutdown."""
from __future__ import annotations

import asyncio
import threading

import pytest

from rllib_spear.env_runners.engines.base import GenerationEngine, GenerationOutput, SamplingConfig
from rllib_spear.env_runners.engines.batching import BatchingScheduler, batch_seed


class GateEngine(GenerationEngine):
    """Records every call (prompts, sampling, caps); the first call waits for ``gate``. Each
    output echoes its prompt's first id, so a test can check who got what."""

    def __init__(self, block_first: bool = False, fail_first: bool = False):
        self.calls: list[tuple[list[list[int]], SamplingConfig, list[int]]] = []
        self.entered, self.gate = threading.Event(), threading.Event()
        self.block_first, self.fail_first = block_first, fail_first
        if not block_first:
            self.gate.set()

    def generate(self, prompts, sampling, max_new_tokens=None):
        self.calls.append(([list(p) for p in prompts], sampling, list(max_new_tokens)))
        self.entered.set()
        if len(self.calls) == 1:
            self.gate.wait(30)
            if self.fail_first:
                raise RuntimeError("batch failed")
        return [GenerationOutput([p[0], 0], [-1.0, -2.0], "stop") for p in prompts]

    def update_weights(self, state_dict, version):
        pass


def _sampling(**kw):
    return SamplingConfig(**{"max_new_tokens": 8, "seed": 0, **kw})


async def _yield(n=3):
    for _ in range(n):
        await asyncio.sleep(0)


def test_concurrent_requests_share_a_call_and_a_late_one_goes_in_the_next():
    eng = GateEngine(block_first=True)
    sched = BatchingScheduler(eng.generate, gather_window_s=0.3, max_gather_s=5.0, max_batch_size=3)

    async def main():
        loop = asyncio.get_running_loop()
        first = [asyncio.ensure_future(sched.submit([10 + i], _sampling(), 4, seed=i)) for i in range(3)]
        await loop.run_in_executor(None, eng.entered.wait, 30)  # the first batch is decoding
        late = asyncio.ensure_future(sched.submit([99], _sampling(), 4, seed=7))
        await _yield()  # the late request is queued while the first batch still decodes
        eng.gate.set()
        return await asyncio.gather(*first), await late

    outs, late = asyncio.run(main())
    assert [c[0] for c in eng.calls] == [[[10], [11], [12]], [[99]]]
    assert [o.token_ids[0] for o in outs] == [10, 11, 12] and late.token_ids[0] == 99
    assert sched.batches == 2 and sched.requests == 4 and sched.max_batch == 3
    sched.close()
    assert not sched.running


def test_a_burst_within_the_gather_window_is_one_batch():
    eng = GateEngine()
    sched = BatchingScheduler(eng.generate, gather_window_s=1.0, max_gather_s=2.0)

    async def main():
        return await asyncio.gather(*(sched.submit([i + 1], _sampling(), 4, seed=i) for i in range(5)))

    outs = asyncio.run(main())
    assert len(eng.calls) == 1 and len(eng.calls[0][0]) == 5
    assert [o.token_ids[0] for o in outs] == [1, 2, 3, 4, 5]
    sched.close()


def test_rows_in_seed_order_and_the_batch_seed_ignores_arrival_order():
    eng = GateEngine()
    sched = BatchingScheduler(eng.generate, gather_window_s=1.0, max_gather_s=2.0, max_batch_size=3)

    async def main():
        reqs = [([30], 3, 9), ([10], 1, 2), ([20], 2, 50)]  # (prompt, seed, cap), arriving out of seed order
        return await asyncio.gather(*(sched.submit(p, _sampling(), cap, seed=s) for p, s, cap in reqs))

    outs = asyncio.run(main())
    prompts, sampling, caps = eng.calls[0]
    assert prompts == [[10], [20], [30]]
    assert caps == [2, 8, 8]  # each request's cap, at most its sampling.max_new_tokens
    assert sampling.seed == batch_seed([1, 2, 3]) == batch_seed([3, 1, 2]) and sampling.max_new_tokens == 8
    assert [o.token_ids[0] for o in outs] == [30, 10, 20]  # every request still gets its own output
    assert batch_seed([None, None]) is None and batch_seed([1, 2]) != batch_seed([1, 3])
    assert batch_seed([5]) == batch_seed([5, None]) and 0 <= batch_seed([-1, 2**70]) < 2**63
    sched.close()


def test_requests_with_other_sampling_parameters_are_not_batched_together():
    eng = GateEngine()
    sched = BatchingScheduler(eng.generate, gather_window_s=1.0, max_gather_s=2.0)

    async def main():
        return await asyncio.gather(sched.submit([1], _sampling(temperature=1.0), 4, seed=1),
                                    sched.submit([2], _sampling(temperature=0.5), 4, seed=2),
                                    sched.submit([3], _sampling(temperature=1.0, seed=99), 4, seed=3))

    asyncio.run(main())
    groups = sorted((c[1].temperature, c[0]) for c in eng.calls)
    assert groups == [(0.5, [[2]]), (1.0, [[1], [3]])]
    sched.close()


def test_a_failing_generate_fails_its_batch_only():
    eng = GateEngine(fail_first=True)
    sched = BatchingScheduler(eng.generate, gather_window_s=0.5, max_gather_s=1.0, max_batch_size=2)

    async def main():
        first = await asyncio.gather(sched.submit([1], _sampling(), 4), sched.submit([2], _sampling(), 4),
                                     return_exceptions=True)
        return first, await sched.submit([3], _sampling(), 4)

    first, after = asyncio.run(main())
    assert all(isinstance(e, RuntimeError) and "batch failed" in str(e) for e in first)
    assert after.token_ids[0] == 3
    sched.close()


def test_bad_requests_and_settings_are_refused():
    eng = GateEngine()
    with pytest.raises(ValueError, match="gather_window_s"):
        BatchingScheduler(eng.generate, gather_window_s=0.1, max_gather_s=0.01)
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchingScheduler(eng.generate, max_batch_size=0)
    sched = BatchingScheduler(eng.generate)
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(sched.submit([], _sampling(), 4))
    with pytest.raises(ValueError, match="temperature"):
        asyncio.run(sched.submit([1], _sampling(temperature=-1.0), 4))
    sched.close()
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(sched.submit([1], _sampling(), 4))


def test_engine_shutdown_stops_the_scheduler_thread_and_agenerate_restarts_it():
    eng = GateEngine()
    out = asyncio.run(eng.agenerate([5, 6], _sampling(), 3, seed=1))
    assert out.token_ids[0] == 5 and eng.calls[0][2] == [3]
    sched = eng.batching_scheduler()
    assert sched.running and eng.batching_scheduler() is sched
    eng.shutdown()
    assert not sched.running
    out = asyncio.run(eng.agenerate([7], _sampling(), 3))
    assert out.token_ids[0] == 7 and eng.batching_scheduler() is not sched
    eng.shutdown()


async def _member(sched, i, delay, submit=True):
    """One episode of the async loop: a member while it runs; it submits after ``delay`` s, or
    ends then without a request."""
    with sched.member():
        await asyncio.sleep(delay)
        if submit:
            return await sched.submit([i + 1], _sampling(), 4, seed=i)
        return None


def test_a_batch_waits_for_every_member_and_closes_once_all_wait():
    eng = GateEngine()
    # a window far longer than the test: only "every member waits" can close these batches
    sched = BatchingScheduler(eng.generate, gather_window_s=600.0, max_gather_s=600.0)

    async def main():
        # the third member queues well after the others: the batch must not close without it
        return await asyncio.wait_for(asyncio.gather(_member(sched, 0, 0.0), _member(sched, 1, 0.0),
                                                     _member(sched, 2, 0.2)), 60)

    outs = asyncio.run(main())
    assert [c[0] for c in eng.calls] == [[[1], [2], [3]]]
    assert [o.token_ids[0] for o in outs] == [1, 2, 3]
    assert sched.batches == sched.batches_of_all_members == 1
    sched.close()


def test_a_member_that_ends_without_a_request_lets_the_batch_close():
    eng = GateEngine()
    sched = BatchingScheduler(eng.generate, gather_window_s=600.0, max_gather_s=600.0)

    async def main():
        return await asyncio.wait_for(asyncio.gather(_member(sched, 0, 0.0), _member(sched, 1, 0.0),
                                                     _member(sched, 2, 0.2, submit=False)), 60)

    outs = asyncio.run(main())
    assert [c[0] for c in eng.calls] == [[[1], [2]]] and outs[2] is None
    assert sched.batches_of_all_members == 1
    sched.close()


def test_requests_without_members_keep_the_gather_window():
    eng = GateEngine()
    sched = BatchingScheduler(eng.generate, gather_window_s=0.2, max_gather_s=5.0)

    async def main():
        first = asyncio.ensure_future(sched.submit([1], _sampling(), 4, seed=0))
        await asyncio.sleep(0.05)  # inside the window: the same batch
        return await asyncio.gather(first, sched.submit([2], _sampling(), 4, seed=1))

    asyncio.run(main())
    assert [c[0] for c in eng.calls] == [[[1], [2]]] and sched.batches_of_all_members == 0
    sched.close()
