"""The SIL buffer as an RLlib replay buffer (docs/algorithms.md 2.6): RLlib's interface and
``from_config``, ``replay_buffer_config`` as the source of truth (contradictions refused by
``validate()``), ``store_buffer_in_checkpoints``, the contract check, and a user buffer class that
receives ``add``, serves replay and resumes exactly in a real SPEAR run (tiny model, CPU)."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
from ray.rllib.utils.from_config import from_config
from ray.rllib.utils.replay_buffers import ReplayBuffer
from ray.rllib.utils.replay_buffers.base import ReplayBufferInterface

import rllib_spear  # noqa: F401  (registers the algorithms and the buffer with RLlib)
from rllib_spear import SPEARConfig
from rllib_spear.callbacks import TrajectoryCallback
from rllib_spear.core.trajectory import Trajectory
from rllib_spear.recipe import Recipe
from rllib_spear.recipe.sil_buffer import SILBatch, SILReplayBuffer
from rllib_spear.recipe.sil_spec import build_sil_buffer
from rllib_spear.testing import ContractError, _contract_sil_batches, check_replay_buffer_contract

EXTENDING = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def _key(t: Trajectory) -> tuple:
    """A trajectory by content (traj_ids are fresh uuids in every run, a restored one too)."""
    return t.uid, tuple(t.assistant_token_ids()), t.total_reward


class TopAdvantageBuffer(ReplayBufferInterface):
    """A user buffer that is not a SILReplayBuffer: keeps the ``capacity`` admitted trajectories
    of highest advantage and replays ``replay_size`` of them each step, drawn with probability
    proportional to their advantage from its own seeded RNG. Logs what it was given and served."""

    def __init__(self, capacity: int = 8, replay_size: int = 2, seed: int | None = None) -> None:
        self.capacity, self.replay_size, self.seed = capacity, replay_size, seed
        self._rng = np.random.default_rng(seed)
        self._items: list[tuple[Trajectory, float]] = []
        self.added_steps: list[int] = []
        self.served: dict[int, list[tuple]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def add(self, batch: SILBatch, **kwargs) -> None:
        self.added_steps.append(batch.step)
        zeroed = batch.loss_masks_zeroed or [False] * len(batch.trajectories)
        new = [(Trajectory.from_dict(t.to_dict()), float(a))
               for t, a, z in zip(batch.trajectories, batch.advantages, zeroed) if a > 0 and not z]
        self._items = sorted(self._items + new, key=lambda item: -item[1])[: self.capacity]

    def sample(self, num_items: int | None = None, *, step: int | None = None, **kwargs) -> list:
        n = min(num_items or self.replay_size, len(self._items))
        out = []
        if n:
            p = np.array([a for _, a in self._items])
            out = [self._items[int(i)] for i in self._rng.choice(len(p), size=n, replace=False, p=p / p.sum())]
        self.served[step] = [_key(t) for t, _ in out]
        return out

    def get_state(self) -> dict:
        return {"items": [(t.to_dict(), a) for t, a in self._items], "rng": self._rng.bit_generator.state}

    def set_state(self, state: dict) -> None:
        self._items = [(Trajectory.from_dict(d), float(a)) for d, a in state["items"]]
        self._rng.bit_generator.state = state["rng"]


USER_BUFFER = {"type": f"{__name__}:TopAdvantageBuffer", "capacity": 6, "replay_size": 2}


# ---- RLlib's interface and construction path ------------------------------------------------------
def test_sil_buffer_is_an_rllib_replay_buffer_built_by_from_config():
    assert issubclass(SILReplayBuffer, ReplayBufferInterface)
    assert not getattr(SILReplayBuffer, "__abstractmethods__", None)
    assert set(ReplayBufferInterface.__abstractmethods__) <= set(vars(SILReplayBuffer))
    # RLlib's own call, as Algorithm.setup makes it for DQN: from_config(ReplayBuffer, config)
    for type_ in (SILReplayBuffer, "rllib_spear.recipe.sil_buffer.SILReplayBuffer"):
        buf = from_config(ReplayBuffer, {"type": type_, "capacity": 4, "trigger": "continuous"})
        assert isinstance(buf, SILReplayBuffer) and isinstance(buf, ReplayBufferInterface)
        assert (buf.capacity, buf.trigger) == (4, "continuous")


@pytest.mark.parametrize("type_", ["SILReplayBuffer", SILReplayBuffer, "rllib_spear.recipe.sil_buffer:SILReplayBuffer"])
def test_spear_builds_its_buffer_from_replay_buffer_config(type_):
    cfg = SPEARConfig().training(replay_buffer_config={"type": type_, "capacity": 8, "baseline_trim": "before_append"},
                                 sil_tolerate_steps=3, sil_trigger="continuous")
    cfg.validate(check_files=False)
    buf = build_sil_buffer(cfg)
    assert type(buf) is SILReplayBuffer
    # replay_buffer_config's knobs, then the sil_* keys for the rest, the seed from the algorithm
    assert buf.config() == {**SILReplayBuffer(seed=0).config(), "capacity": 8, "baseline_trim": "before_append",
                            "tolerate_steps": 3, "trigger": "continuous", "replay_batch_size": 64}
    assert Recipe(cfg).replay_buffer.capacity == 8


def test_default_buffer_is_the_sil_keys_buffer():
    cfg = SPEARConfig().training(sil_capacity=16, sil_keep_zero=False)
    assert cfg.replay_buffer_config == {"type": "SILReplayBuffer"} and cfg.store_buffer_in_checkpoints is True
    buf = build_sil_buffer(cfg)
    assert (buf.capacity, buf.keep_zero, buf.seed) == (16, False, 0)


def test_user_buffer_gets_only_the_defaults_its_constructor_takes():
    buf = build_sil_buffer(SPEARConfig().training(replay_buffer_config=USER_BUFFER).debugging(seed=7))
    assert isinstance(buf, TopAdvantageBuffer)
    assert (buf.capacity, buf.replay_size, buf.seed) == (6, 2, 7)


# ---- validate(): one source of truth, contradictions refused ----------------------------------------
def test_contradicting_sil_key_and_replay_buffer_config_is_refused():
    cfg = SPEARConfig().training(sil_capacity=1024, replay_buffer_config={"type": "SILReplayBuffer", "capacity": 512})
    with pytest.raises(ValueError) as e:
        cfg.validate(check_files=False)
    msg = str(e.value)
    assert "`replay_buffer_config['capacity']` = 512 contradicts `sil_capacity` = 1024" in msg
    assert "drop 'capacity' from replay_buffer_config, or leave `sil_capacity` at its default 2048" in msg
    # agreeing values, or a sil_* key at its default, are no contradiction
    SPEARConfig().training(sil_capacity=512, replay_buffer_config={"capacity": 512}).validate(check_files=False)
    SPEARConfig().training(replay_buffer_config={"capacity": 512}).validate(check_files=False)
    cfg = SPEARConfig().training(sil_trigger="continuous", replay_buffer_config={"trigger": "burst"})
    with pytest.raises(ValueError, match=r"`replay_buffer_config\['trigger'\]` = 'burst' contradicts `sil_trigger`"):
        cfg.validate(check_files=False)


@pytest.mark.parametrize("rbc, match", [
    ({"type": "NoSuchBuffer"},
     r"`replay_buffer_config\['type'\]`: module 'rllib_spear.recipe.sil_buffer' has no class 'NoSuchBuffer'"),
    ({"type": "no_such_module:Buffer"}, r"`replay_buffer_config\['type'\]`: cannot import module 'no_such_module'"),
    ({"type": dict}, r"dict is not a ray.rllib.utils.replay_buffers.ReplayBufferInterface"),
    ({"sil_capacity": 4}, r"takes no argument 'sil_capacity'.*named without the prefix here: 'capacity'"),
    ({"capacity": 0}, r"`replay_buffer_config` \(with the sil_\* defaults filled in\): capacity must be >= 1, got 0"),
    ({"type": f"{__name__}:TopAdvantageBuffer", "tolerate_steps": 2},
     r"TopAdvantageBuffer takes no argument 'tolerate_steps'"),
    ("SILReplayBuffer", r"`replay_buffer_config` must be a dict"),
])
def test_bad_replay_buffer_config_is_named(rbc, match):
    with pytest.raises(ValueError, match=match):
        SPEARConfig().training(replay_buffer_config=rbc).validate(check_files=False)


def test_store_buffer_in_checkpoints_must_be_a_bool():
    with pytest.raises(ValueError, match="`store_buffer_in_checkpoints` must be True or False, got 'yes'"):
        SPEARConfig().training(store_buffer_in_checkpoints="yes").validate(check_files=False)


# ---- store_buffer_in_checkpoints, as RLlib documents it --------------------------------------------
def _filled_recipe(**training) -> Recipe:
    recipe = Recipe(SPEARConfig().training(replay_buffer_config={"capacity": 2, "trigger": "continuous"}, **training))
    for b in _contract_sil_batches(2):
        recipe.sil.buffer.add(b)
    return recipe


def test_store_buffer_in_checkpoints(caplog):
    on, off = _filled_recipe(), _filled_recipe(store_buffer_in_checkpoints=False)
    assert on.get_state()["sil_buffer"]["entries"] and off.get_state() == {"sil_buffer": None}
    # True: restored exactly (the next replay is the same)
    fresh = Recipe(on.cfg)
    fresh.set_state(on.get_state())
    assert [r.traj.traj_id for r in fresh.replay(3).rows] == [r.traj.traj_id for r in on.replay(3).rows] != []
    # True, but the checkpoint holds no buffer; False, but it holds one: a warning, nothing restored
    caplog.set_level(logging.WARNING)
    fresh = Recipe(on.cfg)
    fresh.set_state({"sil_buffer": None})
    assert len(fresh.sil.buffer) == 0
    assert "`store_buffer_in_checkpoints` is True, but the checkpoint holds no" in caplog.text
    fresh = Recipe(off.cfg)
    fresh.set_state(_filled_recipe().get_state())
    assert len(fresh.sil.buffer) == 0
    assert "`store_buffer_in_checkpoints` is False, but the checkpoint holds a" in caplog.text


# ---- the contract check -------------------------------------------------------------------------
def test_contract_holds_for_the_sil_buffer_and_a_user_buffer():
    check_replay_buffer_contract(lambda: SILReplayBuffer(capacity=2, seed=0))
    check_replay_buffer_contract(lambda: SILReplayBuffer(capacity=2, trigger="continuous", replay_batch_size=2, seed=0))
    check_replay_buffer_contract(lambda: TopAdvantageBuffer(seed=0))


class _ForgetsRNG(SILReplayBuffer):
    def set_state(self, state, **kw):
        super().set_state(state, **kw)
        self._rng = np.random.default_rng()  # the restored buffer draws anew


class _NotAnRLlibBuffer:
    def add(self, batch, **kw):
        pass

    def sample(self, num_items=None, **kw):
        return []


class _ReturnsTrajectoriesOnly(TopAdvantageBuffer):
    def sample(self, num_items=None, **kw):
        return [t for t, _ in super().sample(num_items, **kw)]


@pytest.mark.parametrize("make, match", [
    (lambda: _ForgetsRNG(capacity=2, trigger="continuous", replay_batch_size=2, seed=0),
     r"_ForgetsRNG: after set_state\(get_state\(\)\) before step 4, step 4 replays"),
    (_NotAnRLlibBuffer, r"_NotAnRLlibBuffer: is not a ray.rllib.utils.replay_buffers.base.ReplayBufferInterface"),
    (lambda: _ReturnsTrajectoriesOnly(seed=0), r"must return \(Trajectory, finite float A~\) pairs"),
    (lambda: SILReplayBuffer(seed=0), r"replayed nothing in 6 steps"),
])
def test_contract_fails_for_a_broken_buffer(make, match):
    with pytest.raises(ContractError, match=match):
        check_replay_buffer_contract(make)


def test_documented_prioritised_buffer_keeps_the_contract_and_prioritises():
    """docs/extending.md's example, run as written: it validates, keeps the contract, and replays
    high-advantage entries more often than the uniform draw."""
    block = EXTENDING.read_text().split("### A prioritised SIL buffer", 1)[1]
    code = re.search(r"```python\n(.*?)```", block, re.S).group(1)
    scope: dict = {"__name__": "readme_example"}
    exec(compile(code, "docs/extending.md", "exec"), scope)  # noqa: S102 - the docs' own example
    cls, cfg = scope["AdvantagePrioritisedSIL"], scope["config"]
    cfg.validate(check_files=False)
    assert isinstance(build_sil_buffer(cfg), cls)
    check_replay_buffer_contract(lambda: cls(capacity=2, trigger="continuous", replay_batch_size=2, seed=0))

    def top_share(buf) -> float:
        cands = [(None, a) for a in (0.0,) * 8 + (5.0,)]  # one high-advantage entry among 9
        return float(np.mean([8 in set(int(i) for i in buf.select(cands, 2)) for _ in range(400)]))

    assert top_share(cls(seed=0)) > 0.9 > 0.4 > top_share(SILReplayBuffer(seed=0))


# ---- a real SPEAR run with a user buffer -------------------------------------------------------------
class SyntheticRewards(TrajectoryCallback):
    """An untrained tiny model earns nothing: rewards seeded by the step, so that advantages are
    non-zero and a restored run sees the same ones."""

    def on_trajectories(self, *, algorithm, trajectories, runner_stats, step, **kwargs):
        rng = np.random.default_rng(step)
        for t in trajectories:
            t.outcome_reward = float(rng.choice([0.0, 0.25, 1.0]))


def _config(model_path: str):
    return (SPEARConfig().environment("search_qa")
            .env_runners(num_env_runners=0, max_new_tokens=16, max_turns=2, max_model_len=512, max_response_tokens=256)
            .training(group_size=4, tasks_per_iteration=2, lr=1e-4, response_filters=(),
                      group_filter_keep_fraction=None, replay_buffer_config=USER_BUFFER)
            .rl_module(model_config={"model_path": model_path})
            .callbacks(SyntheticRewards)
            .debugging(seed=0))


def _recording(algo) -> list[tuple[int, list[tuple[tuple, bool]]]]:
    """(step, [(trajectory key, is_replay), ...]) per learner update: what the learner was given."""
    calls, update = [], algo.update_learners

    def spy(rows, step):
        calls.append((step, [(_key(r.traj), r.is_replay) for r in rows]))
        return update(rows, step)

    algo.update_learners = spy
    return calls


@pytest.fixture(scope="module")
def user_buffer_run(tmp_path_factory):
    """3 iterations with TopAdvantageBuffer, checkpointed after the first; then a new algorithm
    restored from that checkpoint trains 2 iterations."""
    from rllib_spear.models.factory import tiny_model_path

    cfg = _config(tiny_model_path())
    ckpt = str(tmp_path_factory.mktemp("user_buffer") / "ckpt")
    algo = cfg.build_algo()
    try:
        calls = _recording(algo)
        results = [algo.train()]
        algo.save_to_path(ckpt)
        results += [algo.train(), algo.train()]
        first = {"buffer": algo.local_replay_buffer, "recipe_buffer": algo.recipe.sil.buffer, "calls": calls,
                 "results": results, "state": algo.local_replay_buffer.get_state()}
    finally:
        algo.stop()
    algo = cfg.build_algo()
    try:
        algo.restore_from_path(ckpt)
        calls = _recording(algo)
        algo.train(), algo.train()
        resumed = {"buffer": algo.local_replay_buffer, "calls": calls, "state": algo.local_replay_buffer.get_state()}
    finally:
        algo.stop()
    return first, resumed


def test_user_buffer_receives_add_and_serves_replay(user_buffer_run):
    first, _ = user_buffer_run
    buf = first["buffer"]
    assert isinstance(buf, TopAdvantageBuffer) and buf is first["recipe_buffer"]
    assert buf.added_steps == [1, 2, 3]
    assert buf.served[1] == [] and len(buf.served[2]) == len(buf.served[3]) == 2
    # sequential SIL: the on-policy update, then one update on exactly the rows the buffer served
    replayed = [(step, [i for i, rep in rows if rep]) for step, rows in first["calls"]]
    assert replayed == [(1, []), (2, []), (2, buf.served[2]), (3, []), (3, buf.served[3])]
    assert all(all(rep for _, rep in rows) or not any(rep for _, rep in rows) for _, rows in first["calls"])
    assert first["results"][-1]["spear"]["sil_size"] == len(buf) > 0  # metrics() absent: its size is logged


def test_restored_run_with_a_user_buffer_resumes_exactly(user_buffer_run):
    first, resumed = user_buffer_run
    assert isinstance(resumed["buffer"], TopAdvantageBuffer)
    assert resumed["buffer"].added_steps == [2, 3]
    assert resumed["buffer"].served == {2: first["buffer"].served[2], 3: first["buffer"].served[3]}
    # the same on-policy batches and replays as the original's steps 2 and 3
    assert resumed["calls"] == first["calls"][1:]
    assert resumed["state"]["rng"] == first["state"]["rng"]
    assert ([(_key(Trajectory.from_dict(d)), a) for d, a in resumed["state"]["items"]]
            == [(_key(Trajectory.from_dict(d)), a) for d, a in first["state"]["items"]])
