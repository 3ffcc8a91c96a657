"""TextWorld adapter (``make_env("textworld")``) and how ALFWorld plugs in.

``textworld`` (PyPI, optional: ``pip install textworld``) generates and compiles games locally
(Inform 7 compiler shipped in the wheel; ~5 s per small game) and runs them with the Jericho/Glulx
interpreter, so no download is needed. :class:`TextWorldGym` exposes a game as a gymnasium-style
text env (``reset() -> (obs, info)``, ``step(cmd) -> (obs, reward, terminated, truncated, info)``
with ``info["admissible_commands"]`` and ``info["won"]``), and
:class:`~rllib_spear.envs.text_game.GymTextToolEnv` turns that into the project's ToolEnv
(``<action>..</action>`` turns, ``<observation>..</observation>`` replies, 10 x success reward).

Tasks: ``{"uid": ..., "game_file": "/path/game.z8"}``; :func:`make_textworld_tasks` generates
them (``tw-make custom`` equivalent, seeded) into a directory.

ALFWorld: ``alfworld`` (PyPI, plus its ``alfworld-download`` data, ~2 GB, not available offline
here) builds TextWorld games from the ALFRED PDDL files; its ``AlfredTWEnv`` returns
``textworld.gym`` environments whose ``infos`` contain ``admissible_commands`` and ``won``. To use
it, write a ``make_gym(task)`` that returns a single-game env with the same reset/step contract
(e.g. ``textworld.gym.make(textworld.gym.register_game(task["game_file"], request_infos,
wrappers=[AlfredDemangler(), AlfredInfos]))`` and unwrap the batch of size 1), and pass it to
``GymTextToolEnv(make_gym, max_turns=50)``; :class:`TextWorldGym` with ``wrappers=[...]`` does the
unwrapping for single-game files.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from rllib_spear.envs.text_game import GymTextToolEnv

__all__ = ["TextWorldGym", "TextWorldEnv", "make_textworld_tasks", "textworld_available"]


def textworld_available() -> bool:
    try:
        import textworld  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


_BANNER = re.compile(r"^.*?\$\$\$\$\$\$\$.*?(?=\n\s*-=)", re.DOTALL)


def _clean(text: str) -> str:
    text = _BANNER.sub("", text or "")
    return "\n".join(line.rstrip() for line in text.strip().splitlines() if line.strip())


class TextWorldGym:
    """One TextWorld game file as a gymnasium-style text env."""

    def __init__(self, game_file: str, max_steps: int = 50, wrappers: list | None = None):
        import textworld

        self.game_file = str(game_file)
        self.max_steps = max_steps
        infos = textworld.EnvInfos(admissible_commands=True, won=True, lost=True, objective=True,
                                   description=True, inventory=True, max_score=True, policy_commands=True)
        self._env = textworld.start(self.game_file, request_infos=infos, wrappers=wrappers or [])
        self.steps = 0

    @staticmethod
    def _info(state) -> dict[str, Any]:
        cmds = [c for c in (state.get("admissible_commands") or []) if c not in ("look", "inventory")]
        cmds += ["look", "inventory"]
        return {"admissible_commands": cmds, "won": bool(state.get("won")), "lost": bool(state.get("lost")),
                "objective": state.get("objective"), "policy_commands": list(state.get("policy_commands") or [])}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        state = self._env.reset()
        self.steps = 0
        return _clean(state.feedback), self._info(state)

    def step(self, action: str):
        self.steps += 1
        state, score, done = self._env.step(action)
        info = self._info(state)
        won = info["won"]
        truncated = not done and self.steps >= self.max_steps
        return _clean(state.feedback), (1.0 if won else 0.0), bool(done), truncated, info

    def close(self):
        try:
            self._env.close()
        except Exception:  # noqa: BLE001
            pass


class TextWorldEnv(GymTextToolEnv):
    """ToolEnv over TextWorld games; task key ``game_file``."""

    def __init__(self, **kwargs):
        if not textworld_available():
            raise ImportError("make_env('textworld') needs the optional package: pip install textworld")
        max_turns = kwargs.get("max_turns", 20)
        kwargs.setdefault("max_turns", max_turns)
        kwargs.setdefault("max_obs_chars", 3000)
        super().__init__(lambda task: TextWorldGym(task["game_file"], max_steps=max_turns), **kwargs)


def make_textworld_tasks(out_dir: str | os.PathLike, n: int = 4, seed: int = 0, world_size: int = 3,
                         nb_objects: int = 4, quest_length: int = 2) -> list[dict[str, Any]]:
    """Generate ``n`` seeded TextWorld games into ``out_dir`` (reused if present) and return tasks
    ``{"uid", "game_file", "data_source"}``."""
    import textworld
    from textworld.generator import compile_game, make_game

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tasks = []
    for i in range(n):
        s = seed + i
        name = f"tw_s{s}_w{world_size}_o{nb_objects}_q{quest_length}"
        path = out / f"{name}.z8"
        if not path.exists():
            opts = textworld.GameOptions()
            opts.seeds = s
            opts.nb_rooms = world_size
            opts.nb_objects = nb_objects
            opts.quest_length = quest_length
            opts.path = str(path)
            opts.force_recompile = True
            game = make_game(opts)
            compile_game(game, opts)
        tasks.append({"uid": name, "game_file": str(path), "data_source": "textworld"})
    return tasks
