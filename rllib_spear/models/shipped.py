"""Cold-start builds that ship with the package, found by a manifest instead of by replaying data.

A shipped build is a folder ``rllib_spear/assets/<kind>-<key>/`` holding a ``save_pretrained``
model and tokenizer plus ``manifest.json``:

- ``key``: :func:`recipe_key` of the recipe, the embedded data version and the demonstrations
  version (and of the parent build's key, for builds derived from another one). It is computed
  from constants in the repository only, so resolving ``model_path: embedded`` costs a hash and a
  file read: no scripted demonstrations, no BM25 searches, no dependence on the machine.
- ``data_hash``: :func:`data_hash` of everything the build trained on (demonstrations, corpus
  texts, reading conversations), recorded at ship time. ``tests/models/test_default_policy.py``
  regenerates the data and compares: that is how a change of the demonstrations, the generators
  or a dependency that shapes them (BM25, ...) is caught without making the lookup depend on it.
- ``files``: the sha256 of every file, checked when the build is copied into the cache (a Git LFS
  pointer or a truncated download is refused rather than loaded).
- ``built_with``: the versions of the packages the build ran with, for the record.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from rllib_spear.envs.retrieval import file_sha256

from .factory import atomic_build_dir

__all__ = ["SHIPPED_POLICIES", "MANIFEST", "recipe_key", "data_hash", "find_shipped", "copy_shipped",
           "ship_build", "file_sha256"]

#: Built cold starts shipped with the package, one folder per (kind, key).
SHIPPED_POLICIES = Path(__file__).resolve().parent.parent / "assets"
MANIFEST = "manifest.json"
_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
          "tokenizer_config.json", "chat_template.jinja", "sft_meta.json")
_RECORDED_PACKAGES = ("torch", "transformers", "tokenizers", "bm25s", "numpy")


def _versions() -> dict[str, str]:
    """What the embedded data and demonstrations are versioned by (imported lazily: the data and
    env layers are not needed to load a model)."""
    from rllib_spear.data.generate import DATA_VERSION
    from rllib_spear.envs.demos import DEMOS_VERSION

    return {"data_version": DATA_VERSION, "demos_version": str(DEMOS_VERSION)}


def recipe_key(kind: str, recipe: dict, parent_key: str | None = None) -> str:
    """sha256[:16] of (kind, recipe, data version, demonstrations version, parent key): the name of
    a build of ``recipe``. Pure: the same on every machine for the same repository."""
    payload = {"kind": kind, "recipe": recipe, "parent": parent_key, **_versions()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def data_hash(*parts: Any) -> str:
    """sha256[:16] of the JSON of every part (conversations, corpus texts...) a build trains on."""
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


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


def ship_build(build: Path, kind: str, key: str, recipe: dict, trained_on: str,
               root: Path | None = None) -> Path:
    """Copy a finished build into ``root/<kind>-<key>`` with its manifest, removing older shipped
    builds of the same kind. ``trained_on`` is the :func:`data_hash` of what it trained on."""
    import importlib.metadata as md

    root = root or SHIPPED_POLICIES
    dest = root / f"{kind}-{key}"
    for old in root.glob(f"{kind}-*"):
        if old != dest and old.is_dir():
            shutil.rmtree(old)
    dest.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in _FILES:
        if (build / name).exists():
            shutil.copy2(build / name, dest / name)
            files[name] = file_sha256(dest / name)
    built_with = {}
    for pkg in _RECORDED_PACKAGES:
        try:
            built_with[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    manifest = {"kind": kind, "key": key, "recipe": recipe, **_versions(), "data_hash": trained_on,
                "files": files, "built_with": built_with,
                "shipped": datetime.date.today().isoformat()}
    tmp = dest / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, dest / MANIFEST)
    return dest
