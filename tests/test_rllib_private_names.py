"""Every private name of Ray, RLlib and Tune the library uses lives in ``rllib_spear/rllib_private.py``.

Two checks, each failing with the ``file:line`` of every use found elsewhere:

* a grep of the code of ``rllib_spear/**/*.py`` (comments and docstrings may name them) for
  Ray's private modules (``ray._private``, ``ray._raylet``, any ``ray.<...>._name``,
  ``from ray... import _name``) and for the private attributes the library has needed so far
  (``tuner._local_tuner``, ``learner_group._worker_manager``, ...);
* for every class of ours that subclasses a Ray class: no private name of its Ray bases
  (a method of theirs, or an attribute their code sets on ``self``) is defined or read by the
  class or by a mixin of ours in its MRO. An override of a private hook belongs in an adapter
  base class of ``rllib_private.py``.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import io
import pkgutil
import re
import tokenize
from pathlib import Path

import rllib_spear

PACKAGE = Path(rllib_spear.__file__).parent
ADAPTER_MODULE = "rllib_spear.rllib_private"

#: Ray's private modules, and private module-level names imported from Ray.
PRIVATE_RAY_PATHS = (
    re.compile(r"\bray(?:\.\w+)*\._\w"),            # ray._private, ray._raylet, ray.tune.registry._global_registry
    re.compile(r"\bfrom\s+ray[\w.]*\s+import\s+(?:\(?\s*)?(?:\w+\s*,\s*)*_\w"),  # from ray.x import _y
    re.compile(r"\._private\b"),
    re.compile(r"\b_raylet\b"),
)

#: Private attributes of Ray objects the library has needed (the learner's TorchLearner hooks
#: included): none may come back outside the adapter module.
KNOWN_PRIVATE_ATTRIBUTES = (
    "_global_registry", "_global_node", "_worker_manager", "_local_tuner", "_internal_kv_get",
    "_value_error", "_is_frozen", "_model_config", "_model_config_auto_includes",
    "_create_local_replay_buffer_if_necessary", "_get_backend_config",
    "_uncompiled_update", "_make_module", "_map_module_to_device", "_make_modules_ddp_if_necessary",
)
_KNOWN = re.compile(r"(?<![\w])(" + "|".join(map(re.escape, KNOWN_PRIVATE_ATTRIBUTES)) + r")(?!\w)")

#: RLlib's documented RLModule API: the methods a custom RLModule implements.
RLMODULE_API = frozenset({"_forward", "_forward_train", "_forward_inference", "_forward_exploration"})


def _library_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "rllib_private.py")


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(PACKAGE.parent)}:{line}"


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of ``path``'s code: comments cut off and docstrings blanked (they may
    name a private name to explain what wraps it; a string the code uses, such as an attribute
    name for ``getattr``, stays)."""
    text = path.read_text()
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            for i in range(body[0].lineno - 1, body[0].end_lineno):
                lines[i] = ""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col]
    return list(enumerate(lines, 1))


def test_no_private_ray_name_outside_the_adapter_module():
    found = []
    for path in _library_files():
        for i, line in _code_lines(path):
            hits = [m.group(0) for rx in PRIVATE_RAY_PATHS for m in rx.finditer(line)]
            hits += [m.group(1) for m in _KNOWN.finditer(line)]
            if hits:
                found.append(f"{_where(path, i)}: {sorted(set(hits))}: {line.strip()}")
    assert not found, ("private Ray / RLlib / Tune names outside rllib_spear/rllib_private.py (wrap each "
                       "there, with why and the public API that would replace it):\n" + "\n".join(found))


def _is_ray(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "ray"


def _is_ours(cls: type) -> bool:
    return cls.__module__.startswith("rllib_spear") and cls.__module__ != ADAPTER_MODULE


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


_SELF_ATTR = re.compile(r"\bself\.(_[A-Za-z]\w*)")
_SELF_SET = re.compile(r"\bself\.(_[A-Za-z]\w*)\s*(?::[^=\n]*)?=(?!=)")


def _own_private_names(ray_class: type) -> set[str]:
    """Private names one Ray class defines: its methods and class attributes, and the attributes
    its code sets on ``self``."""
    names = {n for n in vars(ray_class) if _private(n)}
    try:
        names.update(_SELF_SET.findall(inspect.getsource(ray_class)))
    except (OSError, TypeError):  # a class without Python source
        pass
    return names


def _our_private_uses(cls: type) -> dict[str, str]:
    """Private names our classes in ``cls``'s MRO define or read on ``self``: name -> file:line."""
    uses: dict[str, str] = {}
    for k in filter(_is_ours, cls.__mro__):
        lines, first = inspect.getsourcelines(k)
        path = Path(inspect.getsourcefile(k))
        for off, line in enumerate(lines):
            names = _SELF_ATTR.findall(line) + re.findall(r"^\s*def\s+(_[A-Za-z]\w*)", line)
            names += re.findall(r"^\s{4}(_[A-Za-z]\w*)\s*(?::[^=\n]*)?=", line)  # class attributes
            for n in names:
                uses.setdefault(n, _where(path, first + off))
    return uses


def _library_classes() -> list[type]:
    classes = []
    for info in pkgutil.walk_packages(rllib_spear.__path__, "rllib_spear."):
        if info.name.endswith("__main__") or info.name == ADAPTER_MODULE:
            continue
        mod = importlib.import_module(info.name)
        classes += [c for c in vars(mod).values()
                    if inspect.isclass(c) and c.__module__ == mod.__name__ and any(map(_is_ray, c.__mro__))]
    return classes


def test_no_subclass_of_a_ray_class_touches_its_bases_private_names():
    classes = _library_classes()
    assert {"GRPO", "GRPOConfig", "LLMEnvRunner", "HFCausalLMRLModule"} <= {c.__name__ for c in classes}
    found = []
    for cls in classes:
        owners = {b.__name__: _own_private_names(b) for b in cls.__mro__ if _is_ray(b)}
        for name, where in _our_private_uses(cls).items():
            owner = next((o for o, names in owners.items() if name in names), None)
            if owner is not None and name not in RLMODULE_API:
                found.append(f"{where}: {cls.__name__} uses {owner}.{name}")
    assert not found, ("private names of Ray base classes outside rllib_spear/rllib_private.py (override "
                       "them in an adapter base class there):\n" + "\n".join(sorted(set(found))))
