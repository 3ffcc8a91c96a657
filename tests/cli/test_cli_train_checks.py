"""``rllib-spear train`` on what a new user hit (issue "Part 20", item 5): a config the cluster can
never hold is refused before Tune starts; an env runner's real error is reported, not RLlib's
``IndexError``; engine kwargs the engine does not take are refused; a name already used is refused
without ``--resume`` and restored with it; an interrupted run exits non-zero; an env module in the
working directory imports; a value of the wrong type, ``learning_rate`` and a model-name typo get
clear messages. Tune itself is replaced by a fake (``FakeTuner``): no test trains."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rllib_spear import cli
from rllib_spear.cli import CLIError, build_config, load_experiment, main

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "configs" / "spear_cpu_demo.yaml")


class FakeGrid:
    """A ResultGrid of one trial, ended (``terminated``), failed (``error``) or neither."""

    def __init__(self, error=None, terminated=True, path="trial"):
        self.result = SimpleNamespace(error=error, path=path, checkpoint=None, metrics={})
        self.num_errors = int(error is not None)
        self.num_terminated = int(terminated and error is None)

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return self.result


class FakeTuner:
    """Records how ``train`` built or restored the Tuner; ``fit`` returns ``FakeTuner.grid`` or
    raises ``FakeTuner.raises``."""

    calls: list = []
    grid = FakeGrid()
    raises: BaseException | None = None

    def __init__(self, trainable, param_space=None, tune_config=None, run_config=None):
        FakeTuner.calls.append(("new", trainable, param_space, run_config))

    @classmethod
    def restore(cls, path, trainable, **kw):
        cls.calls.append(("restore", trainable, path, kw))
        return cls.__new__(cls)

    def fit(self):
        if FakeTuner.raises is not None:
            raise FakeTuner.raises
        return FakeTuner.grid


@pytest.fixture
def fake_tune(monkeypatch):
    """Tune replaced by FakeTuner, Ray not started (``cli.start_ray`` a no-op)."""
    from ray import tune

    FakeTuner.calls, FakeTuner.grid, FakeTuner.raises = [], FakeGrid(), None
    monkeypatch.setattr(tune, "Tuner", FakeTuner)
    monkeypatch.setattr(cli, "start_ray", lambda exp: None)
    return FakeTuner


def _train(tmp_path: Path, *extra: str, config: str = DEMO) -> int:
    return main(["train", config, "--set", f"storage_path={tmp_path / 'results'}", "--set", "name=exp", *extra])


def _yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------------- 1. resources under Tune
@pytest.fixture
def ray_2_cpus():
    import ray

    ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=cli.ray_runtime_env())
    yield ray
    ray.shutdown()


def test_a_runner_bigger_than_the_cluster_is_refused_before_tune_starts(tmp_path, monkeypatch, ray_2_cpus, capsys):
    """num_cpus_per_env_runner=4 on 2 CPUs: Tune would wait for the placement group forever."""
    from ray import tune

    def never(*a, **k):
        raise AssertionError("Tune was started with a trial the cluster can never hold")

    monkeypatch.setattr(tune, "Tuner", never)
    assert _train(tmp_path, "--set", "env_runners.num_cpus_per_env_runner=4") == 2
    err = capsys.readouterr().err
    assert "can never all start" in err and "num_cpus_per_env_runner=4" in err and "has 2" in err
    assert "Traceback" not in err


def test_placement_group_check_names_gpus_and_passes_what_fits():
    from rllib_spear import SPEARConfig
    from rllib_spear.cluster.resource_check import check_placement_group

    gpu = SPEARConfig().env_runners(num_env_runners=1, num_gpus_per_env_runner=1)
    why = check_placement_group(gpu, gpu.algo_class.default_resource_request(gpu).bundles, {"CPU": 2.0})
    assert "can never all start" in why and "1 GPU" in why and "num_gpus_per_env_runner=1" in why
    fits = SPEARConfig().env_runners(num_env_runners=1)
    bundles = fits.algo_class.default_resource_request(fits).bundles  # driver 1 CPU + runner 1 CPU
    assert check_placement_group(fits, bundles, {"CPU": 2.0}, [{"CPU": 2.0}]) is None
    why = check_placement_group(fits, bundles, {"CPU": 1.0})
    assert "2 CPU" in why and "the trial's driver" in why


# ---------------------------------------------------------------------- 2. the real error
def test_engine_kwargs_the_engine_does_not_take_are_refused(tmp_path, capsys):
    from rllib_spear import SPEARConfig

    with pytest.raises(ValueError, match="'gpu_memory_utilization' is not an argument of the 'hf' engine"):
        SPEARConfig().env_runners(engine="hf", engine_kwargs={"gpu_memory_utilization": 0.5}).validate()
    SPEARConfig().env_runners(engine="hf", engine_kwargs={"max_batch_size": 4}).validate()  # an HF argument
    assert _train(tmp_path, "--set", "env_runners.engine_kwargs.gpu_memory_utilization=0.5") == 2
    assert "'gpu_memory_utilization' is not an argument of the 'hf' engine" in capsys.readouterr().err


#: What Ray 2.60 wrote for the issue's run: the runner's own log, then the trial's error.
_RUNNER_LOG = """:job_id:01000000
:actor_name:LLMEnvRunner
Exception raised in creation task: The actor died because of an error raised in its creation task, \
\x1b[36mray::LLMEnvRunner.__init__()\x1b[39m (pid=5676, ip=192.0.2.2, actor_id=5cf8)
  File "/work/main/rllib_spear/env_runners/engines/__init__.py", line 18, in make_engine
    return HFEngine(model_path, **kw)
TypeError: HFEngine.__init__() got an unexpected keyword argument 'gpu_memory_utilization'
"""
_TRIAL_ERROR = """The actor died because of an error raised in its creation task, ray::SPEAR.__init__() (pid=5591)
  File "/ray/rllib/env/env_runner_group.py", line 319, in get_spaces
    spaces = self.foreach_env_runner(
IndexError: list index out of range"""


def test_a_failed_run_reports_the_first_actor_error(tmp_path, fake_tune, monkeypatch, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "worker-abc-01000000-5676.err").write_text(_RUNNER_LOG)
    (logs / "worker-def-01000000-5591.err").write_text(f":actor_name:SPEAR\nException raised in creation task: "
                                                       f"{_TRIAL_ERROR}\n")
    later = time.time() + 60  # the logs of this run are newer than its start
    for f in logs.iterdir():
        os.utime(f, (later, later + int(f.name.endswith("5591.err"))))  # the runner died first
    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / "error.txt").write_text(_TRIAL_ERROR)
    monkeypatch.setattr(cli, "_ray_logs_dir", lambda: logs)
    fake_tune.grid = FakeGrid(error=RuntimeError(_TRIAL_ERROR), path=str(trial))
    assert _train(tmp_path) == 1
    err = capsys.readouterr().err
    assert "training failed: IndexError: list index out of range" in err
    assert ("first actor error (LLMEnvRunner" in err
            and "TypeError: HFEngine.__init__() got an unexpected keyword argument 'gpu_memory_utilization'" in err)
    assert str(trial / "error.txt") in err


# ---------------------------------------------------------------------- 3. names, --resume, interrupts
def test_an_existing_experiment_needs_resume(tmp_path, fake_tune, capsys):
    exp_dir = tmp_path / "results" / "exp"
    exp_dir.mkdir(parents=True)
    (exp_dir / "tuner.pkl").write_bytes(b"")
    assert _train(tmp_path) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and str(exp_dir) in err
    assert fake_tune.calls == [], "no second trial started"
    assert _train(tmp_path, "--resume") == 0
    kind, trainable, path, kw = fake_tune.calls[0]
    assert (kind, trainable, path) == ("restore", "SPEAR", str(exp_dir)) and kw["resume_unfinished"]


def test_resume_without_an_experiment_is_refused(tmp_path, fake_tune, capsys):
    assert _train(tmp_path, "--resume") == 2
    assert "no experiment to resume" in capsys.readouterr().err and fake_tune.calls == []


def test_an_interrupted_run_exits_non_zero(tmp_path, fake_tune, capsys):
    fake_tune.grid = FakeGrid(terminated=False)  # Tune's Ctrl-C handler: the trial saved, not ended
    assert _train(tmp_path) not in (0, None)
    err = capsys.readouterr().err
    assert "interrupted" in err and "--resume" in err
    fake_tune.grid, fake_tune.raises = FakeGrid(), KeyboardInterrupt()
    assert _train(tmp_path, "--resume") not in (0, None)
    assert "interrupted" in capsys.readouterr().err


# ---------------------------------------------------------------------- 4. import paths from the cwd
def test_an_env_module_in_the_working_directory_imports(tmp_path, fake_tune, monkeypatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cli_part20_envs.py").write_text("from rllib_spear.envs.search_envs import SearchQAEnv as MyEnv\n")
    monkeypatch.delitem(sys.modules, "cli_part20_envs", raising=False)
    config = _yaml(tmp_path, f"algorithm: SPEAR\nstop: {{training_iteration: 1}}\nconfig:\n"
                             f"  environment: {{env: 'cli_part20_envs:MyEnv', dataset: search_qa}}\n"
                             f"  env_runners: {{num_env_runners: 1}}\n")
    try:
        assert _train(tmp_path, config=config) == 0
    finally:
        sys.modules.pop("cli_part20_envs", None)
    assert fake_tune.calls[0][2].env == "cli_part20_envs:MyEnv"
    # the Ray workers get it too (and every process they start)
    assert str(tmp_path) in cli.ray_runtime_env()["env_vars"]["PYTHONPATH"].split(":")


# ---------------------------------------------------------------------- 5. messages
def test_a_value_of_the_wrong_type_names_the_key_and_the_type(tmp_path, capsys):
    path = _yaml(tmp_path, "algorithm: SPEAR\nconfig:\n  env_runners: {temperature: high}\n")
    with pytest.raises(CLIError, match=r"config\.env_runners\.temperature must be a number .*'high'"):
        build_config(load_experiment(path))
    assert main(["train", path]) == 2
    assert "Traceback" not in capsys.readouterr().err
    # YAML 1.1 reads 3e-4 as a string: still the number
    cfg = build_config(load_experiment(_yaml(tmp_path, "algorithm: SPEAR\nconfig:\n  training: {lr: 3e-4}\n")))
    assert cfg.lr == 3e-4


def test_names_other_libraries_use_get_a_suggestion():
    with pytest.raises(CLIError, match="did you mean 'lr'") as e:
        load_experiment(DEMO, ["training.learning_rate=1e-5"])
    assert "training.learning_rate" in str(e.value)
    with pytest.raises(CLIError, match="did you mean 'training.lr'"):
        load_experiment(DEMO, ["learning_rate=1e-5"])


def test_a_model_name_typo_lists_the_closest_names(tmp_path, capsys):
    from rllib_spear import SPEARConfig

    with pytest.raises(ValueError, match="did you mean 'smollm2-search'"):
        SPEARConfig().rl_module(model_config={"model_path": "smollm2-serch"}).validate()
    with pytest.raises(ValueError, match="did you mean 'embedded:search_qa'"):
        SPEARConfig().rl_module(model_config={"model_path": "embedded:serch_qa"}).validate()
    assert _train(tmp_path, "--set", "rl_module.model_config.model_path=embeded") == 2
    err = capsys.readouterr().err
    assert "did you mean 'embedded'" in err and "smollm2-search" in err
