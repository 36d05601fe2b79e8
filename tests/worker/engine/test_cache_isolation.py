"""Prefix-cache isolation on the real engine: a request admitted as the worker admits it
(``worker.admission``) shares cached blocks with its own tenant's requests, never with
another tenant's (unless the operator lets them share), and a request's cache_salt
narrows that further. Another tenant's probe sees a cold cache, in the engine's hit
figures and in the CPU time its first token costs; the warm set follows the blocks; each tenant's
hits show in its usage and metrics."""

from __future__ import annotations

import time
import uuid
from typing import Any

import fakeredis
import pytest

from producer.client import Client
from shared.keys import Keys, new_request_id
from shared.models import GenerationRequest, SamplingParams
from shared.settings import Settings
from shared.usage import last_hours, read_usage, totals
from tests.conftest import as_tenant, serve
from tests.worker.fakes import lockstep
from worker.admission import engine_request
from worker.engine import Engine, EngineRequest
from worker.engine.outputs import RequestOutput
from worker.held import Held
from worker.prefix_cuts import PrefixCuts
from worker.queue import ModelQueue
from worker.service import WorkerService

MODEL = "m"


def queue_with(**settings: Any) -> ModelQueue:
    return ModelQueue(fakeredis.FakeRedis(), Settings(**settings), MODEL, "w1")


def new_system(num_sentences: int = 6) -> str:
    """A system prompt of several blocks that no other test has cached (the engine is
    shared by the session's tests)."""
    return f"[{uuid.uuid4().hex}] " + "You are the support assistant of a small bank. " * (
        num_sentences
    )


class Tenants:
    """Requests as a worker with ``queue``'s settings admits them, each run alone."""

    def __init__(self, engine: Engine, queue: ModelQueue, system: str) -> None:
        self.engine, self.queue, self.system = engine, queue, system
        self.cuts = PrefixCuts(engine)

    def request(self, tenant: str | None, question: str, **kwargs: Any) -> EngineRequest:
        messages = [{"role": "system", "content": self.system},
                    {"role": "user", "content": question}]  # fmt: skip
        req = GenerationRequest(
            model=MODEL,
            messages=messages,
            tenant=tenant,
            sampling=SamplingParams(max_tokens=1, temperature=0.0),
            **kwargs,
        )
        held = Held(new_request_id(MODEL), "lease", req)
        return engine_request(self.engine, self.queue, held, self.cuts)

    def hits(self, tenant: str | None, question: str, **kwargs: Any) -> int:
        """Prompt tokens the request found cached, by its own output and the engine's
        total (which must agree)."""
        before = self.engine.kv_cache.num_hit_tokens
        last = run(self.engine, self.request(tenant, question, **kwargs))
        assert self.engine.kv_cache.num_hit_tokens - before == last.num_prefix_hit_tokens
        return last.num_prefix_hit_tokens


def run(engine: Engine, request: EngineRequest) -> RequestOutput:
    outputs = engine.generate([request])[request.request_id]
    assert outputs[-1].finished
    return outputs[-1]


def system_blocks(engine: Engine, system: str) -> int:
    """The prompt tokens of ``system``'s full blocks (a later request's least hit)."""
    rendered = engine.encode_chat([{"role": "system", "content": system}])
    return (len(rendered) - 1) // engine.kv_cache.block_size * engine.kv_cache.block_size


def test_two_tenants_share_no_block_and_each_shares_its_own(engine: Engine) -> None:
    tenants = Tenants(engine, queue_with(), new_system())
    assert tenants.hits("acme", "What is my balance?") == 0
    # The same system prompt from another tenant: not one cached block is shared.
    assert tenants.hits("globex", "What is my balance?") == 0
    assert tenants.hits(None, "What is my balance?") == 0
    # Within each tenant, the next request hits its tenant's blocks.
    least = system_blocks(engine, tenants.system)
    assert tenants.hits("acme", "Open an account.") >= least > 0
    assert tenants.hits("globex", "Open an account.") >= least
    assert tenants.hits(None, "Open an account.") >= least


def test_tenants_the_operator_lets_share_share_one_cache(engine: Engine) -> None:
    tenants = Tenants(engine, queue_with(cache_shared_tenants="acme, globex"), new_system())
    least = system_blocks(engine, tenants.system)
    assert tenants.hits("acme", "What is my balance?") == 0
    assert tenants.hits("globex", "Open an account.") >= least
    assert tenants.hits(None, "Close my account.") >= least  # the common cache
    assert tenants.hits("initech", "Close my account.") == 0  # not named: its own
    everyone = Tenants(engine, queue_with(cache_shared_tenants="*"), new_system())
    assert everyone.hits("acme", "What is my balance?") == 0
    assert everyone.hits("initech", "Open an account.") >= least


def test_a_cache_salt_narrows_sharing_within_a_tenant(engine: Engine) -> None:
    tenants = Tenants(engine, queue_with(), new_system())
    assert tenants.hits("acme", "What is my balance?", cache_salt="user-1") == 0
    assert tenants.hits("acme", "What is my balance?") == 0
    assert tenants.hits("acme", "What is my balance?", cache_salt="user-2") == 0
    assert tenants.hits("globex", "What is my balance?", cache_salt="user-1") == 0
    least = system_blocks(engine, tenants.system)
    assert tenants.hits("acme", "Open an account.", cache_salt="user-1") >= least


def test_the_warm_set_holds_a_tenants_fingerprints_not_anothers(engine: Engine) -> None:
    tenants = Tenants(engine, queue_with(), new_system())
    acme = tenants.request("acme", "What is my balance?")
    globex = tenants.request("globex", "What is my balance?")
    run(engine, acme)
    warm = set(engine.warm_fingerprints(64))
    assert acme.prefix_cuts[0][0] in warm
    # The same prefix from another tenant has another fingerprint, held warm only once
    # its own blocks are cached: a claim never sends it to acme's warm worker for them.
    assert globex.prefix_cuts[0][0] != acme.prefix_cuts[0][0]
    assert globex.prefix_cuts[0][0] not in warm
    run(engine, globex)
    assert globex.prefix_cuts[0][0] in set(engine.warm_fingerprints(64))


def first_token_cpu_s(engine: Engine, request: EngineRequest) -> tuple[float, int]:
    """The engine's CPU time from admission to the request's first output (what its time
    to first token is made of, less the waits a busy machine adds), and the prompt
    tokens the request found cached."""
    started = time.process_time()
    engine.add_request(request)
    outputs = engine.step()
    while not outputs:
        outputs = engine.step()
    elapsed = time.process_time() - started
    while engine.has_unfinished_requests():
        outputs = engine.step() or outputs
    return elapsed, outputs[-1].num_prefix_hit_tokens


@pytest.mark.usefixtures("one_thread")  # CPU time on one thread: no other thread's spin
def test_another_tenants_probe_costs_what_a_cold_prefill_does(engine: Engine) -> None:
    """An attacker times its own request with a victim's suspected system prompt. Each
    probe comes from a fresh tenant (a tenant's second probe would hit its own first);
    the least of two is taken against stalls."""
    tenants = Tenants(engine, queue_with(), new_system(num_sentences=50))
    run(engine, tenants.request("victim", "What is my balance?"))
    warm = [first_token_cpu_s(engine, tenants.request("victim", f"Question {n}?")) for n in (1, 2)]
    probes = [
        first_token_cpu_s(engine, tenants.request(f"probe-{n}", "What is my balance?"))
        for n in (1, 2)
    ]
    assert all(hits > 0 for _, hits in warm) and all(hits == 0 for _, hits in probes)
    # A probe's prefill computes the whole prompt, as a cold one does: several times
    # the victim's own warm prefill, which computes only the question.
    assert min(s for s, _ in probes) > 3 * min(s for s, _ in warm)


def test_each_tenants_hits_show_in_its_usage_and_metrics(
    engine: Engine, fake_redis: fakeredis.FakeRedis
) -> None:
    """Through the worker loop: what the dashboard's usage table and the tenant metrics
    show for two tenants sending the same system prompt."""
    serve(fake_redis, MODEL)
    settings = Settings(publish_coalesce_ms=0)
    client = Client(connection=fake_redis, settings=settings)
    service = lockstep(WorkerService(engine, fake_redis, settings, MODEL, "w1"))
    system = new_system()
    for tenant, question in (("acme", "Hi"), ("globex", "Hi"), ("acme", "Hello")):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        handle = as_tenant(client, tenant).submit(
            messages=messages, model=MODEL, max_tokens=1, temperature=0
        )
        service.run(burst=True)
        assert handle.result(timeout=5).usage.completion_tokens == 1
    service.close()
    usage = {u.tenant: u for u in totals(read_usage(fake_redis, Keys(), last_hours(1)))}
    globex, acme = usage["globex"], usage["acme"]
    assert (globex.cache_hit_tokens, globex.cache_queried_tokens) == (0, globex.prompt_tokens)
    assert acme.cache_hit_tokens >= system_blocks(engine, system) > 0
    assert 0 < acme.cache_hit_rate < 1
    scrape = service.metrics.render().decode()
    for tenant, hits in (("globex", 0), ("acme", acme.cache_hit_tokens)):
        assert (
            f'tokenq:tenant_prefix_cache_hits_total{{model="m",tenant="{tenant}"}} {hits}.0'
            in scrape
        )
