"""The dashboard's settings: who may look, who may act, and how history is kept.

``TOKENQ_ADMIN_TOKEN`` is required for every action and, unless
``TOKENQ_ADMIN_READ_ONLY_VIEW=true``, for viewing too. They are settings like
any other (``shared/settings.py``).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, replace

from shared.settings import Settings


@dataclass(frozen=True)
class DashboardConfig:
    token_sha256: str | None = None
    read_only_view: bool = False
    # The sampler appends one snapshot per interval; charts cover history_s.
    sample_interval_s: float = 5.0
    history_s: int = 3600
    # Live updates: the overview is rebuilt at most this often per process.
    push_interval_s: float = 2.0
    list_limit: int = 50
    max_workers: int = 256
    max_models: int = 64

    def with_token(self, token: str | None) -> DashboardConfig:
        """This configuration with ``token`` as the admin token (kept only as a digest)."""
        digest = None if not token else hashlib.sha256(token.encode()).hexdigest()
        return replace(self, token_sha256=digest)

    @property
    def history_len(self) -> int:
        """Entries the history stream keeps (a little more than history_s needs)."""
        return int(self.history_s / self.sample_interval_s) + 60

    def token_matches(self, token: str) -> bool:
        if self.token_sha256 is None:
            return False
        given = hashlib.sha256(token.encode()).hexdigest()
        return hmac.compare_digest(given, self.token_sha256)


def load_config(settings: Settings | None = None) -> DashboardConfig:
    """The configuration from the settings (``TOKENQ_ADMIN_*``)."""
    env = settings or Settings()
    token = env.admin_token.get_secret_value() if env.admin_token is not None else None
    config = DashboardConfig(
        read_only_view=env.admin_read_only_view,
        sample_interval_s=env.admin_sample_interval_s,
        history_s=env.admin_history_s,
    )
    return config.with_token(token)
