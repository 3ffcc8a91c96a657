"""Env specs (class, "module:Class", registered names, Tune names), their errors, task sources for
your own env, FunctionToolEnv, and resolution in remote Ray workers."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from rllib_spear.core.episode import EpisodeStats
from rllib_spear.envs import (FunctionToolEnv, StepResult, ToolEnv, env_names, load_tasks, make_env, register_env,
                              resolve_env, scripted_demonstrations, system_prompt, unregister_env)
from rllib_spear.envs.registry import builtin_env_name, check_env_spec


# ----------------------------------------------------------------------------- a user env
class EchoEnv(ToolEnv):
    """One turn: the answer is the assistant text."""

    def __init__(self, max_turns: int = 1, greeting: str = "hi"):
        self.max_turns, self.greeting, self.text = max_turns, greeting, None

    @property
    def system_prompt(self) -> str:
        return f"{self.greeting}: answer in one turn"

    def reset(self, task):
        self.text = None
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": task["question"]}]

    def step(self, assistant_text):
        self.text = assistant_text
        return StepResult(None, 1.0, True)

    def episode_stats(self):
        return EpisodeStats(success=True, outcome_reward=1.0, tool_calls=0, queries_per_step=[0], format_ok=True,
                            has_answer=self.text is not None, extra={"echo": self.text})


class NotAnEnv:
    def __init__(self, **kw):
        pass


def echo_factory(env_config):
    return EchoEnv(**env_config)


@pytest.fixture(scope="module")
def ray_session():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled"}})
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture
def registered():
    names = []

    def reg(name, obj, **kw):
        register_env(name, obj, **kw)
        names.append(name)
        return name

    yield reg
    for n in names:
        try:
            unregister_env(n)
        except KeyError:
            pass


# ----------------------------------------------------------------------------- spec forms
def test_builtin_names_resolve_without_importing_the_env_modules():
    code = textwrap.dedent("""
        import sys
        from rllib_spear.envs.registry import check_env_spec, resolve_env
        for name in ("search_qa", "multi_answer_search", "code_math", "text_game", "textworld"):
            assert check_env_spec(name) is None
            resolve_env(name)
        heavy = [m for m in ("rllib_spear.envs.search_envs", "rllib_spear.envs.code_math",
                             "rllib_spear.envs.text_game", "rllib_spear.envs.textworld_env", "ray.tune") if m in sys.modules]
        assert not heavy, heavy
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RLLIB_SPEAR_NO_REGISTER": "1"})
    assert "OK" in out.stdout, out.stderr[-3000:]


def test_builtins_are_registry_entries():
    assert {"search_qa", "multi_answer_search", "code_math", "text_game", "textworld"} <= set(env_names())
    from rllib_spear.envs.text_game import TextGameEnv

    assert isinstance(make_env("text_game", max_turns=3), TextGameEnv)
    assert resolve_env("text_game").env_cls is TextGameEnv
    assert builtin_env_name(TextGameEnv) == "text_game" and builtin_env_name("text_game") == "text_game"
    assert builtin_env_name(EchoEnv) is None and builtin_env_name("nope") is None


def test_class_spec():
    env = make_env(EchoEnv, greeting="yo")
    assert isinstance(env, EchoEnv) and env.greeting == "yo"
    r = resolve_env(EchoEnv)
    assert r.env_cls is EchoEnv and r.accepts("max_turns") and not r.accepts("nope")
    assert system_prompt(EchoEnv, greeting="hey") == "hey: answer in one turn"


def test_import_path_specs():
    assert isinstance(make_env(f"{__name__}:EchoEnv"), EchoEnv)
    assert isinstance(make_env(f"{__name__}:echo_factory", greeting="x"), EchoEnv)  # a factory(env_config)
    from rllib_spear.envs.text_game import TextGameEnv

    assert isinstance(make_env("rllib_spear.envs.text_game.TextGameEnv"), TextGameEnv)  # RLlib's dotted form
    env = make_env("rllib_spear.envs.function_tools:FunctionToolEnv", tools=[len])
    assert isinstance(env, FunctionToolEnv)


def test_registered_class_factory_and_decorator(registered):
    registered("t_echo_cls", EchoEnv)
    registered("t_echo_factory", echo_factory)
    registered("t_echo_path", f"{__name__}:EchoEnv")
    assert make_env("t_echo_cls", greeting="a").greeting == "a"
    assert make_env("t_echo_factory", greeting="b").greeting == "b"  # factory gets the dict
    assert make_env("t_echo_path", greeting="c").greeting == "c"
    assert {"t_echo_cls", "t_echo_factory", "t_echo_path"} <= set(env_names())

    @register_env("t_echo_deco")
    class Sub(EchoEnv):
        pass

    try:
        assert isinstance(make_env("t_echo_deco"), Sub)
    finally:
        unregister_env("t_echo_deco")
    assert "t_echo_deco" not in env_names()


def test_register_env_also_registers_with_tune(registered):
    from ray.tune.registry import ENV_CREATOR, _global_registry

    registered("t_echo_tune_too", EchoEnv)
    assert _global_registry.contains(ENV_CREATOR, "t_echo_tune_too")
    creator = _global_registry.get(ENV_CREATOR, "t_echo_tune_too")
    assert isinstance(creator({"greeting": "z"}), EchoEnv)  # RLlib's convention: creator(env_config)
    unregister_env("t_echo_tune_too")
    assert not _global_registry.contains(ENV_CREATOR, "t_echo_tune_too")


def test_duplicate_names_raise_unless_override(registered):
    registered("t_dup", EchoEnv)
    register_env("t_dup", EchoEnv)  # the same object again: a no-op
    with pytest.raises(ValueError, match="already registered"):
        register_env("t_dup", echo_factory)
    registered("t_dup", echo_factory, override=True)
    assert isinstance(make_env("t_dup"), EchoEnv)
    with pytest.raises(ValueError, match="already registered"):
        register_env("search_qa", EchoEnv)


def test_tune_register_env_names_resolve():
    from ray import tune
    from ray.tune.registry import ENV_CREATOR, _global_registry

    tune.register_env("t_tune_only", lambda cfg: EchoEnv(greeting=cfg.get("greeting", "tune")))
    try:
        env = make_env("t_tune_only", greeting="rllib")
        assert isinstance(env, EchoEnv) and env.greeting == "rllib"
        assert check_env_spec("t_tune_only") is None
    finally:
        _global_registry.unregister(ENV_CREATOR, "t_tune_only")


# ----------------------------------------------------------------------------- errors
def test_unknown_name_lists_registered_names_and_how_to_register():
    with pytest.raises(ValueError) as e:
        make_env("no_such_env")
    msg = str(e.value)
    assert "'no_such_env'" in msg and "search_qa" in msg and "register_env" in msg and "ray.tune" in msg


def test_bad_import_paths():
    with pytest.raises(ValueError, match="cannot import module 'no_such_pkg_x.envs'.*runtime_env"):
        make_env("no_such_pkg_x.envs:MyEnv")
    with pytest.raises(ValueError, match="has no attribute 'Missing'"):
        make_env(f"{__name__}:Missing")


def test_not_a_tool_env_is_a_clear_error(registered):
    with pytest.raises(TypeError, match="not a subclass of rllib_spear.envs.ToolEnv"):
        make_env(NotAnEnv)
    with pytest.raises(TypeError, match="not a subclass"):
        register_env("t_bad", NotAnEnv)
    with pytest.raises(TypeError, match="factory"):
        register_env("t_bad", 42)
    with pytest.raises(TypeError, match="not a subclass"):
        make_env(f"{__name__}:NotAnEnv")
    registered("t_returns_dict", lambda cfg: {"not": "an env"})
    with pytest.raises(TypeError, match="'t_returns_dict' built a builtins.dict, not a rllib_spear.envs.ToolEnv"):
        make_env("t_returns_dict")
    with pytest.raises(TypeError, match="environment spec must be"):
        resolve_env(3.5)


def test_bad_env_config_names_the_env():
    with pytest.raises(ValueError, match=r"make_env\(.*EchoEnv.*bad env_config \['colour'\]"):
        make_env(EchoEnv, colour="red")


def test_scripted_demonstrations_are_for_builtins_only():
    with pytest.raises(ValueError, match="no scripted policy for environment .*EchoEnv"):
        scripted_demonstrations(EchoEnv, [{"question": "q"}])


def test_config_validate_resolves_the_spec_early(registered):
    from rllib_spear import SPEARConfig

    tasks = [{"question": "q", "answer": "a"}]
    for spec in (EchoEnv, f"{__name__}:EchoEnv", registered("t_cfg_env", EchoEnv), "search_qa"):
        SPEARConfig().environment(spec, dataset=tasks).validate()
    with pytest.raises(ValueError, match=r"`env` .*unknown environment 'nope'.*register_env"):
        SPEARConfig().environment("nope").validate()
    with pytest.raises(ValueError, match="`env` .*not a subclass"):
        SPEARConfig().environment(NotAnEnv).validate()
    with pytest.raises(ValueError, match="`env` .*register a factory with rllib_spear.register_env"):
        SPEARConfig().environment(echo_factory).validate()


def test_top_level_exports():
    import rllib_spear

    assert rllib_spear.register_env is register_env
    assert rllib_spear.FunctionToolEnv is FunctionToolEnv


# ----------------------------------------------------------------------------- task sources
def test_tasks_as_list_callable_or_parquet_for_a_custom_env(tmp_path):
    rows = [{"question": "q1", "answer": "a", "meta": {"k": 1}}, {"question": "q2", "answer": "b"}]
    got = load_tasks(rows, env=EchoEnv)
    assert [t["question"] for t in got] == ["q1", "q2"] and got[0]["meta"] == {"k": 1}
    assert len({t["uid"] for t in got}) == 2
    assert load_tasks(lambda: rows, env=EchoEnv)[1]["answer"] == "b"
    assert load_tasks(lambda split: [dict(r, split=split) for r in rows], "test", env=EchoEnv)[0]["split"] == "test"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"question": "q", "prompt": "not code_math"}]), tmp_path / "train.parquet")
    got = load_tasks(str(tmp_path), "train", env="t_any_custom_name")  # columns kept as they are
    assert got[0]["prompt"] == "not code_math" and "answer" not in got[0]
    # a built-in env still validates its rows
    with pytest.raises(ValueError, match="golden_answers"):
        load_tasks([{"question": "q"}], env="search_qa")


def test_custom_env_without_dataset_says_how_to_give_one(registered):
    for env in (EchoEnv, registered("t_no_data", EchoEnv), f"{__name__}:EchoEnv"):
        with pytest.raises(ValueError, match="has no default dataset.*dataset=.*list of task dicts"):
            load_tasks(env, "train", env=env)
    with pytest.raises(ValueError, match="empty"):
        load_tasks([], env=EchoEnv)
    with pytest.raises(ValueError, match="must return a list"):
        load_tasks(lambda: "nope", env=EchoEnv)


# ----------------------------------------------------------------------------- remote workers
def _local_env_class():
    # Defined in a function, so cloudpickle ships it by value (a class of this module would be
    # pickled by reference, and workers cannot import test modules).
    class LocalEnv(FunctionToolEnv):
        def __init__(self, greeting: str = "hi", **kwargs):
            super().__init__(tools=[len], **kwargs)
            self.greeting = greeting

    return LocalEnv


def test_specs_resolve_in_remote_workers(ray_session, registered, tmp_path):
    import ray
    from ray import tune
    from ray.tune.registry import ENV_CREATOR, _global_registry

    local_cls = _local_env_class()
    registered("t_remote_name", local_cls)  # registered in the driver only
    tune.register_env("t_remote_tune", lambda cfg: local_cls(**cfg))
    # a module only on the driver's sys.path (not the driver's cwd or script directory)
    (tmp_path / "driver_only_envs.py").write_text("from rllib_spear.envs.function_tools import FunctionToolEnv\n")
    sys.path.insert(0, str(tmp_path))
    try:
        @ray.remote(num_cpus=0)
        def build(specs):  # one worker process builds them all
            from rllib_spear.envs import make_env

            out = []
            for spec in specs:
                try:
                    out.append(type(make_env(spec, greeting="w")).__name__)
                except Exception as e:  # noqa: BLE001
                    out.append(f"{type(e).__name__}: {e}")
            return out

        specs = [local_cls, "t_remote_name", "t_remote_tune", "rllib_spear.envs.function_tools:FunctionToolEnv",
                 "driver_only_envs:FunctionToolEnv"]
        got = ray.get(build.remote(specs))
    finally:
        sys.path.remove(str(tmp_path))
        _global_registry.unregister(ENV_CREATOR, "t_remote_tune")
    assert got[:3] == ["LocalEnv"] * 3, got
    assert got[3].startswith("ValueError: make_env('rllib_spear.envs.function_tools:FunctionToolEnv'): bad "
                             "env_config"), got[3]  # resolved in the worker; greeting is not its option
    assert "cannot import module 'driver_only_envs'" in got[4] and "runtime_env" in got[4], got[4]


def test_runtime_env_py_modules_ships_a_module_path(tmp_path):
    """What the import error advises: ray.init(runtime_env={"py_modules": [...]}) (a job of its own)."""
    mod = tmp_path / "shipped_envs.py"
    mod.write_text(textwrap.dedent("""
        from rllib_spear.envs.function_tools import FunctionToolEnv

        class ShippedEnv(FunctionToolEnv):
            def __init__(self, **kw):
                super().__init__(tools=[len], **kw)
    """))
    code = textwrap.dedent(f"""
        import os, sys
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        sys.path.insert(0, {str(tmp_path)!r})
        import ray
        ray.init(num_cpus=1, include_dashboard=False, runtime_env={{"py_modules": [{str(mod)!r}]}})

        @ray.remote(num_cpus=0)
        def build(spec):
            from rllib_spear.envs import make_env
            return type(make_env(spec)).__name__

        print("GOT", ray.get(build.remote("shipped_envs:ShippedEnv")))
        ray.shutdown()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(tmp_path.parent))
    assert "GOT ShippedEnv" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]
