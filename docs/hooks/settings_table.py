"""MkDocs hook: the configuration page's table of settings, built from
``shared.settings.Settings`` and the comments above its fields, so the page lists
every setting there is, with its default, and cannot drift from the code."""

from __future__ import annotations

import ast
import inspect
from typing import Any

from pydantic import SecretStr

from shared import settings as settings_module
from shared.settings import Settings

PLACEHOLDER = "<!-- settings-table -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    if PLACEHOLDER not in markdown:
        return markdown
    return markdown.replace(PLACEHOLDER, settings_table())


def settings_table() -> str:
    comments = field_comments()
    rows = ["| variable | default | what it does |", "| --- | --- | --- |"]
    for name, info in Settings.model_fields.items():
        env = f"`TOKENQ_{name.upper()}`"
        rows.append(f"| {env} | {_default(info.default)} | {comments.get(name, '')} |")
    return "\n".join(rows)


# What a setting does where the code has no comment right above it (its comment sits
# above a neighbour, or its name says most of it).
PLAIN = {
    "redis_url": "The Redis every process shares (also rediss://, redis+cluster://, "
    "redis+sentinel://).",
    "redis_replica_timeout_ms": "How long a fate-deciding write waits for "
    "TOKENQ_REDIS_MIN_REPLICAS replicas before it fails with ReplicationTimeout.",
    "namespace": "The prefix of every key, so several deployments share one Redis.",
    "default_model": "The model a submit names when it names none.",
    "max_prompt_chars": "The longest prompt a submit takes, in characters.",
    "served_ttl_s": "How long a model counts as served after its last worker's beat.",
    "idempotency_ttl_s": "How long an idempotency key returns its original request.",
    "max_attempts": "Claims a request may take before it is dead-lettered.",
    "worker_heartbeat_ms": "How often a worker beats (registry, leases); a worker "
    "silent for a few beats is dead.",
    "drain_timeout_s": "How long a stopping worker finishes what it holds before it "
    "hands the rest back.",
    "model_cache_dir": "Where converted models are kept (the default model's safetensors copy).",
    "batch_poll_s": "How often a batch's driver looks at its lines' requests.",
    "batch_job_timeout_s": "RQ's timeout for one batch-driving job.",
    "max_batch_lines": "The most lines one batch file may hold.",
    "rq_maintenance_s": "How often RQ's workers run their maintenance.",
    "batch_ttl_s": "How long a batch's records are kept after it ends.",
    "webhook_timeout_s": "How long one webhook delivery may take.",
    "webhook_ttl_s": "How long a webhook delivery's record is kept.",
    "webhook_retry_s": "Waits before each retry of a failed webhook delivery.",
    "admin_read_only_view": "Let the dashboard be viewed without the admin token.",
    "admin_sample_interval_s": "How often the dashboard's history takes a snapshot.",
    "admin_history_s": "How much history the dashboard's charts keep.",
}


def field_comments() -> dict[str, str]:
    """Each field's description: the ``#`` lines right above it, else ``PLAIN``'s."""
    source = inspect.getsource(settings_module)
    lines = source.splitlines()
    cls = next(
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Settings"
    )
    found: dict[str, str] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            text = _comment_above(lines, node.lineno - 1) or PLAIN.get(name, "")
            found[name] = text.replace("|", "\\|")
    return found


def _comment_above(lines: list[str], index: int) -> str:
    taken: list[str] = []
    i = index - 1
    while i >= 0 and lines[i].strip().startswith("#"):
        taken.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    return " ".join(taken)


def _default(value: Any) -> str:
    if isinstance(value, SecretStr):
        return "(empty)" if not value.get_secret_value() else "(set)"
    if value is None:
        return "(unset)"
    if isinstance(value, tuple):
        value = ",".join(str(v) for v in value)
    return f"`{value}`"
