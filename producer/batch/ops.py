"""The batch operations behind ``tokenq batch`` and the gateway: submit, status, cancel,
results, resume."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
import redis

from producer.batch import chain, driver, store, webhooks
from producer.batch.bodies import URL_KINDS, parse_jsonl
from producer.batch.context import Context, batch_redis
from producer.batch.lines import BatchInputError, BatchLine
from producer.batch.models import BatchState, BatchStatus
from producer.batch.store import Results
from producer.client import Client
from producer.paging import Page
from shared.chat import read_chat_features
from shared.errors import InvalidParam, InvalidRequest, TokenqError
from shared.priority import parse_priority
from shared.settings import Settings

TICK_FUNC = "producer.batch.jobs.advance_batch"
Source = str | bytes | Path | Iterable[Mapping[str, Any]]


class BatchEnded(TokenqError):
    """The batch has already ended, so it cannot be resumed."""


def batch_chain(ctx: Context, batch_id: str) -> chain.Chain:
    return chain.Chain(ctx.bkeys.meta(batch_id), TICK_FUNC, (batch_id,), batch_id)


class Batches:
    """Batches on the Redis that ``client`` talks to (``Batches(Client())``)."""

    def __init__(self, client: Client, settings: Settings | None = None) -> None:
        s = settings or client.settings
        self.ctx = Context(batch_redis(s, client.redis), s, client.redis)

    def submit(
        self,
        source: Source,
        *,
        priority: int | str = "low",
        model: str | None = None,
        webhook_url: str | None = None,
        tenant: str | None = None,
        endpoint: str | None = None,
        details: Mapping[str, str] | None = None,
    ) -> str:
        """Create a batch from JSONL (text, bytes, a path) or line dicts; returns its id.
        Raises BatchInputError listing the lines it cannot tell apart (not JSON, no or a
        repeated custom_id, an unknown url); nothing is queued then. A line whose body
        the live route would refuse gets that 400 as its error line, and the others run.
        Its lines run as ``tenant``'s requests, whatever their own metadata says. With an
        ``endpoint`` (OpenAI's), every line must call it. ``details`` are kept with it
        (OpenAI's input_file_id, metadata)."""
        ctx = self.ctx
        lines = parse_jsonl(
            _jsonl(source),
            ctx.settings,
            model=model,
            max_lines=ctx.settings.max_batch_lines,
            features=lambda name: read_chat_features(ctx.main, ctx.keys, name),
        )
        kept = {**(details or {}), "endpoint": _endpoint(lines, endpoint)}
        if webhook_url is not None:
            webhooks.check_url(webhook_url)
            webhooks.require_secret(ctx)
        with ctx.redis.pipeline(transaction=True) as pipe:
            pipe.multi()
            batch_id = store.create(
                ctx, pipe, lines, _priority(priority), webhook_url, tenant, kept
            )
            chain.start(ctx, batch_chain(ctx, batch_id), pipe)
            pipe.execute()
        return batch_id

    # With a ``scope`` (a tenant), another tenant's batch is NotFound, as a gone one is.
    def status(self, batch_id: str, scope: str | None = None) -> BatchStatus:
        return store.status(self.ctx, batch_id, scope)

    def list(self, limit: int = 50, scope: str | None = None) -> list[BatchStatus]:
        return store.list_batches(self.ctx, limit, scope)

    def page(
        self, limit: int, scope: str | None = None, after: str | None = None
    ) -> Page[BatchStatus]:
        """Newest first, from the batch after ``after``."""
        return store.page_batches(self.ctx, limit=limit, scope=scope, after=after)

    def cancel(self, batch_id: str, scope: str | None = None) -> BatchStatus:
        """Stop the batch: queued lines are removed at once, running ones stop within a
        step; lines done so far keep their results. A batch that has ended is left as is."""
        if self._mark_cancelling(batch_id, scope):
            driver.cancel_pending(self.ctx, batch_id)
        return self.status(batch_id)

    def results(self, batch_id: str, scope: str | None = None) -> Results:
        """(output JSONL lines, error JSONL lines), each in input order."""
        return store.results(self.ctx, batch_id, scope)

    def resume(self, batch_id: str) -> str:
        """Start a new driver job for a batch whose jobs were lost; returns its job id."""
        if self.status(batch_id).state.terminal:
            raise BatchEnded(f"batch {batch_id} has already ended; nothing to resume")
        return chain.start(self.ctx, batch_chain(self.ctx, batch_id))

    def _mark_cancelling(self, batch_id: str, scope: str | None) -> bool:
        key = self.ctx.bkeys.meta(batch_id)
        with self.ctx.redis.pipeline(transaction=True) as pipe:
            for _ in range(chain.MAX_WATCH_TRIES):
                try:
                    pipe.watch(key)  # type: ignore[no-untyped-call]
                    if store.meta(self.ctx, batch_id, scope)["state"] != BatchState.IN_PROGRESS:
                        return False
                    pipe.multi()
                    pipe.hset(key, "state", BatchState.CANCELLING.value)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue
        raise TokenqError(f"batch {batch_id} kept changing; try the cancel again")


def _jsonl(source: Source) -> str | bytes:
    if isinstance(source, Path):
        try:
            return source.read_bytes()
        except OSError as e:
            raise BatchInputError([f"cannot read {source}: {e.strerror}"]) from e
    if isinstance(source, str | bytes):
        return source
    encoded, problems = [], []
    for number, line in enumerate(source, 1):
        try:
            encoded.append(orjson.dumps(dict(line)))
        except TypeError as e:  # orjson's JSONEncodeError: a value JSON cannot carry
            problems.append(f"line {number}: {e}")
    if problems:
        raise BatchInputError(problems)
    return b"\n".join(encoded)


def _endpoint(lines: list[BatchLine], endpoint: str | None) -> str:
    """The batch's endpoint: the one given, which every line must call, or the one its
    lines share ("mixed" when they call several)."""
    urls = {kind: url for url, kind in URL_KINDS.items()}
    if endpoint is None:
        kinds = {line.kind for line in lines}
        return urls[kinds.pop()] if len(kinds) == 1 else "mixed"
    if endpoint not in URL_KINDS:
        raise InvalidParam("endpoint", f"{endpoint!r} is not one of {', '.join(URL_KINDS)}")
    want = URL_KINDS[endpoint]
    problems = [
        f"custom_id {line.custom_id!r}: its url is {urls[line.kind]}, not the batch's "
        f"endpoint {endpoint}"
        for line in lines
        if line.kind != want
    ]
    if problems:
        raise BatchInputError(problems)
    return endpoint


def _priority(value: int | str) -> int:
    try:
        return parse_priority(value)
    except ValueError as e:
        raise InvalidRequest(str(e)) from e
