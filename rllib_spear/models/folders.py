"""The policy's ``model_path`` must be a local model folder: nothing is ever downloaded.

The learners build the module and the engines load the weights from ``<model_path>/config.json``
and its ``save_pretrained`` files. A Hugging Face hub id or a missing folder would otherwise fail
deep inside a remote actor (transformers retrying a download, or "Repo id must be in the form
..."); these checks name the path and the fix before anything starts. No torch import here:
``validate()`` calls :func:`looks_like_hub_id`.
"""
from __future__ import annotations

import re
from pathlib import Path

__all__ = ["looks_like_hub_id", "require_model_folder"]

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def looks_like_hub_id(path: str) -> bool:
    """Whether ``path`` has the shape of a hub id (``owner/name``, relative) and no such folder
    exists here (``meta-llama/Llama-3.1-8B-Instruct``: True; ``/models/x`` or an existing
    ``models/x``: False)."""
    return bool(_HUB_ID.fullmatch(str(path))) and not Path(path).exists()


def model_path_fix(path: str) -> str:
    """How to turn ``path`` into a local folder (the download command and the override)."""
    name = str(path).rstrip("/").rsplit("/", 1)[-1] or "model"
    repo = path if looks_like_hub_id(path) else f"<owner>/{name}"
    return (f"nothing is downloaded: put the model in a local folder first (e.g. `hf download "
            f"{repo} --local-dir /models/{name}`) and point rl_module.model_config.model_path at it "
            f"(--set rl_module.model_config.model_path=/models/{name})")


def require_model_folder(path: str, given: str | None = None) -> str:
    """``path`` (a resolved ``model_path``) when it is a folder holding ``config.json``; else a
    ValueError naming the path as the user gave it (``given``, default ``path``) and the fix."""
    given = str(path) if given is None else str(given)
    if (Path(path) / "config.json").is_file():
        return str(path)
    what = ("looks like a Hugging Face hub id" if looks_like_hub_id(given)
            else "is not a folder" if not Path(path).is_dir() else "is a folder without config.json")
    raise ValueError(f"model_path {given!r} {what}: the policy is loaded from a local save_pretrained folder "
                     f"(<folder>/config.json); {model_path_fix(given)}")
