"""``result_format: json`` prints the search results as the released SPADER tool does: indent 2
(``json.dumps(api_response, indent=2)``), and its truncation budget counts the indented text exactly."""
from __future__ import annotations

import json

from rllib_spear.envs.retrieval import Passage, format_search_results


def P(i: int, n: int) -> Passage:
    return Passage(id=str(i), title=f"T{i}", text="x" * n)


def test_json_is_indented_by_two():
    out = format_search_results(["q"], [[P(1, 3)]], max_chars=None, fmt="json")
    assert out == (
        '[\n'
        '  {\n'
        '    "query": "q",\n'
        '    "documents": [\n'
        '      {\n'
        '        "title": "T1",\n'
        '        "contents": "xxx"\n'
        '      }\n'
        '    ]\n'
        '  }\n'
        ']'
    )


def test_json_budget_counts_the_indented_text():
    # one query, a 3-character document: the output above is 119 characters (11 lines: 2 + 4 + 18
    # + 19 + 8 + 23 + 26 + 8 + 6 + 4 + 1); a second hit adds "," + "\n" + its 4 indented lines
    # (8 + 23 + 26 + 7) = 66 -> 185.
    one = format_search_results(["q"], [[P(1, 3)]], max_chars=None, fmt="json")
    two = format_search_results(["q"], [[P(1, 3), P(2, 3)]], max_chars=None, fmt="json")
    assert (len(one), len(two)) == (119, 185)
    # the budget is exact: 185 characters keep both hits, 184 keep one (plus the note)
    assert format_search_results(["q"], [[P(1, 3), P(2, 3)]], max_chars=185, fmt="json") == two
    cut = format_search_results(["q"], [[P(1, 3), P(2, 3)]], max_chars=184, fmt="json")
    assert cut == one + "\nSystem Note: Retrieval results truncated at 184 characters."
    # several queries, round-robin by rank, never over budget
    docs = [[P(i, 300) for i in range(5)] for _ in range(3)]
    js = format_search_results(["q1", "q2", "q3"], docs, max_chars=2000, fmt="json")
    body = js.split("\nSystem Note")[0]
    assert len(body) <= 2000
    assert [len(r["documents"]) for r in json.loads(body)] == [2, 2, 1]
