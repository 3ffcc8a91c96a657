"""Atomic, verified checkpoints (docs/design.md "Atomic checkpoints"): a save that fails or is
killed mid-write leaves the previous checkpoint loadable and no partial one; a full disk names the
path and the fix; a truncated, corrupted or missing file is refused at restore by name.

The GRPO tests run the real ``GRPO.save_to_path`` / ``restore_from_path`` / ``from_checkpoint``
(RLlib's Checkpointable writer underneath) on an algorithm object without actors: its state is a
plain dict, so no Ray cluster is needed."""
from __future__ import annotations

import errno
import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rllib_spear import checkpoint_io
from rllib_spear.checkpoint_io import (MANIFEST_FILE, CheckpointWriteError, CorruptCheckpointError, atomic_folder,
                                       verify_checkpoint)
from rllib_spear.checkpoint_paths import resolve_checkpoint

STATE_FILE = "algorithm_state.pkl"


def _bare_grpo(state: dict, restored: list | None = None):
    """A GRPO object without actors whose state is ``state`` (set_state appends to ``restored``)."""
    from rllib_spear.algorithms.grpo.grpo import GRPO

    algo = object.__new__(GRPO)
    algo.config = SimpleNamespace(sharding=None)
    algo.get_state = lambda *a, **k: dict(state)
    algo.get_checkpointable_components = lambda: []
    algo.get_ctor_args_and_kwargs = lambda: ((), {})
    algo.set_state = lambda s: (restored if restored is not None else []).append(s)
    algo.env_runner_group = SimpleNamespace(num_remote_env_runners=lambda: 0, local_env_runner=None)
    return algo


def _restored_state(path: Path) -> dict:
    out: list = []
    _bare_grpo({}, out).restore_from_path(str(path))
    return out[-1]


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def _failing_pickle_dump(monkeypatch, exc) -> None:
    """RLlib's pickle.dump of the state file writes part of it, then raises ``exc`` (or what
    ``exc(file)`` returns, when it is a function)."""
    import ray.rllib.utils.checkpoints as rllib_checkpoints

    real = pickle.dump

    def dump(obj, f, *a, **k):
        if isinstance(obj, dict) and "step" in obj:  # the algorithm state, not the ctor args
            f.write(b"\x80\x04partial")
            raise exc(f) if callable(exc) else exc
        return real(obj, f, *a, **k)

    monkeypatch.setattr(rllib_checkpoints.pickle, "dump", dump)


# ------------------------------------------------------------------ checkpoint_io alone
def test_atomic_folder_publishes_a_complete_folder(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_folder(target) as tmp:
        assert not target.exists() and tmp.parent == tmp_path
        (tmp / "sub").mkdir()
        (tmp / "sub" / "a.bin").write_bytes(b"a" * 1000)
        (tmp / "b.json").write_text("{}")
    assert sorted(p.name for p in target.iterdir()) == ["b.json", MANIFEST_FILE, "sub"]
    assert _leftovers(tmp_path) == []
    assert verify_checkpoint(target) is True
    with atomic_folder(target) as tmp:  # replaces the existing folder whole (swap)
        (tmp / "c.bin").write_bytes(b"c")
    assert sorted(p.name for p in target.iterdir()) == ["c.bin", MANIFEST_FILE]
    assert _leftovers(tmp_path) == []


def test_swap_without_rename_exchange(tmp_path, monkeypatch):
    """Where renameat2(RENAME_EXCHANGE) is missing: two renames; a failing second one puts the
    previous checkpoint back; a crash between them is named at restore with the fix."""
    monkeypatch.setattr(checkpoint_io, "_rename_exchange", lambda a, b: False)
    target = tmp_path / "ckpt"
    for content in (b"old", b"new"):
        with atomic_folder(target) as tmp:
            (tmp / "x.bin").write_bytes(content)
    assert (target / "x.bin").read_bytes() == b"new" and _leftovers(tmp_path) == []

    real_rename, calls = os.rename, []

    def rename(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise OSError(errno.EIO, "I/O error", str(b))
        real_rename(a, b)

    monkeypatch.setattr(checkpoint_io.os, "rename", rename)
    with pytest.raises(CheckpointWriteError):
        with atomic_folder(target) as tmp:
            (tmp / "x.bin").write_bytes(b"newer")
    monkeypatch.setattr(checkpoint_io.os, "rename", real_rename)
    assert (target / "x.bin").read_bytes() == b"new" and _leftovers(tmp_path) == []

    old = tmp_path / ".ckpt.old-123-abc"  # what a kill between the two renames leaves
    target.rename(old)
    with pytest.raises(FileNotFoundError, match=rf"{old}; rename it back"):
        verify_checkpoint(target)


def test_verify_a_component_subfolder(tmp_path):
    """A component restore names a subfolder: the manifest above it checks that subfolder's files."""
    target = tmp_path / "ckpt"
    with atomic_folder(target) as tmp:
        (tmp / "learner").mkdir()
        (tmp / "learner" / "w.bin").write_bytes(b"w" * 100)
        (tmp / "other.bin").write_bytes(b"o" * 100)
    (target / "other.bin").write_bytes(b"x")
    assert verify_checkpoint(target / "learner") is True
    (target / "learner" / "w.bin").write_bytes(b"w" * 99)
    with pytest.raises(CorruptCheckpointError, match="w.bin: 99 bytes where 100 were written"):
        verify_checkpoint(target / "learner")


def test_a_change_after_verification_is_still_found(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_folder(target) as tmp:
        (tmp / "w.bin").write_bytes(b"w" * 100)
    assert verify_checkpoint(target)
    (target / "w.bin").write_bytes(b"v" * 100)  # same size, new contents: the mtime changed
    os.utime(target / "w.bin", ns=(1, 1))
    with pytest.raises(CorruptCheckpointError, match="CRC-32"):
        verify_checkpoint(target)


def test_resolve_skips_an_incomplete_latest_checkpoint(tmp_path, caplog):
    """An interrupted copy (e.g. to Tune's storage) leaves a truncated latest checkpoint: the CLI
    takes the latest complete one."""
    trial = tmp_path / "trial"
    for i in (1, 2):
        with atomic_folder(trial / f"checkpoint_00000{i}") as tmp:
            (tmp / "rllib_checkpoint.json").write_text("{}")
            (tmp / STATE_FILE).write_bytes(b"s" * 100)
    assert resolve_checkpoint(trial) == trial / "checkpoint_000002"
    (trial / "checkpoint_000002" / STATE_FILE).write_bytes(b"s" * 10)
    with caplog.at_level(logging.WARNING):
        assert resolve_checkpoint(trial) == trial / "checkpoint_000001"
    assert "checkpoint_000002" in caplog.text and "10 bytes where 100 were written" in caplog.text


# ------------------------------------------------------------------ GRPO.save_to_path / restore_from_path
def test_save_writes_a_manifest_and_restores(tmp_path):
    path = tmp_path / "ckpt"
    assert _bare_grpo({"step": 1}).save_to_path(str(path)) == str(path)
    assert (path / MANIFEST_FILE).is_file() and _leftovers(tmp_path) == []
    assert _restored_state(path)["step"] == 1
    _bare_grpo({"step": 2}).save_to_path(str(path))  # over an existing checkpoint
    assert _restored_state(path)["step"] == 2 and _leftovers(tmp_path) == []


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """An exception from inside the write (what a kill looks like to the files): today's save
    into the same folder left a half-written state file there."""
    path = tmp_path / "ckpt"
    _bare_grpo({"step": 1}).save_to_path(str(path))
    _failing_pickle_dump(monkeypatch, RuntimeError("killed mid-write"))
    with pytest.raises(RuntimeError, match="killed mid-write"):
        _bare_grpo({"step": 2}).save_to_path(str(path))
    monkeypatch.undo()
    assert _restored_state(path)["step"] == 1
    assert _leftovers(tmp_path) == [], "the partial temporary folder is removed"


def test_failed_first_save_leaves_nothing(tmp_path, monkeypatch):
    _failing_pickle_dump(monkeypatch, RuntimeError("killed mid-write"))
    with pytest.raises(RuntimeError):
        _bare_grpo({"step": 1}).save_to_path(str(tmp_path / "ckpt"))
    assert list(tmp_path.iterdir()) == []


def test_full_disk_names_the_path_and_the_fix(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    _bare_grpo({"step": 1}).save_to_path(str(path))
    def full_disk(_):  # the OSError of the write into the save's temporary folder
        (tmp,) = [p for p in tmp_path.iterdir() if p.name.startswith(".ckpt.tmp-")]
        return OSError(errno.ENOSPC, "No space left on device", str(tmp / STATE_FILE))

    _failing_pickle_dump(monkeypatch, full_disk)
    with pytest.raises(CheckpointWriteError) as info:
        _bare_grpo({"step": 2}).save_to_path(str(path))
    monkeypatch.undo()
    msg = str(info.value)
    assert info.value.errno == errno.ENOSPC and isinstance(info.value, OSError)
    assert f"could not write the checkpoint {path}" in msg and "ENOSPC" in msg
    assert f"while writing {STATE_FILE};" in msg
    assert f"free space on the filesystem of {tmp_path}" in msg and "save to another path" in msg
    assert f"the previous checkpoint at {path} is untouched" in msg
    assert _restored_state(path)["step"] == 1 and _leftovers(tmp_path) == []


_KILLED_SAVE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from types import SimpleNamespace
    from rllib_spear.algorithms.grpo.grpo import GRPO

    class SlowToPickle:
        # pickled after the large blob: says "mid-write", then waits for the SIGKILL
        def __reduce__(self):
            Path(sys.argv[2]).write_text("writing")
            time.sleep(120)
            return (str, ("never",))

    algo = object.__new__(GRPO)
    algo.config = SimpleNamespace(sharding=None)
    algo.get_state = lambda *a, **k: {"step": 2, "blob": b"x" * (64 << 20), "slow": SlowToPickle()}
    algo.get_checkpointable_components = lambda: []
    algo.get_ctor_args_and_kwargs = lambda: ((), {})
    algo.save_to_path(sys.argv[1])
""")


def test_sigkill_mid_save_keeps_the_previous_checkpoint(tmp_path):
    """A process SIGKILLed while it writes a large state over an existing checkpoint: the
    previous one still loads, and the next save clears the dead save's temporary folder."""
    path, marker = tmp_path / "ckpt", tmp_path / "marker"
    _bare_grpo({"step": 1}).save_to_path(str(path))
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_SAVE, str(path), str(marker)],
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None, "the saving process ended before its write"
            assert time.monotonic() < deadline, "the saving process never reached its write"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _restored_state(path)["step"] == 1
    dead = [n for n in _leftovers(tmp_path) if n.startswith(".ckpt.tmp-")]
    assert dead, "the killed save wrote into a temporary folder"
    _bare_grpo({"step": 3}).save_to_path(str(path))
    assert _restored_state(path)["step"] == 3 and _leftovers(tmp_path) == []


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_file_is_refused_by_name(tmp_path, damage):
    path = tmp_path / "ckpt"
    _bare_grpo({"step": 1, "blob": b"x" * 4096}).save_to_path(str(path))
    f = path / STATE_FILE
    data = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
        expected = rf"{f}: {len(data) // 2} bytes where {len(data)} were written"
    elif damage == "flip":
        f.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
        expected = rf"{f}: CRC-32 \w+ where \w+ was written"
    else:
        f.unlink()
        expected = rf"{f}: missing"
    with pytest.raises(CorruptCheckpointError, match=expected) as info:
        _restored_state(path)
    assert "restore an earlier checkpoint" in str(info.value)


def test_from_checkpoint_refuses_before_building(tmp_path):
    """``GRPO.from_checkpoint`` checks the manifest before it unpickles the constructor args."""
    from rllib_spear.algorithms.grpo.grpo import GRPO

    path = tmp_path / "ckpt"
    _bare_grpo({"step": 1}).save_to_path(str(path))
    ctor = path / "class_and_ctor_args.pkl"
    ctor.write_bytes(ctor.read_bytes()[:-3])
    with pytest.raises(CorruptCheckpointError, match=rf"{ctor}: \d+ bytes where \d+ were written"):
        GRPO.from_checkpoint(str(path))


def test_unreadable_manifest_is_named(tmp_path):
    path = tmp_path / "ckpt"
    _bare_grpo({"step": 1}).save_to_path(str(path))
    (path / MANIFEST_FILE).write_text('{"files": ')
    with pytest.raises(CorruptCheckpointError, match=rf"{path / MANIFEST_FILE}: the checkpoint's manifest"):
        _restored_state(path)


def test_checkpoint_without_manifest_still_loads(tmp_path, caplog):
    """A checkpoint of an older version (no manifest) loads, with a debug log."""
    path = tmp_path / "ckpt"
    _bare_grpo({"step": 1}).save_to_path(str(path))
    (path / MANIFEST_FILE).unlink()
    with caplog.at_level(logging.DEBUG, logger="rllib_spear.checkpoint_io"):
        assert _restored_state(path)["step"] == 1
    assert f"no {MANIFEST_FILE}" in caplog.text
