"""Generation engines behind one interface (``GenerationEngine``): ``hf`` and ``vllm``."""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Mapping

from .base import GenerationEngine, GenerationOutput, SamplingConfig

__all__ = ["GenerationEngine", "GenerationOutput", "SamplingConfig", "make_engine", "ENGINES", "check_engine_kwargs"]

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


#: Engine name -> (module, class), imported by :func:`check_engine_kwargs` to read its signature.
_ENGINE_CLASSES = {"hf": (".hf_engine", "HFEngine"), "vllm": (".vllm_engine", "VLLMEngine")}
#: Keyword arguments the runner passes itself (``make_engine``'s model_path; the model and
#: tokenizer objects of an in-process engine): not settings a config gives.
_NOT_SETTINGS = {"self", "model_path", "model", "tokenizer"}


def check_engine_kwargs(config: Any, err: Callable[[str], None]) -> None:
    """``err`` for each ``engine_kwargs`` key the chosen engine's constructor does not take. Without
    it a vLLM setting under ``engine='hf'`` (``gpu_memory_utilization``) killed the env runner in
    its ``__init__`` and the run ended in an unrelated ``IndexError`` of RLlib, the cause only in
    the actor's log. An engine that takes ``**kwargs`` (vLLM: any ``vllm.LLM`` argument) is not
    judged. Called by ``GRPOConfig.validate()``."""
    name, kwargs = getattr(config, "engine", None), getattr(config, "engine_kwargs", None) or {}
    if name not in _ENGINE_CLASSES or not isinstance(kwargs, Mapping) or not kwargs:
        return  # an unknown engine is validate()'s own error
    module, cls_name = _ENGINE_CLASSES[name]
    params = inspect.signature(getattr(importlib.import_module(module, __name__), cls_name).__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    takes = sorted(set(params) - _NOT_SETTINGS)
    other = [e for e in ENGINES if e != name]
    for key in kwargs:
        if key not in params or key in _NOT_SETTINGS:
            err(f"`engine_kwargs` key {key!r} is not an argument of the {name!r} engine ({cls_name} takes "
                f"{', '.join(takes)}): remove it, or choose the engine it belongs to "
                f"(.env_runners(engine={other[0]!r}) / --set env_runners.engine={other[0]})")
