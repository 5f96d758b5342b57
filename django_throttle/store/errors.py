"""What a store call raises when the store, not the caller, is at fault."""

from __future__ import annotations

from redis.exceptions import RedisClusterException, RedisError

# Everything a Redis call raises when the server is down, hung, full, read-only,
# loading, or answers a script error: redis-py wraps these in RedisError, apart from
# socket-level OSErrors and a cluster it cannot map (RedisClusterException).
STORE_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError, RedisClusterException)
