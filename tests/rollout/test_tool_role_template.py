"""``observation_template: "chat_template"``: a tool observation rendered as a ``tool`` role message
by the tokenizer's own chat template (rllib_spear/env_runners/rollout.py), checked on a
hand-written Qwen2.5-style template, and the env's tool schemas reaching the prompt."""
from __future__ import annotations

import json

import pytest

from rllib_spear.env_runners.engines.base import GenerationEngine, GenerationOutput, SamplingConfig
from rllib_spear.env_runners.rollout import MultiTurnRollout, ObservationTemplate, RolloutConfig
from rllib_spear.models.tokenizer import CHATML_TEMPLATE, train_chat_tokenizer

# The structure of Qwen2.5-Instruct's template (written for this test): a default system message,
# the tools block inside it when tools are given, consecutive tool messages grouped into one user
# turn of <tool_response> blocks.
QWEN25_STYLE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or message.role == 'assistant' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def tok():
    t = train_chat_tokenizer(["print(2 + 2) tool_call code_interpreter answer boxed"] * 4, vocab_size=300)
    t.chat_template = QWEN25_STYLE
    return t


def test_tool_message_pieces_on_a_qwen25_template(tok):
    t = ObservationTemplate.named("chat_template", tok)
    assert t.prefix == "\n<|im_start|>user\n<tool_response>\n"
    assert t.suffix == "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert t.render("4") == "\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_plain_chatml_tool_role(tok):
    plain = train_chat_tokenizer(["x y"] * 2, vocab_size=300)
    assert plain.chat_template == CHATML_TEMPLATE
    t = ObservationTemplate.named("chat_template", plain)
    assert (t.prefix, t.suffix) == ("\n<|im_start|>tool\n", "<|im_end|>\n<|im_start|>assistant\n")


def test_unusable_templates_are_named(tok):
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        ObservationTemplate.named("chat_template", None)
    odd = train_chat_tokenizer(["x y"] * 2, vocab_size=300)
    odd.eos_token = "<|endoftext|>"  # the template closes turns with <|im_end|>
    with pytest.raises(ValueError, match="does not start with the eos token"):
        ObservationTemplate.named("chat_template", odd)
    with pytest.raises(ValueError, match="'chatml', 'llama3' or 'chat_template'"):
        ObservationTemplate.named("chat-template", tok)


class ScriptedEngine(GenerationEngine):
    """Answers turn k of every prompt with ``replies[k]`` + eos (log-prob 0)."""

    def __init__(self, tok, replies):
        self.turns = [tok.encode(r, add_special_tokens=False) + [tok.eos_token_id] for r in replies]
        self.calls = 0

    def generate(self, prompts, sampling, max_new_tokens=None):
        ids = self.turns[self.calls]
        self.calls += 1
        return [GenerationOutput(list(ids), [0.0] * len(ids), "stop") for _ in prompts]

    def update_weights(self, state_dict, version):
        self.version = version


def test_retool_episode_tokens_equal_the_chat_template_rendering(tok):
    from rllib_spear.envs import make_env

    call = '<tool_call>' + json.dumps({"name": "code_interpreter", "arguments": {"code": "print(2 + 2)"}}) + "</tool_call>"
    answer = "The answer is \\boxed{4}"
    task = {"uid": "t", "prompt": "What is 2+2?", "answer": "4"}
    engine = ScriptedEngine(tok, [call, answer])
    env_factory = lambda: make_env("code_math", tool_format="retool")  # noqa: E731
    rollout = MultiTurnRollout(engine, tok, env_factory, SamplingConfig(max_new_tokens=64),
                               RolloutConfig(max_turns=4, max_model_len=4096, max_response_tokens=2048,
                                             max_observation_tokens=512, observation_template="chat_template"))
    (traj,), _ = rollout.run([task], 1)
    assert traj.outcome_reward == 1.0 and traj.stats.tool_calls == 1
    env = env_factory()
    conversation = [*env.reset(task), {"role": "assistant", "content": call}, {"role": "tool", "content": "4"},
                    {"role": "assistant", "content": answer}]
    want = tok.apply_chat_template(conversation, tools=env.tool_schemas, tokenize=False)
    assert want.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                           "\n\n# Tools\n\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"code_interpreter\"")
    assert "<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in want
    # every token of the episode: prompt with the tools block, the sampled turns, the tool message
    assert tok.decode(traj.input_ids()) == want[: -len("\n")]  # the last <|im_end|> is sampled, its \n is not
    assert [s.kind for s in traj.segments] == ["prompt", "assistant", "observation", "assistant"]
