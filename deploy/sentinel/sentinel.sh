#!/bin/sh
# A Redis Sentinel watching tokenq's primary: writes its config (Sentinel rewrites the
# file as it learns the topology, so it must be writable), then runs it.
#   REDIS_PRIMARY_HOST  the primary's host name as it starts (Sentinel tracks it after)
#   TOKENQ_REDIS_PASSWORD  the password of the primary and its replicas
#   SENTINEL_QUORUM (default 2 of 3), SENTINEL_DOWN_AFTER_MS (default 5000)
set -eu
conf=/data/sentinel.conf
cat > "$conf" <<CONF
port 26379
dir /data
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel monitor tokenq ${REDIS_PRIMARY_HOST} 6379 ${SENTINEL_QUORUM:-2}
sentinel auth-pass tokenq ${TOKENQ_REDIS_PASSWORD}
sentinel down-after-milliseconds tokenq ${SENTINEL_DOWN_AFTER_MS:-5000}
sentinel failover-timeout tokenq 60000
sentinel parallel-syncs tokenq 1
CONF
exec redis-server "$conf" --sentinel
