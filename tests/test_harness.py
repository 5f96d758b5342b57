"""The harness itself: a real redis-server we can stop, pause and restart."""

import pytest
import redis


def test_server_is_real_and_empty(redis_server, redis_client):
    info = redis_client.info("server")
    assert "redis_version" in info
    assert redis_client.dbsize() == 0
    redis_client.set("marker", 1, ex=60)


def test_each_test_starts_empty(redis_client):
    assert redis_client.get("marker") is None


def test_stop_pause_restart(redis_server):
    if not redis_server.managed:
        pytest.skip("REDIS_URL points at a server this harness does not own")
    pid = redis_server.pid
    redis_server.pause()
    client = redis_server.client(socket_timeout=0.2)
    with pytest.raises(redis.TimeoutError):
        client.ping()
    redis_server.resume()
    assert client.ping()
    redis_server.kill()
    with pytest.raises(redis.ConnectionError):
        redis_server.client(socket_connect_timeout=0.2).ping()
    redis_server.start()
    assert redis_server.pid != pid
    assert redis_server.client().ping()
