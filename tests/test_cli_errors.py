"""``rllib-spear`` input errors: a typo in a YAML key or a ``--set`` fails at once with "did you
mean" (rllib_spear/config_keys.py), a user error prints its message alone (exit 2; the traceback
with ``--debug``), ``eval`` / ``export`` find a trial's latest checkpoint, ``--version``, and
``--help`` answers without importing Ray or torch."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rllib_spear.checkpoint_paths import resolve_checkpoint
from rllib_spear.cli import CLIError, build_config, load_experiment, main

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "configs" / "spear_cpu_demo.yaml")


def _error(overrides: list[str], path: str = DEMO) -> str:
    with pytest.raises(CLIError) as e:
        load_experiment(path, overrides)
    return str(e.value)


def _yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------------- unknown keys
def test_bare_builder_key_names_its_section():
    msg = _error(["lr=1e-5"])
    assert "--set lr=1e-5" in msg and "did you mean 'training.lr'" in msg


def test_misspelt_section_in_set_suggests_the_section():
    msg = _error(["trainig.lr=1e-5"])
    assert "'trainig.lr'" in msg and "did you mean 'training.lr'" in msg


def test_misspelt_builder_kwarg_suggests_the_kwarg():
    msg = _error(["training.group_szie=8"])
    assert "training.group_szie" in msg and "did you mean 'group_size'" in msg
    msg = _error(["env_runners.max_new_token=64"])
    assert "did you mean 'max_new_tokens'" in msg


def test_stop_key_near_miss_is_refused():
    msg = _error(["stop.training_iterations=1"])
    assert "stop.training_iterations" in msg and "did you mean 'training_iteration'" in msg
    msg = _error(["stop.success_rate=0.9"])  # a section metric written flat
    assert "did you mean 'env_runners/success_rate'" in msg


def test_valid_keys_pass_and_a_dotted_stop_metric_becomes_a_tune_path():
    exp = load_experiment(DEMO, ["training.lr=1e-5", "stop.training_iteration=1", "stop.env_runners.success_rate=0.9",
                                 "stop.time_total_s=60", "env_runners.engine_kwargs.anything=1",
                                 "rl_module.model_config.model_path=embedded", "num_cpus=2", "checkpoint_freq=0"])
    assert exp["stop"] == {"training_iteration": 1, "env_runners/success_rate": 0.9, "time_total_s": 60}
    assert exp["config"]["training"]["lr"] == 1e-5
    assert build_config(exp).lr == 1e-5


def test_unknown_yaml_keys_fail_with_the_file_and_a_suggestion(tmp_path):
    msg = _error([], _yaml(tmp_path, "algorithm: SPEAR\nstop: {training_iteration: 1}\nchekpoint_freq: 5\n"))
    assert "exp.yaml" in msg and "'chekpoint_freq'" in msg and "did you mean 'checkpoint_freq'" in msg
    msg = _error([], _yaml(tmp_path, "algorithm: SPEAR\nconfig:\n  trainig: {lr: 1.0e-5}\n"))
    assert "'config.trainig'" in msg and "did you mean 'training'" in msg
    msg = _error([], _yaml(tmp_path, "algorithm: SPEAR\nconfig:\n  training: {group_szie: 8}\n"))
    assert "did you mean 'group_size'" in msg
    msg = _error([], _yaml(tmp_path, "algorithm: SPEAR\ntraining: {lr: 1.0e-5}\n"))  # outside config:
    assert "did you mean 'config.training'" in msg
    msg = _error([], _yaml(tmp_path, "algorithm: SPEAR\nstop: {env_runners: {success_rate: 0.9}}\n"))
    assert "one key with '/'" in msg


def test_build_config_checks_a_mapping_too():
    with pytest.raises(CLIError, match="did you mean 'group_size'"):
        build_config({"algorithm": "SPEAR", "config": {"training": {"group_szie": 8}}})


def test_python_training_call_names_the_bad_key():
    from rllib_spear import GRPOConfig, SPEARConfig

    with pytest.raises(TypeError, match=r"'group_szie'; did you mean 'group_size'\?"):
        GRPOConfig().training(group_szie=8)
    with pytest.raises(TypeError, match="SPEARConfig.training.*did you mean 'lr'"):
        SPEARConfig().training(lrr=1e-5)
    assert GRPOConfig().training(lr=1e-5, group_size=4, gamma=1.0).group_size == 4  # RLlib's and ours


# ---------------------------------------------------------------------- messages, exit codes
def test_validation_error_prints_the_message_alone(capsys):
    assert main(["train", DEMO, "--set", "training.group_size=0"]) == 2
    err = capsys.readouterr().err
    assert "group_size" in err and "Traceback" not in err and "_validate_config" not in err
    assert len(err.strip().splitlines()) <= 3, err


def test_debug_shows_the_traceback():
    with pytest.raises(CLIError):
        main(["train", DEMO, "--debug", "--set", "training.group_size=0"])
    with pytest.raises(CLIError):
        main(["--debug", "train", DEMO, "--set", "lr=1"])


def test_missing_yaml_is_a_message(capsys, tmp_path):
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert "nope.yaml: no such config file" in err and "Traceback" not in err
    assert main(["plan", str(tmp_path / "nope.yaml")]) == 2


def test_typo_through_main_exits_2(capsys):
    assert main(["plan", DEMO, "--set", "trainig.lr=1e-5"]) == 2
    assert "did you mean 'training.lr'" in capsys.readouterr().err


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"rllib-spear {version('rllib-spear')}"


# ---------------------------------------------------------------------- fast, plain --help
def _help_run(args: list[str]) -> subprocess.CompletedProcess:
    """``args`` under ``python -X importtime``: stderr lists every module the process imported."""
    env = {k: v for k, v in os.environ.items() if k != "RLLIB_SPEAR_NO_REGISTER"}
    return subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def _imported(importtime_stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip() for line in importtime_stderr.splitlines()
            if line.startswith("import time:")}


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["--version"]], ids=" ".join)
def test_help_imports_neither_ray_nor_torch(argv):
    script = Path(sys.executable).parent / "rllib-spear"
    launchers = [["-m", "rllib_spear.cli"]] + ([[str(script)]] if script.is_file() else [])
    for launcher in launchers:
        out = _help_run([*launcher, *argv])
        assert out.returncode == 0, out.stderr[-2000:]
        heavy = {m for m in _imported(out.stderr) if m.split(".")[0] in ("ray", "torch", "transformers")}
        assert not heavy, (launcher, sorted(heavy)[:10])
        assert "rllib-spear" in out.stdout


def test_help_is_plain_text():
    out = _help_run(["-m", "rllib_spear.cli", "--help"]).stdout
    sub = _help_run(["-m", "rllib_spear.cli", "plan", "--help"]).stdout
    assert "``" not in out + sub and "--host-memory-gb" in sub


# ---------------------------------------------------------------------- checkpoint folders
def _checkpoint(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "class_and_ctor_args.pkl").write_bytes(b"")
    return path


def test_resolve_checkpoint_levels(tmp_path):
    exp = tmp_path / "exp"
    trial = exp / "SPEAR_abc_00000"
    first = _checkpoint(trial / "checkpoint_000002")
    latest = _checkpoint(trial / "checkpoint_000010")  # numeric order, not name order of mixed widths
    (trial / "checkpoint_000011").mkdir()  # unfinished: no checkpoint files
    assert resolve_checkpoint(first) == first
    assert resolve_checkpoint(trial) == latest
    assert resolve_checkpoint(exp) == latest  # the only trial
    _checkpoint(exp / "SPEAR_abc_00001" / "checkpoint_000001")
    with pytest.raises(FileNotFoundError, match="holds 2 trials") as e:
        resolve_checkpoint(exp)
    assert "SPEAR_abc_00000" in str(e.value) and "SPEAR_abc_00001" in str(e.value)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        resolve_checkpoint(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="not an Algorithm checkpoint"):
        resolve_checkpoint(tmp_path)


def test_eval_of_an_ambiguous_experiment_lists_its_trials(tmp_path, capsys):
    for name in ("t0", "t1"):
        _checkpoint(tmp_path / name / "checkpoint_000001")
    assert main(["eval", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds 2 trials" in err and "t0" in err and "Traceback" not in err
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2


def test_a_mapping_value_of_set_is_checked_inside():
    msg = _error(["stop={training_iterations: 3}"])
    assert "did you mean 'training_iteration'" in msg
    msg = _error(["training={group_szie: 8}"])
    assert "did you mean 'group_size'" in msg
    assert load_experiment(DEMO, ["training={lr: 1.0e-5}"])["config"]["training"] == {"lr": 1e-5}
