"""``rllib-spear export CHECKPOINT OUT``: an Algorithm checkpoint -> a plain HF ``save_pretrained``
folder (config, safetensors weights, tokenizer) that transformers and vLLM load.

The learner's weights are read from either layout a checkpoint can have:

* ``learner_group/learner/sharded_state/<module_id>``: the torch.distributed.checkpoint shards
  written by FSDP learners (any number of ranks). DCP reads every shard into one unsharded module
  here, in this process, without a process group;
* ``learner_group/learner/rl_module/<module_id>``: RLlib's own module state (DDP / single learner).

The module is rebuilt from the module spec stored in the checkpoint (its ``model_path`` folder must
exist on this machine: it provides the architecture and the tokenizer), its weights replaced by
the checkpoint's, LoRA adapters merged into the base weights, then saved.
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path

__all__ = ["export_checkpoint"]


def _learner_dir(checkpoint: Path) -> Path:
    d = checkpoint / "learner_group" / "learner"
    if not d.is_dir():
        raise FileNotFoundError(f"{checkpoint}: not an Algorithm checkpoint (no learner_group/learner folder); "
                                "pass the folder Algorithm.save_to_path / Tune wrote (checkpoint_00000N)")
    return d


def _module_spec(learner_dir: Path, module_id: str):
    import rllib_spear  # noqa: F401  (classes referenced by the pickle)

    with open(learner_dir / "class_and_ctor_args.pkl", "rb") as f:
        ctor = pickle.load(f)["ctor_args_and_kwargs"][1]
    specs = ctor["module_spec"].rl_module_specs
    if module_id not in specs:
        raise KeyError(f"module {module_id!r} not in the checkpoint; it has {sorted(specs)}")
    return specs[module_id]


def export_checkpoint(checkpoint: str | Path, out: str | Path, *, module_id: str = "default_policy",
                      dtype: str | None = None) -> Path:
    """Write the learner's policy of ``checkpoint`` to ``out`` as an HF model folder.

    Args:
        checkpoint: an Algorithm checkpoint folder.
        out: the folder to create (``save_pretrained`` layout).
        module_id: the RLModule to export.
        dtype: "bfloat16" / "float16" / "float32" for the saved weights (default: the module's
            master dtype, usually float32).
    """
    import torch

    from .models.dtypes import torch_dtype

    checkpoint, out = Path(checkpoint).absolute(), Path(out)
    learner_dir = _learner_dir(checkpoint)
    spec = _module_spec(learner_dir, module_id)
    spec.inference_only = False  # the full (PEFT) module, so adapters load before the merge
    module = spec.build()
    sharded = learner_dir / "sharded_state" / module_id
    plain = learner_dir / "rl_module" / module_id
    with torch.no_grad():
        if sharded.is_dir():
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

            target = {"model": get_model_state_dict(module)}
            dcp.load(target, checkpoint_id=str(sharded))
            set_model_state_dict(module, target["model"])
            source = f"sharded ({sharded.relative_to(checkpoint)})"
        elif plain.is_dir():
            module.restore_from_path(plain)
            source = f"rl_module ({plain.relative_to(checkpoint)})"
        else:
            raise FileNotFoundError(f"{learner_dir}: neither sharded_state/{module_id} nor rl_module/{module_id}")
    model = module.model
    if hasattr(model, "merge_and_unload"):  # LoRA: the served model is base + deltas
        model = model.merge_and_unload()
    if dtype is not None:
        model = model.to(torch_dtype(dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    model_path = Path(str(spec.model_config["model_path"]))
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(model_path).save_pretrained(out)
    with open(learner_dir / "state.pkl", "rb") as f:
        seq_no = int(pickle.load(f).get("weights_seq_no", 0))
    (out / "rllib_spear_export.json").write_text(json.dumps(
        {"checkpoint": str(checkpoint), "module_id": module_id, "weights_seq_no": seq_no,
         "source": source, "base_model_path": str(model_path), "dtype": str(next(model.parameters()).dtype)},
        indent=2))
    return out
