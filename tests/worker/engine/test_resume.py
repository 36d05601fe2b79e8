"""A request resumed at any token boundary emits exactly the text an uninterrupted
run emits: multi-byte characters split across tokens and held-back stop-string
prefixes included."""

from __future__ import annotations

import pytest

from worker.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from worker.engine.resume import resume_text_state

TEXTS = ["Café 😀 naïve — 東京タワー 🎉!", "Hello world, say HELLO and stop here please"]
STOPS = ("HELLO", "stop here")


@pytest.fixture(scope="module")
def tokenizer(model_path: str) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def _run(
    det: IncrementalDetokenizer, matcher: StopStringMatcher, ids: list[int]
) -> tuple[str, int]:
    """The text emitted, and how many tokens ran before a stop string ended it."""
    out = []
    for n, token_id in enumerate(ids, 1):
        text, stopped = matcher.add(det.add([token_id]))
        out.append(text)
        if stopped:
            return "".join(out), n
    return "".join(out) + matcher.flush(), len(ids)


@pytest.mark.parametrize("text", TEXTS)
def test_resuming_at_every_token_emits_the_same_text(tokenizer: object, text: str) -> None:
    prompt = tokenizer.encode("Say:")  # type: ignore[attr-defined]
    ids = tokenizer.encode(text)  # type: ignore[attr-defined]
    whole, num_run = _run(IncrementalDetokenizer(tokenizer, prompt), StopStringMatcher(STOPS), ids)  # type: ignore[arg-type]
    for k in range(1, num_run):  # a worker can die after any token before the stop
        det, matcher = IncrementalDetokenizer(tokenizer, prompt), StopStringMatcher(STOPS)  # type: ignore[arg-type]
        emitted = "".join(matcher.add(det.add([t]))[0] for t in ids[:k])
        det2, matcher2 = resume_text_state(tokenizer, prompt, ids[:k], emitted, STOPS)  # type: ignore[arg-type]
        rest, num_more = _run(det2, matcher2, ids[k:])
        assert (emitted + rest, k + num_more) == (whole, num_run), f"resumed after token {k}"
