"""Each refusal the real engine (the default model) decides travels as data: the final
event the worker writes carries its code, the native field at fault and a message,
through the same code that writes finals to Redis, and the producer reads them back
from those fields."""

from __future__ import annotations

from typing import Any

import jinja2
import orjson
import pytest

from producer.refusals import refusal_of
from shared.models import FinalEvent, FinishReason, GenerationRequest
from shared.ops.publish import Final
from shared.refusal import Refusal, RefusalCode, RequestRefused
from tests.worker.engine.factories import make_request
from worker.admission import engine_request
from worker.engine import Engine, EngineRequest
from worker.engine.prompt_tokens import encode_chat
from worker.engine.request import LoraRef
from worker.engine_like import admission_error
from worker.held import Held
from worker.publisher import final_of, finish_of

CONTEXT = RefusalCode.CONTEXT_LENGTH_EXCEEDED
INVALID = RefusalCode.INVALID_VALUE


def on_the_wire(final: Final) -> FinalEvent:
    """The final event as Redis stores it (its JSON, as publish.lua splices it)."""
    return FinalEvent.model_validate_json(final.untimed_json)


def held_for(request_id: str) -> Held:
    return Held(request_id, "lease", GenerationRequest(model="m", prompt="x"))


def refused_at_admission(engine: Engine, req: EngineRequest) -> FinalEvent:
    """What the worker writes for a request ``engine`` will not take."""
    with pytest.raises(RequestRefused) as raised:
        engine.add_request(req)
    error, refusal = admission_error(req.request_id, raised.value)
    finish = finish_of(held_for(req.request_id), FinishReason.ERROR, error, None, 0, refusal)
    return on_the_wire(finish.event().final)  # type: ignore[arg-type]


def assert_refused(final: FinalEvent, code: RefusalCode, param: str, says: str) -> Refusal:
    assert final.finish_reason is FinishReason.ERROR
    refusal = final.refusal
    assert refusal is not None and (refusal.code, refusal.param) == (code, param)
    assert says in refusal.message and not refusal.message.startswith("request ")
    assert final.error == f"cannot run this request: {refusal.message}"  # for people
    shown = refusal_of(final)
    assert shown is not None and (shown.code, shown.param) == (code.value, param)
    return refusal


@pytest.mark.parametrize(
    ("fields", "code", "param", "says"),
    [
        ({"prompt_token_ids": [1] * 9000}, CONTEXT, "prompt", "9000 prompt tokens"),
        ({"max_tokens": 9000}, CONTEXT, "max_tokens", "max_tokens 9000 need 9002"),
        ({"logit_bias": {60000: 1.0}}, INVALID, "logit_bias", "token id 60000 is not in"),
        ({"stop_token_ids": [60000]}, INVALID, "stop_token_ids", "token id 60000 is not in"),
        ({"prompt_token_ids": []}, INVALID, "prompt", "no tokens"),
        ({"lora": LoraRef("a", "/nowhere")}, INVALID, "lora", "LoRA adapter"),
        ({"task": "embed", "prompt_token_ids": [1] * 9000}, CONTEXT, "prompt", "text to embed"),
        ({"task": "embed", "dimensions": 100_000}, INVALID, "dimensions", "100000 is more"),
    ],
)
def test_what_the_engine_refuses_at_admission_is_a_typed_final(
    engine: Engine, fields: dict[str, Any], code: RefusalCode, param: str, says: str
) -> None:
    prompt = fields.pop("prompt_token_ids", [1, 2])
    req = make_request(prompt, **fields)
    assert_refused(refused_at_admission(engine, req), code, param, says)


def test_a_grammar_that_cannot_compile_ends_with_a_typed_final(engine: Engine) -> None:
    req = make_request([1, 2], "bad-regex", guided_regex="(?<=a)b")
    [output] = engine.generate([req])["bad-regex"]
    final = final_of(held_for("bad-regex"), FinishReason.ERROR, output, error=output.error)
    refusal = on_the_wire(final).refusal
    assert refusal is not None and (refusal.code, refusal.param) == (INVALID, "guided_regex")
    assert "Lookbehind is not supported" in refusal.message
    again = refused_at_admission(engine, make_request([1, 2], guided_regex="(?<=a)b"))
    assert again.refusal is not None and again.refusal.param == "guided_regex"


class RefusingTemplate:
    """A tokenizer whose chat template raises, as a template's ``raise_exception`` does."""

    def apply_chat_template(self, *_: object, **__: object) -> str:
        raise jinja2.TemplateError("Conversation roles must alternate user/assistant")


def test_what_admission_refuses_names_its_field(engine: Engine) -> None:
    """The worker's own checks before the engine: token ids, the chat template."""
    outside = Held("ids", "lease", GenerationRequest(model="m", prompt_token_ids=[5, 60000]))
    with pytest.raises(RequestRefused) as raised:
        engine_request(engine, None, outside)  # type: ignore[arg-type]
    assert (raised.value.refusal.code, raised.value.refusal.param) == (INVALID, "prompt_token_ids")
    assert "prompt_token_ids[1] is 60000" in raised.value.refusal.message
    with pytest.raises(RequestRefused) as template:
        encode_chat(RefusingTemplate(), [{"role": "user", "content": "hi"}])
    assert (template.value.refusal.code, template.value.refusal.param) == (INVALID, "messages")


def test_a_final_without_a_refusal_is_written_as_before(engine: Engine) -> None:
    """No ``refusal`` key at all: a reader from before refusals reads it unchanged."""
    final = final_of(held_for("fine"), FinishReason.STOP)
    assert "refusal" not in orjson.loads(final.untimed_json)
    assert on_the_wire(final).refusal is None
