"""A scripted worker: plays the worker side with the real Lua scripts (claim, publish,
finish), one token per held request per step, honouring cancels, so gateway tests run
fast and deterministic without a model. Also registers itself as a live worker."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from shared.chat import REGISTRY_FIELD as CHAT_FIELD
from shared.chat import ChatFeatures
from shared.connection import close, connect, is_cluster
from shared.flows import claim_flow, drive, finish_flow
from shared.keys import Keys, model_tag
from shared.models import FinalEvent, FinishReason, GenerationRequest, TokenEvent, Usage
from shared.ops.claim import Claim, Claimed
from shared.ops.moves import Fate
from shared.ops.publish import Finish, Publish, PublishCode, TokenPublish, slot_of
from shared.registry import mark_served
from shared.scripts import Scripts
from shared.settings import Settings

MODEL = "test-model"
MAX_STEPS = 200_000


def token_text(index: int) -> str:
    return f"t{index} "


def expected_text(num_tokens: int) -> str:
    return "".join(token_text(i) for i in range(num_tokens))


@dataclass
class _Running:
    claimed: Claimed
    request: GenerationRequest
    num_sent: int = 0


@dataclass
class ScriptedWorker:
    url: str
    settings: Settings = field(default_factory=Settings)
    model: str = MODEL
    worker_id: str = "scripted-1"
    step_s: float = 0.005
    num_tokens: int = 8  # tokens per answer, at most max_tokens
    max_num_seqs: int = 64
    tokens_per_entry: int = 1  # more: that many steps' tokens as one entry, as coalescing does
    embedding_size: int | None = None  # registered, as a real worker's hidden size is
    chat: ChatFeatures | None = None  # registered, as a real worker's template features are
    script: tuple[str, ...] = ()  # the answer's tokens' texts (default: t0 t1 ...)
    running: dict[str, _Running] = field(default_factory=dict)
    claimed: list[GenerationRequest] = field(default_factory=list)  # every request it took
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.redis = connect(self.url, self.settings.redis_cluster)
        self.cluster = is_cluster(self.redis)
        self.keys = Keys(self.settings.namespace)
        self.scripts = Scripts(self.redis)
        self.tag = model_tag(self.model)

    def register(self) -> None:
        fields = {
            "model": self.model,
            "version": "test",
            "pid": "0",
            "device": "cpu",
            "max_num_seqs": str(self.max_num_seqs),
            "running": str(len(self.running)),
            "tokens_per_s": "0",
            "state": "serving",
            "heartbeat_ms": str(int(time.time() * 1000)),
        }
        if self.embedding_size is not None:
            fields["embedding_size"] = str(self.embedding_size)
        if self.chat is not None:
            fields[CHAT_FIELD] = self.chat.to_field()
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.worker(self.worker_id), mapping=fields)  # type: ignore[arg-type]
        pipe.pexpire(self.keys.worker(self.worker_id), 10_000)
        pipe.zadd(self.keys.workers(), {self.worker_id: time.time()})
        mark_served(pipe, self.keys, self.settings, self.model)
        pipe.execute()

    def start(self) -> ScriptedWorker:
        """Start serving (again, after ``stop``)."""
        self._stop.clear()
        self.register()
        self._thread = threading.Thread(target=self._loop, name="scripted-worker", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        close(self.redis)

    def _loop(self) -> None:
        last_beat = time.monotonic()
        for _ in range(MAX_STEPS):
            if self._stop.wait(self.step_s):
                return
            self.step()
            if time.monotonic() - last_beat > 1.0:
                self.register()
                last_beat = time.monotonic()

    def step(self) -> None:
        """Claim what fits, finish what is done, then one token for every other held
        request, all in one publish call as a worker's step does."""
        self._claim()
        for run in [r for r in self.running.values() if r.num_sent >= self._limit(r)]:
            limit = run.request.sampling.max_tokens
            self._finish(run, FinishReason.LENGTH if run.num_sent == limit else FinishReason.STOP)
        runs = list(self.running.values())
        if self.cluster:  # one publish call per slot (see shared.ops.publish)
            runs.sort(key=lambda r: slot_of(r.claimed.request_id))
        if not runs:
            return
        sizes = [min(self.tokens_per_entry, self._limit(r) - r.num_sent) for r in runs]
        events = [self._event(r, n) for r, n in zip(runs, sizes, strict=True)]
        publish = Publish(events)
        calls = publish.calls(self.keys, self.settings.result_ttl_s, self.cluster)
        written = publish.parse(self.scripts.send(calls))
        for run, n, w in zip(runs, sizes, written, strict=True):
            run.num_sent += n
            if w.code is PublishCode.CANCEL_REQUESTED:
                self._finish(run, FinishReason.CANCELLED)

    def _limit(self, run: _Running) -> int:
        return min(len(self.script) or self.num_tokens, run.request.sampling.max_tokens)

    def _text(self, index: int) -> str:
        return self.script[index] if self.script else token_text(index)

    def _claim(self) -> None:
        room = self.max_num_seqs - len(self.running)
        if room <= 0:
            return
        claim = Claim(self.tag, self.worker_id, self.settings.lease_ms, room, room)
        flow = claim_flow(self.keys, self.settings, claim, self.cluster)
        for c in drive(self.scripts, flow):
            request = GenerationRequest.model_validate_json(c.payload)
            self.running[c.request_id] = _Running(c, request, c.num_generated)
            self.claimed.append(request)

    def _event(self, run: _Running, num_tokens: int) -> TokenPublish:
        first, num_top = run.num_sent, run.request.sampling.logprobs
        steps = [
            TokenEvent(
                index=i,
                token_ids=(i,),
                text=self._text(i),
                logprobs=None if num_top is None else (_logprob(i, num_top),),
            )
            for i in range(first, first + num_tokens)
        ]
        wire = TokenEvent.coalesce(steps).wire()
        return TokenPublish(
            run.claimed.request_id, run.claimed.lease_token, wire, first, num_tokens
        )

    def _finish(self, run: _Running, reason: FinishReason) -> None:
        c, n = run.claimed, run.num_sent
        usage = Usage(prompt_tokens=3, completion_tokens=n)
        final = FinalEvent(finish_reason=reason, usage=usage)
        output = dumps_output("".join(self._text(i) for i in range(n)), list(range(n)))
        state = Fate.CANCELLED if reason is FinishReason.CANCELLED else Fate.FINISHED
        finish = Finish(c.request_id, c.lease_token, final, output, state)
        drive(self.scripts, finish_flow(self.keys, self.settings, finish))
        del self.running[c.request_id]


def dumps_output(text: str, token_ids: list[int]) -> bytes:
    import orjson

    return orjson.dumps({"text": text, "token_ids": token_ids})


def _logprob(index: int, num_top: int) -> dict[str, object]:
    top = [{"token_id": index + k, "logprob": -0.5 - k} for k in range(num_top)]
    return {"token_id": index, "logprob": -0.5, "top": top}
