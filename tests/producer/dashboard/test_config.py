from __future__ import annotations

import pytest

from producer.dashboard.config import DashboardConfig, load_config


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENQ_ADMIN_TOKEN", "tok")
    monkeypatch.setenv("TOKENQ_ADMIN_READ_ONLY_VIEW", "true")
    monkeypatch.setenv("TOKENQ_ADMIN_SAMPLE_INTERVAL_S", "2")
    config = load_config()
    assert config.read_only_view is True
    assert config.sample_interval_s == 2.0
    assert config.token_matches("tok")
    assert not config.token_matches("tok ")


def test_viewing_needs_a_token_unless_switched_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOKENQ_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("TOKENQ_ADMIN_READ_ONLY_VIEW", raising=False)
    config = load_config()
    assert (config.token_sha256, config.read_only_view) == (None, False)
    assert not config.token_matches("")


def test_history_length_covers_the_window() -> None:
    config = DashboardConfig(sample_interval_s=5, history_s=3600)
    assert config.history_len == 720 + 60
    assert "secret" not in repr(config.with_token("secret"))
