"""Incremental text equals a full decode; stop strings cut and hold back text."""

from __future__ import annotations

import random
from typing import Any

import pytest

from worker.engine.detokenizer import (
    IncrementalDetokenizer,
    StopStringMatcher,
    TokenNames,
    TokenTexts,
)

TEXTS = [
    "Party time 🎉🎉 with family 👨‍👩‍👧‍👦 and 🇯🇵 flags!",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
    "Crème brûlée, naïve façade, São Paulo, Ångström, ﬁnal œuvre.",
    "mixed: café ☕ 中文 😀 ok",
]


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_text_equals_a_full_decode(tokenizer: Any, text: str) -> None:
    prompt = tokenizer.encode("Say something:")
    ids = tokenizer.encode(text)
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detokenizer.add([token_id]) for token_id in ids]
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("text", TEXTS)
def test_logprob_names_are_each_tokens_text_and_their_bytes_join_to_the_text(
    tokenizer: Any, text: str
) -> None:
    """A token that holds part of a character is named by its own bytes, which join
    with its neighbours' into the text, as OpenAI's ``bytes`` do."""
    names = TokenNames(tokenizer)
    ids = tokenizer.encode(text)
    joined = b""
    for token_id in ids:
        token, raw = names[token_id]
        assert token == tokenizer.decode([token_id], skip_special_tokens=False)
        assert (raw is None) == ("\ufffd" not in token)
        joined += token.encode() if raw is None else bytes(raw)
    assert joined.decode() == tokenizer.decode(ids)
    assert any(names[i][1] for i in ids)  # the text has characters split over tokens


def test_a_special_token_is_named_by_its_own_text(tokenizer: Any) -> None:
    assert TokenNames(tokenizer)[tokenizer.eos_token_id] == (tokenizer.eos_token, None)


def test_several_tokens_at_once(tokenizer: Any) -> None:
    ids = tokenizer.encode(TEXTS[0])
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    deltas = [detokenizer.add(ids[i : i + 3]) for i in range(0, len(ids), 3)]
    assert "".join(deltas) == tokenizer.decode(ids)


def test_joined_token_texts_equal_the_decoders_text(tokenizer: Any) -> None:
    texts = TokenTexts.of(tokenizer)
    assert texts.concatenative  # the default model's decoder is byte-level
    rng = random.Random(0)
    vocab = tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=True)
    specials = tokenizer.all_special_ids
    windows = [[rng.randrange(vocab) for _ in range(rng.randint(1, 4))] for _ in range(3000)]
    windows += [[rng.choice(specials), rng.randrange(vocab)] for _ in range(100)]
    windows += [tokenizer.encode(text)[i : i + 2] for text in TEXTS for i in range(8)]
    for window in windows:
        assert texts.decode(window) == tokenizer.decode(window, skip_special_tokens=True)


def test_special_tokens_give_no_text(tokenizer: Any) -> None:
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    assert detokenizer.add(tokenizer.encode("Hi")) == "Hi"
    assert detokenizer.add([tokenizer.eos_token_id]) == ""


def feed(matcher: StopStringMatcher, pieces: list[str]) -> tuple[list[str], bool]:
    emitted = []
    for piece in pieces:
        text, stopped = matcher.add(piece)
        emitted.append(text)
        if stopped:
            return emitted, True
    return emitted, False


def test_stop_string_spanning_pieces_is_cut_and_never_emitted() -> None:
    emitted, stopped = feed(StopStringMatcher(("STOP!",)), ["Hello S", "TO", "P! more"])
    assert stopped
    assert emitted == ["Hello ", "", ""]


def test_text_that_may_start_a_stop_string_is_held_back_then_released() -> None:
    matcher = StopStringMatcher(("<end>",))
    emitted, stopped = feed(matcher, ["a <e", "n", "x b"])
    assert not stopped
    assert emitted == ["a ", "", "<enx b"]


def test_flush_releases_held_back_text_at_the_end() -> None:
    matcher = StopStringMatcher(("###",))
    assert matcher.add("done #") == ("done ", False)
    assert matcher.flush() == "#"


def test_earliest_of_several_stop_strings_wins() -> None:
    matcher = StopStringMatcher(("world", "lo w"))
    assert matcher.matched is None
    assert matcher.add("hello world") == ("hel", True)
    assert matcher.matched == "lo w"  # the final event names it (Anthropic's stop_sequence)


def test_stop_strings_are_ignored_while_not_allowed() -> None:
    matcher = StopStringMatcher(("x",))
    assert matcher.add("axb", can_stop=False) == ("axb", False)
    assert matcher.add("cxd") == ("c", True)
