"""``replay_buffer_config`` of self-imitation: which buffer class SIL builds, and with which
constructor arguments (docs/algorithms.md 2.6).

One source of truth: the buffer is built from ``replay_buffer_config`` alone, by RLlib's own
``ray.rllib.utils.from_config`` (as DQN and SAC build theirs). Each SIL knob the dict leaves out
is filled from its ``sil_*`` key (``capacity`` <- ``sil_capacity``, ...), so the ``sil_*`` keys
are the documented names of the defaults; ``seed`` comes from the algorithm's ``seed``. A knob
given in both places with different values, while its ``sil_*`` key is off its default, is a
contradiction that ``validate()`` refuses (:func:`check_replay_buffer_config`).

``type`` is ``"SILReplayBuffer"`` (or any class name of ``rllib_spear.recipe.sil_buffer``), a
class, ``"pkg.module:Class"`` or ``"pkg.module.Class"``. A class whose constructor takes no
``**kwargs`` gets only the ``sil_*`` defaults it names (a user buffer ``__init__(self,
capacity, seed=None)`` gets ``capacity`` and ``seed``).
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any

from . import sil_buffer
from .piece import ErrorFn
from .sil_buffer import SILReplayBuffer

__all__ = ["SIL_BUFFER_KNOBS", "DEFAULT_REPLAY_BUFFER_CONFIG", "resolve_buffer_class", "buffer_kwargs",
           "build_sil_buffer", "check_replay_buffer_config"]

#: constructor argument of SILReplayBuffer -> the ``training()`` key that holds its default
SIL_BUFFER_KNOBS: dict[str, str] = {k: f"sil_{k}" for k in (
    "capacity", "tolerate_steps", "baseline_buffer_size", "trigger", "replay_batch_size",
    "min_replay_size", "require_tool_call", "keep_zero", "std_normalize")}

DEFAULT_REPLAY_BUFFER_CONFIG: dict[str, Any] = {"type": "SILReplayBuffer"}

def resolve_buffer_class(type_: Any) -> type:
    """The class named by ``replay_buffer_config["type"]`` (None: ``SILReplayBuffer``); a
    ValueError naming what is wrong otherwise."""
    if type_ is None:
        return SILReplayBuffer
    if isinstance(type_, type):
        return type_
    if not isinstance(type_, str) or not type_:
        raise ValueError(f"must be a class or a name ('SILReplayBuffer', 'pkg.module:Class'), got {type_!r}")
    if ":" in type_:
        mod_name, _, attr = type_.partition(":")
    elif "." in type_:
        mod_name, _, attr = type_.rpartition(".")
    else:
        mod_name, attr = sil_buffer.__name__, type_
    try:
        obj = getattr(importlib.import_module(mod_name), attr)
    except ImportError as e:
        raise ValueError(f"cannot import module {mod_name!r} of {type_!r} ({type(e).__name__}: {e})") from e
    except AttributeError:
        raise ValueError(f"module {mod_name!r} has no class {attr!r} (a name of this library's buffers is "
                         "'SILReplayBuffer'; a class of yours is 'pkg.module:Class')") from None
    if not isinstance(obj, type):
        raise ValueError(f"{type_!r} is a {type(obj).__name__}, not a class")
    return obj


def _accepted(cls: type) -> set[str] | None:
    """Keyword arguments ``cls(...)`` takes; None when it takes ``**kwargs``."""
    params = inspect.signature(cls).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _rbc(cfg: Any) -> dict[str, Any]:
    rbc = getattr(cfg, "replay_buffer_config", None)
    return dict(DEFAULT_REPLAY_BUFFER_CONFIG if rbc is None else rbc)


def buffer_kwargs(cfg: Any, cls: type) -> dict[str, Any]:
    """Constructor arguments of the SIL buffer: ``replay_buffer_config`` (less ``type``), plus
    the ``sil_*`` default of each knob it leaves out that ``cls`` takes."""
    given = {k: v for k, v in _rbc(cfg).items() if k != "type"}
    defaults = {kw: getattr(cfg, key) for kw, key in SIL_BUFFER_KNOBS.items()}
    defaults["seed"] = int(getattr(cfg, "seed", 0) or 0)
    takes = _accepted(cls)
    return {**{k: v for k, v in defaults.items() if k not in given and (takes is None or k in takes)}, **given}


def build_sil_buffer(cfg: Any) -> Any:
    """The SIL buffer of ``cfg``: ``from_config`` (RLlib's construction path) of the resolved
    ``replay_buffer_config``."""
    from ray.rllib.utils.from_config import from_config

    sil_buffer.register_with_rllib()
    cls = resolve_buffer_class(_rbc(cfg).get("type"))
    buf = from_config(SILReplayBuffer, {**buffer_kwargs(cfg, cls), "type": cls})
    if buf is None:  # from_config answers None for an abstract class
        raise TypeError(f"replay_buffer_config['type'] = {cls.__qualname__} is abstract: it lacks "
                        f"{sorted(getattr(cls, '__abstractmethods__', ()))}")
    return buf


def check_replay_buffer_config(cfg: Any, err: ErrorFn) -> None:
    """``validate()`` of ``replay_buffer_config`` and ``store_buffer_in_checkpoints``: a dict
    whose ``type`` is a replay buffer class that takes every given key, SIL knobs a
    ``SILReplayBuffer`` accepts, and no contradiction with a ``sil_*`` key."""
    from .self_imitation import SIL_DEFAULTS

    if not isinstance(cfg.store_buffer_in_checkpoints, bool):
        err(f"`store_buffer_in_checkpoints` must be True or False, got {cfg.store_buffer_in_checkpoints!r}")
    rbc = getattr(cfg, "replay_buffer_config", None)
    if rbc is not None and not isinstance(rbc, dict):
        err("`replay_buffer_config` must be a dict {'type': 'SILReplayBuffer' | a class | 'pkg.module:Class', "
            f"'capacity': ..., <SIL knobs>}}, got {rbc!r}")
    rbc = _rbc(cfg)
    try:
        cls = resolve_buffer_class(rbc.get("type"))
    except ValueError as e:
        err(f"`replay_buffer_config['type']`: {e}")
    _check_interface(cls, err)
    takes = _accepted(cls)
    for k in rbc:
        if k == "type" or takes is None or k in takes:
            continue
        hint = (f"; the SIL knobs are named without the prefix here: {k[4:]!r}"
                if k.startswith("sil_") and k[4:] in SIL_BUFFER_KNOBS else "")
        err(f"`replay_buffer_config[{k!r}]`: {cls.__qualname__} takes no argument {k!r} "
            f"(it takes {sorted(takes)}){hint}")
    for kw, key in SIL_BUFFER_KNOBS.items():
        ours = getattr(cfg, key)
        if kw in rbc and ours != SIL_DEFAULTS[key] and ours != rbc[kw]:
            err(f"`replay_buffer_config[{kw!r}]` = {rbc[kw]!r} contradicts `{key}` = {ours!r}: the buffer is "
                f"built from replay_buffer_config, and `{key}` only fills in a knob it leaves out; set the "
                f"knob in one place: drop {kw!r} from replay_buffer_config, or leave `{key}` at its default "
                f"{SIL_DEFAULTS[key]!r} (docs/algorithms.md 2.6)")
    if issubclass(cls, SILReplayBuffer):
        try:  # the constructor checks every knob (range, choice) and names it
            cls(**buffer_kwargs(cfg, cls))
        except (TypeError, ValueError) as e:
            err(f"`replay_buffer_config` (with the sil_* defaults filled in): {e}")


def _check_interface(cls: type, err: ErrorFn) -> None:
    from ray.rllib.utils.replay_buffers.base import ReplayBufferInterface

    sil_buffer.register_with_rllib()
    if not issubclass(cls, ReplayBufferInterface):
        err(f"`replay_buffer_config['type']` = {cls.__qualname__} is not a ray.rllib.utils.replay_buffers."
            "ReplayBufferInterface: subclass SILReplayBuffer, or ReplayBufferInterface with the methods "
            "SPEAR calls (docs/algorithms.md 2.6)")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        err(f"`replay_buffer_config['type']` = {cls.__qualname__} does not implement {missing} of "
            "ReplayBufferInterface (docs/algorithms.md 2.6)")
