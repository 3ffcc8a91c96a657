"""Models: tiny from-scratch policies, the trained ChatML tokenizer, cold-start SFT, chunked
log-probs, the RLlib RLModule holding a HF causal LM, and the packaged SmolLM2 loader.

Imports are lazy (``rllib_spear.models.X`` loads its submodule on first use), so importing this
package does not import torch, transformers or ray.

This package imports neither the environments, the data nor the cold starts
(``tests/models/test_layering.py``): the embedded policies, and the resolution of
``model_path: "embedded"``, live in ``rllib_spear.coldstart``; a module here takes a folder.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "train_chat_tokenizer": "tokenizer",
    "assistant_token_mask": "tokenizer",
    "CHATML_TEMPLATE": "tokenizer",
    "build_tiny_model": "factory",
    "tiny_model_path": "factory",
    "synthetic_conversations": "factory",
    "conversation_texts": "factory",
    "cold_start_sft": "sft",
    "sft_examples": "sft",
    "token_logprobs": "logprobs",
    "naive_token_logprobs": "logprobs",
    "HFCausalLMRLModule": "rl_module",
    "hf_rl_module_spec": "rl_module",
    "smollm2_path": "smollm",
    "smollm2_gguf_path": "smollm",
}

__all__ = sorted(_EXPORTS)

#: Names that moved to ``rllib_spear.coldstart`` (an AttributeError says where they are now).
_MOVED = ("default_policy_path", "task_policy_path", "task_policy_env_config", "DEFAULT_POLICY_RECIPE",
          "resolve_model_path")


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        if name in _MOVED:
            raise AttributeError(f"rllib_spear.models.{name} moved: import it from rllib_spear.coldstart "
                                 f"(from rllib_spear.coldstart import {name})")
        raise AttributeError(f"module 'rllib_spear.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
