"""Agent programs of the tests, importable as "agent_programs:<name>" (a program given by import path)."""
from __future__ import annotations

import asyncio
import time

CALC = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                          "parameters": {"type": "object",
                                                         "properties": {"expression": {"type": "string"}}}}}]


def chat_twice(task, client):
    """A plain chat loop of two calls; reward 1."""
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(2):
        r = client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
        messages += [r.choices[0].message, {"role": "user", "content": "go on"}]
    return 1.0


async def achat_twice(task, client):
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(2):
        r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
        messages += [r.choices[0].message, {"role": "user", "content": "go on"}]
    return 0.5


def misbehaving(task, client):
    """Calls once, then does what ``task["mode"]`` says: raise, hang, return a non-number."""
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
    mode = task.get("mode")
    if mode == "raise":
        raise RuntimeError("the agent's tool crashed")
    if mode == "hang":
        time.sleep(60)
    if mode == "text":
        return "done"
    return 1.0


async def amisbehaving(task, client):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
    mode = task.get("mode")
    if mode == "raise":
        raise RuntimeError("the agent's tool crashed")
    if mode == "hang":
        await asyncio.sleep(60)
    return 1.0


def rewrites_history(task, client):
    """Two calls whose second prompt does not extend the first (a summarising agent)."""
    r = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
    summary = f"Summary: {r.choices[0].message.content[:10]}"
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": summary}])
    return 0.0


def uses_calculator(task, client):
    """Offers the calculator; runs every call the model makes and returns the result to it."""
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(2):
        r = client.chat.completions.create(model="policy", messages=messages, tools=CALC)
        msg = r.choices[0].message
        messages.append(msg)
        if not msg.tool_calls:
            break
        for call in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
    return 1.0


def passes_temperature(task, client):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}], temperature=1.0)
    return 1.0
