"""The worlds of the text game, each fully determined by a seed: 2-4 connected rooms, each with two
receptacles (some openable and closed), 2-4 objects hidden in receptacles, and a pick-and-place
goal "put the X in the Y" with X and Y in different rooms.

:func:`generate_game` builds one (:class:`GameSpec`). The task rows of the embedded text-game
dataset name a world by its seed and sizes and carry its goal (``data/generate.py``); the text
game environment plays it (``envs/text_game.py``). Pure Python.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["ROOMS", "OPENABLE", "OBJECTS", "GameSpec", "generate_game"]

#: Every room a world may have, with its two receptacles (a receptacle stands in one room).
ROOMS = {
    "kitchen": ["fridge", "counter"],
    "hallway": ["shelf", "closet"],
    "bedroom": ["bed", "dresser"],
    "bathroom": ["sink", "cupboard"],
    "garden": ["bench", "shed"],
    "study": ["desk", "drawer"],
    "cellar": ["crate", "barrel"],
    "attic": ["chest", "box"],
}
OPENABLE = {"fridge", "closet", "dresser", "cupboard", "shed", "drawer", "crate", "barrel", "chest", "box"}
OBJECTS = ["apple", "key", "book", "mug", "coin", "candle", "pen", "plate", "sock", "towel", "bottle", "spoon"]


@dataclass
class GameSpec:
    """One world: its rooms and their links, where each object lies, and the goal."""

    seed: int
    rooms: list[str]
    edges: dict[str, list[str]]
    receptacles: dict[str, list[str]]  # room -> receptacles
    contents: dict[str, list[str]]  # receptacle -> objects
    closed: set[str]
    start: str
    goal_obj: str
    goal_rec: str

    @property
    def goal_text(self) -> str:
        return f"put the {self.goal_obj} in the {self.goal_rec}"


def generate_game(seed: int, n_rooms: int = 3, n_objects: int = 3) -> GameSpec:
    """A solvable game, fully determined by (seed, n_rooms, n_objects)."""
    rng = random.Random(seed)
    n_rooms = max(2, min(n_rooms, len(ROOMS)))
    rooms = rng.sample(sorted(ROOMS), n_rooms)
    edges: dict[str, list[str]] = {r: [] for r in rooms}
    for i in range(1, n_rooms):  # random tree
        a, b = rooms[i], rooms[rng.randrange(i)]
        edges[a].append(b)
        edges[b].append(a)
    recs = {r: list(ROOMS[r]) for r in rooms}
    all_recs = [x for r in rooms for x in recs[r]]
    closed = {x for x in all_recs if x in OPENABLE and rng.random() < 0.6}
    objs = rng.sample(OBJECTS, max(1, min(n_objects, len(OBJECTS))))
    contents: dict[str, list[str]] = {x: [] for x in all_recs}
    start = rng.choice(rooms)
    goal_obj = objs[0]
    obj_room = rng.choice(rooms)
    goal_room = rng.choice([r for r in rooms if r != obj_room])
    contents[rng.choice(recs[obj_room])].append(goal_obj)
    for o in objs[1:]:
        contents[rng.choice(all_recs)].append(o)
    goal_rec = rng.choice(recs[goal_room])
    return GameSpec(seed, rooms, edges, recs, contents, closed, start, goal_obj, goal_rec)
