"""Atomic, verifiable checkpoint folders (docs/design.md "Fault tolerance", "Atomic checkpoints").

A save writes into a temporary sibling folder (``.<name>.tmp-<pid>-<hex>``, same filesystem),
records every file's size and CRC-32 in a manifest as its last file, fsyncs the files and the
folders, and only then renames the folder into place; a target folder that exists already is
swapped with it in one ``renameat2(RENAME_EXCHANGE)`` where Linux offers it. A kill at any moment
leaves the previous checkpoint at the target and at most a hidden temporary folder (removed by
the next save of that target). ``verify_checkpoint`` checks the manifest before anything reads
the checkpoint and names the first missing, truncated or corrupted file. No Ray import here.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import shutil
import threading
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

logger = logging.getLogger(__name__)

__all__ = ["MANIFEST_FILE", "CheckpointWriteError", "CorruptCheckpointError", "atomic_folder", "is_local_path",
           "write_manifest", "verify_checkpoint", "check_sizes"]

#: The manifest, written last into a checkpoint's top folder.
MANIFEST_FILE = "rllib_spear_manifest.json"
_FORMAT = "rllib_spear.checkpoint_manifest"
_VERSION = 1
_TMP_TAG = ".tmp-"
_OLD_TAG = ".old-"
#: Read size of the checksums (large reads: zlib.crc32 releases the GIL, so files hash in parallel).
_CHUNK = 8 << 20
#: Parent folders searched for a manifest when a restore names a subfolder (a component restore).
_MAX_PARENTS = 6
#: (root, manifest stamp) -> the files' (size, mtime_ns) when they last verified: a second check of
#: an unchanged checkpoint in this process (from_checkpoint, then restore_from_path) only stats.
_VERIFIED: dict[tuple[str, tuple], dict[str, tuple[int, int]]] = {}
_VERIFIED_LOCK = threading.Lock()


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a quota, permissions): nothing was left at
    the target and the previous checkpoint there, if any, is untouched."""


class CorruptCheckpointError(ValueError):
    """A checkpoint's file is missing, truncated or corrupted (its manifest says otherwise)."""


# ------------------------------------------------------------------ writing
def is_local_path(path: Any, filesystem: Any = None) -> bool:
    """Whether ``path`` is on the local (or a mounted shared) filesystem: no URI, and no pyarrow
    filesystem other than the local one. Only there can a folder be renamed atomically."""
    if path is not None and "://" in str(path):
        return False
    if filesystem is None:
        return True
    try:
        import pyarrow.fs

        return isinstance(filesystem, pyarrow.fs.LocalFileSystem)
    except ImportError:  # pragma: no cover - pyarrow comes with Ray
        return False


def _sibling(target: Path, tag: str) -> Path:
    return target.with_name(f".{target.name}{tag}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _remove_leftovers(target: Path) -> None:
    """Temporary folders of earlier saves of ``target`` (a killed save leaves its own): never a
    checkpoint, so they go. An ``.old-`` folder (a swap interrupted between its two renames, where
    RENAME_EXCHANGE is missing) goes only once ``target`` exists."""
    own = f".{target.name}"
    for p in target.parent.iterdir():
        tag = p.name[len(own):] if p.name.startswith(own) else ""
        if tag.startswith(_TMP_TAG) or (tag.startswith(_OLD_TAG) and target.exists()):
            shutil.rmtree(p, ignore_errors=True)


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    except OSError as e:
        # some filesystems (and all of Windows) cannot fsync a folder; the files are synced
        if not directory or e.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _fsync_dirs(root: Path) -> None:
    """fsync every folder under ``root`` (deepest first) and ``root``: the names of the files."""
    for dirpath, _, _ in sorted(os.walk(root), key=lambda t: -len(t[0])):
        _fsync_path(Path(dirpath), directory=True)


def _rename_exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    C library or the filesystem lacks it."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _sync_rename(target: Path) -> None:
    """fsync the folder that holds ``target`` after a rename. The new checkpoint is in place
    already, so a failure here is logged, not raised (the error would say the save failed)."""
    try:
        _fsync_path(target.parent, directory=True)
    except OSError as e:
        logger.warning("checkpoint %s: written, but the fsync of its folder failed (%s); the rename "
                       "may not survive a power loss", target, e)


def _publish(tmp: Path, target: Path) -> None:
    """Move the complete ``tmp`` to ``target``; at no moment is there no checkpoint at ``target``
    (where RENAME_EXCHANGE is missing, between the two renames the old one is ``.<name>.old-*``)."""
    if not target.exists():
        os.rename(tmp, target)
        _sync_rename(target)
        return
    if not target.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{target} is a file, not a checkpoint folder; remove it "
                                 "or save to another path", str(target))
    if _rename_exchange(tmp, target):
        old = tmp  # the exchange left the previous checkpoint under the temporary name
    else:
        old = _sibling(target, _OLD_TAG)
        os.rename(target, old)
        try:
            os.rename(tmp, target)
        except BaseException:
            os.rename(old, target)  # the previous checkpoint back in place; the caller drops tmp
            raise
    _sync_rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc`` (itself, or one in its cause chain: a learner actor's write
    failure reaches the driver wrapped in a Ray error)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        # the explicit cause only: an OSError merely being handled when ``exc`` was raised is not it
        exc = exc.__cause__ or getattr(exc, "cause", None)
    return None


def _write_error(target: Path, err: OSError, tmp: Path | None = None) -> CheckpointWriteError:
    what = errno.errorcode.get(err.errno or 0, "")
    name = str(err.filename or "")
    if tmp is not None and name.startswith(f"{tmp}{os.sep}"):
        name = os.path.relpath(name, tmp)  # the temporary folder is gone: the file as the checkpoint names it
    where = f" while writing {name}" if name else ""
    kept = f"the previous checkpoint at {target} is untouched" if target.exists() else "nothing was left at the target"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = (f"free space on the filesystem of {target.parent} (df -h {target.parent}; a save needs room for "
               f"the new checkpoint beside the previous one) or save to another path (Tune: "
               f"RunConfig(storage_path=...); keep fewer with CheckpointConfig(num_to_keep=...))")
    elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = f"make {target.parent} writable for this user or save to another path"
    else:
        fix = f"check the filesystem of {target.parent} or save to another path"
    return CheckpointWriteError(err.errno, f"could not write the checkpoint {target}: {err.strerror or err}"
                                           f"{f' ({what})' if what else ''}{where}; {fix}. The partial write "
                                           f"was removed; {kept}.", str(target))


@contextlib.contextmanager
def atomic_folder(target: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``target`` to write a checkpoint into; on a clean exit its
    manifest is written, everything is fsynced and it replaces ``target`` (created or swapped);
    on any error it is removed and ``target`` is left as it was. An OSError (ENOSPC, EDQUOT,
    EACCES ...) becomes a :class:`CheckpointWriteError` naming the path and the fix."""
    target = Path(target).absolute()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(target)
        tmp = _sibling(target, _TMP_TAG)
        tmp.mkdir()
    except OSError as e:
        raise _write_error(target, e) from e
    try:
        yield tmp
        write_manifest(tmp)
        _fsync_dirs(tmp)
        _publish(tmp, target)
    except BaseException as e:  # a KeyboardInterrupt too: the partial folder must not stay
        shutil.rmtree(tmp, ignore_errors=True)
        err = _os_error(e)
        if err is not None and not isinstance(e, CheckpointWriteError):
            raise _write_error(target, err, tmp) from e
        raise


# ------------------------------------------------------------------ the manifest
def _files(root: Path) -> list[str]:
    """Every regular file under ``root`` but the manifest, as sorted POSIX paths relative to it."""
    out = []
    for dirpath, _, names in os.walk(root):
        for n in names:
            rel = (Path(dirpath) / n).relative_to(root).as_posix()
            if rel != MANIFEST_FILE:
                out.append(rel)
    return sorted(out)


def _crc32(path: Path, fsync: bool = False) -> tuple[int, str]:
    """(size, CRC-32 hex) of ``path`` read whole; with ``fsync`` its data is also flushed to disk
    through the same descriptor (the manifest's read is the fsync's pass over the file)."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
        if fsync:
            os.fsync(f.fileno())
    return size, f"{crc:08x}"


def _parallel(fn, items: list) -> list:
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(8, len(items), os.cpu_count() or 1)) as pool:
        return list(pool.map(fn, items))


def write_manifest(root: str | Path) -> Path:
    """Write ``root``'s manifest (every file's size and CRC-32), fsyncing each file on the way;
    the last file of a save."""
    root = Path(root)
    rels = _files(root)
    sums = _parallel(lambda rel: _crc32(root / rel, fsync=True), rels)
    manifest = {"format": _FORMAT, "version": _VERSION, "checksum": "crc32",
                "files": {rel: {"size": size, "crc32": crc} for rel, (size, crc) in zip(rels, sums)}}
    path = root / MANIFEST_FILE
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    return path


def _find_manifest(path: Path) -> tuple[Path, str] | None:
    """(checkpoint root, ``path`` relative to it) of the nearest folder at or above ``path`` with a
    manifest (a component restore names a subfolder of a checkpoint), or None."""
    for depth, root in enumerate([path, *path.parents]):
        if depth > _MAX_PARENTS:
            break
        if (root / MANIFEST_FILE).is_file():
            return root, "" if root == path else path.relative_to(root).as_posix()
    return None


def _read_manifest(root: Path) -> dict:
    path = root / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        if manifest.get("format") != _FORMAT or not isinstance(files, dict):
            raise ValueError("not a manifest of this format")
        return files
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpointError(f"{path}: the checkpoint's manifest is unreadable ({e}); the checkpoint "
                                     f"{root} is damaged: restore an earlier checkpoint, or copy this one "
                                     "again from where it was written") from e


def _damaged(root: Path, file: Path, what: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{file}: {what}; the checkpoint {root} is damaged (truncated or corrupted, "
                                  "e.g. an interrupted copy or a full disk): restore an earlier checkpoint (the "
                                  "previous checkpoint_NNNNNN of the trial), or copy this one again from where "
                                  f"it was written (its {MANIFEST_FILE} lists every file with its size and CRC-32)")


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


def _check_entry(root: Path, rel: str, entry: dict, checksum: bool) -> None:
    file = root / rel
    stat = _stat(file)
    if stat is None:
        raise _damaged(root, file, "missing (the manifest lists it)")
    if stat[0] != entry["size"]:
        raise _damaged(root, file, f"{stat[0]} bytes where {entry['size']} were written")
    if checksum:
        _, crc = _crc32(file)
        if crc != entry["crc32"]:
            raise _damaged(root, file, f"CRC-32 {crc} where {entry['crc32']} was written")


def _entries(files: dict, sub: str) -> dict:
    prefix = f"{sub}/" if sub else ""
    return {rel: e for rel, e in files.items() if rel.startswith(prefix)}


def _interrupted_swap(path: Path) -> Path | None:
    """The previous checkpoint of ``path`` left as ``.<name>.old-*`` by a swap interrupted between
    its two renames (only where RENAME_EXCHANGE is missing), when ``path`` itself is gone."""
    if path.exists() or not path.parent.is_dir():
        return None
    own = f".{path.name}{_OLD_TAG}"
    return next((p for p in sorted(path.parent.iterdir()) if p.name.startswith(own)), None)


def verify_checkpoint(path: str | Path, checksums: bool = True) -> bool:
    """Check the checkpoint at ``path`` (or the files under ``path`` of the checkpoint that holds
    it) against its manifest before anything reads it: every listed file is there with its size
    and (``checksums``) its CRC-32. Returns False for a checkpoint without a manifest (written
    before manifests existed; it loads as it is). Raises :class:`CorruptCheckpointError` naming
    the first bad file and the fix."""
    path = Path(path).absolute()
    old = _interrupted_swap(path)
    if old is not None:
        raise FileNotFoundError(errno.ENOENT, f"{path} is missing: a save was interrupted while it replaced this "
                                f"checkpoint, which is now {old}; rename it back (mv {old} {path}) and restore "
                                "again", str(path))
    found = _find_manifest(path)
    if found is None:
        logger.debug("%s: no %s (a checkpoint of an older version): loaded without verification",
                     path, MANIFEST_FILE)
        return False
    root, sub = found
    entries = _entries(_read_manifest(root), sub)
    key = (str(root), _stat(root / MANIFEST_FILE) or (0, 0))
    stamps = {rel: _stat(root / rel) for rel in entries}
    with _VERIFIED_LOCK:
        done = _VERIFIED.get(key)
    if checksums and done is not None and all(done.get(rel) == st for rel, st in stamps.items()):
        return True  # verified in this process and unchanged since
    _parallel(lambda item: _check_entry(root, item[0], item[1], checksums), sorted(entries.items()))
    if checksums:
        with _VERIFIED_LOCK:
            _VERIFIED.setdefault(key, {}).update(stamps)
    return True


def check_sizes(path: str | Path) -> str | None:
    """Why the checkpoint at ``path`` is incomplete by its manifest's sizes (a cheap stat, no
    reads), or None when it is complete or has no manifest."""
    try:
        verify_checkpoint(path, checksums=False)
    except CorruptCheckpointError as e:
        return str(e)
    return None
