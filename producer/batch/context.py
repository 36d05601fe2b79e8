"""What every batch operation and RQ job needs: a connection, settings and key names."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from shared.keys import BatchKeys, Keys
from shared.scripts import Scripts
from shared.settings import Settings, get_settings


@dataclass
class Context:
    redis: redis.Redis
    settings: Settings = field(default_factory=get_settings)

    def __post_init__(self) -> None:
        self.keys = Keys(self.settings.namespace)
        self.bkeys = BatchKeys(self.settings.namespace)
        self.scripts = Scripts(self.redis)

    def batch_queue(self) -> Queue:
        return rq_queue(self.redis, self.bkeys.batch_queue())

    def webhook_queue(self) -> Queue:
        return rq_queue(self.redis, self.bkeys.webhook_queue())


def rq_queue(connection: redis.Redis, name: str) -> Queue:
    """An RQ queue that stores job arguments as JSON: nothing is pickled."""
    return Queue(name, connection=connection, serializer=JSONSerializer)
