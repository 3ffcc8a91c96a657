"""One table of the dtype names users write ("bf16", "bfloat16", "torch.bfloat16", ...), shared by
the RLModule (learner), the HF engine and the vLLM engine, so a name that works in one works in all."""
from __future__ import annotations

import torch

__all__ = ["DTYPES", "torch_dtype", "dtype_name"]

#: Accepted names -> torch dtype.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a name of :data:`DTYPES` (or of a torch dtype); ValueError naming the
    accepted names otherwise."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[str(dtype).replace("torch.", "").lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}") from None


def dtype_name(dtype: str | torch.dtype) -> str:
    """The canonical name ("float32", "bfloat16", "float16"): what vLLM's ``dtype=`` accepts."""
    return str(torch_dtype(dtype)).replace("torch.", "")
