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

``rllib_spear_export.json`` beside the weights says where they came from and how the policy was
prompted in training (:func:`prompt_metadata`): the environment, its env_config, the system
prompt it wrote, the tool-call format, the observation template and the sampling settings. A
policy prompted otherwise (plain chat with no system prompt) does not behave as trained. Every
exported file gets the mode a new file gets here (0644 under umask 022): safetensors writes its
file 0600.
"""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any, Mapping

__all__ = ["export_checkpoint", "prompt_metadata", "METADATA_FILE"]

#: The metadata file of an export (provenance and the training prompt format).
METADATA_FILE = "rllib_spear_export.json"
#: Placeholder question of ``example_messages`` in the metadata.
QUESTION_PLACEHOLDER = "{question}"
#: The sampling settings of training an exported policy was run with.
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_new_tokens", "stop", "max_turns", "max_model_len",
                  "max_response_tokens")
_CHAT_TEMPLATE_NOTE = (
    "Training prompts were tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tool_schemas "
    "when set) with the tokenizer saved here: messages = [system: system_prompt, user: the task as the env writes it "
    "(example_messages)]. Each tool result came back as the next user/tool turn rendered by observation_template "
    "('chatml' / 'llama3' markers, or 'chat_template': a tool message through this chat template). Prompt the model "
    "the same way; without the system prompt it has no tool format to follow.")


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

    Raises ``checkpoint_io.CorruptCheckpointError`` naming the file when the checkpoint's
    manifest says a file is missing, truncated or corrupted.
    """
    import torch

    from .checkpoint_io import verify_checkpoint
    from .models.dtypes import torch_dtype

    checkpoint, out = Path(checkpoint).absolute(), Path(out)
    verify_checkpoint(checkpoint)  # a truncated or corrupted file is refused by name, before any read
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
    before = _file_stamps(out)
    model.save_pretrained(out, safe_serialization=True)
    model_path = Path(str(spec.model_config["model_path"]))
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(model_path).save_pretrained(out)
    with open(learner_dir / "state.pkl", "rb") as f:
        seq_no = int(pickle.load(f).get("weights_seq_no", 0))
    config = _algorithm_config(checkpoint)
    info = {"checkpoint": str(checkpoint), "module_id": module_id, "weights_seq_no": seq_no,
            "source": source, "base_model_path": str(model_path), "dtype": str(next(model.parameters()).dtype),
            **(prompt_metadata(config) if config is not None else {})}
    (out / METADATA_FILE).write_text(json.dumps(info, indent=2, default=repr))
    follow_umask(out, before)
    return out


def _algorithm_config(checkpoint: Path) -> dict[str, Any] | None:
    """The AlgorithmConfig state an Algorithm checkpoint was built with (its top-level
    ``class_and_ctor_args.pkl``: ``Algorithm.get_ctor_args_and_kwargs``); None without one."""
    path = checkpoint / "class_and_ctor_args.pkl"
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        args = pickle.load(f)["ctor_args_and_kwargs"][0]
    state = args[0] if args else None
    if state is not None and not isinstance(state, Mapping):
        state = getattr(state, "__dict__", None)
    return dict(state) if state is not None else None


def _spec_name(spec: Any) -> Any:
    """An env spec as JSON: a name or import path as given, a class as its import path."""
    if isinstance(spec, type):
        return f"{spec.__module__}:{spec.__qualname__}"
    return spec if isinstance(spec, str) else repr(spec)


def _example_messages(env: Any) -> list[dict[str, Any]] | None:
    """The opening messages the env writes for a task whose question is a placeholder (None when
    the env needs more of a task than a question)."""
    q = QUESTION_PLACEHOLDER
    try:
        return env.reset({"question": q, "prompt": q, "problem": q, "answer": "", "answers": [], "golden_answers": []})
    except Exception:  # noqa: BLE001 - an env may need task keys only its dataset has
        return None


def static_system_prompt(spec: Any, env_config: Mapping[str, Any]) -> str | None:
    """The system prompt of env ``spec`` read without building it: ``env_config["system_prompt"]``,
    else the class's own string (a class attribute ``system_prompt``, or the default of its
    ``system_prompt`` keyword); None when only an instance can say (a property computed from
    the constructor's arguments, a factory)."""
    import inspect

    from .envs import resolve_env

    given = env_config.get("system_prompt")
    if isinstance(given, str) and given:
        return given
    cls = resolve_env(spec).env_cls  # imports the class; builds nothing
    if cls is None:
        return None
    attr = inspect.getattr_static(cls, "system_prompt", None)
    if isinstance(attr, str) and attr:
        return attr
    try:
        param = inspect.signature(cls).parameters.get("system_prompt")
    except (TypeError, ValueError):
        return None
    default = None if param is None else param.default
    return default if isinstance(default, str) and default else None


def prompt_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """How a policy trained with ``config`` (an AlgorithmConfig's state, or the config) was
    prompted: the env and its env_config, the system prompt the env writes, the tool-call
    parser and tag, tool schemas, the observation template and the sampling settings, and a
    note on the chat template. The system prompt is read without building the env where the
    config or the class says it (:func:`static_system_prompt`); the rest (and the prompt of an
    env that computes it) comes from an instance. An env that cannot be built here (a corpus or
    sandbox missing on this machine) keeps the prompt read statically, else leaves
    ``system_prompt`` None, and says why."""
    if not isinstance(config, Mapping):
        config = vars(config)
    env_config = dict(config.get("env_config") or {})
    meta: dict[str, Any] = {"env": _spec_name(config.get("env")), "env_config": env_config}
    try:
        static = static_system_prompt(config.get("env"), env_config)
    except Exception:  # noqa: BLE001 - an unknown env: the build below says why
        static = None
    try:
        from .envs import make_env

        env = make_env(config.get("env"), **env_config)
    except Exception as e:  # noqa: BLE001 - the export itself must not depend on the env's resources
        meta.update(env_class=None, system_prompt=static, system_prompt_error=f"{type(e).__name__}: {e}")
    else:
        meta.update(env_class=f"{type(env).__module__}.{type(env).__qualname__}",
                    system_prompt=getattr(env, "system_prompt", None),
                    prompt_source=getattr(env, "prompt_source", "env"),
                    tool_parser=getattr(env, "parser_name", None), observation_tag=getattr(env, "tag", None),
                    tool_schemas=getattr(env, "tool_schemas", None), example_messages=_example_messages(env))
        if hasattr(env, "close"):
            env.close()
    meta["observation_template"] = config.get("observation_template")
    meta["sampling"] = {k: config.get(k) for k in _SAMPLING_KEYS}
    meta["chat_template"] = _CHAT_TEMPLATE_NOTE
    return meta


def _file_stamps(folder: Path) -> dict[Path, int]:
    """(file -> mtime_ns) of the files under ``folder``: what the export finds there already."""
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def _new_file_mode(folder: Path) -> int:
    """The mode a new file gets in ``folder`` (0644 under umask 022): created and read back,
    which also honours a default ACL, instead of swapping the process-wide umask."""
    probe = folder / f".rllib_spear_mode_probe_{os.getpid()}"
    probe.touch()
    try:
        return probe.stat().st_mode & 0o777
    finally:
        probe.unlink()


def follow_umask(folder: Path, before: Mapping[Path, int]) -> None:
    """Give every file the export wrote under ``folder`` (new, or changed since ``before``) the
    mode of a normal new file: safetensors writes ``model.safetensors`` 0600, which other users
    and a serving container running as another user cannot read."""
    mode = _new_file_mode(folder)
    for path, stamp in _file_stamps(folder).items():
        if before.get(path) != stamp:
            path.chmod(mode)
