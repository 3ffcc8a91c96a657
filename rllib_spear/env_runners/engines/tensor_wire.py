"""Tensors as plain msgpack values, for ``collective_rpc`` arguments that must reach a vLLM
engine core in its own process (``env_runners/engines/vllm_worker.py``)."""
from __future__ import annotations

import torch

__all__ = ["encode_tensors", "decode_tensors"]


def encode_tensors(items) -> list:
    """HF-named tensors as plain msgpack values ``[name, dtype, shape, bytes]``: a multiprocess
    engine core decodes ``collective_rpc`` arguments without their types, so a tensor would
    arrive as a list (vLLM's own weight-transfer engines send tensors on their own channel)."""
    out = []
    for name, t in items:
        t = t.detach().contiguous().cpu()
        out.append([name, str(t.dtype).removeprefix("torch."), list(t.shape),
                    t.reshape(-1).view(torch.uint8).numpy().tobytes()])
    return out


def decode_tensors(items) -> list:
    """The inverse of :func:`encode_tensors`; (name, tensor) pairs pass through."""
    out = []
    for item in items:
        if len(item) == 4 and isinstance(item[3], (bytes, bytearray, memoryview)):
            name, dtype, shape, data = item
            t = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(getattr(torch, dtype)).reshape(shape)
            out.append((name, t))
        else:
            out.append((item[0], item[1]))
    return out
