"""The model layer stands alone: no module under rllib_spear/models imports the environments, the
data or the cold starts, at module level or inside a function (docs/design.md, "The embedded
default policy", "Where the code lives"). The cold starts (rllib_spear.coldstart) depend on the
models, never the reverse. The sources are parsed, not imported."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rllib_spear"
FORBIDDEN = ("rllib_spear.envs", "rllib_spear.data", "rllib_spear.coldstart")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The absolute names an import statement brings in (``from . import x`` -> ``pkg.x``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".")
        base = base if is_package else base[:-1]
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{a.name}" for a in node.names]


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def _violations(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):  # every depth: functions, methods, try blocks
            for name in _imported(node, module, path.name == "__init__.py"):
                if _forbidden(name):
                    found.append(f"{module} (line {node.lineno}) imports {name}")
                    break
        # importlib.import_module("rllib_spear.envs...") is an import too
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                    "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
                if isinstance(node.args[0].value, str) and _forbidden(node.args[0].value):
                    found.append(f"{module} (line {node.lineno}) imports {node.args[0].value}")
    return found


def test_models_import_no_env_data_or_coldstart_module():
    assert (PACKAGE / "models").is_dir()
    bad = _violations(PACKAGE / "models")
    assert not bad, "the model layer must not import envs/data/coldstart:\n" + "\n".join(bad)


def test_the_checker_sees_relative_and_nested_imports(tmp_path):
    """The checker itself: relative imports at any level and imports inside functions count."""
    pkg = PACKAGE / "models"
    cases = {
        "from ..envs import make_env": True,
        "from .. import coldstart": True,
        "from ..data.generate import DATA_VERSION": True,
        "import rllib_spear.envs.retrieval": True,
        "def f():\n    from rllib_spear.coldstart.lookup import find_shipped": True,
        "from .factory import hash_dir": False,
        "from ..core import trajectory": False,
        "import rllib_spear.models.sft": False,
    }
    for code, bad in cases.items():
        tree = ast.parse(code)
        names = [n for node in ast.walk(tree) for n in _imported(node, "rllib_spear.models.x", False)]
        assert any(_forbidden(n) for n in names) is bad, (code, names)
    assert _module_name(pkg / "__init__.py") == "rllib_spear.models"
