"""Hostile code against the sandbox: every case is contained, reported in the result (never an
exception), finishes within its timeout, and this test process survives."""
import os
import shutil
import socket
import time

import pytest

from rllib_spear.testing import make_stats

from rllib_spear.envs.sandbox import PythonSandbox, available_backends

WALL = 3.0
BACKENDS = available_backends()
ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def sb():
    s = PythonSandbox(wall_timeout_s=WALL, cpu_time_s=1, memory_mb=512, max_processes=16, max_output_bytes=1 << 20)
    return s


def run(sb, code):
    t = time.monotonic()
    res = sb.run(code)
    assert time.monotonic() - t < WALL + 3, res
    return res


def _sandbox_uid_processes():
    from rllib_spear.envs.sandbox import _proc_uid

    return sum(1 for d in os.listdir("/proc") if d.isdigit() and 61000 <= (_proc_uid(d) or 0) < 62024)


def _assert_no_sandbox_processes():
    for _ in range(20):
        if _sandbox_uid_processes() == 0:
            return
        time.sleep(0.1)
    assert _sandbox_uid_processes() == 0


def test_backend_choice(sb):
    if shutil.which("bwrap") and BACKENDS["bwrap"]:
        assert sb.backend == "bwrap"
    assert sb.run("print(6*7)").output == "42\n"


def test_fork_bomb(sb):
    res = run(sb, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert res.error and ("timeout" in res.error or "signal" in res.error)
    _assert_no_sandbox_processes()


def test_memory_bomb(sb):
    res = run(sb, "x = []\nwhile True:\n    x.append(bytearray(50 * 1024 * 1024))\n")
    assert "MemoryError" in res.output and not res.ok
    res = run(sb, "x = bytearray(8 * 1024 ** 3)")
    assert "MemoryError" in res.output


def test_infinite_loop(sb):
    res = run(sb, "while True:\n    pass\n")
    assert res.error and ("CPU" in res.error or "timeout" in res.error)
    res = PythonSandbox(wall_timeout_s=1.0).run("import time\ntime.sleep(60)")  # wall clock, no CPU
    assert res.timed_out and "timeout" in res.error


def test_write_outside_scratch(sb, tmp_path):
    targets = [tmp_path / "pwned", "/tmp/rllib_spear_pwned", os.path.join(os.getcwd(), "pwned_by_sandbox")]
    code = "\n".join(
        f"try:\n    open({str(t)!r}, 'w').write('x')\n    print('wrote', {str(t)!r})\nexcept Exception as e:\n    print('no', type(e).__name__)"
        for t in targets) + "\nopen('inside.txt', 'w').write('fine')\nprint(open('inside.txt').read())\n"
    res = run(sb, code)
    assert "fine" in res.output
    for t in targets:
        assert not os.path.exists(t), f"sandbox wrote {t}"


def test_read_planted_secret(sb, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-4242")
    secret.chmod(0o600)
    code = (f"for p in [{str(secret)!r}, '/etc/shadow', '/root/.bashrc', '/proc/1/environ']:\n"
            "    try:\n        print(open(p).read()[:200])\n    except Exception as e:\n        print('denied', p, type(e).__name__)\n")
    res = run(sb, code)
    assert "TOPSECRET-4242" not in res.output and "denied" in res.output


def test_parent_environment(sb, monkeypatch):
    monkeypatch.setenv("RLLIB_SPEAR_PLANTED", "ENVSECRET-777")
    me = os.getpid()
    code = (f"import os\nprint(dict(os.environ))\n"
            f"for p in ['/proc/{me}/environ', '/proc/' + str(os.getppid()) + '/environ', '/proc/self/environ']:\n"
            "    try:\n        print(open(p, 'rb').read())\n    except Exception as e:\n        print('denied', type(e).__name__)\n")
    res = run(sb, code)
    assert "ENVSECRET-777" not in res.output


def test_network_socket(sb):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    code = (f"import socket\nfor addr in [('127.0.0.1', {port}), ('8.8.8.8', 53), ('1.1.1.1', 80)]:\n"
            "    try:\n        s = socket.create_connection(addr, timeout=1)\n        print('CONNECTED', addr)\n"
            "    except Exception as e:\n        print('blocked', addr, type(e).__name__)\n")
    res = run(sb, code)
    assert "CONNECTED" not in res.output
    with pytest.raises(OSError):
        srv.accept()
    srv.close()


def test_kill_parent(sb):
    me = os.getpid()
    code = (f"import os, signal\nfor f in [lambda: os.kill({me}, 9), lambda: os.kill(os.getppid(), 9), "
            f"lambda: os.killpg(os.getpgid({me}), 9), lambda: os.kill(-1, 9)]:\n"
            "    try:\n        f()\n    except Exception as e:\n        print('denied', type(e).__name__)\n")
    res = run(sb, code)
    assert os.getpid() == me  # still alive
    assert sb.run("print('alive')").output == "alive\n"


def test_print_100mb(sb):
    res = run(sb, "import sys\nsys.stdout.write('x' * 100_000_000)\n")
    assert res.output_truncated and "output cap" in res.error
    assert len(res.output) <= (1 << 20)


def test_error_observation_in_env():
    from rllib_spear.envs import make_env

    env = make_env("code_math", sandbox_config={"wall_timeout_s": 2.0, "cpu_time_s": 1})
    env.reset({"prompt": "p", "answer": "1"})
    r = env.step("<code>\n```python\nwhile True: pass\n```\n</code>")
    assert r.observation.startswith("<interpreter>") and "Error:" in r.observation and not r.done
    r = env.step("<code>\n```python\nprint('y' * 10_000_000)\n```\n</code>")
    assert "output truncated" in r.observation and len(r.observation) < 2000


@pytest.mark.parametrize("backend", ["process", "unshare"])
def test_fallback_backends(backend, tmp_path, monkeypatch):
    if not BACKENDS.get(backend):
        pytest.skip(f"backend {backend} not usable here")
    if not ROOT:
        pytest.skip("fallback uid drop is only available to root")
    sb = PythonSandbox(backend=backend, wall_timeout_s=2.0, cpu_time_s=1, memory_mb=512)
    secret = tmp_path / "secret.txt"
    secret.write_text("FALLBACK-SECRET")
    secret.chmod(0o600)
    monkeypatch.setenv("RLLIB_SPEAR_PLANTED", "ENV-FALLBACK")
    me = os.getpid()
    code = (f"import os\nprint(os.getuid(), dict(os.environ))\n"
            f"for f in [lambda: open({str(secret)!r}).read(), lambda: open('/proc/{me}/environ').read(), "
            f"lambda: os.kill({me}, 9), lambda: open({str(tmp_path / 'w')!r}, 'w').write('x')]:\n"
            "    try:\n        print(f())\n    except Exception as e:\n        print('denied', type(e).__name__)\n")
    res = run(sb, code)
    assert res.backend == backend
    assert "FALLBACK-SECRET" not in res.output and "ENV-FALLBACK" not in res.output
    assert int(res.output.split()[0]) >= 61000 and not (tmp_path / "w").exists()
    res = run(sb, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert res.error
    _assert_no_sandbox_processes()
    res = run(sb, "x = bytearray(4 * 1024 ** 3)")
    assert "MemoryError" in res.output


_RUNNER = r'''
import sys, time, json
from rllib_spear.envs.sandbox import PythonSandbox
sb = PythonSandbox(backend=sys.argv[1], wall_timeout_s=8.0, cpu_time_s=5)
time.sleep(float(sys.argv[2]))
r = sb.run(sys.argv[3])
print(json.dumps({"output": r.output, "error": r.error, "exit_code": r.exit_code}))
'''


@pytest.mark.parametrize("backend", ["bwrap", "process"])
def test_failing_cell_in_other_process_does_not_kill_running_cell(backend):
    """Two env-runner processes at once: B's failing cell must not kill A's running cell."""
    import json
    import subprocess
    import sys

    if not BACKENDS.get(backend):
        pytest.skip(f"backend {backend} not usable here")
    a = subprocess.Popen([sys.executable, "-c", _RUNNER, backend, "0", "import time\ntime.sleep(3)\nprint(1)"],
                         stdout=subprocess.PIPE, text=True)
    b = subprocess.Popen([sys.executable, "-c", _RUNNER, backend, "1.5", "1/0"], stdout=subprocess.PIPE, text=True)
    rb = json.loads(b.communicate(timeout=30)[0].strip().splitlines()[-1])
    ra = json.loads(a.communicate(timeout=30)[0].strip().splitlines()[-1])
    assert rb["exit_code"] == 1 and "ZeroDivisionError" in rb["output"]
    assert ra["exit_code"] == 0 and ra["error"] is None and ra["output"] == "1\n", ra


@pytest.mark.parametrize("backend", ["bwrap", "process"])
def test_disk_fill_many_files_stopped_at_quota(backend):
    import glob
    import tempfile

    if not BACKENDS.get(backend):
        pytest.skip(f"backend {backend} not usable here")
    pattern = os.path.join(tempfile.gettempdir(), "rllib_spear_sbx_*")
    before = set(glob.glob(pattern))
    sb = PythonSandbox(backend=backend, wall_timeout_s=10.0, scratch_quota_mb=64)
    res = sb.run("for i in range(2000):\n    open(f'f{i}', 'wb').write(b'x' * 100_000)\nprint('done')")
    assert not res.ok and "done" not in res.output
    assert "scratch quota of 64 MB exceeded" in res.error, res
    assert set(glob.glob(pattern)) <= before  # nothing left on the host disk
    assert sb.run("print(len(__import__('os').listdir('.')))").output.strip() in ("0", "1")  # fresh dir


def test_auto_without_bwrap_refuses_unless_weak_allowed(monkeypatch):
    import rllib_spear.envs.sandbox as sbmod

    real = shutil.which
    monkeypatch.setattr(sbmod.shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real(name, *a, **k))
    with pytest.raises(RuntimeError, match="allow_weak_sandbox") as ei:
        PythonSandbox(wall_timeout_s=3.0)
    assert "install bubblewrap" in str(ei.value)
    with pytest.warns(RuntimeWarning, match="weaker"):
        weak = PythonSandbox(wall_timeout_s=3.0, allow_weak_sandbox=True)
    assert weak.backend in ("unshare", "process")
    res = weak.run("print(6*7)")
    assert res.ok and res.output == "42\n" and res.backend == weak.backend


def test_many_concurrent_cells_all_correct():
    from concurrent.futures import ThreadPoolExecutor

    sb = PythonSandbox(wall_timeout_s=15.0, cpu_time_s=5)

    def job(i):
        out = []
        for k in range(4):
            if (i + k) % 3 == 0:
                r = sb.run("1/0")
                out.append((r.exit_code == 1 and "ZeroDivisionError" in r.output and r.backend == sb.backend) or r)
            else:
                r = sb.run(f"import time\ntime.sleep(0.2)\nprint({i} * 100 + {k})")
                out.append((r.ok and r.output == f"{i * 100 + k}\n") or r)
        return out

    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(job, range(8)))
    assert all(r is True for rs in results for r in rs), results
    _assert_no_sandbox_processes()


def test_code_env_refuses_at_construction_and_reports_its_backend(monkeypatch):
    """The code environment picks its sandbox when built (a runner without bubblewrap fails at
    start, naming the fix), and every episode says which backend ran its code."""
    import rllib_spear.envs.sandbox as sbmod
    from rllib_spear.envs.code_math import CodeMathEnv
    from rllib_spear.metrics import rollout_metrics
    from rllib_spear.core.trajectory import Segment, Trajectory

    env = CodeMathEnv(sandbox_config={"wall_timeout_s": 9.5})
    env.reset({"prompt": "1+1?", "answer": "2"})
    stats = env.episode_stats()
    assert stats["sandbox_backend"] == "bwrap" and stats["sandbox_weak"] is False
    real = shutil.which
    monkeypatch.setattr(sbmod.shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real(name, *a, **k))
    with pytest.raises(RuntimeError, match="allow_weak_sandbox"):
        CodeMathEnv(sandbox_config={"wall_timeout_s": 9.25})  # a config no earlier env cached
    with pytest.warns(RuntimeWarning):
        weak = CodeMathEnv(sandbox_config={"wall_timeout_s": 9.0, "allow_weak_sandbox": True})
    weak.reset({"prompt": "1+1?", "answer": "2"})
    assert weak.episode_stats().extra["sandbox_weak"] is True
    seg = [Segment("prompt", [1, 2]), Segment("assistant", [3], [0.0], step=0)]
    trajs = [Trajectory(uid="a", segments=list(seg), step_rewards=[0.0], stats=make_stats(sandbox_weak=w))
             for w in (True, False, False, False)]
    assert rollout_metrics(trajs, [])["sandbox_weak_rate"] == 0.25


def test_bwrap_binds_paths_under_tmp_on_top_of_the_scratch_tmpfs():
    """A venv under /tmp (a CI clone in /tmp) must stay visible: the scratch tmpfs is mounted at
    /tmp before the read-only binds, never replaced by a symlink after them (which made bwrap
    fail, and `auto` refuse, whenever the interpreter's site-packages lived under /tmp)."""
    from rllib_spear.envs.sandbox import _bwrap_cmd

    cmd = _bwrap_cmd("/usr/bin/python3", ["/tmp/ci/.venv/lib/python3.11/site-packages"], "/tmp/work",
                     root=True, quota_bytes=1 << 20)
    tmpfs = max(i for i, a in enumerate(cmd) if a == "--tmpfs" and cmd[i + 1] == "/tmp")
    bind = cmd.index("/tmp/ci/.venv/lib/python3.11/site-packages")
    assert tmpfs < bind
    assert not any(a == "--symlink" and cmd[i + 2] == "/tmp" for i, a in enumerate(cmd[:-2]))
