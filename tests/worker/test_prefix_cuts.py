"""Where a request's fingerprints fall in its tokens (worker/prefix_cuts.py): each cut
rendered alone, kept as far as it agrees with the whole prompt."""

from __future__ import annotations

from typing import Any

from shared.models import GenerationRequest
from shared.prefixes import fingerprints
from worker.prefix_cuts import PrefixCuts


class CharEncoder:
    """One token per character; a chat renders as '<role>:content|' per message, then
    'assistant:' (a generation prompt)."""

    def __init__(self) -> None:
        self.num_renders = 0

    def encode_prompt(self, prompt: str) -> list[int]:
        self.num_renders += 1
        return [ord(c) for c in prompt]

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        rendered = "".join(f"<{m['role']}>:{m['content']}|" for m in messages) + "assistant:"
        return self.encode_prompt(rendered)


def chat(question: str) -> GenerationRequest:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": question}]
    return GenerationRequest(model="m", messages=messages)


def test_each_cut_maps_to_the_tokens_it_shares_with_the_prompt() -> None:
    encoder = CharEncoder()
    cuts = PrefixCuts(encoder)
    req = chat("why?")
    ids = encoder.encode_chat([m.template_view() for m in req.messages or ()])
    system_len = len("<system>:be brief|")
    # The system prompt rendered alone agrees up to its end (then 'assistant' vs '<user>').
    assert cuts.of(req, ids, b"") == tuple(
        zip(fingerprints(req, b""), [system_len, len(ids)], strict=True)
    )


def test_a_shared_cut_is_rendered_once() -> None:
    encoder = CharEncoder()
    cuts = PrefixCuts(encoder)
    for question in ("a", "b", "c"):
        req = chat(question)
        cuts.of(req, encoder.encode_chat([m.template_view() for m in req.messages or ()]), b"")
    assert encoder.num_renders == 3 + 1 + 3  # the prompts, the system prompt once, each whole


def test_a_plain_prompts_spans() -> None:
    encoder = CharEncoder()
    prompt = "p" * 1100
    req = GenerationRequest(model="m", prompt=prompt)
    assert [n for _, n in PrefixCuts(encoder).of(req, encoder.encode_prompt(prompt), b"")] == [
        512,
        1024,
    ]
