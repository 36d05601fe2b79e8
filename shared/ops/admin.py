"""reset.lua and retry.lua: running a dead-lettered request again."""

from __future__ import annotations

from shared.keys import Keys, tag_of
from shared.scripts import ScriptCall


def reset_call(keys: Keys, request_id: str) -> ScriptCall:
    """Its reply: the priority once it is ready to queue, '' when it is not dead."""
    return ScriptCall("reset", [keys.request(request_id), keys.stream(request_id)], [])


def retry_call(keys: Keys, request_id: str, priority: str) -> ScriptCall:
    """Its reply: 1 when requeued, 0 when the id is not in the dead-letter set."""
    tag = tag_of(request_id)
    return ScriptCall(
        "retry",
        [keys.dead(tag), keys.queue(tag), keys.seq(tag), keys.wakeup(tag)],
        [request_id, priority, keys.lifecycle_channel()],
    )
