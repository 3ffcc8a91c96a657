"""A SPEAR run that survives a seeded chaos schedule (docs/design.md "Fault tolerance", "The chaos
benchmark"): 2 remote env runners, 2 DDP learners (gloo), SIL on, the tiny model on CPU, through
``tune.Tuner`` with a ``FailureConfig`` and a checkpoint every iteration. While it trains, the
schedule (drawn from ``--seed``) kills, each once and at a random moment of a random iteration:

* ``runner``: one env runner actor (``ray.kill``; RLlib restarts it, the run goes on);
* ``checkpoint_write``: the trial's process in the middle of a checkpoint save (after the files,
  before the manifest: the save never completes, the previous checkpoint must still load);
* ``learner``: DDP rank 1 (the iteration fails with ``LearnerRankDied``, Tune restarts the trial);
* ``driver``: the trial's own process (SIGKILL; Tune restarts the trial).

The runner kill comes first (it changes the batch split, so it must fall before the last restart
for the comparison below); the other three come in a random order. Then the uninterrupted run is
rebuilt from the checkpoint the last restart resumed from (``Algorithm.restore_from_path``, no
Tune, nothing killed) and trained to the same iteration count. Prints the kills, the restarts,
the iterations redone, the skipped optimizer steps, the group accounting of every iteration that
counted (requested = trained + dropped_incomplete_groups + lost_groups), and whether the final
weights and SIL buffer equal the uninterrupted run's (bitwise: SHA-256 of every tensor and of the
buffer's state).

    .venv/bin/python benchmarks/chaos.py [--iterations 10] [--seed 0] [--out benchmarks/out/chaos]

Exit status 0 when every check passes, 1 otherwise. ~5 min on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import numpy as np  # noqa: E402

#: The kills, in the order the schedule may not change for the first one (see the docstring).
KILLS = ("runner", "checkpoint_write", "learner", "driver")


def draw_schedule(seed: int, iterations: int) -> list[dict]:
    """One event per kind: ``iteration`` (2..iterations-1, distinct, runner first) and ``moment``
    (the fraction of the previous iteration's wall time after which the kill fires; the
    checkpoint kill fires inside the save)."""
    if iterations < len(KILLS) + 2:
        raise SystemExit(f"--iterations must be >= {len(KILLS) + 2} (one iteration per kill, a first and a last)")
    rng = np.random.default_rng(seed)
    its = sorted(int(i) for i in rng.choice(np.arange(2, iterations), size=len(KILLS), replace=False))
    rest = list(rng.permutation(KILLS[1:]))
    moments = [round(float(rng.uniform(0.1, 0.9)), 3) for _ in KILLS]
    return [{"kind": str(kind), "iteration": it, "moment": None if kind == "checkpoint_write" else m}
            for kind, it, m in zip(("runner", *rest), its, moments)]


def digest_weights(algorithm) -> str:
    """SHA-256 over the learner module's parameters, by name."""
    (module,) = algorithm.learner_group.get_weights().values()
    h = hashlib.sha256()
    for k in sorted(module):
        h.update(k.encode())
        h.update(np.ascontiguousarray(np.asarray(module[k])).tobytes())
    return h.hexdigest()


def _without_ids(tree):
    """``tree`` without its ``traj_id`` fields: random per rollout (uuid4), the one thing a
    restored run draws anew; everything else of the buffer is compared."""
    if isinstance(tree, dict):
        return {k: _without_ids(v) for k, v in tree.items() if k != "traj_id"}
    if isinstance(tree, (list, tuple)):
        return [_without_ids(v) for v in tree]
    return tree


def digest_sil(algorithm) -> str:
    """SHA-256 of the SIL buffer's checkpoint state (entries, baseline history, RNG, counters)."""
    buf = algorithm.local_replay_buffer
    return hashlib.sha256(pickle.dumps(_without_ids(buf.get_state()) if buf is not None else None)).hexdigest()


def make_config(model_path: str, record_dir: str, chaos: dict | None):
    """SPEAR (SIL on), 2 runners, 2 DDP learners; a callback that gives seeded rewards (an
    untrained tiny model earns none), records every iteration and, with ``chaos`` (the schedule
    and its marker folder), carries out the kills."""
    from rllib_spear import SPEARConfig
    from rllib_spear.callbacks import TrajectoryCallback

    class ChaosCallback(TrajectoryCallback):
        """Runs in the trial's process: the records and the kills both happen there."""

        def __init__(self):
            super().__init__()
            self.iter_started = time.monotonic()
            self.last_iter_s = 5.0
            self.batch: dict = {}
            self.armed: set[str] = set()

        # ---- records
        def _append(self, name: str, row: dict) -> None:
            with open(os.path.join(record_dir, name), "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "t": time.time(), **row}) + "\n")

        def on_algorithm_init(self, *, algorithm, **kwargs):
            self._append("attempts.jsonl", {"event": "start"})

        def on_checkpoint_loaded(self, *, algorithm, **kwargs):
            self._append("attempts.jsonl", {"event": "restored", "algo_step": algorithm.algo_step})
            self.iter_started = time.monotonic()  # the next iteration starts now, not at the build
            if chaos is not None and os.path.exists(self._timing_file()):
                self.last_iter_s = float(open(self._timing_file()).read())  # measured by an earlier attempt
            self._arm(algorithm)

        def _timing_file(self) -> str:
            return os.path.join(chaos["dir"], "last_iteration_s")

        def on_trajectories(self, *, algorithm, trajectories, runner_stats, step, **kwargs):
            rng = np.random.default_rng(1000 + step)
            for t in trajectories:
                t.outcome_reward = float(rng.choice([0.0, 0.5, 1.0]))
            ids = [t.assistant_token_ids() for t in trajectories]
            self.batch = {"batch": hashlib.sha256(repr(ids).encode()).hexdigest(),
                          "groups_trained": len({t.uid for t in trajectories})}

        def on_train_result(self, *, algorithm, result, **kwargs):
            now = time.monotonic()
            self.last_iter_s, self.iter_started = max(now - self.iter_started, 0.5), now
            if chaos is not None:
                with open(self._timing_file(), "w") as f:
                    f.write(str(self.last_iter_s))
            learner = result.get("learners", {}).get("default_policy", {})

            def count(d, key):  # a per-iteration "sum" metric; absent or NaN (nothing logged) = 0
                v = d.get(key, 0)
                return int(v) if v == v else 0

            self._append("iterations.jsonl", {
                "iteration": algorithm.algo_step, "weights": digest_weights(algorithm), "sil": digest_sil(algorithm),
                "groups_requested": int(algorithm.config.tasks_per_iteration),
                "dropped_incomplete_groups": count(result, "dropped_incomplete_groups"),
                "lost_groups": count(result, "lost_groups"),
                "lost_env_runner_samples": count(result, "lost_env_runner_samples"),
                "skipped_steps": count(learner, "skipped_steps"),
                "sil_size": len(algorithm.local_replay_buffer),
                **self.batch})
            self._arm(algorithm)

        # ---- chaos
        def _arm(self, algorithm) -> None:
            """Arm every kill that is due by the next iteration and not done (over all attempts:
            a marker file) nor armed in this process: a timer fires at ``moment`` x the last
            iteration's wall time from now."""
            if chaos is None:
                return
            nxt = algorithm.algo_step + 1
            for ev in chaos["schedule"]:
                marker = os.path.join(chaos["dir"], f"done_{ev['kind']}")
                # the save of iteration k follows its on_train_result: armed then, it dies in it
                due = algorithm.algo_step if ev["kind"] == "checkpoint_write" else nxt
                if ev["iteration"] > due or os.path.exists(marker) or ev["kind"] in self.armed:
                    continue
                self.armed.add(ev["kind"])
                if ev["kind"] == "checkpoint_write":
                    self._arm_checkpoint_kill(algorithm, marker, ev)
                    continue
                delay = ev["moment"] * self.last_iter_s
                timer = threading.Timer(delay, self._kill, (algorithm, ev, marker, delay))
                timer.daemon = True
                timer.start()

        def _kill(self, algorithm, ev, marker, delay) -> None:
            import ray

            open(marker, "w").close()
            self._append("kills.jsonl", {**ev, "iteration": algorithm.algo_step + 1, "after_s": round(delay, 2)})
            if ev["kind"] == "runner":
                actors = algorithm.env_runner_group._worker_manager.actors()
                ray.kill(actors[sorted(actors)[0]], no_restart=False)
            elif ev["kind"] == "learner":
                mgr = algorithm.learner_group._worker_manager
                ray.kill(mgr.actors()[mgr.actor_ids()[1]], no_restart=True)
            elif ev["kind"] == "driver":
                os.kill(os.getpid(), signal.SIGKILL)

        def _arm_checkpoint_kill(self, algorithm, marker, ev) -> None:
            """The next save dies after its files are written and before its manifest."""
            from rllib_spear import checkpoint_io

            def write_manifest_then_die(root):
                if not os.path.exists(marker):
                    open(marker, "w").close()
                    self._append("kills.jsonl", {**ev, "iteration": algorithm.algo_step, "after_s": None,
                                                 "files_written": len(list(Path(root).rglob("*")))})
                    os.kill(os.getpid(), signal.SIGKILL)
                return original(root)

            original = checkpoint_io.write_manifest
            checkpoint_io.write_manifest = write_manifest_then_die

    return (SPEARConfig().environment("search_qa")
            .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.25, max_new_tokens=16, max_turns=2,
                         max_model_len=512, max_response_tokens=256)
            .learners(num_learners=2, num_cpus_per_learner=0.5)
            .resources(num_cpus_for_main_process=0.25)
            .fault_tolerance(restart_failed_env_runners=True, delay_between_env_runner_restarts_s=0)
            .training(group_size=4, tasks_per_iteration=4, lr=1e-4, sil_enabled=True,
                      response_filters=(), group_filter_keep_fraction=None)
            .rl_module(model_config={"model_path": model_path})
            .debugging(seed=0)
            .callbacks(ChaosCallback))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def run_chaos(args, model_path: str, work: Path) -> tuple[dict, list[dict], list[dict], list[dict]]:
    from ray import tune

    record, marks = work / "chaos_records", work / "chaos_markers"
    record.mkdir()
    marks.mkdir()
    schedule = draw_schedule(args.seed, args.iterations)
    cfg = make_config(model_path, str(record), {"schedule": schedule, "dir": str(marks)})
    print("schedule (seed %d): %s" % (args.seed, ", ".join(
        f"{e['kind']} in iteration {e['iteration']} "
        + ("(its save)" if e["moment"] is None else f"at {e['moment']:.0%}") for e in schedule)), flush=True)
    t0 = time.monotonic()
    grid = tune.Tuner("SPEAR", param_space=cfg, run_config=tune.RunConfig(
        name="chaos", stop={"training_iteration": args.iterations}, storage_path=str(work / "tune"), verbose=0,
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
        failure_config=tune.FailureConfig(max_failures=len(KILLS) + 2))).fit()
    (result,) = [grid[i] for i in range(len(grid))]
    print(f"chaos run: {time.monotonic() - t0:.0f} s, error: {result.error!r}", flush=True)
    return ({"result": result, "schedule": schedule}, read_jsonl(record / "iterations.jsonl"),
            read_jsonl(record / "attempts.jsonl"), read_jsonl(record / "kills.jsonl"))


def lineage(attempts: list[dict], iterations: list[dict]) -> tuple[list[dict], list[dict]]:
    """(per attempt: pid, restored algo_step, iterations it finished; the records of the
    iterations that counted: the last record of each iteration number, as the final attempt's
    history goes)."""
    by_pid: dict[int, dict] = {}
    for a in attempts:
        row = by_pid.setdefault(a["pid"], {"pid": a["pid"], "restored": 0, "finished": []})
        if a["event"] == "restored":
            row["restored"] = a["algo_step"]
    for r in iterations:
        by_pid.setdefault(r["pid"], {"pid": r["pid"], "restored": 0, "finished": []})["finished"].append(r["iteration"])
    order = sorted(by_pid.values(), key=lambda row: min([a["t"] for a in attempts if a["pid"] == row["pid"]] or [0]))
    counted: dict[int, dict] = {}
    for r in sorted(iterations, key=lambda r: r["t"]):
        counted[r["iteration"]] = r
    return order, [counted[k] for k in sorted(counted)]


def uninterrupted_from(checkpoint: str | None, model_path: str, work: Path, start: int, stop: int) -> list[dict]:
    """Build the same config (no kills), restore ``checkpoint`` (None: from scratch) and train
    ``start`` -> ``stop``; returns the iteration records."""
    record = work / "plain_records"
    record.mkdir()
    algo = make_config(model_path, str(record), None).build_algo()
    try:
        if checkpoint is not None:
            algo.restore_from_path(checkpoint)
        assert algo.algo_step == start, (algo.algo_step, start)
        for _ in range(start, stop):
            algo.train()
    finally:
        algo.stop()
    return read_jsonl(record / "iterations.jsonl")


def checkpoint_of(result, iteration: int) -> str | None:
    if iteration == 0:
        return None
    for ckpt, metrics in result.best_checkpoints:
        if metrics.get("training_iteration") == iteration:
            return ckpt.path
    raise SystemExit(f"no checkpoint of iteration {iteration} among {[m.get('training_iteration') for _, m in result.best_checkpoints]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0, help="seed of the chaos schedule (the run's seed is 0)")
    ap.add_argument("--model", default="tiny", help="'tiny' (the test model) or a model folder")
    ap.add_argument("--out", default="benchmarks/out/chaos")
    args = ap.parse_args(argv)

    import ray

    import rllib_spear  # noqa: F401  (registers SPEAR with Tune)
    from rllib_spear.models.factory import tiny_model_path

    model_path = tiny_model_path() if args.model == "tiny" else args.model
    work = Path(tempfile.mkdtemp(prefix="rllib_spear_chaos_"))
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {
        "GLOO_SOCKET_IFNAME": os.environ["GLOO_SOCKET_IFNAME"], "RAY_AUTH_MODE": "disabled"}})
    try:
        meta, iterations, attempts, kills = run_chaos(args, model_path, work)
        result = meta["result"]
        attempt_rows, counted = lineage(attempts, iterations)
        last_restore = attempt_rows[-1]["restored"] if attempt_rows else 0
        t0 = time.monotonic()
        plain = uninterrupted_from(checkpoint_of(result, last_restore), model_path, work, last_restore,
                                   args.iterations)
        print(f"uninterrupted run from iteration {last_restore}: {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        ray.shutdown()

    # ---- report
    print("\nkills:")
    for k in kills:
        when = "inside the checkpoint save" if k["kind"] == "checkpoint_write" else f"{k['after_s']} s into it"
        print(f"  {k['kind']:<17} iteration {k['iteration']:>2}, {when} (pid {k['pid']})")
    print("attempts (Tune restarts = attempts - 1):")
    redone = 0
    killed_by = {k["pid"]: k["kind"] for k in kills if k["kind"] != "runner"}
    for i, a in enumerate(attempt_rows):
        nxt = attempt_rows[i + 1]["restored"] if i + 1 < len(attempt_rows) else None
        # the iteration the attempt was in when it died: a killed save is that of its last
        # finished iteration; any other kill lands in the iteration after it
        last = max(a["finished"], default=a["restored"])
        dying = last if killed_by.get(a["pid"]) == "checkpoint_write" else last + 1
        lost = 0 if nxt is None else dying - nxt
        redone += lost
        print(f"  pid {a['pid']}: restored at iteration {a['restored']}, finished {a['finished']}"
              + ("" if nxt is None else f", died; {lost} iteration(s) redone"))
    final = counted[-1] if counted else {}
    plain_final = plain[-1] if plain else {}
    accounting = [(r["iteration"], r["groups_requested"], r["groups_trained"], r["dropped_incomplete_groups"],
                   r["lost_groups"]) for r in counted]
    print("groups per iteration that counted (iteration: requested = trained + dropped incomplete + lost):")
    print("  " + "; ".join(f"{it}: {q} = {t} + {d} + {lo}" for it, q, t, d, lo in accounting))
    skipped = sum(r["skipped_steps"] for r in counted)
    checks = {
        "every kill happened": sorted(k["kind"] for k in kills) == sorted(KILLS),
        "Tune restarted the trial after each trial kill": len(attempt_rows) == 1 + sum(
            k["kind"] != "runner" for k in kills),
        f"reached {args.iterations} iterations": (result.error is None
                                                 and result.metrics.get("training_iteration") == args.iterations
                                                 and final.get("iteration") == args.iterations),
        "every requested group trained or counted": all(q == t + d + lo for _, q, t, d, lo in accounting),
        "final weights equal the uninterrupted run's": bool(final) and final.get("weights") == plain_final.get("weights"),
        "final SIL buffer equals the uninterrupted run's": bool(final) and final.get("sil") == plain_final.get("sil"),
        "every iteration after the last restart equals it": [
            (r["batch"], r["weights"], r["sil"]) for r in counted if r["iteration"] > last_restore] == [
            (r["batch"], r["weights"], r["sil"]) for r in plain],
    }
    print(f"restarts: {len(attempt_rows) - 1}; iterations redone: {redone}; skipped optimizer steps: {skipped}; "
          f"last restart resumed from iteration {last_restore}; SIL buffer size at the end {final.get('sil_size')}")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"seed": args.seed, "iterations": args.iterations, "schedule": meta["schedule"], "kills": kills,
               "attempts": attempt_rows, "iterations_redone": redone, "skipped_steps": skipped,
               "last_restore": last_restore, "accounting": accounting, "checks": checks,
               "final_weights": final.get("weights"), "uninterrupted_weights": plain_final.get("weights")}
    (out / "chaos.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {out / 'chaos.json'}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
