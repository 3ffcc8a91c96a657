"""Find the Algorithm checkpoint a path means (``rllib-spear eval`` / ``export``).

Tune writes ``<storage_path>/<name>/<trial>/checkpoint_000NNN``: the experiment folder holds one
folder per trial, each trial folder one ``checkpoint_*`` folder per save. A user may pass any of
the three levels; :func:`resolve_checkpoint` takes the checkpoint itself, the latest checkpoint of
a trial, or that of the only trial of an experiment, and otherwise names what it found; a latest
checkpoint whose files do not match its manifest's sizes (an interrupted copy) is skipped. No Ray
import here: this runs before the (slow) restore.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from .checkpoint_io import check_sizes

logger = logging.getLogger(__name__)

__all__ = ["is_checkpoint", "trial_checkpoints", "latest_complete", "resolve_checkpoint"]

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


def latest_complete(checkpoints: list[Path]) -> Path:
    """The latest of a trial's ``checkpoints`` whose files match their manifest's sizes (a copy to
    Tune's storage that was interrupted leaves an incomplete folder); a skipped one is logged.
    The latest itself when none is complete: its restore then names the bad file."""
    for ckpt in reversed(checkpoints):
        why = check_sizes(ckpt)
        if why is None:
            return ckpt
        logger.warning("skipping the incomplete checkpoint %s: %s", ckpt, why)
    return checkpoints[-1]


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint ``path`` means: itself when it is one; the latest complete one of a trial
    folder (:func:`latest_complete`); that of the only trial of an experiment folder.
    FileNotFoundError naming the path and what to pass otherwise (the trials when there are
    several)."""
    p = Path(path).expanduser().absolute()
    if not p.exists():
        raise FileNotFoundError(f"{path}: no such folder (pass a checkpoint_NNNNNN folder, a Tune trial folder "
                                f"or an experiment folder with one trial)")
    if is_checkpoint(p):
        return p
    own = trial_checkpoints(p)
    if own:
        return latest_complete(own)
    trials = [d for d in sorted(p.iterdir()) if d.is_dir() and trial_checkpoints(d)] if p.is_dir() else []
    if len(trials) == 1:
        return latest_complete(trial_checkpoints(trials[0]))
    if trials:
        listing = "\n".join(f"  {t} (latest: {trial_checkpoints(t)[-1].name})" for t in trials)
        raise FileNotFoundError(f"{path} holds {len(trials)} trials; pass one of them:\n{listing}")
    raise FileNotFoundError(f"{path}: not an Algorithm checkpoint (no {' or '.join(_MARKERS)}), and no "
                            f"checkpoint_NNNNNN folder in it or in a trial folder under it")
