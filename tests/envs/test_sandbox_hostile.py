"""Hostile code against the sandbox: every case is contained, reported in the result (never an
exception), finishes within its timeout, and this test process survives."""
import os
import shutil
import socket
import time

import pytest

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
    assert res.output_truncated and "output limit" in res.error
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
