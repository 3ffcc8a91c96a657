"""Find the Algorithm checkpoint a path means (``rllib-spear eval`` / ``export``).

Tune writes ``<storage_path>/<name>/<trial>/checkpoint_000NNN``: the experiment folder holds one
folder per trial, each trial folder one ``checkpoint_*`` folder per save. A user may pass any of
the three levels; :func:`resolve_checkpoint` takes the checkpoint itself, the latest checkpoint of
a trial, or that of the only trial of an experiment, and otherwise names what it found. No Ray
import here: this runs before the (slow) restore.
"""
from __future__ import annotations

import re
from pathlib import Path

__all__ = ["is_checkpoint", "trial_checkpoints", "resolve_checkpoint"]

#: Files only an Algorithm checkpoint's top folder has (ray/rllib/utils/checkpoints.py writes them).
_MARKERS = ("class_and_ctor_args.pkl", "rllib_checkpoint.json")
_NUMBERED = re.compile(r"checkpoint_(\d+)")


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is an Algorithm checkpoint folder (``Algorithm.save_to_path`` / Tune)."""
    return path.is_dir() and any((path / m).is_file() for m in _MARKERS)


def trial_checkpoints(trial: Path) -> list[Path]:
    """The ``checkpoint_NNNNNN`` checkpoints of a Tune trial folder, oldest first."""
    found = []
    for d in trial.iterdir() if trial.is_dir() else ():
        m = _NUMBERED.fullmatch(d.name)
        if m and is_checkpoint(d):
            found.append((int(m.group(1)), d))
    return [d for _, d in sorted(found)]


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint ``path`` means: itself when it is one; the latest of a trial folder; the
    latest of the only trial of an experiment folder. FileNotFoundError naming the path and what
    to pass otherwise (the trials when there are several)."""
    p = Path(path).expanduser().absolute()
    if not p.exists():
        raise FileNotFoundError(f"{path}: no such folder (pass a checkpoint_NNNNNN folder, a Tune trial folder "
                                f"or an experiment folder with one trial)")
    if is_checkpoint(p):
        return p
    own = trial_checkpoints(p)
    if own:
        return own[-1]
    trials = [d for d in sorted(p.iterdir()) if d.is_dir() and trial_checkpoints(d)] if p.is_dir() else []
    if len(trials) == 1:
        return trial_checkpoints(trials[0])[-1]
    if trials:
        listing = "\n".join(f"  {t} (latest: {trial_checkpoints(t)[-1].name})" for t in trials)
        raise FileNotFoundError(f"{path} holds {len(trials)} trials; pass one of them:\n{listing}")
    raise FileNotFoundError(f"{path}: not an Algorithm checkpoint (no {' or '.join(_MARKERS)}), and no "
                            f"checkpoint_NNNNNN folder in it or in a trial folder under it")
