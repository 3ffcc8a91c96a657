"""A small project-trained tokenizer with a ChatML chat template, and assistant-token masks.

The embedded default policy cannot download a tokenizer, so it trains a byte-level BPE on the
texts of its own tasks (``train_chat_tokenizer``). ``assistant_token_mask`` turns a conversation
into token ids plus a 0/1 mask that is 1 exactly on the assistant content and its end-of-turn
token, tokenizing the chat template piece by piece so that the assistant tokens are the same ids
the engine would sample after the generation prompt.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

__all__ = [
    "SPECIAL_TOKENS",
    "CHATML_TEMPLATE",
    "train_chat_tokenizer",
    "assistant_token_mask",
]

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

#: ChatML: ``<|im_start|>{role}\n{content}<|im_end|>\n`` per message; the generation prompt is
#: ``<|im_start|>assistant\n``. Roles are free-form (system, user, assistant, tool, ...).
CHATML_TEMPLATE = (
    r"{%- for message in messages -%}"
    r"{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    r"{{ '<|im_start|>assistant\n' }}"
    "{%- endif -%}"
)


def train_chat_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 1024,
    *,
    min_frequency: int = 2,
):
    """Train a ByteLevel BPE on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``.

    Specials: ``<|endoftext|>`` (id 0, pad), ``<|im_start|>`` (1), ``<|im_end|>`` (2, eos).
    The 256 byte symbols are always in the vocabulary, so any text round-trips.
    Deterministic for the same texts (the ``tokenizers`` BPE trainer is).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(texts)
    if not texts:
        raise ValueError("train_chat_tokenizer needs at least one text")
    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must be > {256 + len(SPECIAL_TOKENS)}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    # The Qwen2 pre-tokenization (single digits, NFC): transformers 5 rebuilds any tokenizer saved
    # next to a qwen2 config as a Qwen2Tokenizer with exactly this pipeline, so training with it
    # keeps the tokenization identical whichever class loads the folder (HF, vLLM, qwen2, llama).
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        bos_token=None,
        unk_token=None,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.padding_side = "left"
    return fast


def _render(tokenizer, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
    if not messages and not add_generation_prompt:
        return ""
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _encode(tokenizer, text: str) -> list[int]:
    if not text:
        return []
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def assistant_token_mask(
    tokenizer, messages: Sequence[Mapping[str, str]]
) -> tuple[list[int], list[int]]:
    """Token ids of the chat-templated conversation and a 0/1 mask over them.

    The mask is 1 exactly on the tokens of each assistant message's content and the
    end-of-turn token (``tokenizer.eos_token``) that closes it; everything else (system/user/tool
    turns, role headers, the newline after the end-of-turn token) is 0.

    Pieces are tokenized separately: the text before each assistant turn *including* its
    generation prompt (``<|im_start|>assistant\\n``), then the assistant content and its
    end-of-turn token. That is how a rollout builds the sequence (prompt tokenized, completion
    sampled), so SFT and RL see the same assistant token ids. Works for any chat template whose
    rendering of a prefix of the conversation is a prefix of the full rendering (ChatML, SmolLM2);
    raises ``ValueError`` otherwise.
    """
    eos = tokenizer.eos_token
    if eos is None:
        raise ValueError("assistant_token_mask needs a tokenizer with an eos_token (end of turn)")
    ids: list[int] = []
    mask: list[int] = []
    done = ""  # text already tokenized
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        head = _render(tokenizer, messages[:i], add_generation_prompt=True)
        if not head.startswith(done):
            raise ValueError("chat template is not prefix-stable; cannot build an assistant mask")
        piece = _encode(tokenizer, head[len(done):])
        ids += piece
        mask += [0] * len(piece)
        full = _render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not full.startswith(head):
            raise ValueError("chat template is not prefix-stable; cannot build an assistant mask")
        body = full[len(head):]
        content = msg["content"]
        start = len(content) if body.startswith(content) else 0
        end = body.find(eos, start)
        if end < 0:
            raise ValueError(f"assistant turn {i} is not closed by eos {eos!r} in the template")
        end += len(eos)
        piece = _encode(tokenizer, body[:end])
        ids += piece
        mask += [1] * len(piece)
        done = head + body[:end]
    full = _render(tokenizer, messages, add_generation_prompt=False)
    if not full.startswith(done):
        raise ValueError("chat template is not prefix-stable; cannot build an assistant mask")
    piece = _encode(tokenizer, full[len(done):])
    ids += piece
    mask += [0] * len(piece)
    return ids, mask
