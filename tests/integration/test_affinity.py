"""Two real workers on the default model, each with a KV budget that holds about half
of the distinct prefixes, and many requests cycling over those prefixes: every output
equals ``generate``'s, and with prefix affinity the fleet finds far more of the prompts
in its caches (so computes far fewer prompt tokens) than without it. The time each
run took is printed; bench/affinity.py measures throughput at scale."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.models import FinishReason
from shared.settings import DEFAULT_MODEL, Settings
from tests.conftest import serve
from tests.integration.affinity import Outcome, fleet, preamble, run_load, serving
from tests.integration.faults import wait_until
from tests.reference import greedy_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1500)]

# About 340 tokens each. An odd number: two workers taking the queue's heads in turn
# each see every prefix, not half of them each.
NUM_PREFIXES = 7
NUM_REQUESTS = 42
MAX_TOKENS = 4
# About 1,300 tokens of SmolLM2-135M's KV cache (45 KiB a token): 3 to 4 of the 7
# prefixes, the 2 sequences running included.
WORKER_ARGS = ("--kv-cache-mib", "56", "--max-num-seqs", "2", "--no-self-check")


def prompts() -> list[str]:
    return [
        f"{preamble(i % NUM_PREFIXES, 18)}\nQuestion {i}: which shelf holds entry {i % 31}?"
        for i in range(NUM_REQUESTS)
    ]


def run(url: str, connection: redis.Redis, affinity: bool, log_dir: Path) -> Outcome:
    connection.flushall()
    serve(connection, DEFAULT_MODEL)
    client = Client(connection=connection, settings=Settings(max_queued=1000))
    sampling = {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    bodies = [{"model": DEFAULT_MODEL, "prompt": p, "sampling": sampling} for p in prompts()]
    with fleet(url, 2, affinity, log_dir, *WORKER_ARGS):
        wait_until(lambda: serving(connection) == 2, 600, "two workers serving")
        outcome = run_load(client, bodies, 900)
    print(
        f"affinity {'on' if affinity else 'off'}: {outcome.total_s:.1f} s, prefix hit rate "
        f"{outcome.figures.hit_rate:.2f}, prompt tokens computed "
        f"{outcome.figures.computed_tokens}, claims by affinity {outcome.figures.affinity_claims}"
    )
    return outcome


def test_claims_by_affinity_keep_every_output_exact(
    redis_server: EmbeddedRedis, real_redis: redis.Redis, default_model_dir: Path, tmp_path: Path
) -> None:
    off = run(redis_server.url, real_redis, False, tmp_path)
    on = run(redis_server.url, real_redis, True, tmp_path)
    references = greedy_reference(default_model_dir, [(p, False) for p in prompts()], MAX_TOKENS)
    for outcome in (off, on):
        for result, reference in zip(outcome.results, references, strict=True):
            assert result.finish_reason is FinishReason.LENGTH
            assert list(result.token_ids) == reference
    assert off.figures.affinity_claims == 0 and on.figures.affinity_claims > 0
    # Claims leave a peer's warm prefixes to it and take cold ones with their siblings,
    # from the first claim on: five runs here measured hit rate 0.21-0.29 -> 0.64-0.72
    # and 10,560-11,856 -> 4,176-5,360 prompt tokens computed (one of them with two busy
    # loops on the 2-core box). Before the first claims grouped cold
    # siblings, one worker's look-ahead took six prefixes at once, its peer was left
    # the seventh, and runs measured 0.16-0.36; the bounds fail that and leave room for
    # timing.
    assert on.figures.hit_rate >= off.figures.hit_rate + 0.15
    assert on.figures.computed_tokens <= 0.8 * off.figures.computed_tokens
    print(
        f"AFFINITY REPORT hit rate {off.figures.hit_rate:.2f} -> {on.figures.hit_rate:.2f}, "
        f"prompt tokens computed {off.figures.computed_tokens} -> "
        f"{on.figures.computed_tokens}, time with affinity / without: "
        f"{on.total_s / off.total_s:.2f}"
    )
