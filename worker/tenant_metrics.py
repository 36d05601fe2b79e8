"""Usage counters per tenant, with a bounded number of label values: the first
``MAX_TENANT_LABELS`` tenants a worker sees get their own, later ones share 'other',
so a client that invents tenants cannot blow up the scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from shared import metric_names as names
from shared.models import Usage
from shared.usage import NO_TENANT


class TenantCounters:
    def __init__(self, model: str, registry: CollectorRegistry) -> None:
        self.model = model
        labels = ["model", "tenant"]
        self.prompt_tokens = Counter(
            names.TENANT_PROMPT_TOKENS, "Prompt tokens per tenant", labels, registry=registry
        )
        self.generation_tokens = Counter(
            names.TENANT_GENERATION_TOKENS, "Generated tokens per tenant", labels, registry=registry
        )
        self.requests = Counter(
            names.TENANT_REQUESTS, "Requests ended per tenant", labels, registry=registry
        )
        self.prefix_queries = Counter(
            names.TENANT_PREFIX_CACHE_QUERIES,
            "Prompt tokens looked up in the prefix cache per tenant",
            labels,
            registry=registry,
        )
        self.prefix_hits = Counter(
            names.TENANT_PREFIX_CACHE_HITS,
            "Of those, tokens found cached per tenant",
            labels,
            registry=registry,
        )
        self._named: set[str] = set()

    def label(self, tenant: str | None) -> str:
        name = tenant or NO_TENANT
        if name in self._named:
            return name
        if len(self._named) < names.MAX_TENANT_LABELS:
            self._named.add(name)
            return name
        return names.OTHER_TENANTS

    def on_usage(self, tenant: str | None, usage: Usage) -> None:
        label = (self.model, self.label(tenant))
        self.prompt_tokens.labels(*label).inc(usage.prompt_tokens)
        self.generation_tokens.labels(*label).inc(usage.completion_tokens)
        self.requests.labels(*label).inc()

    def on_prefix_cache(self, tenant: str | None, num_queried: int, num_hit: int) -> None:
        """A request's prefix-cache lookups, counted with its usage (when it ends)."""
        label = (self.model, self.label(tenant))
        self.prefix_queries.labels(*label).inc(num_queried)
        self.prefix_hits.labels(*label).inc(num_hit)
