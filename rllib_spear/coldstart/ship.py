"""Shipping cold-start builds into the package (``rllib_spear/assets``), with their manifest.

``python -m rllib_spear.coldstart`` rebuilds the default policy and every task cold start of
``SHIPPED_TASKS`` from scratch and ships them (``ship_default_policy``, ``ship_task_policy``):
run it after changing a recipe (``coldstart.recipes``) or the embedded data, bump
``DATA_VERSION`` (rllib_spear/data/generate.py) / ``DEMOS_VERSION`` (rllib_spear/envs/demos.py)
when the generators or the demonstrations change, and commit ``rllib_spear/assets``. The
manifest's fields are described in ``coldstart.lookup``.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
from pathlib import Path

from .build import default_policy_path, task_policy_path
from .data import default_policy_data_hash, task_policy_data_hash
from .lookup import MANIFEST, SHIPPED_POLICIES, file_sha256
from .recipes import DEFAULT_POLICY_RECIPE, SHIPPED_TASKS, default_policy_key, task_policy_key, task_recipe, versions

__all__ = ["ship_build", "ship_default_policy", "ship_task_policy", "main"]

_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
          "tokenizer_config.json", "chat_template.jinja", "sft_meta.json")
_RECORDED_PACKAGES = ("torch", "transformers", "tokenizers", "bm25s", "numpy")


def ship_build(build: Path, kind: str, key: str, recipe: dict, trained_on: str,
               root: Path | None = None) -> Path:
    """Copy a finished build into ``root/<kind>-<key>`` with its manifest, removing older shipped
    builds of the same kind. ``trained_on`` is the ``coldstart.data.data_hash`` of what it trained on."""
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
    manifest = {"kind": kind, "key": key, "recipe": recipe, **versions(), "data_hash": trained_on,
                "files": files, "built_with": built_with,
                "shipped": datetime.date.today().isoformat()}
    tmp = dest / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, dest / MANIFEST)
    return dest


def ship_default_policy(cache_dir: str | os.PathLike | None = None) -> Path:
    """Build the default recipe from scratch (or take this cache's build of the same data) and
    copy it with its manifest into ``SHIPPED_POLICIES``, replacing older shipped builds."""
    path = Path(default_policy_path(cache_dir, build=True))
    return ship_build(path, "default-policy", default_policy_key(), DEFAULT_POLICY_RECIPE,
                      default_policy_data_hash(cache_dir=cache_dir))


def ship_task_policy(task: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Like ``ship_default_policy`` for ``task_policy_path(task)`` (run it after the default policy)."""
    path = Path(task_policy_path(task, cache_dir, build=True))
    return ship_build(path, f"task-policy-{task}", task_policy_key(task), task_recipe(task, None),
                      task_policy_data_hash(task, cache_dir=cache_dir))


def main() -> None:  # pragma: no cover - maintenance entry point (~20 min on 2 cores)
    """Rebuild and ship the default policy, then every task cold start of ``SHIPPED_TASKS``."""
    logging.basicConfig(level=logging.INFO)
    print(ship_default_policy())
    for task in SHIPPED_TASKS:
        print(ship_task_policy(task))
