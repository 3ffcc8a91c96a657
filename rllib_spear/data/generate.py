"""Deterministic generators of the embedded default datasets.

Everything is drawn from ``random.Random(seed)`` (stable across Python versions for the calls used
here: ``random``, ``randrange``, ``choice``, ``shuffle``, ``sample``), so the same seed gives
byte-identical tables.

The fictional world (seed 1234 by default): 240 people, 50 towns, 12 rivers, 6 regions. Every
name is invented, so answers can only be found by searching the corpus. Answers are short (1-2
words) and drawn from small pools (50 towns, 10 occupations, 6 regions, 12 rivers, 240 names...),
so a blind guess is right now and then but rarely.

Tables (all parquet, see :mod:`rllib_spear.data`):

- ``corpus``: ``id, title, text`` - one passage per person, town, river and region.
- ``search_qa_{train,test}``: Search-R1 format ``uid, question, golden_answers (list[str]),
  data_source`` (``fictional_1hop`` / ``fictional_2hop``) plus ``answer_type`` and ``queries``
  (the searches a scripted policy makes; used by :func:`rllib_spear.envs.scripted_demonstrations`).
- ``multi_answer_{train,test}``: QAMPARI-like ``uid, question, answers (list[list[str]]: one alias
  list per entity, 3-8 entities), data_source, answer_type, queries``.
- ``code_math_{train,test}``: DAPO-math format ``uid, prompt, answer, data_source``: integer
  arithmetic on 4-6 digit numbers, exact answers that need the interpreter.
- ``text_game_{train,test}``: ``uid, seed, n_rooms, n_objects, goal, data_source``; the game itself
  is rebuilt from ``seed`` by :mod:`rllib_spear.envs.text_game`.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

__all__ = ["World", "build_world", "corpus_rows", "search_qa_rows", "multi_answer_rows",
           "code_math_rows", "text_game_rows", "split_of", "DATA_VERSION"]

# The cache folder's name: bump it whenever a generator's output changes, or machines that
# generated the data before keep using their stale copy (v1 caches written before the 60
# "born in A or B" multi-answer questions were added hold 130 instead of 180 train tasks).
DATA_VERSION = "v2"

FIRST = ["Alder", "Brin", "Corla", "Dace", "Elva", "Fenn", "Garo", "Hale", "Ilsa", "Joren",
         "Kael", "Lira", "Mott", "Nessa", "Orin", "Pell", "Quill", "Rhea", "Soren", "Tamsin",
         "Ulla", "Varo", "Wren", "Yara", "Zev", "Ansel", "Bryn", "Cato", "Dara", "Edda",
         "Faro", "Gwen", "Hollis", "Iver", "Juna", "Kestrel", "Lorne", "Mira", "Nils", "Oona"]
LAST = ["Quen", "Tovel", "Marsh", "Brack", "Ferrow", "Gale", "Holt", "Inder", "Jessop", "Kettle",
        "Lomax", "Mercer", "Nolt", "Orrin", "Ashby", "Bellam", "Corvin", "Dunmore", "Elstow", "Fairlie",
        "Gorran", "Harrow", "Ivel", "Kilby", "Larch", "Moller", "Norrell", "Oakes", "Pryor", "Quarry",
        "Rudd", "Sable", "Thorne", "Uffing", "Vance", "Wendle", "Yelland", "Zorn", "Calder", "Fenwick"]
TOWN_A = ["Vel", "Ost", "Bran", "Dun", "Kel", "Mar", "Tor", "Ash", "Fen", "Gil", "Hol", "Lin",
          "Nor", "Pel", "Rav", "Sel", "Tam", "Wyn"]
TOWN_B = ["mora", "brook", "ford", "wick", "stead", "holm", "by", "ton", "mere", "vale"]
RIVERS = ["Ossel", "Lune", "Tarrow", "Brisk", "Cellan", "Dwyre", "Emmer", "Fraye", "Gollan", "Hesk",
          "Iddle", "Jorrow"]
REGIONS = ["Northmarch", "Eastfold", "Southmere", "Westvale", "Highcairn", "Lowmoor"]
OCCUPATIONS = ["baker", "painter", "weaver", "sailor", "mason", "potter", "tailor", "farmer",
               "doctor", "poet"]
MATERIALS = ["copper", "glass", "silver", "iron", "oak", "clay", "wool", "brass", "stone", "amber"]
THINGS = ["kite", "lantern", "compass", "clock", "bell", "loom", "plough", "whistle", "lens",
          "wheel", "harp", "pump"]


@dataclass
class Person:
    name: str
    town: str
    year: int
    occupation: str
    invention: str
    mentor: str = ""


@dataclass
class Town:
    name: str
    river: str
    region: str
    founded: int
    founder: str = ""


@dataclass
class World:
    people: list[Person]
    towns: list[Town]
    rivers: dict[str, str]  # river -> region
    capitals: dict[str, str]  # region -> town
    by_name: dict[str, Person] = field(default_factory=dict)
    town_by_name: dict[str, Town] = field(default_factory=dict)


def _sizes(rng: random.Random, n_items: int, n_groups: int, lo: int, hi: int) -> list[int]:
    """Group sizes in [lo, hi] summing to n_items."""
    sizes = [lo] * n_groups
    left = n_items - lo * n_groups
    assert 0 <= left <= (hi - lo) * n_groups
    while left:
        g = rng.randrange(n_groups)
        if sizes[g] < hi:
            sizes[g] += 1
            left -= 1
    return sizes


def build_world(seed: int = 1234, n_people: int = 240, n_towns: int = 50, n_mentors: int = 45) -> World:
    rng = random.Random(seed)
    names = [f"{f} {l}" for f in FIRST for l in LAST]
    rng.shuffle(names)
    names = names[:n_people]
    towns = sorted({a + b for a in TOWN_A for b in TOWN_B})
    rng.shuffle(towns)
    towns = towns[:n_towns]
    rivers = {r: REGIONS[i % len(REGIONS)] for i, r in enumerate(RIVERS)}
    river_sizes = _sizes(rng, n_towns, len(RIVERS), 3, 6)
    town_objs = []
    k = 0
    for r, sz in zip(RIVERS, river_sizes):
        for _ in range(sz):
            town_objs.append(Town(towns[k], r, rivers[r], rng.randrange(1200, 1700)))
            k += 1
    rng.shuffle(town_objs)
    births = _sizes(rng, n_people, n_towns, 3, 8)
    people = []
    k = 0
    for t, sz in zip(town_objs, births):
        for _ in range(sz):
            people.append(Person(names[k], t.name, rng.randrange(1700, 1900), rng.choice(OCCUPATIONS),
                                 f"{rng.choice(MATERIALS)} {rng.choice(THINGS)}"))
            k += 1
    rng.shuffle(people)
    mentors = people[:n_mentors]
    students = _sizes(rng, n_people, n_mentors, 3, 8)
    order = list(range(n_people))
    rng.shuffle(order)
    k = 0
    for m, sz in zip(mentors, students):
        for _ in range(sz):
            p = people[order[k]]
            k += 1
            p.mentor = m.name
    for p in people:  # nobody studies under themself: swap with a neighbour's mentor
        if p.mentor == p.name:
            q = next(x for x in people if x.mentor != p.name and x.name != p.mentor and x is not p)
            p.mentor, q.mentor = q.mentor, p.mentor
    for t in town_objs:
        t.founder = rng.choice(people).name
    capitals = {}
    for reg in REGIONS:
        cands = sorted(t.name for t in town_objs if t.region == reg)
        capitals[reg] = rng.choice(cands)
    w = World(people, town_objs, rivers, capitals)
    w.by_name = {p.name: p for p in people}
    w.town_by_name = {t.name: t for t in town_objs}
    return w


def _uid(prefix: str, *parts) -> str:
    h = hashlib.sha1("|".join(map(str, parts)).encode()).hexdigest()[:10]
    return f"{prefix}-{h}"


def split_of(uid: str, test_fraction: float = 0.2) -> str:
    """Stable train/test assignment from the uid."""
    v = int(hashlib.sha1(uid.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if v < test_fraction else "train"


def corpus_rows(w: World) -> list[dict]:
    rows = []
    for i, p in enumerate(sorted(w.people, key=lambda x: x.name)):
        rows.append({"id": f"person-{i:03d}", "title": p.name,
                     "text": f"{p.name} was a {p.occupation} born in {p.town} in {p.year}. {p.name} invented "
                             f"the {p.invention} and studied under {p.mentor}."})
    for i, t in enumerate(sorted(w.towns, key=lambda x: x.name)):
        rows.append({"id": f"town-{i:03d}", "title": t.name,
                     "text": f"{t.name} is a town in the {t.region} region on the {t.river} river. {t.name} was "
                             f"founded in {t.founded} by {t.founder}."})
    for i, (r, reg) in enumerate(sorted(w.rivers.items())):
        rows.append({"id": f"river-{i:03d}", "title": f"{r} river",
                     "text": f"The {r} river flows through the {reg} region."})
    for i, reg in enumerate(REGIONS):
        rows.append({"id": f"region-{i:03d}", "title": f"{reg} region",
                     "text": f"The {reg} region has its capital at {w.capitals[reg]}."})
    return rows


def search_qa_rows(w: World, seed: int = 1234) -> list[dict]:
    rng = random.Random(seed + 1)
    rows = []

    def add(q, ans, src, atype, queries):
        uid = _uid("sqa", q)
        rows.append({"uid": uid, "question": q, "golden_answers": [ans], "data_source": src,
                     "answer_type": atype, "queries": queries})

    person_q = [
        ("Where was {p} born?", lambda p: p.town, "town"),
        ("When was {p} born?", lambda p: str(p.year), "year"),
        ("What did {p} invent?", lambda p: p.invention, "invention"),
        ("Who was the mentor of {p}?", lambda p: p.mentor, "person"),
        ("What was the occupation of {p}?", lambda p: p.occupation, "occupation"),
    ]
    town_q = [
        ("Which river flows through {t}?", lambda t: t.river, "river"),
        ("Who founded {t}?", lambda t: t.founder, "person"),
        ("In which region is {t}?", lambda t: t.region, "region"),
    ]
    for p in w.people:
        for tmpl, f, at in rng.sample(person_q, 2):
            add(tmpl.format(p=p.name), f(p), "fictional_1hop", at, [p.name])
    for t in w.towns:
        tmpl, f, at = rng.choice(town_q)
        add(tmpl.format(t=t.name), f(t), "fictional_1hop", at, [t.name])
    two_hop = [
        ("Which river flows through the town where {p} was born?",
         lambda p: w.town_by_name[p.town].river, "river", lambda p: [p.name, p.town]),
        ("What was the occupation of the mentor of {p}?",
         lambda p: w.by_name[p.mentor].occupation, "occupation", lambda p: [p.name, p.mentor]),
        ("Where was the mentor of {p} born?",
         lambda p: w.by_name[p.mentor].town, "town", lambda p: [p.name, p.mentor]),
        ("Who founded the town where {p} was born?",
         lambda p: w.town_by_name[p.town].founder, "person", lambda p: [p.name, p.town]),
    ]
    for p in rng.sample(w.people, 200):
        tmpl, f, at, qs = rng.choice(two_hop)
        add(tmpl.format(p=p.name), f(p), "fictional_2hop", at, qs(p))
    seen, out = set(), []
    for r in rows:
        if r["uid"] not in seen:
            seen.add(r["uid"])
            out.append(r)
    return out


def _person_aliases(p: Person) -> list[str]:
    return [p.name, f"{p.name} of {p.town}"]


def multi_answer_rows(w: World, seed: int = 1234) -> list[dict]:
    rows = []

    def add(q, answers, atype, queries):
        rows.append({"uid": _uid("maq", q), "question": q, "answers": answers, "data_source": "fictional_multi",
                     "answer_type": atype, "queries": queries})

    for t in sorted(w.towns, key=lambda x: x.name):
        natives = sorted((p for p in w.people if p.town == t.name), key=lambda p: p.name)
        add(f"Who was born in {t.name}?", [_person_aliases(p) for p in natives], "person",
            [f"born in {t.name}"] + [f"{t.name} {occ}" for occ in sorted({p.occupation for p in natives})])
        inv = sorted({p.invention for p in natives})
        if 3 <= len(inv) <= 8:
            add(f"What did people born in {t.name} invent?", [[x, f"the {x}"] for x in inv], "invention",
                [f"born in {t.name} invented"] + [f"{t.name} {occ}" for occ in sorted({p.occupation for p in natives})])
    rng = random.Random(seed + 4)
    towns = sorted(w.towns, key=lambda x: x.name)
    pairs = set()
    for _ in range(2000):
        if len(pairs) >= 60:
            break
        a, b = sorted(rng.sample(range(len(towns)), 2))
        nat = [p for p in w.people if p.town in (towns[a].name, towns[b].name)]
        if len(nat) <= 8 and (a, b) not in pairs:
            pairs.add((a, b))
            ta, tb = towns[a].name, towns[b].name
            nat.sort(key=lambda p: p.name)
            add(f"Who was born in {ta} or {tb}?", [_person_aliases(p) for p in nat], "person",
                [f"born in {ta}", f"born in {tb}"])
    for r in sorted(w.rivers):
        ts = sorted(t.name for t in w.towns if t.river == r)
        add(f"Which towns lie on the {r} river?", [[x, f"{x} town"] for x in ts], "town",
            [f"town on the {r} river", f"{r} river founded"])
    for m in sorted({p.mentor for p in w.people}):
        st = sorted((p for p in w.people if p.mentor == m), key=lambda p: p.name)
        add(f"Who studied under {m}?", [_person_aliases(p) for p in st], "person",
            [f"studied under {m}"] + [f"studied under {m} {occ}" for occ in sorted({p.occupation for p in st})])
    return rows


def code_math_rows(seed: int = 1234, n: int = 400) -> list[dict]:
    rng = random.Random(seed + 2)
    rows = []

    def num(lo_d, hi_d):
        d = rng.randint(lo_d, hi_d)
        return rng.randrange(10 ** (d - 1), 10**d)

    kinds = [
        lambda: (f"{(a := num(4, 6))} * {(b := num(4, 6))}", a * b),
        lambda: (f"{(a := num(4, 5))} * {(b := num(4, 5))} + {(c := num(4, 6))}", a * b + c),
        lambda: (f"{(a := num(4, 5))} * {(b := num(4, 5))} - {(c := num(4, 6))}", a * b - c),
        lambda: (f"({(a := num(4, 6))} + {(b := num(4, 6))}) * {(c := num(4, 5))}", (a + b) * c),
        lambda: (f"{(a := num(3, 4))} * {(b := num(3, 4))} * {(c := num(2, 3))}", a * b * c),
    ]
    seen = set()
    while len(rows) < n:
        expr, val = rng.choice(kinds)()
        if expr in seen:
            continue
        seen.add(expr)
        rows.append({"uid": _uid("math", expr), "prompt": f"What is {expr}?", "answer": str(val),
                     "data_source": "synthetic_arith", "expression": expr})
    return rows


def text_game_rows(seed: int = 1234, n: int = 300) -> list[dict]:
    from .text_game_worlds import generate_game

    rng = random.Random(seed + 3)
    rows = []
    for i in range(n):
        gseed = rng.randrange(2**31)
        n_rooms = rng.choice([2, 3, 3, 4])
        n_objects = rng.choice([2, 3, 4])
        g = generate_game(gseed, n_rooms=n_rooms, n_objects=n_objects)
        rows.append({"uid": _uid("game", gseed, n_rooms, n_objects), "seed": gseed, "n_rooms": n_rooms,
                     "n_objects": n_objects, "goal": g.goal_text, "data_source": "textgame"})
    return rows
