"""Prometheus metric names, in one place: workers and gateways export them, the
dashboard and the autoscaler read them. Named after vLLM's where they mean the same
(``vllm:`` becomes ``tokenq:``)."""

REQUESTS_RUNNING = "tokenq:num_requests_running"
REQUESTS_WAITING = "tokenq:num_requests_waiting"
QUEUE_DEPTH = "tokenq:queue_depth"  # queued in Redis, per model and priority: what KEDA reads
TIME_TO_FIRST_TOKEN = "tokenq:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "tokenq:inter_token_latency_seconds"
E2E_LATENCY = "tokenq:e2e_request_latency_seconds"
QUEUE_TIME = "tokenq:request_queue_time_seconds"
PROMPT_TOKENS = "tokenq:prompt_tokens"  # counters get a _total suffix when exported
GENERATION_TOKENS = "tokenq:generation_tokens"
REQUEST_SUCCESS = "tokenq:request_success"
PREEMPTIONS = "tokenq:num_preemptions"
KV_CACHE_USAGE = "tokenq:kv_cache_usage_perc"
PREFIX_CACHE_QUERIES = "tokenq:prefix_cache_queries"  # prompt tokens looked up in the cache
PREFIX_CACHE_HITS = "tokenq:prefix_cache_hits"  # of those, tokens found cached
# Requests a claim took for a prefix the worker holds warm, ahead of queue order.
AFFINITY_CLAIMS = "tokenq:affinity_claims"
# Speculative decoding: rows verified with drafts, draft tokens proposed, and kept.
SPEC_DECODE_NUM_DRAFTS = "tokenq:spec_decode_num_drafts"
SPEC_DECODE_NUM_DRAFT_TOKENS = "tokenq:spec_decode_num_draft_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS = "tokenq:spec_decode_num_accepted_tokens"
SPEC_DECODE_ACCEPTANCE_RATE = "tokenq:spec_decode_acceptance_rate"  # since start, 0..1
SPEC_DECODE_TOKENS_PER_STEP = "tokenq:spec_decode_tokens_per_step"  # per verified row
# Per tenant (at most MAX_TENANT_LABELS tenants by name, the rest as 'other').
TENANT_PROMPT_TOKENS = "tokenq:tenant_prompt_tokens"
TENANT_GENERATION_TOKENS = "tokenq:tenant_generation_tokens"
TENANT_REQUESTS = "tokenq:tenant_requests"
# Prompt tokens of a tenant's requests looked up in the prefix cache, and found cached.
TENANT_PREFIX_CACHE_QUERIES = "tokenq:tenant_prefix_cache_queries"
TENANT_PREFIX_CACHE_HITS = "tokenq:tenant_prefix_cache_hits"
MAX_TENANT_LABELS = 100
OTHER_TENANTS = "other"
