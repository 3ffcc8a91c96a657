"""The launcher: the program that runs inside the sandbox. It sets the rlimits, drops to the
sandbox uid, runs the preamble, replays earlier cells silently and runs the new cell, then reports
memory / disk-full status on a private pipe. Its configuration arrives as JSON in ``argv[1]``."""

__all__: list[str] = []

_LAUNCHER = r'''
import json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
# One thread per numeric library (numpy's OpenBLAS, OpenMP, MKL), set before anything loads
# them: their default is a thread per core, and threads count against RLIMIT_NPROC and the
# address-space limit, so on a many-core machine `import numpy` would fail or print errors.
for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(v, "1")
for p in cfg["site"]:
    sys.path.append(p)
for m in cfg["preimport"]:
    try:
        __import__(m)
    except Exception:
        pass
import traceback
SFD = cfg["status_fd"]
if SFD is not None:
    try:
        os.set_inheritable(SFD, False)
    except OSError:
        SFD = None
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
L = cfg["limits"]
def lim(r, v):
    try:
        resource.setrlimit(r, (v, v))
    except (ValueError, OSError):
        pass
lim(resource.RLIMIT_CORE, 0)
lim(resource.RLIMIT_NOFILE, L["nofile"])
lim(resource.RLIMIT_FSIZE, L["fsize"])
lim(resource.RLIMIT_NPROC, L["nproc"])
try:
    resource.setrlimit(resource.RLIMIT_CPU, (L["cpu"], L["cpu"] + 1))
except (ValueError, OSError):
    pass
if cfg["uid"] is not None:
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])
    if os.getuid() != cfg["uid"] or os.geteuid() != cfg["uid"] or os.getegid() != cfg["uid"]:
        os._exit(97)
os.umask(0o077)
os.chdir(cfg["cwd"])
with open(cfg["cells"], encoding="utf-8") as f:
    cells = json.load(f)
lim(resource.RLIMIT_AS, L["as"])
g = {"__name__": "__main__", "__builtins__": __builtins__}
SCRIPT_TB = cfg["script_tracebacks"]
if SCRIPT_TB:
    import linecache
def run(src, name):
    if SCRIPT_TB:  # source lines in tracebacks, as for a script file
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    exec(compile(src, name, "exec"), g)
rc = 0
status = {}
out, err = sys.stdout, sys.stderr
try:
    run(cfg["preamble"], "<preamble>")
    if cells[:-1]:
        sys.stdout = sys.stderr = open(os.devnull, "w")
        for i, c in enumerate(cells[:-1]):
            try:
                run(c, f"<cell {i}>")
            except BaseException:
                pass
        sys.stdout, sys.stderr = out, err
    run(cells[-1], "<cell>")
except SystemExit as e:
    sys.stdout, sys.stderr = out, err
    rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
except BaseException as e:
    sys.stdout, sys.stderr = out, err
    if isinstance(e, MemoryError):
        status["memory"] = True
    elif isinstance(e, OSError) and e.errno in (28, 122):  # ENOSPC, EDQUOT
        status["disk_full"] = True
    tb = e.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next
    try:
        traceback.print_exception(type(e), e, tb, limit=None if SCRIPT_TB else 5)
    except BaseException:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
    rc = 1
try:
    sys.stdout.flush(); sys.stderr.flush()
except BaseException:
    pass
if cfg["quota_fs"]:
    try:
        st = os.statvfs(cfg["cwd"])
        if st.f_bavail * st.f_frsize < 256 * 1024:
            status["disk_full"] = True
    except OSError:
        pass
if SFD is not None and status:
    try:
        os.write(SFD, json.dumps(status).encode())
    except OSError:
        pass
os._exit(rc)
'''
