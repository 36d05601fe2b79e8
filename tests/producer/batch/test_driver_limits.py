"""A batch line over its model's registered limits is refused at fan-out, as every
submit path refuses it: an error line with the refusal's code, and nothing queued."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from producer.batch import driver, store
from producer.batch.ops import Batches
from shared.keys import model_tag
from shared.limits import ModelLimits
from shared.registry import LIMITS_FIELD, register_worker
from tests.producer.batch.conftest import MODEL

LIMITS = ModelLimits(vocab_size=1000, max_model_len=64)


def test_a_line_over_the_limits_is_an_error_line_and_never_queued(
    make_batches: Callable[..., Batches],
) -> None:
    batches = make_batches()
    ctx = batches.ctx
    pipe = ctx.redis.pipeline(transaction=False)
    fields = {"model": MODEL, LIMITS_FIELD: LIMITS.model_dump_json()}
    register_worker(pipe, ctx.keys, ctx.settings, "w-registered", fields)
    pipe.execute()
    messages = [{"role": "user", "content": "hi"}]
    lines = [
        {"custom_id": "long", "body": {"model": MODEL, "messages": messages, "max_tokens": 64}},
        {"custom_id": "fits", "body": {"model": MODEL, "messages": messages, "max_tokens": 3}},
    ]
    batch_id = batches.submit(lines)
    assert driver.fan_out(ctx, batch_id, store.meta(ctx, batch_id)) == 2
    assert ctx.redis.zcard(ctx.keys.queue(model_tag(MODEL))) == 1  # only "fits"
    (error,) = (orjson.loads(e) for e in ctx.redis.hvals(ctx.bkeys.errors(batch_id)))
    assert error["custom_id"] == "long"
    assert error["error"]["code"] == "context_length_exceeded"
    assert "sampling.max_tokens: 64 is past the model's context of 64" in error["error"]["message"]
