"""The synchronous Python client: submit requests, stream tokens, read results."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import redis

from producer.api_keys import find_key
from producer.following import (
    MAX_LOOKUPS,
    Unrepeated,
    block_ms,
    deadline_of,
    has_final,
    parse_events,
    result_or_tail,
)
from producer.requests import build_embed_requests, build_request, embedding_of
from producer.streams.threaded import ThreadHub, sync_source
from producer.submit import Submit, Submitter
from shared.connection import UNREACHABLE, close, connect
from shared.flows import cancel_flow, drive
from shared.keys import Keys, tag_of
from shared.limits import LimitsCache
from shared.models import FinalEvent, GenerationRequest, RequestStatus, Result, StreamEvent
from shared.reads import position_read, result_read, run_read, status_read
from shared.replication import Replicas
from shared.scripts import Scripts
from shared.settings import Settings, get_settings

log = logging.getLogger(__name__)


class Client:
    """Talks to tokenq through Redis. ``Client()`` reads ``TOKENQ_REDIS_URL``."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        connection: redis.Redis | None = None,
        settings: Settings | None = None,
        api_key: str | None = None,
        submitter: Submitter | None = None,
    ) -> None:
        """``api_key`` (one of ``TOKENQ_API_KEYS``) submits as its tenant, with its
        weight, under its rate limits, as the gateway does with it; without one, as
        ``submitter`` (a trusted service naming its own tenant), or as no tenant."""
        self.settings = settings or get_settings()
        self.submitter = submitter_for(self.settings, api_key, submitter)
        url = redis_url or self.settings.redis_url
        self.redis = connection or connect(url, self.settings.redis_cluster)
        self.keys = Keys(self.settings.namespace)
        self._scripts = Scripts(self.redis, Replicas.of(self.settings))
        self._limits = LimitsCache(self.redis, self.keys)  # what the model's workers take
        self._submit = Submit(self.keys, self.settings, self._scripts, self._limits)
        self._hub: ThreadHub[StreamEvent] | None = None
        self._hub_lock = threading.Lock()
        # Followers look Redis up on quiet spells: a few at a time (see AsyncClient).
        self._lookups = threading.BoundedSemaphore(MAX_LOOKUPS)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._hub is not None:
            self._hub.stop()
            self._hub = None
        close(self.redis)

    def _streams(self) -> ThreadHub[StreamEvent]:
        """The one reader every stream of this client is followed through."""
        with self._hub_lock:
            if self._hub is None:
                self._hub = ThreadHub(sync_source(self.redis), parse_events).start()
            return self._hub

    def submit(self, prompt: str | None = None, **kwargs: Any) -> Handle:
        """Enqueue one request; see ``producer.requests.build_request`` for arguments
        (``traceparent``: the W3C trace context to trace it under; with the
        OpenTelemetry SDK active, the current span is its parent by default)."""
        return self.submit_request(build_request(self.settings, prompt, **kwargs))

    def submit_request(self, request: GenerationRequest | Mapping[str, Any]) -> Handle:
        return self.submit_many([request])[0]

    def embed(
        self, texts: str | Sequence[str], *, timeout: float | None = None, **kwargs: Any
    ) -> list[list[float]]:
        """The L2-normalised embedding of each text, in order, queued with a priority
        like any request (``model``, ``priority``, ``dimensions``, ``deadline``,
        ``metadata``). RequestFailed when one ends without a vector."""
        handles = self.submit_many(build_embed_requests(self.settings, texts, **kwargs))
        return [embedding_of(handle.result(timeout)) for handle in handles]

    def submit_many(
        self, requests: Iterable[GenerationRequest | Mapping[str, Any]]
    ) -> list[Handle]:
        """Validate all, then enqueue all in one round trip. A full queue raises QueueFull
        for the first request that did not fit; the ones before it stay accepted."""
        submitted = self._submit(self.submitter, requests)
        return [Handle(self, i) for i in submitted.request_ids]

    def handle(self, request_id: str) -> Handle:
        tag_of(request_id)  # validates the id before it becomes a key
        return Handle(self, request_id)


class Handle:
    """One submitted request."""

    def __init__(self, client: Client, request_id: str) -> None:
        self.client = client
        self.id = request_id

    def __repr__(self) -> str:
        return f"Handle({self.id!r})"

    def status(self) -> RequestStatus:
        return run_read(self.client.redis, status_read(self.client.keys, self.id))

    def position(self) -> int | None:
        """Requests ahead of this one in its queue (0: next), or None once claimed."""
        return run_read(self.client.redis, position_read(self.client.keys, self.id))

    def cancel(self) -> str:
        """'cancelled' (was queued), 'requested' (running: stops within a step),
        'done' (had already ended)."""
        c = self.client
        return drive(c._scripts, cancel_flow(c.keys, c.settings, self.id))

    def stream(self, after: str = "0-0", timeout: float | None = None) -> Iterator[StreamEvent]:
        """Token events as they arrive, then the final event; resume with ``after``.
        RequestTimeout if the final event has not come within ``timeout`` seconds.
        Every stream of a client is read by one shared reader (one connection)."""
        give_up, unrepeated = deadline_of(timeout), Unrepeated()
        key = self.client.keys.stream(self.id)
        with self.client._streams().follow(key, after) as follower:
            while True:
                events = follower.next(block_ms(give_up, timeout, self.id) / 1000)
                for event in unrepeated.events(events):
                    yield event
                    if isinstance(event.event, FinalEvent):
                        return
                if not events:
                    with self.client._lookups:
                        self._look()  # raises NotFound if the request is gone

    def _look(self) -> None:
        """NotFound if the request is gone; Redis away (a failover) is waited out: the
        stream's reader follows the new primary by itself."""
        try:
            self.status()
        except UNREACHABLE as e:
            log.info("looking up %s failed (%s); still waiting", self.id, e)

    def _result(self) -> Result | None:
        try:
            return run_read(self.client.redis, result_read(self.client.keys, self.id))
        except UNREACHABLE as e:
            log.info("reading the result of %s failed (%s); still waiting", self.id, e)
            return None

    def result(self, timeout: float | None = None) -> Result:
        """Wait for the request to end and return its result."""
        give_up, c = deadline_of(timeout), self.client
        result, tail = run_read(c.redis, result_or_tail(c.keys, self.id))
        if result is not None:
            return result
        with c._streams().follow(c.keys.stream(self.id), tail) as follower:
            while True:
                events = follower.next(block_ms(give_up, timeout, self.id) / 1000)
                if not events or has_final(events):  # ended, or a quiet spell: look
                    with c._lookups:
                        result = self._result()
                    if result is not None:
                        return result


def submitter_for(
    settings: Settings, api_key: str | None, submitter: Submitter | None
) -> Submitter:
    """Who a client submits as: its API key's tenant, or ``submitter``."""
    if api_key is None:
        return submitter or Submitter()
    if submitter is not None:
        raise ValueError("give an api_key or a submitter, not both: the key names its tenant")
    return Submitter.of_key(find_key(settings, api_key))
