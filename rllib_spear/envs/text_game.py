"""Procedurally generated turn-based text games (ALFWorld-like) and the gymnasium-style adapter.

A game (from a seed, ``data/text_game_worlds.py``): 2-4 connected rooms, each with two
receptacles (some openable and closed), 2-4 objects hidden in receptacles, and a pick-and-place
goal "put the X in the Y" with X and Y in different rooms. Actions (the admissible list is shown every turn, as in ALFWorld/verl-agent):
``go to <room>``, ``open <r>``, ``close <r>``, ``take <obj> from <r>``, ``put <obj> in <r>``,
``look``, ``inventory``. The player carries one object at a time. Sparse reward: the episode
ends when the goal holds (success) or after ``max_turns`` turns.

Three layers:

- :class:`TextGame`: the game logic (``admissible_actions()``, ``act(action) -> feedback``).
- :class:`TextGameGym`: gymnasium-style API (``reset(seed, options) -> (obs, info)``,
  ``step(action) -> (obs, reward, terminated, truncated, info)``, ``info["admissible_commands"]``,
  ``info["won"]``), a ``gymnasium.Env`` subclass when gymnasium is installed.
- :class:`GymTextToolEnv`: wraps any such gym-style text env (this one, TextWorld, ALFWorld) into a
  :class:`~rllib_spear.envs.base.ToolEnv`: the assistant answers ``<think>..</think>`` then
  ``<action>..</action>``; the observation comes back as ``<observation>..</observation>``.
  Rewards (SPEAR agent tasks): ``success_reward`` (10) on the step that wins; an invalid action
  (unparseable or not admissible; the game state does not change) pays ``-invalid_action_penalty``
  (0.1, verl-agent) on that step. Every step counts as a tool call.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable

from rllib_spear.data.text_game_worlds import OPENABLE, GameSpec, generate_game
from rllib_spear.envs.base import StepResult, ToolEnv
from rllib_spear.core.episode import EpisodeStats
from rllib_spear.envs.parsers import check_think_format, get_parser

__all__ = ["TextGame", "TextGameGym", "GymTextToolEnv", "TextGameEnv", "solve_game",
           "TEXT_GAME_SYSTEM_PROMPT", "STEP_TEMPLATE_NO_HIS", "STEP_TEMPLATE"]

TEXT_GAME_SYSTEM_PROMPT = (
    "You play a text game. Each turn, think inside <think>...</think>, then give exactly one "
    "admissible action inside <action>...</action>."
)


# The per-step prompts of the window layout (GymTextToolEnv.step_prompt, docs/design.md "Sample
# layouts: full and window"): the released agent tree's ALFWorld templates, word for word
# (ALFWORLD_TEMPLATE_NO_HIS / ALFWORLD_TEMPLATE of verl-agent's
# agent_system/environments/prompts/alfworld.py, its "observaitons" typo included), with one
# adaptation: "the ALFRED Embodied Environment" is ``{environment}`` (our games are not ALFRED;
# GymTextToolEnv.step_prompt_environment). The <think>/<action> format is ours too.
_STEP_TURN = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
    "within <think> </think> tags. \n"  # (the released text has this trailing space)
    "Once you've finished your reasoning, you should choose an admissible action for current step and present it "
    "within <action> </action> tags.\n"
)
STEP_TEMPLATE_NO_HIS = (
    "\nYou are an expert agent operating in {environment}.\n"
    "Your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n" + _STEP_TURN
)
STEP_TEMPLATE = (
    "\nYou are an expert agent operating in {environment}. Your task is to: {task_description}\n"
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent {history_length} "
    "observaitons and the corresponding actions you took: {action_history}\n"
    "You are now at step {current_step} and your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n" + _STEP_TURN
)


class TextGame:
    """Mutable state of one game."""

    def __init__(self, spec: GameSpec):
        self.spec = spec
        self.room = spec.start
        self.contents = {k: list(v) for k, v in spec.contents.items()}
        self.closed = set(spec.closed)
        self.holding: str | None = None
        self.won = False

    def _rec_room(self, rec: str) -> str | None:
        return next((r for r, rs in self.spec.receptacles.items() if rec in rs), None)

    def describe(self) -> str:
        parts = []
        for rec in self.spec.receptacles[self.room]:
            if rec in self.closed:
                parts.append(f"a closed {rec}")
            elif self.contents[rec]:
                parts.append(f"a {rec} with " + ", ".join(f"a {o}" for o in self.contents[rec]))
            else:
                parts.append(f"an empty {rec}" if rec in OPENABLE else f"a {rec}")
        exits = ", ".join(self.spec.edges[self.room])
        return f"You are in the {self.room}. You see {', '.join(parts)}. Exits: {exits}."

    def admissible_actions(self) -> list[str]:
        acts = [f"go to {r}" for r in self.spec.edges[self.room]]
        for rec in self.spec.receptacles[self.room]:
            if rec in OPENABLE:
                acts.append(f"close {rec}" if rec not in self.closed else f"open {rec}")
            if rec not in self.closed:
                if self.holding is None:
                    acts += [f"take {o} from {rec}" for o in self.contents[rec]]
                else:
                    acts.append(f"put {self.holding} in {rec}")
        return acts + ["look", "inventory"]

    def act(self, action: str) -> str | None:
        """Apply an admissible action; returns feedback, or None if not admissible."""
        action = " ".join(action.lower().split())
        if action not in self.admissible_actions():
            return None
        w = action.split()
        if action == "look":
            return self.describe()
        if action == "inventory":
            return f"You are carrying a {self.holding}." if self.holding else "You are carrying nothing."
        if w[0] == "go":
            self.room = w[2]
            return self.describe()
        if w[0] == "open":
            self.closed.discard(w[1])
            inside = self.contents[w[1]]
            return f"You open the {w[1]}. " + (f"Inside you see {', '.join('a ' + o for o in inside)}."
                                                if inside else "It is empty.")
        if w[0] == "close":
            self.closed.add(w[1])
            return f"You close the {w[1]}."
        if w[0] == "take":
            obj, rec = w[1], w[3]
            self.contents[rec].remove(obj)
            self.holding = obj
            return f"You take the {obj} from the {rec}."
        if w[0] == "put":
            obj, rec = w[1], w[3]
            self.contents[rec].append(obj)
            self.holding = None
            if obj == self.spec.goal_obj and rec == self.spec.goal_rec:
                self.won = True
            return f"You put the {obj} in the {rec}."
        return None  # pragma: no cover


def solve_game(spec: GameSpec) -> list[str]:
    """Shortest-ish scripted plan (BFS over rooms): reach the object, open, take, carry, open, put."""
    g = TextGame(spec)

    def path(a: str, b: str) -> list[str]:
        prev = {a: None}
        q = deque([a])
        while q:
            x = q.popleft()
            for y in spec.edges[x]:
                if y not in prev:
                    prev[y] = x
                    q.append(y)
        out = []
        while b != a:
            out.append(b)
            b = prev[b]
        return out[::-1]

    src = next(r for r, objs in spec.contents.items() if spec.goal_obj in objs)
    src_room = g._rec_room(src)
    dst_room = g._rec_room(spec.goal_rec)
    plan = [f"go to {r}" for r in path(spec.start, src_room)]
    if src in spec.closed:
        plan.append(f"open {src}")
    plan.append(f"take {spec.goal_obj} from {src}")
    plan += [f"go to {r}" for r in path(src_room, dst_room)]
    if spec.goal_rec in spec.closed:
        plan.append(f"open {spec.goal_rec}")
    plan.append(f"put {spec.goal_obj} in {spec.goal_rec}")
    return plan


try:  # a real gymnasium.Env when gymnasium is installed; duck-typed otherwise
    import gymnasium as _gym

    _GymBase = _gym.Env
except Exception:  # noqa: BLE001
    _gym = None
    _GymBase = object


class TextGameGym(_GymBase):
    """Gymnasium-style wrapper of :class:`TextGame`: string observations and actions.

    ``reset(seed=None, options={"task": {...}})`` (task keys ``seed``, ``n_rooms``, ``n_objects``)
    returns ``(obs, info)``; ``step(action)`` returns ``(obs, reward, terminated, truncated, info)``
    with reward 1.0 on the winning step; ``info`` has ``admissible_commands``, ``won``, ``valid``,
    ``goal`` and ``room`` (the player's room, which every description names).
    """

    metadata = {"render_modes": []}

    def __init__(self, task: dict | None = None, max_steps: int = 50):
        self.task = task or {"seed": 0}
        self.max_steps = max_steps
        self.game: TextGame | None = None
        self.steps = 0
        if _gym is not None:
            from gymnasium import spaces

            self.observation_space = spaces.Text(max_length=4096)
            self.action_space = spaces.Text(max_length=256)

    def _info(self, valid: bool = True) -> dict:
        return {"admissible_commands": self.game.admissible_actions(), "won": self.game.won, "valid": valid,
                "goal": self.game.spec.goal_text, "room": self.game.room}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        task = dict((options or {}).get("task") or self.task)
        if seed is not None:
            task["seed"] = seed
        spec = generate_game(int(task.get("seed", 0)), int(task.get("n_rooms", 3)), int(task.get("n_objects", 3)))
        if task.get("goal") and task["goal"] != spec.goal_text:
            raise ValueError(f"task goal {task['goal']!r} does not match generated game {spec.goal_text!r}")
        self.game = TextGame(spec)
        self.steps = 0
        return f"Your task is to: {spec.goal_text}.\n{self.game.describe()}", self._info()

    def step(self, action: str):
        self.steps += 1
        fb = self.game.act(action)
        valid = fb is not None
        if not valid:
            fb = "Nothing happens."
        terminated = self.game.won
        truncated = not terminated and self.steps >= self.max_steps
        return fb, (1.0 if terminated else 0.0), terminated, truncated, self._info(valid)


class GymTextToolEnv(ToolEnv):
    """Any gym-style text env with admissible commands as a ToolEnv (see module docstring).

    ``make_gym(task) -> env`` builds the gym env for a task; it must return observations as text
    and put ``admissible_commands`` (list[str]) and ``won`` (bool) into ``info``.
    """

    tag = "observation"
    #: who the window layout's step prompt says the agent is in (STEP_TEMPLATE's {environment})
    step_prompt_environment = "a text-based household game"

    def __init__(self, make_gym: Callable[[dict], Any], *, max_turns: int = 12, success_reward: float = 10.0,
                 invalid_action_penalty: float = 0.1, system_prompt: str = TEXT_GAME_SYSTEM_PROMPT,
                 show_admissible: bool = True, max_obs_chars: int = 2000, parser: str = "action"):
        self.make_gym = make_gym
        self.max_turns = max_turns
        self.success_reward = success_reward
        self.invalid_action_penalty = invalid_action_penalty
        self.system_prompt = system_prompt
        self.show_admissible = show_admissible
        self.max_obs_chars = max_obs_chars
        self.parser = get_parser(parser, supported_calls=("action",))  # any registered action parser
        self._env = None
        self._reset_state()

    def _reset_state(self):
        self.turns = 0
        self.done = True
        self.won = False
        self.admissible: list[str] = []
        self.last_info: dict = {}
        self.queries_per_step: list[int] = []
        self.step_penalties: list[float] = []  # per step: -invalid_action_penalty or 0 (GiGPO, 3.5)
        self.invalid_actions = 0
        self.unformatted_steps = 0  # steps with no single <action>..</action>: Dr.BoT's "incomplete"
        self.incomplete_steps: list[bool] = []  # per step: that step held no action in the format
        self.format_ok = True
        self.outcome = 0.0
        # window layout (step_prompt): (observation the step was taken at, its action), the
        # task text, and the observation of the step about to be taken
        self.step_history: list[tuple[str, str]] = []
        self.task_text = ""
        self.current_obs = ""

    def _render(self, text: str) -> str:
        text = str(text).strip()
        if self.show_admissible and self.admissible:
            text += "\nAdmissible actions: " + ", ".join(self.admissible)
        if len(text) > self.max_obs_chars:
            text = text[: self.max_obs_chars] + " ...[truncated]"
        return text

    def reset(self, task: dict[str, Any]) -> list[dict[str, str]]:
        if self._env is not None and hasattr(self._env, "close"):
            try:
                self._env.close()
            except Exception:  # noqa: BLE001
                pass
        self._reset_state()
        self.task = task
        self._env = self.make_gym(task)
        obs, info = self._env.reset()
        self.admissible = list(info.get("admissible_commands") or [])
        self.last_info = dict(info)
        self.done = False
        self.current_obs = str(obs).strip()
        # the released harness reads the task from the first observation (extract_task)
        cut = self.current_obs.find("Your task is to: ")
        self.task_text = self.current_obs[cut + len("Your task is to: "):].strip() if cut >= 0 else self.current_obs
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": self._render(obs)}]

    def step(self, assistant_text: str) -> StepResult:
        if self.done:
            return StepResult(None, 0.0, True, {"error": "episode is over"})
        self.turns += 1
        parsed = self.parser.parse(assistant_text)
        if check_think_format(assistant_text if isinstance(assistant_text, str) else "") is not None:
            self.format_ok = False
        action = None
        if parsed.kind == "tool":
            cand = parsed.calls[0].arguments["action"]
            match = next((a for a in self.admissible if a.lower() == cand.lower()), None)
            action = match
            err = None if match else f"'{cand}' is not an admissible action"
        else:
            err = parsed.error
            self.unformatted_steps += 1
        self.incomplete_steps.append(parsed.kind != "tool")
        # the history the window layout's step prompt shows: the released projection's action
        # (the <action> text lower-cased, or the reply's last 30 characters without one)
        said = cand.lower() if parsed.kind == "tool" else str(assistant_text).lower()[-30:]
        self.step_history.append((self.current_obs, said))
        reward, info = 0.0, {"valid_action": action is not None}
        self.queries_per_step.append(1)
        self.step_penalties.append(0.0 if action is not None else -float(self.invalid_action_penalty))
        if action is None:
            self.invalid_actions += 1
            self.format_ok = False
            reward -= self.invalid_action_penalty
            text = f"Invalid action: {err}."
        else:
            try:
                obs, _r, terminated, truncated, ginfo = self._env.step(action)
            except Exception as e:  # noqa: BLE001 - a crashing game ends the episode, no raise
                self.done = True
                info["error"] = f"game error: {type(e).__name__}: {e}"
                return StepResult(None, reward, True, info)
            self.admissible = list(ginfo.get("admissible_commands") or [])
            self.last_info = dict(ginfo)
            self.won = bool(ginfo.get("won"))
            text = str(obs)
            if self.won:
                self.done = True
                self.outcome = self.success_reward
                reward += self.success_reward
                info["success"] = True
                return StepResult(None, reward, True, info)
            if terminated or truncated:
                self.done = True
                if truncated:
                    info["truncated"] = True
                return StepResult(None, reward, True, info)
        if self.turns >= self.max_turns:
            self.done = True
            info["truncated"] = True
            return StepResult(None, reward, True, info)
        self.current_obs = str(text).strip()
        return StepResult(f"<observation>{self._render(text)}</observation>", reward, False, info)

    def step_prompt(self, history_steps: int) -> list[dict[str, str]]:
        """The window layout's prompt of the next step (``ToolEnv.step_prompt``): the released
        ALFWorld step template (``STEP_TEMPLATE_NO_HIS`` at the first step or with
        ``history_steps=0``, else ``STEP_TEMPLATE`` with the last ``history_steps`` steps as
        ``[Observation n: '...', Action n: '...']`` lines, verl-agent's ``SimpleMemory.fetch``),
        one user message as there."""
        cap = self.max_obs_chars

        def clip(text: str) -> str:
            return text if len(text) <= cap else text[:cap] + " ...[truncated]"

        admissible = "\n ".join(f"'{a}'" for a in self.admissible if a != "help")
        taken = len(self.step_history)
        if taken == 0 or history_steps <= 0:
            content = STEP_TEMPLATE_NO_HIS.format(environment=self.step_prompt_environment,
                                                  current_observation=clip(self.current_obs),
                                                  admissible_actions=admissible)
        else:
            recent = self.step_history[-history_steps:]
            first = taken - len(recent) + 1
            lines = [f"[Observation {first + j}: '{clip(o)}', Action {first + j}: '{a}']"
                     for j, (o, a) in enumerate(recent)]
            content = STEP_TEMPLATE.format(environment=self.step_prompt_environment, task_description=self.task_text,
                                           step_count=taken, history_length=len(recent),
                                           action_history="\n".join(lines), current_step=taken + 1,
                                           current_observation=clip(self.current_obs), admissible_actions=admissible)
        return [{"role": "user", "content": content}]

    def episode_stats(self) -> EpisodeStats:
        return EpisodeStats.coerce({
            "tool_calls": self.turns,
            "queries_per_step": list(self.queries_per_step),
            "step_penalties": list(self.step_penalties),
            "success": self.won,
            "format_ok": self.format_ok,
            # Dr.BoT's "incomplete" filter (docs/algorithms.md 1.5) on an agent task: a step with
            # no action in the format, not a lost game (an inadmissible but well-formed action is
            # complete). Per episode: one such step masks the episode (per step with
            # filter_scope="step": incomplete_steps).
            "has_answer": self.turns > 0 and self.unformatted_steps == 0,
            "incomplete_steps": list(self.incomplete_steps),  # the same check per step (filter_scope="step")
            "unformatted_steps": self.unformatted_steps,
            "outcome_reward": self.outcome,
            "invalid_actions": self.invalid_actions,
            "turns": self.turns,
        }, type(self).__name__)


class TextGameEnv(GymTextToolEnv):
    """The procedurally generated game as a ToolEnv (task keys: seed, n_rooms, n_objects, goal)."""

    def __init__(self, **kwargs):
        max_turns = kwargs.get("max_turns", 12)
        super().__init__(lambda task: TextGameGym(task, max_steps=max_turns), **kwargs)
