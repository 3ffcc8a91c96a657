"""scripts/device_kit.py: the packing of wheels into device calls under the carry limit, and the
device-side install (stash, reassemble, sha256, pip install) on a small wheel made here, split
across two calls; no network."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device_kit.py"


def _kit_module():
    spec = importlib.util.spec_from_file_location("device_kit", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


dk = _kit_module()


def _file(name: str, size: int) -> dict:
    return {"name": name, "size": size}


def test_pack_splits_a_large_file_into_equal_parts_and_starts_each_stage_in_a_new_call():
    mb = 2**20
    files = {"iteration": [_file("ray.whl", 76 * mb), _file("small.whl", 2 * mb), _file("tiny.whl", mb // 2)],
             "learning": [_file("smol.whl", 89 * mb)]}
    calls = dk.pack(files, 46 * mb)
    assert all(sum(p["size"] for p in c) <= 46 * mb for c in calls)
    ray_parts = [p for c in calls for p in c if p["file"] == "ray.whl"]
    assert [p["size"] for p in ray_parts] == [38 * mb, 38 * mb], "two equal parts"
    assert [p["offset"] for p in ray_parts] == [0, 38 * mb]
    # the small files ride with the last part of Ray's wheel; the learning stage starts a new call
    assert {p["file"] for p in calls[1]} == {"ray.whl", "small.whl", "tiny.whl"}
    assert {p["file"] for p in calls[2]} == {"smol.whl"} and {p["file"] for p in calls[3]} == {"smol.whl"}
    for name, size in (("ray.whl", 76 * mb), ("smol.whl", 89 * mb)):
        assert sum(p["size"] for c in calls for p in c if p["file"] == name) == size


def test_pack_keeps_a_fitting_stage_in_one_call():
    mb = 2**20
    calls = dk.pack({"iteration": [_file("ray.whl", 34 * mb), _file("pydantic_core.whl", 2 * mb)]}, 46 * mb)
    assert len(calls) == 1 and len(calls[0]) == 2


def test_device_image_list_parses_names_and_versions():
    image = dk.device_image(ROOT / "scripts" / "device_image_packages.txt")
    assert image["torch"] == "2.11.0" and image["transformers"] == "5.17.0"
    assert "pandas" in image and image["pandas"] is None
    assert "ray" not in image, "the device image has no Ray: the kit carries it"
    assert "typing-extensions" in image, "names are canonical (PEP 503)"


def _wheel(tmp: Path, payload: int) -> Path:
    """A pure-Python wheel of a module ``kit_probe_pkg`` with ``payload`` bytes of incompressible data."""
    name = "kit_probe_pkg-1.0-py3-none-any.whl"
    data = hashlib.sha256(b"seed").digest() * (payload // 32)
    files = {"kit_probe_pkg/__init__.py": b"__version__ = '1.0'\n", "kit_probe_pkg/blob.bin": data,
             "kit_probe_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: kit-probe-pkg\nVersion: 1.0\n",
             "kit_probe_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                   b"Tag: py3-none-any\n"}
    record = "".join(f"{k},,\n" for k in files) + "kit_probe_pkg-1.0.dist-info/RECORD,,\n"
    files["kit_probe_pkg-1.0.dist-info/RECORD"] = record.encode()
    path = tmp / name
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for k, v in files.items():
            z.writestr(k, v)
    return path


def _install(kit: Path, stash: Path, site: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "install", "--kit", str(kit), "--stash", str(stash),
                           "--site", str(site), *extra], capture_output=True, text=True, timeout=300)


@pytest.fixture()
def split_kit(tmp_path):
    """A kit of one wheel split over two calls (a budget smaller than the wheel)."""
    wheel = _wheel(tmp_path, 300_000)
    size = wheel.stat().st_size
    files = {"iteration": [{"name": wheel.name, "package": "kit-probe-pkg", "version": "1.0", "path": str(wheel),
                            "size": size, "sha256": dk.sha256_file(wheel)}]}
    kit = tmp_path / "kit"
    manifest = dk.write_kit(kit, files, size // 2 + 1024, {"imports": {"iteration": ["kit_probe_pkg"]}})
    return kit, manifest


def test_install_reassembles_parts_carried_by_two_calls(split_kit, tmp_path):
    kit, manifest = split_kit
    assert len(manifest["calls"]) == 2
    assert manifest["calls"][0]["completes"] == [] and manifest["calls"][1]["completes"] == ["iteration"]
    assert "--stash-only" in manifest["calls"][0]["command"]
    assert "install" in manifest["calls"][1]["command"] and "gpu_rllib_iteration.py" in manifest["calls"][1]["command"]
    stash, site = tmp_path / "stash", tmp_path / "site"
    call2 = kit.parent / "later_call2"
    (kit / "call2").rename(call2)  # the first call carries only its own folder

    first = _install(kit, stash, site, "--stash-only")
    assert first.returncode == 0, first.stderr
    early = _install(kit, stash, site)
    assert early.returncode == 3, "a part is missing"
    assert "carried by call 2" in early.stdout

    call2.rename(kit / "call2")
    done = _install(kit, stash, site)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reassembled" in done.stdout and "imports ok" in done.stdout
    assert (site / "kit_probe_pkg" / "blob.bin").stat().st_size >= 300_000
    assert json.loads((site / ".rllib_spear_kit.json").read_text())
    again = _install(kit, stash, site)
    assert again.returncode == 0 and "already installed" in again.stdout


def test_install_refuses_a_corrupted_part(split_kit, tmp_path):
    kit, manifest = split_kit
    part = kit / "call1" / manifest["calls"][0]["parts"][0]["name"]
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    res = _install(kit, tmp_path / "stash", tmp_path / "site")
    assert res.returncode != 0
    assert part.name in res.stderr and "sha256" in res.stderr
