"""The HTTP gateway: OpenAI-compatible and native routes over a tokenq queue."""

from producer.gateway.app import create_app
from producer.gateway.config import ApiKey, ApiKeys, GatewayConfig, load_api_keys, parse_api_keys

__all__ = ["ApiKey", "ApiKeys", "GatewayConfig", "create_app", "load_api_keys", "parse_api_keys"]
