"""The compute precision of a learner: ``.learners(mixed_precision=None | "bf16" | "auto")``.

"bf16" keeps float32 master weights, gradients and AdamW state and computes in bf16 (autocast on a
replicated learner, FSDP's bf16 gather when sharded). "auto" picks "bf16" where the learner's
device computes bf16 in hardware and the master weights are float32, and None (float32 compute)
elsewhere: on a CPU without bf16 instructions, autocast emulates bf16 and runs slower than
float32, so the choice depends on the machine, not on the model (docs/design.md "Learner
sharding", mixed precision "auto").

Where the device computes bf16:
* CUDA: ``torch.cuda.is_bf16_supported(including_emulation=False)`` (Ampere and newer). A process
  without a GPU (the driver planning a GPU learner's memory) assumes so.
* CPU: the flags the kernel reports in ``/proc/cpuinfo``: ``avx512_bf16`` or ``amx_bf16`` on
  x86-64, ``bf16`` (FEAT_BF16) on aarch64. No such file (not Linux): no.
"""
from __future__ import annotations

import functools
from typing import Iterable

import torch

__all__ = ["MIXED_PRECISION_SETTINGS", "CPU_BF16_FLAGS", "cpu_flags", "cpu_has_native_bf16",
           "device_has_native_bf16", "resolve_mixed_precision"]

#: What ``.learners(mixed_precision=...)`` accepts.
MIXED_PRECISION_SETTINGS = (None, "bf16", "auto")
#: CPU flags of bf16 arithmetic in hardware: AVX-512 BF16 and AMX (x86-64), FEAT_BF16 (aarch64).
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@functools.lru_cache(maxsize=4)
def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (x86 "flags", aarch64 "Features" lines of ``path``); empty where the
    file is missing or unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return frozenset(flags)


def cpu_has_native_bf16(flags: Iterable[str] | None = None) -> bool:
    """True when the CPU (``flags``, default this machine's :func:`cpu_flags`) computes bf16 in hardware."""
    return not CPU_BF16_FLAGS.isdisjoint(cpu_flags() if flags is None else flags)


def device_has_native_bf16(device_type: str, *, flags: Iterable[str] | None = None) -> bool:
    """True when a ``device_type`` ("cpu", "cuda") device of this process computes bf16 in hardware.
    ``flags``: the CPU flags to judge by (tests); a process without CUDA judging "cuda" says True."""
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return True  # planning for a GPU elsewhere: the GPUs these models train on have bf16
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if device_type == "cpu":
        return cpu_has_native_bf16(flags)
    return False


def resolve_mixed_precision(setting: str | None, *, device_type: str, weight_dtype: str = "float32",
                            native_bf16: bool | None = None) -> str | None:
    """The precision a learner on ``device_type`` computes in for ``mixed_precision=setting``:
    None and "bf16" as given; "auto" -> "bf16" when ``weight_dtype`` is float32 and the device
    computes bf16 in hardware (``native_bf16``, default :func:`device_has_native_bf16`), else None.
    Any other setting is a ValueError naming the accepted ones."""
    if setting not in MIXED_PRECISION_SETTINGS:
        raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION_SETTINGS} "
                         f"(.learners(mixed_precision=...)), got {setting!r}")
    if setting != "auto":
        return setting
    from .dtypes import dtype_name

    if dtype_name(weight_dtype) != "float32":
        return None  # bf16 master weights compute in their own dtype; "auto" adds no cast
    native = device_has_native_bf16(device_type) if native_bf16 is None else bool(native_bf16)
    return "bf16" if native else None
