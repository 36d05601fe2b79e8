"""Batch jobs and webhooks on RQ: OpenAI-style JSONL batches fanned into tokenq's queue,
and signed webhook deliveries with retries."""

from producer.batch.lines import BatchInputError
from producer.batch.models import BatchCounts, BatchState, BatchStatus
from producer.batch.ops import BatchEnded, Batches
from producer.batch.signing import BadSignature, sign, verify
from producer.batch.watch import submit_with_webhook

__all__ = [
    "BadSignature",
    "BatchCounts",
    "BatchEnded",
    "BatchInputError",
    "BatchState",
    "BatchStatus",
    "Batches",
    "sign",
    "submit_with_webhook",
    "verify",
]
