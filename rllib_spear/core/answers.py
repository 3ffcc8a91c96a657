"""Answer normalisation and answer-set metrics (exact match, token F1, alias-aware set P/R/F1).

Pure Python. Shared by the environments (rewards) and by SPADER's diversity reward, so that
"found in a tool response" and "answered correctly" use one definition of string equality.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable, Sequence

__all__ = [
    "normalize_answer",
    "exact_match",
    "token_f1",
    "dedupe_gold_entities",
    "set_precision_recall_f1",
]

# Quote variants that tokenizers and web text produce; unified before punctuation is stripped so
# "O’Brien" and "O'Brien" normalise to the same string.
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "`": "'"})
# string.punctuation misses the typographic dashes; the released SPADER metrics strip them too.
_PUNCT = set(string.punctuation) | {"\u2014", "\u2013", "\u2010"}
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Normalise an answer string: lowercase, unify quotes, drop punctuation (incl. the dashes
    U+2014, U+2013, U+2010), drop the articles a/an/the, collapse whitespace.

    ``normalize_answer("The  O’Brien—Smith!") == "obriensmith"``; ``normalize_answer(None) == ""``
    (a missing answer is empty, as in the official metric code, never the string "none").
    """
    if text is None:
        return ""
    if not isinstance(text, str):
        text = str(text)
    s = text.lower().translate(_QUOTES)
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, golds: Iterable[str]) -> float:
    """EM = 1 if normalize(prediction) equals normalize(g) for some gold g, else 0."""
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def token_f1(prediction: str, golds: Iterable[str]) -> float:
    """Max over golds of the SQuAD token F1: with c = |tokens(p) ∩ tokens(g)| (multiset),
    P = c/|p|, R = c/|g|, F1 = 2PR/(P+R); 0 when c = 0."""
    p_toks = normalize_answer(prediction).split()
    best = 0.0
    for g in golds:
        g_toks = normalize_answer(g).split()
        common = sum((Counter(p_toks) & Counter(g_toks)).values())
        if common == 0:
            continue
        prec, rec = common / len(p_toks), common / len(g_toks)
        best = max(best, 2 * prec * rec / (prec + rec))
    return best


def dedupe_gold_entities(gold: Sequence[Sequence[str] | str]) -> list[frozenset[str]]:
    """Gold entities as sets of normalised aliases.

    Each entity is a string or a list of aliases. Aliases normalising to "" are dropped, entities
    left with no alias are dropped, and entities with the same normalised alias set are merged
    (first occurrence kept), as the released SPADER metrics do.
    """
    out: list[frozenset[str]] = []
    seen: set[frozenset[str]] = set()
    for ent in gold:
        aliases = [ent] if isinstance(ent, str) else list(ent)
        norm = frozenset(a for a in (normalize_answer(x) for x in aliases) if a)
        if norm and norm not in seen:
            seen.add(norm)
            out.append(norm)
    return out


def set_precision_recall_f1(
    predictions: Sequence[str], gold: Sequence[Sequence[str] | str]
) -> tuple[float, float, float]:
    """Alias-aware set metrics for multi-answer QA.

    With E the deduplicated gold entities (alias sets) and P the distinct normalised non-empty
    predictions:
      recall    = |{e in E : some alias of e in P}| / |E|
      precision = |{p in P : p equals some alias of some e}| / |P|
      F1        = 2·prec·rec / (prec + rec)   (0 if both are 0)
    Empty gold or empty predictions give (0, 0, 0).
    """
    entities = dedupe_gold_entities(gold)
    preds = {p for p in (normalize_answer(x) for x in predictions) if p}
    if not entities or not preds:
        return 0.0, 0.0, 0.0
    all_aliases = set().union(*entities)
    recall = sum(1 for e in entities if e & preds) / len(entities)
    precision = sum(1 for p in preds if p in all_aliases) / len(preds)
    f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    return precision, recall, f1
