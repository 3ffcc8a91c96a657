"""Key checks with "did you mean ...": the keys of an ``rllib-spear`` experiment (its YAML file and
its ``--set`` overrides) and the kwargs of the config builder methods (``.training(group_szie=8)``).

A misspelt key used to be kept and then dropped (``--set trainig.lr=1e-5``) or only warned about
by Tune while the run went on (``stop.training_iterations``); every check here fails at once
instead, naming the key and the closest valid ones (``key_suggestions.py``).

Rules (rllib_spear/cli.py documents the YAML layout):

* top-level keys: :data:`TOP_LEVEL_KEYS`;
* ``config``: one mapping per AlgorithmConfig builder method (:func:`builder_sections`), each
  holding the kwargs of that method (:func:`builder_keys`; the values below a kwarg, such as the
  keys of ``env_config`` or ``engine_kwargs``, belong to the environment or the engine and are
  not checked here);
* ``stop``: a Tune result key of :data:`STOP_KEYS`, or a metric inside a result section written
  as one path with "/" (``env_runners/success_rate``); any other flat key is refused, since Tune
  only warns about a key it never sees and trains to the end.

Pure Python at import (difflib, inspect): the config instances are passed in, so Ray is only
loaded by whoever built them (``rllib-spear --help`` imports this module).
"""
from __future__ import annotations

import difflib
import inspect
from typing import Any, Collection, Mapping

from .key_suggestions import KEY_ALIASES, did_you_mean, explicit_params

__all__ = ["ConfigKeyError", "ConfigTypeError", "TOP_LEVEL_KEYS", "STOP_KEYS", "SHORTHAND_SECTIONS",
           "check_value_type", "check_section_types", "builder_sections", "builder_keys", "check_key_path",
           "check_experiment_keys", "check_override_keys"]

#: The top-level keys of an experiment YAML (rllib_spear/cli.py).
TOP_LEVEL_KEYS = ("algorithm", "stop", "name", "storage_path", "checkpoint_freq", "max_failures", "num_samples",
                  "num_cpus", "config")

#: Builder sections a ``--set`` key may name without ``config.`` (``training.lr=1e-5``): RLlib's
#: AlgorithmConfig builder methods that take keyword settings.
SHORTHAND_SECTIONS = ("environment", "env_runners", "training", "learners", "rl_module", "debugging",
                      "fault_tolerance", "resources", "reporting", "evaluation", "checkpointing",
                      "callbacks", "multi_agent", "offline_data", "experimental", "framework", "api_stack",
                      "python_environment")

#: Flat result keys a ``stop`` criterion may name: what Tune fills in on every result
#: (ray/tune/result.py) and RLlib's lifetime counters and old-stack episode means.
STOP_KEYS = ("training_iteration", "timesteps_total", "time_total_s", "time_this_iter_s", "episodes_total",
             "timesteps_this_iter", "episodes_this_iter", "time_since_restore", "timesteps_since_restore",
             "iterations_since_restore", "episode_reward_mean", "episode_reward_max", "episode_reward_min",
             "episode_len_mean", "episode_return_mean", "num_env_steps_sampled_lifetime",
             "num_env_steps_trained_lifetime", "num_agent_steps_sampled_lifetime", "num_episodes_lifetime")

#: Metrics this library reports inside a result section (a flat ``success_rate`` is suggested as
#: ``env_runners/success_rate``).
_NESTED_METRICS = ("env_runners/reward_total_mean", "env_runners/success_rate", "env_runners/f1_mean",
                   "env_runners/em_mean", "env_runners/tool_call_rate", "env_runners/turns_mean",
                   "env_runners/response_length_mean")

#: Methods that return the config but are no builder section.
_NOT_SECTIONS = {"copy", "freeze", "update_from_dict", "get_config_for_module"}


class ConfigKeyError(ValueError):
    """An unknown key in an experiment or a builder call; the message names it and the fix."""


class ConfigTypeError(ConfigKeyError):
    """A builder setting of the wrong type (``temperature: "high"``); the message names the key and
    the type its default has."""


def _listing(choices: Collection[str], limit: int = 12) -> str:
    names = sorted(choices)
    more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def builder_sections(config: Any) -> set[str]:
    """The builder methods of ``config`` (``config.<section>(**kwargs)``): public methods that
    return the config and need no positional argument."""
    out = set()
    for name in dir(type(config)):
        attr = getattr(type(config), name, None)
        if name.startswith("_") or name in _NOT_SECTIONS or not inspect.isfunction(attr):
            continue
        sig = inspect.signature(attr)
        ret = sig.return_annotation
        returns_config = "Self" in str(ret) or (isinstance(ret, str) and ret.strip("'\"").endswith("Config"))
        needs_positional = any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                               for p in list(sig.parameters.values())[1:])
        if returns_config and not needs_positional:
            out.add(name)
    return out


def _extra_keys(config: Any, section: str) -> set[str] | None:
    """Keys a builder method takes through ``**kwargs`` (the library's knobs on RLlib's methods):
    ``<section>_keys()`` of the config when it has one, else the defaults tables."""
    keys_of = getattr(config, f"{section}_keys", None)
    if callable(keys_of):
        return set(keys_of())
    from .algorithms.grpo import defaults

    tables = {"env_runners": (defaults.SAMPLING_DEFAULTS, defaults.ENGINE_RESOURCE_DEFAULTS),
              "learners": (defaults.LEARNER_DEFAULTS,), "evaluation": (), "environment": (),
              "resources": (defaults.COLOCATE_DEFAULTS,)}
    if section not in tables:
        return None
    return {k for table in tables[section] for k in table}


def builder_keys(config: Any, section: str) -> set[str] | None:
    """The kwargs ``config.<section>()`` accepts: the named parameters along the class hierarchy
    (a method with ``**kwargs`` hands the rest to its parent's) plus the library's own knobs;
    None when a ``**kwargs`` method's keys are not known (nothing is checked then)."""
    keys: set[str] = set()
    for cls in type(config).__mro__:
        fn = cls.__dict__.get(section)
        if fn is None:
            continue
        names, var_kw = explicit_params(fn)
        keys |= names
        if not var_kw:
            return keys
        extra = _extra_keys(config, section)
        if extra is None:
            return None
        keys |= extra
    return keys or None


def _display(path: list[str], shorthand: bool) -> str:
    """``config.training.lr`` as written: ``training.lr`` in a ``--set`` of a builder section."""
    if shorthand and len(path) > 1 and path[0] == "config":
        return ".".join(path[1:])
    return ".".join(path)


def _section_suggestions(key: str, config: Any, shorthand: bool) -> list[str]:
    """``training.lr`` (``config.training.lr``) for a bare ``lr`` that is a builder kwarg."""
    out = []
    for section in sorted(builder_sections(config)):
        keys = builder_keys(config, section)
        if keys and key in keys:
            out.append(f"{section}.{key}" if shorthand else f"config.{section}.{key}")
    return out


def _stop_problem(key: str, value: Any) -> str | None:
    """Why ``stop.<key>`` is refused (None when it is a Tune result key or a "/" metric path)."""
    if isinstance(value, Mapping):
        return (f"stop.{key} is a mapping: write a nested metric as one key with '/', "
                f"e.g. stop: {{{key}/success_rate: 0.9}}")
    if key in STOP_KEYS or "/" in key:
        return None
    nested = [m for m in _NESTED_METRICS if m.rsplit("/", 1)[1] == key]
    hint = (f"; did you mean {nested[0]!r}?" if nested
            else did_you_mean(key, STOP_KEYS + _NESTED_METRICS, cutoff=0.7))
    return (f"stop.{key} is not a result key Tune fills in{hint} (flat keys: {', '.join(STOP_KEYS[:4])}, ... "
            f"(STOP_KEYS in rllib_spear/config_keys.py); a metric inside a result section is one path with '/', "
            f"e.g. env_runners/success_rate)")


def _top_level_hints(path: list[str], config: Any, shorthand: bool) -> list[str]:
    """What an unknown top-level key was meant to be: a builder section written outside
    ``config``, a bare builder kwarg (``lr`` -> ``training.lr``), or a near-miss of a top-level
    key or a section (``trainig.lr`` -> ``training.lr``)."""
    sections = builder_sections(config)
    prefix = "" if shorthand else "config."
    top, rest = path[0], path[1:]
    if top in sections:
        return [prefix + ".".join(path)]
    hints = _section_suggestions(KEY_ALIASES.get(top, top), config, shorthand) if not rest else []
    for c in difflib.get_close_matches(top, sorted(set(TOP_LEVEL_KEYS) | sections), n=3, cutoff=0.6):
        hints.append((prefix if c in sections else "") + ".".join([c, *rest]))
    return list(dict.fromkeys(hints))


def check_key_path(path: list[str], config: Any, *, value: Any = None, shorthand: bool = False) -> None:
    """ConfigKeyError when the experiment key ``path`` (``["config", "training", "lr"]``) is not
    valid for ``config`` (the algorithm's default config). ``shorthand``: the key was written as
    a ``--set`` may write it (``training.lr``), and suggestions are written that way too."""
    top = path[0]
    if top not in TOP_LEVEL_KEYS:
        hints = _top_level_hints(path, config, shorthand)
        hint = f"; did you mean {' or '.join(repr(h) for h in hints)}?" if hints else ""
        raise ConfigKeyError(f"unknown key {'.'.join(path)!r}{hint} (top-level keys: {', '.join(TOP_LEVEL_KEYS)}; "
                             f"builder settings go under config.<section>, e.g. config.training.lr)")
    if top == "stop" and len(path) > 1:
        problem = _stop_problem("/".join(path[1:]), value)
        if problem:
            raise ConfigKeyError(problem)
    if top != "config" or len(path) < 2:
        return
    sections = builder_sections(config)
    section = path[1]
    if section not in sections:
        raise ConfigKeyError(f"{_display(path[:2], shorthand)!r} is not an AlgorithmConfig builder method of "
                             f"{type(config).__name__}{did_you_mean(section, sections)} (sections: "
                             f"{_listing(sections & set(SHORTHAND_SECTIONS))})")
    if len(path) < 3:
        return
    keys = builder_keys(config, section)
    if keys is not None and path[2] not in keys:
        raise ConfigKeyError(f"unknown key {_display(path[:3], shorthand)!r}: {type(config).__name__}.{section}() "
                             f"takes no {path[2]!r}{did_you_mean(path[2], keys)}")


def check_experiment_keys(exp: Mapping[str, Any], config: Any, *, shorthand: bool = False) -> None:
    """Every key of an experiment mapping, as :func:`check_key_path` checks one: the top-level
    keys, each ``stop`` key, each ``config`` section and each section's kwargs."""
    for top, value in exp.items():
        check_key_path([str(top)], config, shorthand=shorthand)
        if top == "stop" and value is not None:
            if not isinstance(value, Mapping):
                raise ConfigKeyError(f"stop must be a mapping of result key to value (e.g. "
                                     f"{{training_iteration: 10}}), got {value!r}")
            for key, v in value.items():
                check_key_path(["stop", str(key)], config, value=v, shorthand=shorthand)
        if top == "config" and value is not None:
            if not isinstance(value, Mapping):
                raise ConfigKeyError(f"config must be a mapping of builder section to settings, got {value!r}")
            for section, kwargs in value.items():
                check_key_path(["config", str(section)], config, shorthand=shorthand)
                if kwargs is not None and not isinstance(kwargs, Mapping):
                    raise ConfigKeyError(f"config.{section} must be a mapping of {section}() settings, got {kwargs!r}")
                for key in kwargs or {}:
                    check_key_path(["config", str(section), str(key)], config, shorthand=shorthand)


def check_override_keys(path: list[str], value: Any, config: Any) -> None:
    """The keys one ``--set`` override writes: its path and, when its value is a mapping (``--set
    stop='{training_iteration: 3}'``), the keys inside it, with suggestions in ``--set`` form."""
    check_key_path(path, config, value=value, shorthand=True)  # the whole path, named as written
    nested: Any = value
    for key in reversed(path):
        nested = {key: nested}
    check_experiment_keys(nested, config, shorthand=True)  # and what a mapping value holds


# ---------------------------------------------------------------------- value types
#: Values RLlib takes in place of a number for some numeric knobs (rollout_fragment_length,
#: evaluation_duration, ...).
_NUMBER_WORDS = ("auto",)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def check_value_type(path: str, value: Any, default: Any) -> Any:
    """``value`` for the builder setting ``path`` (``config.env_runners.temperature``) whose default
    is ``default``: a numeric setting must get a number, else ConfigTypeError naming the key and the
    type (the comparisons in ``validate()`` would otherwise end in a bare ``TypeError``). A string
    that reads as a number is taken as one (YAML 1.1 reads ``3e-4`` as a string). Only numeric
    defaults are judged: a boolean, string or None default may stand for a knob of several types."""
    if value is None or isinstance(default, bool) or not isinstance(default, (int, float)):
        return value
    if isinstance(value, (list, tuple)) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value  # a number, or a schedule such as lr: [[0, 1e-6], [100, 1e-7]]
    if isinstance(value, str) and value in _NUMBER_WORDS:
        return value
    number = _number(value) if isinstance(value, str) else None
    if number is not None:
        return int(number) if isinstance(default, int) and number.is_integer() else number
    want = "an integer" if isinstance(default, int) else "a number"
    raise ConfigTypeError(f"{path} must be {want} (default {default!r}), got {value!r} (a {type(value).__name__})")


def _default_of(config: Any, key: str) -> Any:
    """The config's current value of a builder kwarg (None when it has no attribute of that name or
    the attribute is a deprecated one that raises on access)."""
    try:
        return getattr(config, key, None)
    except Exception:  # noqa: BLE001 - RLlib's deprecated properties raise ValueError
        return None


def check_section_types(section: str, kwargs: Mapping[str, Any], config: Any) -> dict[str, Any]:
    """The kwargs of ``config.<section>()`` with each value checked by :func:`check_value_type`
    against ``config``'s default of the same name."""
    return {k: check_value_type(f"config.{section}.{k}", v, _default_of(config, k)) for k, v in kwargs.items()}
