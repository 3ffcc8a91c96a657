"""An async vLLM engine whose weight update raises resumes (no vLLM engine built: a fake handle
records pause / resume): paused, every request in flight and every later one would hang. Its
weights are then marked invalid (version -1), so the next sync is applied whatever its version
(engines/vllm_engine.py, docs/design.md "vLLM async engine")."""
from __future__ import annotations

import pytest

from rllib_spear.env_runners.engines.vllm_engine import VLLMEngine


class _Handle:
    """The async handle's pause / resume and the transfer API, each step able to fail."""

    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def pause(self):
        self.calls.append("pause")

    def resume(self):
        self.calls.append("resume")

    def _step(self, name):
        self.calls.append(name)
        if self.fail == name:
            raise RuntimeError(f"{name} failed")

    def collective_rpc(self, method, args=()):
        self._step(method)

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def start_weight_update(self):
        self._step("start_weight_update")

    def update_weights(self, request):
        self._step("update_weights")

    def finish_weight_update(self, weight_version=None):
        self._step("finish_weight_update")


def _engine(fail=None):
    eng = object.__new__(VLLMEngine)  # the update paths only need these
    eng.llm, eng.async_engine, eng._update_paused = _Handle(fail), True, False
    eng.version, eng._failed_updates = 3, 0
    eng.update_method, eng.on_cpu, eng.tie_word_embeddings = "reload", True, False
    eng.weight_transfer_backend = "rllib_spear_gloo"
    return eng


@pytest.fixture(autouse=True)
def _in_process(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setattr(VLLMEngine, "rpc_pickles_args", property(lambda self: False))


def test_a_failed_update_resumes_the_engine_and_invalidates_its_weights():
    import torch

    eng = _engine(fail="rllib_spear_reload")
    with pytest.raises(RuntimeError, match="rllib_spear_reload failed"):
        eng.update_weights({"w": torch.zeros(1)}, version=4)
    assert eng.llm.calls == ["pause", "rllib_spear_reload", "resume"]
    assert not eng._update_paused and eng.version == -1
    eng.llm.fail = None  # the next update goes through and resumes as usual
    eng.update_weights({"w": torch.zeros(1)}, version=4)
    assert eng.version == 4 and eng.llm.calls[-1] == "resume" and not eng._update_paused


def test_a_failed_streamed_update_resumes_the_engine():
    import torch

    eng = _engine(fail="rllib_spear_reload")
    with pytest.raises(RuntimeError):
        eng.load_weights_stream(iter([("w", torch.zeros(1))]))
    assert eng.llm.calls[-1] == "resume" and not eng._update_paused and eng.version == -1


@pytest.mark.parametrize("step", ["start_weight_update", "update_weights", "finish_weight_update"])
def test_a_failed_transfer_api_update_resumes_the_engine(step):
    eng = _engine(fail=step)
    with pytest.raises(RuntimeError, match=f"{step} failed"):
        eng.start_weight_update()
        eng.receive_weight_update({"names": []})
        eng.finish_weight_update(4)
    assert eng.llm.calls[0] == "pause" and eng.llm.calls[-1] == "resume", eng.llm.calls
    assert not eng._update_paused and eng.version == -1
    eng.llm.fail, eng.llm.calls = None, []
    eng.start_weight_update()
    eng.receive_weight_update({"names": []})
    eng.finish_weight_update(4)
    assert eng.llm.calls[0] == "pause" and eng.llm.calls[-1] == "resume" and eng.version == 4
