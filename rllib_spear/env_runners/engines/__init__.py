"""Generation engines behind one interface (``GenerationEngine``): ``hf`` and ``vllm``."""
from __future__ import annotations

from .base import GenerationEngine, GenerationOutput, SamplingConfig

__all__ = ["GenerationEngine", "GenerationOutput", "SamplingConfig", "make_engine", "ENGINES"]

ENGINES = ("hf", "vllm")


def make_engine(name: str, model_path: str, **kw) -> GenerationEngine:
    """Build an engine by name: ``"hf"`` -> ``HFEngine(model_path, **kw)`` (kw: dtype, device,
    max_batch_size, ...); ``"vllm"`` -> ``VLLMEngine(model_path, **kw)`` (kw: dtype, seed,
    max_model_len, update_method, plus any ``vllm.LLM`` argument). vLLM is imported only here."""
    if name == "hf":
        from .hf_engine import HFEngine

        return HFEngine(model_path, **kw)
    if name == "vllm":
        from .vllm_engine import VLLMEngine

        return VLLMEngine(model_path, **kw)
    raise ValueError(f"unknown engine {name!r}; expected one of {ENGINES}")
