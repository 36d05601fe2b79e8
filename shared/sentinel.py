"""Reaching a Redis primary through Sentinel: ``redis+sentinel://`` URLs.

    redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE_NAME[/DB][?OPTIONS]
    rediss+sentinel://...   TLS to the sentinels and to the primary

The credentials are the primary's; ``sentinel_username`` and ``sentinel_password``
options are the sentinels' own (unset: none). Other options are redis-py's URL options
(``ssl_ca_certs``, ``socket_timeout``, ...) and apply to both. redis-py's Sentinel
support asks the sentinels for the primary's address whenever it opens a connection,
so after a failover every connection finds the new primary by itself; each process
says so once in its log, for each change of primary it sees.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.connection
import redis.retry
import redis.sentinel
from redis.backoff import ExponentialBackoff
from redis.connection import parse_url

from shared.errors import InvalidRequest

SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
log = logging.getLogger("tokenq.redis")


@dataclass(frozen=True)
class SentinelUrl:
    sentinels: list[tuple[str, int]]
    service: str
    tls: bool
    # Connection options for the primary, and for the sentinels.
    options: dict[str, Any] = field(default_factory=dict)
    sentinel_options: dict[str, Any] = field(default_factory=dict)


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0] in SCHEMES


def parse_sentinel_url(url: str) -> SentinelUrl:
    """InvalidRequest naming what is wrong with a ``redis+sentinel://`` URL."""
    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    service, _, db = path.partition("/")
    if scheme not in SCHEMES or not hosts or not service:
        raise InvalidRequest(
            f"not a Sentinel URL: {shown_sentinel_url(url)!r}; expected "
            "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE_NAME[/DB]"
        )
    extra = dict(parse_qsl(query))
    sentinel_options = {k: extra.pop(k) for k in SENTINEL_OPTIONS if k in extra}
    plain = f"{SCHEMES[scheme]}://{userinfo + '@' if userinfo else ''}x/{db.strip('/') or 0}"
    options: dict[str, Any] = parse_url(plain + ("?" + urlencode(extra) if extra else ""))  # type: ignore[no-untyped-call]
    options.pop("host", None)
    options.pop("connection_class", None)
    tls = scheme == "rediss+sentinel"
    shared = {k: v for k, v in options.items() if k.startswith(("ssl_", "socket_"))}
    sentinel_kwargs = {**shared, **_renamed(sentinel_options), **({"ssl": True} if tls else {})}
    return SentinelUrl(_hosts(hosts, url), unquote(service), tls, options, sentinel_kwargs)


def _renamed(sentinel_options: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix("sentinel_"): v for k, v in sentinel_options.items()}


def _hosts(hosts: str, url: str) -> list[tuple[str, int]]:
    found = []
    for item in hosts.split(","):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InvalidRequest(
                f"sentinel address {item!r} in {shown_sentinel_url(url)!r} is not HOST:PORT"
            )
        found.append((host.strip("[]"), int(port)))
    return found


def shown_sentinel_url(url: str) -> str:
    """The URL with the password (and any sentinel password) replaced."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:***@{hosts}" if colon else netloc
    tail, q, query = tail.partition("?")
    if q:
        pairs = [(k, "***" if k == "sentinel_password" else v) for k, v in parse_qsl(query)]
        query = urlencode(pairs)
    return f"{scheme}{sep}{netloc}{slash}{tail}{q}{query}"


class _Primaries:
    """The primary each service was last found at, in this process: a change is logged
    once, however many connections find it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[tuple[str, frozenset[str]], tuple[str, int]] = {}

    def seen(self, service: str, sentinels: frozenset[str], address: tuple[str, int]) -> None:
        """``sentinels``: who was asked (two deployments may name a service alike)."""
        address = (str(address[0]), int(address[1]))
        with self._lock:
            before = self._known.get((service, sentinels))
            if before == address:
                return
            self._known[service, sentinels] = address
        if before is None:
            log.info("Redis primary of %r is at %s:%d (Sentinel)", service, *address)
        else:
            log.warning(
                "Redis failed over: the primary of %r is now %s:%d (was %s:%d)",
                service, *address, *before,
            )  # fmt: skip


PRIMARIES = _Primaries()


class SentinelConnection(redis.sentinel.SentinelManagedConnection):
    """redis-py's, but a connection reopened by itself (a command finds it closed) asks
    the sentinels where the primary is, as ``connect`` does: redis-py 8.1 reopens it at
    its last address, the dead primary's, after a failover."""

    _addressed = False

    def connect_to(self, address: tuple[str, int]) -> None:
        self._addressed = True
        try:
            super().connect_to(address)  # type: ignore[no-untyped-call]
        finally:
            self._addressed = False

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        if not self._addressed and self._sock is None and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(*args, **kwargs)


class SentinelSSLConnection(SentinelConnection, redis.connection.SSLConnection):
    pass


class AsyncSentinelConnection(redis.asyncio.sentinel.SentinelManagedConnection):
    """The asyncio twin of ``SentinelConnection``."""

    _addressed = False

    async def connect_to(self, address: tuple[str, int]) -> None:
        self._addressed = True
        try:
            await super().connect_to(address)  # type: ignore[no-untyped-call]
        finally:
            self._addressed = False

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        if not self._addressed and not self.is_connected and self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(*args, **kwargs)


class AsyncSentinelSSLConnection(AsyncSentinelConnection, redis.asyncio.SSLConnection):
    pass


def _named(sentinels: list[Any]) -> frozenset[str]:
    names = set()
    for s in sentinels:
        kwargs = s.connection_pool.connection_kwargs
        names.add(f"{kwargs.get('host')}:{kwargs.get('port')}")
    return frozenset(names)


class LoggingSentinel(redis.sentinel.Sentinel):
    def discover_master(self, service_name: str) -> tuple[str, int]:
        address: tuple[str, int] = super().discover_master(service_name)  # type: ignore[no-untyped-call]
        PRIMARIES.seen(service_name, _named(self.sentinels), address)
        return address


class AsyncLoggingSentinel(redis.asyncio.sentinel.Sentinel):
    async def discover_master(self, service_name: str) -> tuple[str, int]:
        address: tuple[str, int] = await super().discover_master(service_name)
        PRIMARIES.seen(service_name, _named(self.sentinels), address)
        return address


# A command that meets a connection error (the primary died, or is now a replica) is
# sent again, on a connection to the primary the sentinels name then, for up to about
# FAILOVER_RETRY_S: long enough for Sentinel to promote a replica, short enough that a
# caller hears of an outage. (Every script tokenq sends is safe to repeat.)
FAILOVER_RETRIES = 10
FAILOVER_RETRY_S = 5.0


def _retries(options: dict[str, Any], retry_class: Any) -> dict[str, Any]:
    backoff = ExponentialBackoff(cap=FAILOVER_RETRY_S / FAILOVER_RETRIES * 2, base=0.05)
    retry = retry_class(backoff, FAILOVER_RETRIES)
    errors = [redis.ConnectionError, redis.TimeoutError]
    return {"retry": retry, "retry_on_error": errors, **options}


def connect_sentinel(url: str, **options: Any) -> redis.Redis:
    """A client of the primary of the URL's service (``options`` as redis-py's)."""
    options = _retries(options, redis.retry.Retry)
    s = parse_sentinel_url(url)
    options.setdefault("connection_class", SentinelSSLConnection if s.tls else SentinelConnection)
    sentinel = LoggingSentinel(s.sentinels, sentinel_kwargs=s.sentinel_options, ssl=s.tls)  # type: ignore[no-untyped-call]
    client: redis.Redis = sentinel.master_for(s.service, **{**s.options, **options})  # type: ignore[no-untyped-call]
    return client


class AsyncBlockingSentinelPool(
    redis.asyncio.sentinel.SentinelConnectionPool, redis.asyncio.BlockingConnectionPool
):
    """Sentinel's pool that waits for a free connection (``timeout``) at its limit
    (``max_connections``) rather than failing, as a gateway's does."""


def connect_sentinel_async(url: str, **options: Any) -> redis.asyncio.Redis:
    options = _retries(options, redis.asyncio.retry.Retry)
    s = parse_sentinel_url(url)
    connection = AsyncSentinelSSLConnection if s.tls else AsyncSentinelConnection
    options.setdefault("connection_class", connection)
    sentinel = AsyncLoggingSentinel(  # type: ignore[no-untyped-call]
        s.sentinels, sentinel_kwargs=s.sentinel_options, ssl=s.tls
    )
    client: redis.asyncio.Redis = sentinel.master_for(s.service, **{**s.options, **options})
    return client
