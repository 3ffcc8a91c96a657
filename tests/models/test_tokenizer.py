"""The trained ChatML tokenizer and the assistant-token mask, token by token."""
from __future__ import annotations

import pytest

from rllib_spear.models.factory import conversation_texts, synthetic_conversations
from rllib_spear.models.tokenizer import assistant_token_mask, train_chat_tokenizer


@pytest.fixture(scope="module")
def tok():
    return train_chat_tokenizer(conversation_texts(synthetic_conversations(100, seed=0)), vocab_size=600)


def test_specials_and_template(tok):
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    msgs.append({"role": "assistant", "content": "yo"})
    assert tok.apply_chat_template(msgs, tokenize=False).endswith("<|im_start|>assistant\nyo<|im_end|>\n")
    # byte-level: anything round-trips, specials stay single tokens
    s = "Ünïcode ✓ 12345 <answer>x</answer><|im_end|>"
    ids = tok(s, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == s and ids[-1] == 2


def test_saved_tokenizer_tokenizes_identically(tiny_path, tiny_tokenizer):
    # transformers rebuilds qwen2 tokenizers as Qwen2Tokenizer; our pre-tokenization must survive it
    trained = train_chat_tokenizer(conversation_texts(synthetic_conversations(200, seed=0)), vocab_size=512)
    for s in ["In which city did Alba build the tower?", "  a\n\n<search>x 1999</search>", "naïve café"]:
        assert tiny_tokenizer(s)["input_ids"] == trained(s)["input_ids"]


def test_assistant_mask_token_by_token(tok):
    msgs = [
        {"role": "system", "content": "Answer."},
        {"role": "user", "content": "Where is Alba?"},
        {"role": "assistant", "content": "<search>Alba</search>"},
        {"role": "user", "content": "<information>Alba is in Quenth.</information>"},
        {"role": "assistant", "content": "<answer>Quenth</answer>"},
    ]
    ids, mask = assistant_token_mask(tok, msgs)
    assert len(ids) == len(mask)
    # the ids decode to exactly the template's rendering
    assert tok.decode(ids) == tok.apply_chat_template(msgs, tokenize=False)
    pieces = [tok.decode([i]) for i in ids]
    # walk the rendering and predict every token's mask from the character it starts at
    text = "".join(pieces)
    spans = []
    pos = 0
    for m in msgs:
        head = f"<|im_start|>{m['role']}\n"
        body = m["content"] + "<|im_end|>"
        start = pos + len(head)
        spans.append((start, start + len(body), m["role"] == "assistant"))
        pos = start + len(body) + 1  # trailing "\n"
    assert pos == len(text)
    c = 0
    for piece, k in zip(pieces, mask):
        inside = [a for (s, e, a) in spans if s <= c < e]
        expected = 1 if (inside and inside[0]) else 0
        assert k == expected, (piece, c)
        # no token straddles an assistant span boundary
        for s, e, a in spans:
            if a:
                assert not (c < s < c + len(piece)) and not (c < e < c + len(piece))
        c += len(piece)
    masked = tok.decode([i for i, k in zip(ids, mask) if k])
    assert masked == "<search>Alba</search><|im_end|><answer>Quenth</answer><|im_end|>"
    assert sum(1 for i, k in zip(ids, mask) if k and i == tok.eos_token_id) == 2
    # the assistant tokens are exactly what a rollout samples after the generation prompt
    prompt = tok.apply_chat_template(msgs[:2], add_generation_prompt=True, tokenize=False)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert ids[: len(p_ids)] == p_ids and mask[len(p_ids)] == 1 and mask[len(p_ids) - 1] == 0


def test_assistant_mask_leading_newline_content(tok):
    # content that starts with a newline must not merge with the header's newline
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\n\nhello"}]
    ids, mask = assistant_token_mask(tok, msgs)
    assert tok.decode([i for i, k in zip(ids, mask) if k]) == "\n\nhello<|im_end|>"
    assert tok.decode(ids) == tok.apply_chat_template(msgs, tokenize=False)


def test_no_assistant_means_no_mask(tok):
    ids, mask = assistant_token_mask(tok, [{"role": "user", "content": "q"}])
    assert ids and not any(mask)
