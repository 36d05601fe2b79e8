"""Prefix fingerprints (shared/prefixes.py): chained, so two requests share one only if
they share everything up to its cut; the adapter and tools seed the chain."""

from __future__ import annotations

from typing import Any

from shared.models import GenerationRequest
from shared.prefixes import CHAR_CUTS, MAX_CUTS, TOKEN_CUTS, cuts, fingerprints

NO_SALT = b""  # a request of the common cache (shared.cache_scope)


def chat(*contents: str, **kwargs: Any) -> GenerationRequest:
    roles = ["system", *(["user", "assistant"] * len(contents))]
    messages = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=False)]
    return GenerationRequest(model="m", messages=messages, **kwargs)


def test_a_chat_is_cut_after_its_system_prompt_and_its_last_messages() -> None:
    short = fingerprints(chat("sys", "q1"), NO_SALT)
    other = fingerprints(chat("sys", "q2"), NO_SALT)
    assert len(short) == 2 and short[0] == other[0] and short[1] != other[1]
    turns = [f"turn {i}" for i in range(9)]
    long_cuts = cuts(chat("sys", *turns), NO_SALT)
    assert [c.num_messages for c in long_cuts] == [1, 8, 9, 10]
    assert len(long_cuts) == MAX_CUTS
    # The next turn starts with this conversation: it shares its longest fingerprint.
    next_turn = cuts(chat("sys", *turns, "more", "again"), NO_SALT)
    assert long_cuts[-1].fingerprint in {c.fingerprint for c in next_turn}


def test_the_adapter_and_tools_seed_the_chain() -> None:
    base = fingerprints(chat("sys", "q"), NO_SALT)
    assert fingerprints(chat("sys", "q", lora="poet"), NO_SALT)[0] != base[0]
    tool = {"name": "f", "parameters": {"type": "object", "properties": {}}}
    assert fingerprints(chat("sys", "q", tools=[tool]), NO_SALT)[0] != base[0]
    assert fingerprints(chat("sys", "q"), NO_SALT)[0] == base[0]  # deterministic


def test_plain_prompts_and_token_ids_are_cut_at_doubling_spans() -> None:
    text = "x" * 1500
    assert [c.num_chars for c in cuts(GenerationRequest(model="m", prompt=text), NO_SALT)] == [
        512,
        1024,
    ]
    longer = fingerprints(GenerationRequest(model="m", prompt=text + "y" * 3000), NO_SALT)
    assert longer[:2] == fingerprints(GenerationRequest(model="m", prompt=text), NO_SALT)
    assert len(longer) == MAX_CUTS and CHAR_CUTS[-1] <= 4500
    ids = GenerationRequest(model="m", prompt_token_ids=list(range(600)))
    assert [c.num_token_ids for c in cuts(ids, NO_SALT)] == [t for t in TOKEN_CUTS if t <= 600]
    assert fingerprints(GenerationRequest(model="m", prompt="short"), NO_SALT) == []


def test_an_embed_request_has_none() -> None:
    req = GenerationRequest(model="m", prompt="x" * 2000, task="embed")
    assert fingerprints(req, NO_SALT) == []
