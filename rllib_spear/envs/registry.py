"""Which tool environment an env spec names, and how remote runners find it.

An env spec is what ``.environment(env=...)`` and :func:`make_env` take:

* a :class:`~rllib_spear.envs.base.ToolEnv` subclass: built as ``cls(**env_config)``;
* a name registered with :func:`register_env` (the five built-ins and ``agent_program`` are
  registered here, imported on first use), or with Ray Tune's ``ray.tune.register_env(name,
  creator)`` (RLlib's convention: ``creator(env_config: dict) -> env``);
* an import path ``"pkg.module:ClassName"`` (or RLlib's dotted ``"pkg.module.ClassName"``): the
  attribute is a ToolEnv subclass or a factory ``factory(env_config: dict) -> ToolEnv``.

:func:`resolve_env` turns a spec into a :class:`ResolvedEnv` (``.make(env_config)`` builds one
instance); the result of every build must be a ``ToolEnv``.

Remote env runners (Ray actors) receive the config, spec included, and resolve it themselves:

* a class travels with the config (cloudpickle: by value when defined in ``__main__`` or inside a
  function, by reference, i.e. re-imported, otherwise);
* an import path is imported in the worker. Ray 2.60 puts the driver's working directory and
  the directory of the driver script on every worker's ``sys.path``, not other entries added
  to ``sys.path`` at run time; ship anything
  else with ``ray.init(runtime_env={"py_modules": [path]})`` or ``{"working_dir": path}``;
* :func:`register_env` also registers the name in Ray Tune's registry, which Ray keeps in the
  cluster's KV store for the job, so runners (and Tune's trainable actor) find a name registered
  in the driver before or after ``ray.init``. Looking a name up there uses Tune's private
  registry, as RLlib itself does (``rllib_private.tune_env_registry``: Tune has no public lookup).
"""
from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Mapping

from ..registry import Registry
from .base import ToolEnv

__all__ = ["ENVS", "BUILTIN_ENVS", "ResolvedEnv", "register_env", "unregister_env", "resolve_env",
           "env_names", "env_label", "builtin_env_name", "check_env_spec"]

log = logging.getLogger(__name__)

REGISTER_HOW = ("register it with rllib_spear.register_env(name, MyEnv) (a ToolEnv subclass or a "
                "factory(env_config) -> ToolEnv), pass the class itself, or an import path "
                "'pkg.module:MyEnv'")

ENVS: Registry[Any] = Registry("environment", register_hint="rllib_spear.register_env")

# The built-ins, as import paths: resolving a name imports nothing, building one imports its module.
BUILTIN_ENVS = {
    "search_qa": "rllib_spear.envs.search_envs:SearchQAEnv",
    "multi_answer_search": "rllib_spear.envs.search_envs:MultiAnswerSearchEnv",
    "multi_answer": "rllib_spear.envs.search_envs:MultiAnswerSearchEnv",
    "code_math": "rllib_spear.envs.code_math:CodeMathEnv",
    "text_game": "rllib_spear.envs.text_game:TextGameEnv",
    "textworld": "rllib_spear.envs.textworld_env:TextWorldEnv",
}
for _name, _path in BUILTIN_ENVS.items():
    ENVS.register(_name, _path)
# The user's agent program against the runner's OpenAI endpoint (rollout_mode="agent_program"):
# registered by name, but no built-in task kind (its tasks, data and reward are the user's).
ENVS.register("agent_program", "rllib_spear.envs.agent_program:AgentProgramEnv")


class _ClassCreator:
    """A ToolEnv class as an RLlib-style creator, ``creator(env_config) -> cls(**env_config)``
    (what :func:`register_env` puts in Tune's registry for a class)."""

    def __init__(self, cls: type):
        self.cls = cls

    def __call__(self, env_config: Mapping[str, Any] | None = None) -> ToolEnv:
        return self.cls(**dict(env_config or {}))

    def __repr__(self) -> str:
        return f"_ClassCreator({self.cls.__module__}.{self.cls.__qualname__})"


class _PathCreator:
    """An import path as an RLlib-style creator (imported in the process that builds the env)."""

    def __init__(self, path: str):
        self.path = path

    def __call__(self, env_config: Mapping[str, Any] | None = None) -> ToolEnv:
        return ResolvedEnv(self.path, self.path).make(env_config)


def _is_tool_env_class(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, ToolEnv)


def _check_target(obj: Any, label: str) -> None:
    if isinstance(obj, type) and not issubclass(obj, ToolEnv):
        raise TypeError(f"environment {label}: {obj.__module__}.{obj.__qualname__} is not a subclass of "
                        "rllib_spear.envs.ToolEnv (subclass it, or register a factory(env_config) that "
                        "returns a ToolEnv)")
    if not callable(obj):
        raise TypeError(f"environment {label}: expected a ToolEnv subclass or a factory(env_config) -> "
                        f"ToolEnv, got {type(obj).__name__} {obj!r:.80}")


@dataclass
class ResolvedEnv:
    """A resolved env spec: ``label`` (for messages) and the class or factory that builds it.

    ``target`` is a ToolEnv subclass (called as ``cls(**env_config)``), a factory (called as
    ``factory(env_config)``), or, for a built-in, its import path (imported on first use).
    """

    label: str
    target: Any

    def _loaded(self) -> Any:
        t = self.target
        if isinstance(t, str):  # a built-in, imported on first use
            t = _import_path(t, self.label)
            _check_target(t, self.label)
            self.target = t
        return t

    @property
    def env_cls(self) -> type | None:
        """The ToolEnv subclass, or None for a factory."""
        t = self._loaded()
        return t if _is_tool_env_class(t) else None

    def accepts(self, key: str) -> bool:
        """Whether the class takes the keyword ``key`` (named or through ``**kwargs``); False for
        a factory (it reads what it wants from the dict)."""
        cls = self.env_cls
        if cls is None:
            return False
        try:
            params = inspect.signature(cls).parameters.values()
        except (TypeError, ValueError):
            return False
        return any(p.name == key or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)

    def make(self, env_config: Mapping[str, Any] | None = None) -> ToolEnv:
        """A new instance built from ``env_config``; ``ValueError`` naming the env for a config
        its constructor refuses, ``TypeError`` when the result is not a ToolEnv."""
        t = self._loaded()
        cfg = dict(env_config or {})
        try:
            env = t(**cfg) if isinstance(t, type) else t(cfg)
        except TypeError as e:
            raise ValueError(f"make_env({self.label!r}): bad env_config {sorted(cfg)}: {e}") from e
        if not isinstance(env, ToolEnv):
            raise TypeError(f"environment {self.label!r} built a {type(env).__module__}.{type(env).__qualname__}, "
                            "not a rllib_spear.envs.ToolEnv (reset(task) -> messages, step(text) -> StepResult, "
                            "episode_stats() -> EpisodeStats, system_prompt)")
        return env


def _import_path(path: str, label: str | None = None) -> Any:
    """The object at ``"pkg.module:attr"`` (or dotted ``"pkg.module.attr"``)."""
    if ":" in path:
        mod_name, _, attr = path.partition(":")
    else:
        mod_name, _, attr = path.rpartition(".")
    who = f"environment {label or path!r}"
    if not mod_name or not attr:
        raise ValueError(f"{who}: {path!r} is not an import path 'pkg.module:ClassName'")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ValueError(
            f"{who}: cannot import module {mod_name!r} ({type(e).__name__}: {e}). The module must be "
            "importable in every process that builds the env (remote env runners too): Ray puts the "
            "driver's working directory and script directory on the workers' sys.path; ship anything else "
            "with ray.init(runtime_env={'py_modules': [path]}) or {'working_dir': path}") from e
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{who}: module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _tune_registry():
    """Tune's process registry and its env category (private: RLlib resolves env names with
    it), or None without Ray."""
    try:
        from ..rllib_private import tune_env_registry
    except ImportError:  # pragma: no cover - ray is a dependency
        return None, None
    return tune_env_registry()


def _from_tune(name: str) -> Any | None:
    reg, cat = _tune_registry()
    if reg is None:
        return None
    try:
        if not reg.contains(cat, name):
            return None
        return reg.get(cat, name)
    except Exception as e:  # noqa: BLE001 - an unpicklable or missing creator: say so
        raise ValueError(f"environment {name!r} is registered with Tune but cannot be loaded here: "
                         f"{type(e).__name__}: {e}") from e


def register_env(name: str, env: Any = None, *, override: bool = False) -> Any:
    """Register a tool environment under ``name`` and return it; with ``env`` omitted, a decorator.

    ``env``: a :class:`ToolEnv` subclass (built as ``env(**env_config)``), any other callable
    (RLlib's convention: ``env(env_config: dict) -> ToolEnv``), or an import path
    ``"pkg.module:ClassName"``. The name is also registered with ``ray.tune.register_env`` (as an
    ``env_config -> env`` creator), so remote env runners of the same Ray job resolve it too.
    A taken name raises ``ValueError`` unless ``override=True``.
    """
    if env is None:
        def deco(obj: Any) -> Any:
            register_env(name, obj, override=override)
            return obj
        return deco
    if not isinstance(env, str):
        _check_target(env, repr(name))
    ENVS.register(name, env, override=override)
    reg, _ = _tune_registry()
    if reg is None:
        return env
    from ray.tune.registry import register_env as tune_register_env

    creator = _PathCreator(env) if isinstance(env, str) else _ClassCreator(env) if isinstance(env, type) else env
    try:
        tune_register_env(name, creator)
    except Exception as e:  # noqa: BLE001 - unpicklable: still usable in this process
        log.warning("register_env(%r): could not register it with Ray Tune (%s: %s); only this process "
                    "(a local env runner) can build it, remote env runners cannot", name, type(e).__name__, e)
    return env


def unregister_env(name: str) -> None:
    """Remove a name added with :func:`register_env` (here and in Tune's registry); for tests."""
    ENVS.unregister(name)
    if name in BUILTIN_ENVS:
        ENVS.register(name, BUILTIN_ENVS[name])
        return
    reg, cat = _tune_registry()
    if reg is not None:
        reg.unregister(cat, name)


def env_names() -> list[str]:
    """Names registered with :func:`register_env` in this process (built-ins included; names
    registered only with ``ray.tune.register_env`` are found too but not listed)."""
    return ENVS.names()


def env_label(spec: Any) -> str:
    """A short description of a spec for messages and metrics."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, type):
        return f"{spec.__module__}:{spec.__qualname__}"
    return repr(spec)[:80]


def resolve_env(spec: Any) -> ResolvedEnv:
    """The env a spec names (see module docstring). A built-in is not imported until built.

    Raises ``ValueError`` for an unknown name or an import path that does not import (naming the
    spec and the registered names) and ``TypeError`` for an object that is not a ToolEnv class or
    a factory.
    """
    if isinstance(spec, ResolvedEnv):
        return spec
    if isinstance(spec, str):
        if spec in ENVS:
            target = ENVS.get(spec)
            if isinstance(target, str) and spec not in BUILTIN_ENVS:
                target = _import_path(target, spec)
                _check_target(target, repr(spec))
            return ResolvedEnv(spec, target)
        creator = _from_tune(spec)
        if creator is not None:
            if isinstance(creator, _PathCreator):  # registered by our register_env as a path
                return ResolvedEnv(spec, resolve_env(creator.path).target)
            if isinstance(creator, _ClassCreator):  # ... or as a class: build it as one
                creator = creator.cls
            _check_target(creator, repr(spec))
            return ResolvedEnv(spec, creator)
        if ":" in spec or "." in spec:
            try:
                target = _import_path(spec)
            except ValueError as e:
                if ":" in spec:
                    raise
                raise ValueError(f"unknown environment {spec!r}: not a registered name ({env_names()}), and as "
                                 f"an import path: {e}. To use your own, {REGISTER_HOW}") from e.__cause__
            _check_target(target, repr(spec))
            return ResolvedEnv(spec, target)
        raise ValueError(f"unknown environment {spec!r}; registered: {env_names()} (or names registered "
                         f"with ray.tune.register_env). To use your own, {REGISTER_HOW}")
    if isinstance(spec, type):
        _check_target(spec, env_label(spec))
        return ResolvedEnv(env_label(spec), spec)
    if callable(spec):
        return ResolvedEnv(env_label(spec), spec)
    raise TypeError(f"environment spec must be a name, an import path 'pkg.module:Class' or a ToolEnv "
                    f"subclass, got {type(spec).__name__} {spec!r:.80}")


def builtin_env_name(spec: Any) -> str | None:
    """The built-in name of a spec ("search_qa", ...) when it is one (by name or by class), else None."""
    if isinstance(spec, str):
        return spec if spec in BUILTIN_ENVS and ENVS.get(spec) == BUILTIN_ENVS[spec] else None
    if isinstance(spec, type):
        path = f"{spec.__module__}:{spec.__qualname__}"
        return next((n for n, p in BUILTIN_ENVS.items() if p == path and n != "multi_answer"), None)
    return None


def check_env_spec(spec: Any, *, in_config: bool = False) -> str | None:
    """None when ``spec`` resolves, else the reason (for ``config.validate()``). Imports nothing for
    a built-in name. ``in_config``: RLlib's config takes a name or a class only, not a factory."""
    if in_config and not isinstance(spec, (str, type)):
        return (f"{spec!r:.80} is not a name, an import path 'pkg.module:Class' or a ToolEnv subclass; "
                "register a factory with rllib_spear.register_env('my_env', factory) and pass 'my_env'")
    try:
        resolve_env(spec)
    except (ValueError, TypeError) as e:
        return str(e)
    return None
