"""Text state for a request resumed on another worker.

The earlier worker emitted text for the tokens it published, but may have held
some back: the start of a multi-byte character not yet complete, or text that
could still become a stop string. Replaying its output tokens through a fresh
detokenizer and stop matcher rebuilds exactly the state it had; what the stream
already carried (``emitted_text``) is marked emitted, and the rest stays held
back, to be emitted or cut by the next tokens, as it would have been.
"""

from __future__ import annotations

from worker.engine.detokenizer import (
    IncrementalDetokenizer,
    StopStringMatcher,
    Tokenizer,
    TokenTexts,
)


def resume_text_state(
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    output_ids: list[int],
    emitted_text: str | None,
    stop: tuple[str, ...],
    texts: TokenTexts | None = None,
) -> tuple[IncrementalDetokenizer, StopStringMatcher]:
    """A detokenizer (sharing ``texts``) and stop matcher as they stood after
    ``output_ids``; with ``emitted_text`` None, everything decoded so far counts as
    emitted."""
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, texts)
    matcher = StopStringMatcher(stop)
    matcher.text = "".join(detokenizer.add([token_id]) for token_id in output_ids)
    emitted = len(matcher.text) if emitted_text is None else len(emitted_text)
    if not matcher.text.startswith(emitted_text or ""):
        emitted = len(matcher.text)  # a different tokenizer or text: never repeat text
    matcher.num_emitted_chars = emitted
    return detokenizer, matcher
