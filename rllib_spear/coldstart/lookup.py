"""Finding a cold start: shipped builds by their manifest, and model names to folders.

A shipped build is a folder ``rllib_spear/assets/<kind>-<key>/`` holding a ``save_pretrained``
model and tokenizer plus ``manifest.json`` (written by ``coldstart.ship``):

- ``key``: :func:`rllib_spear.coldstart.recipes.recipe_key` of the recipe, the embedded data
  version and the demonstrations version (and of the parent build's key, for builds derived from
  another one). It is computed from constants in the repository only, so resolving
  ``model_path: embedded`` costs a hash and a file read: no scripted demonstrations, no BM25
  searches, no dependence on the machine.
- ``data_hash``: :func:`rllib_spear.coldstart.data.data_hash` of everything the build trained on
  (demonstrations, corpus texts, reading conversations), recorded at ship time.
  ``tests/models/test_default_policy.py`` regenerates the data and compares: that is how a change
  of the demonstrations, the generators or a dependency that shapes them (BM25, ...) is caught
  without making the lookup depend on it.
- ``files``: the sha256 of every file, checked when the build is copied into the cache (a Git LFS
  pointer or a truncated download is refused rather than loaded).
- ``built_with``: the versions of the packages the build ran with, for the record.

``resolve_model_path`` turns a ``model_path`` into a folder: "embedded" and "embedded:<task>" name
the embedded cold starts, the names of ``NAMED_COLD_STARTS`` ("smollm2-search", "smollm2-tools") the
cold starts of real pretrained models (built on first use, never shipped), anything else is returned unchanged. The algorithm (``GRPO.setup``), the env
runners and the CLI call it; the model layer (``rllib_spear.models``) only ever sees folders.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from rllib_spear.envs.retrieval import file_sha256
from rllib_spear.cache_paths import cache_root
from rllib_spear.models.factory import atomic_build_dir

__all__ = ["SHIPPED_POLICIES", "NAMED_COLD_STARTS", "NAMED_COLD_START_SHAPES", "MANIFEST", "read_manifest", "find_shipped", "copy_shipped", "file_sha256",
           "is_embedded_name", "resolve_model_path", "cold_start_name"]

#: Built cold starts shipped with the package, one folder per (kind, key).
SHIPPED_POLICIES = Path(__file__).resolve().parent.parent / "assets"
MANIFEST = "manifest.json"

#: Cold starts of real pretrained models, by the ``model_path`` that names them: name ->
#: (module of this package, function returning the folder). Built on first use, never shipped.
NAMED_COLD_STARTS: dict[str, tuple[str, str]] = {
    "smollm2-search": ("smollm2", "smollm2_search_path"),
    # SmolLM2 taught the Hermes tool-call format on synthetic tools: where a new tool or environment starts
    "smollm2-tools": ("smollm2_tools", "smollm2_tools_path"),
    # the plain instruct model, no cold start (it answers a new tool's requests in prose)
    "smollm2-instruct": ("smollm2", "smollm2_instruct_path"),
}

#: The bundled config.json (rllib_spear/assets/model_configs) of each named cold start's model:
#: what the memory planner sizes it by without building it.
NAMED_COLD_START_SHAPES: dict[str, str] = {name: "SmolLM2-135M-Instruct" for name in NAMED_COLD_STARTS}


def read_manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def find_shipped(kind: str, key: str, root: Path | None = None) -> tuple[Path, dict] | None:
    """(folder, manifest) of the shipped build of ``kind`` with ``key``, or None."""
    folder = (root or SHIPPED_POLICIES) / f"{kind}-{key}"
    manifest = read_manifest(folder)
    if manifest is None or manifest.get("kind") != kind or manifest.get("key") != key:
        return None
    return folder, manifest


def copy_shipped(folder: Path, manifest: dict, dest: Path) -> Path:
    """Copy a shipped build into ``dest`` (atomically, a ``DONE`` marker last), checking every
    file against the manifest's sha256; a mismatch raises and leaves nothing at ``dest``."""
    if (dest / "DONE").exists():
        return dest
    with atomic_build_dir(dest) as tmp:
        for name, digest in manifest["files"].items():
            shutil.copy2(folder / name, tmp / name)
            if file_sha256(tmp / name) != digest:
                raise RuntimeError(
                    f"shipped build {folder}: {name} does not match its manifest (sha256); the package "
                    "is damaged or holds a Git LFS pointer: reinstall it, or build the policy with "
                    "RLLIB_SPEAR_BUILD_DEFAULT_POLICY=1")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        (tmp / "DONE").write_text("ok\n")
    return dest


def is_embedded_name(path: str) -> bool:
    """Whether ``path`` names a cold start ("embedded" or "embedded:<task>") rather than a folder."""
    return path == "embedded" or path.startswith("embedded:")


def resolve_model_path(path: str) -> str:
    """"embedded" -> the default policy (``default_policy_path``, trained on search_qa);
    "embedded:<task>" -> that policy fine-tuned on the task's demonstrations (``task_policy_path``,
    e.g. "embedded:multi_answer_search"); a name of ``NAMED_COLD_STARTS`` -> that cold start
    ("smollm2-search": ``coldstart.smollm2.smollm2_search_path``, "smollm2-tools":
    ``coldstart.smollm2_tools.smollm2_tools_path``); anything else unchanged."""
    if path in NAMED_COLD_STARTS:
        import importlib

        module, function = NAMED_COLD_STARTS[path]
        return getattr(importlib.import_module(f"{__package__}.{module}"), function)()
    if not is_embedded_name(path):
        return path
    from . import build  # build finds shipped builds through this module: imported on use

    task = path.split(":", 1)[1] if ":" in path else "default"
    return build.default_policy_path() if task in ("", "default", "search_qa") else build.task_policy_path(task)


def cold_start_name(path: str, cache_dir: str | Path | None = None) -> str | None:
    """The name of ``NAMED_COLD_STARTS`` that ``path`` is, or whose build it is (a folder that a
    cache record ``<cache>/<name>-<key>.json`` points to); None for anything else. Reads the
    records only: never builds."""
    if path in NAMED_COLD_STARTS:
        return path
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    for name in NAMED_COLD_STARTS:
        for record in root.glob(f"{name}-*.json"):
            try:
                if json.loads(record.read_text()).get("path") == path:
                    return name
            except (OSError, ValueError, AttributeError):
                continue
    return None
