"""How close the memory planner (rllib_spear/planning/) comes to what torch allocates, on CPU.

For the project's tiny model (``rllib_spear.models.factory.tiny_model_path``) and a random-init
~20M-parameter Qwen2 (built from a ``Qwen2Config``, nothing downloaded), on one micro-batch:

* parameter, gradient and AdamW-state bytes after one optimizer step (``sum(numel x element size)``
  of ``model.parameters()``, their ``.grad`` and ``optimizer.state``) vs the planner's
  ``P x 4``, ``P_train x 4`` and ``2 x P_train x 4``;
* activation bytes: the sum of the unique tensor storages autograd saves for backward (a
  ``torch.autograd.graph.saved_tensors_hooks`` pack hook, parameters excluded) while
  ``rllib_spear.models.logprobs.token_logprobs`` runs forward, without and with
  ``gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})``, in
  float32, in bf16 weights (FSDP's bf16 compute) and under bf16 autocast (DDP's mixed precision),
  full fine-tune and LoRA, vs ``models.activations.saved_bytes`` (+ autocast weight copies);
* the peak of the whole forward + backward above the persistent state (torch profiler memory
  events), vs the planner's activation peak (``planning.activation_peak``: saved tensors plus the
  transient head chunks, recomputed block and gradient buffers).

    python benchmarks/planner_accuracy.py            # about 2 minutes on 2 cores
    python benchmarks/planner_accuracy.py --quick    # the tiny model only

The output is the "How close" table of docs/memory_planner.md.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass

import torch

from rllib_spear import planning
from rllib_spear.models.activations import Precision, saved_bytes
from rllib_spear.models.logprobs import token_logprobs
from rllib_spear.models.shapes import ModelShape

#: The ~20M-parameter random Qwen2 of the benchmark (GQA 6/2, untied head).
QWEN2_20M = dict(vocab_size=16384, hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                 num_attention_heads=6, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False)


def random_model(arch: str = "qwen2", dtype: torch.dtype = torch.float32, seed: int = 0, **config):
    """A random-init HF causal LM of ``arch`` ("qwen2", "qwen3", "llama") with SDPA attention."""
    import transformers

    cfg_cls, lm_cls = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
                       "llama": ("LlamaConfig", "LlamaForCausalLM")}[arch]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_cls)(attn_implementation="sdpa", **config)
    return getattr(transformers, lm_cls)(cfg).to(dtype)


def micro_batch(vocab: int, rows: int, row_len: int, padded: bool, seed: int = 0):
    """``rows`` x ``row_len`` ids and mask; ``padded``: every row but the first is left-padded by a
    varying amount (as the learner's token-budget parts are)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, row_len), generator=g)
    mask = torch.ones(rows, row_len, dtype=torch.long)
    if padded:
        for r in range(1, rows):
            mask[r, : (r * row_len) // (2 * rows)] = 0
    return ids, mask


def _autocast(on: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()


def measure_saved(model, ids, mask, *, autocast: bool = False, chunk_size: int | None = None,
                  packed: bool = False) -> int:
    """Bytes of the unique storages autograd saves in ``token_logprobs``' forward (parameters'
    storages excluded; a bf16 weight copy of autocast counts); ``chunk_size``: its head chunk;
    ``packed``: the rows' real tokens scored as one packed row (``packed_microbatches``)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen.setdefault(st.data_ptr(), st.nbytes())
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _autocast(autocast):
        out = token_logprobs(model, ids, mask, chunk_size=chunk_size, packed=packed)
    del out
    return sum(seen.values())


def measure_peak(model, ids, mask, *, autocast: bool = False) -> int:
    """Peak bytes allocated above the starting point during forward + backward of the second
    micro-batch of an accumulation (gradients already allocated, so only the transients and the
    saved activations count), from the torch profiler's CPU memory events."""
    from torch.profiler import ProfilerActivity, profile

    def step():
        with _autocast(autocast):
            lp = token_logprobs(model, ids, mask)
        (lp.float() * mask).sum().backward()

    step()  # first micro-batch: allocates .grad
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    cur = peak = 0
    for e in events:
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak


def state_bytes_after_step(model) -> tuple[int, int, int]:
    """(parameter, gradient, AdamW state) bytes after one AdamW step on a tiny batch."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    ids = torch.randint(0, model.config.vocab_size, (1, 16))
    token_logprobs(model, ids).sum().backward()
    opt.step()
    nb = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    state = [v for s in opt.state.values() for k, v in s.items() if torch.is_tensor(v) and k != "step"]
    return (nb(model.parameters()), nb(p.grad for p in model.parameters() if p.grad is not None), nb(state))


@dataclass
class Row:
    model: str
    regime: str
    checkpointing: bool
    measured: int
    planned: int
    peak_measured: int | None = None
    peak_planned: int | None = None


def _regimes(quick: bool):
    """(label, storage dtype, Precision, LoRA kwargs or None)."""
    fp32 = ("float32", torch.float32, Precision(4), None)
    bf16 = ("bf16 weights (= FSDP bf16)", torch.bfloat16, Precision(2), None)
    amp = ("bf16 autocast (DDP bf16)", torch.float32, Precision(4, autocast=True), None)
    lora = ("float32 + LoRA r=8 q,v", torch.float32, Precision(4), {"r": 8, "target_modules": ["q_proj", "v_proj"]})
    return [fp32, amp] if quick else [fp32, bf16, amp, lora]


def compare(name: str, build, shape: ModelShape, rows: int, row_len: int, quick: bool = False,
            peak: bool = True) -> list[Row]:
    """Measured vs planned saved bytes (and peaks) of one model over the regimes."""
    out = []
    ids, mask = micro_batch(shape.vocab, rows, row_len, padded=rows > 1)
    for label, dtype, prec, lora in _regimes(quick):
        for ckpt in (False, True):
            model = build(dtype)
            targets = []
            if lora:
                from peft import LoraConfig, get_peft_model

                model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))
                targets = shape.lora_targets(lora["target_modules"])
            if ckpt:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                if lora:
                    model.enable_input_require_grads()
            measured = measure_saved(model, ids, mask, autocast=prec.autocast)
            scored = int((mask[:, 1:].bool() & mask[:, :-1].bool()).sum())  # every real target scored
            est = saved_bytes(shape, prec, rows=rows, row_len=row_len, checkpointing=ckpt,
                              lora_targets=targets, lora_r=(lora or {}).get("r", 0), scored=scored)
            row = Row(name, label, ckpt, measured, est.total)
            # bf16 backward is slow on CPUs without bf16 matmul units: peaks in float32 only,
            # except on the tiny model
            if peak and (dtype == torch.float32 and not prec.autocast or name == "tiny"):
                row.peak_measured = measure_peak(model, ids, mask, autocast=prec.autocast)
                a = planning.activation_peak(shape, prec, rows=rows, row_len=row_len, checkpointing=ckpt,
                                            lora=lora, full_finetune=not lora, scored=scored)
                row.peak_planned = a.total + a.autocast_weights
            out.append(row)
            del model
    return out


def _mib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:9.2f}"


def print_table(rows: list[Row]) -> None:
    print("| model | regime | act. ckpt | saved measured MiB | planned MiB | planned/measured "
          "| fwd+bwd peak measured MiB | planned MiB | planned/measured |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        pk = (f"{r.peak_planned / r.peak_measured:.3f}" if r.peak_measured else "-")
        print(f"| {r.model} | {r.regime} | {'on' if r.checkpointing else 'off'} | {_mib(r.measured)} | "
              f"{_mib(r.planned)} | {r.planned / r.measured:.3f} | {_mib(r.peak_measured)} | "
              f"{_mib(r.peak_planned)} | {pk} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the tiny model, float32 and autocast only")
    ap.add_argument("--tokens", type=int, default=2048, help="micro-batch tokens (rows x row length)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    from transformers import AutoModelForCausalLM

    from rllib_spear.models.factory import tiny_model_path

    tiny = tiny_model_path()
    tiny_shape = ModelShape.from_config(tiny, "tiny (factory)")
    models = [("tiny", lambda dt: AutoModelForCausalLM.from_pretrained(tiny, dtype=dt, attn_implementation="sdpa"),
               tiny_shape)]
    if not args.quick:
        models.append(("qwen2-20M", lambda dt: random_model("qwen2", dt, **QWEN2_20M),
                       ModelShape.from_config({"model_type": "qwen2", **QWEN2_20M}, "qwen2-20M")))

    print("## Parameters, gradients, AdamW state after one step (float32, full fine-tune)\n")
    print("| model | parameters | measured param / grad / AdamW bytes | planned | ratio |")
    print("| --- | ---: | --- | --- | ---: |")
    for name, build, shape in models:
        model = build(torch.float32)
        n = sum(p.numel() for p in model.parameters())
        got = state_bytes_after_step(model)
        want = (4 * shape.num_params, 4 * shape.num_params, 8 * shape.num_params)
        ratio = sum(want) / sum(got)
        print(f"| {name} | {n:,} (planner {shape.num_params:,}) | {' / '.join(f'{g:,}' for g in got)} | "
              f"{' / '.join(f'{w:,}' for w in want)} | {ratio:.4f} |")
    rows_, row_len = 4, args.tokens // 4
    print(f"\n## Activations: one micro-batch of {rows_} x {row_len} tokens, left-padded\n")
    table = []
    for name, build, shape in models:
        table += compare(name, build, shape, rows_, row_len, quick=args.quick)
    print_table(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
