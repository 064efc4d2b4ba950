"""The test harness's redis-server does what the fleet tests rely on: it answers, dies, pauses and restarts."""

from __future__ import annotations

import redis.asyncio as redis

from tests.redis_server import RedisServer


async def test_the_shared_server_answers_and_starts_empty(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert await client.ping()
        assert await client.dbsize() == 0
        await client.set("k", "v")
    finally:
        await client.aclose()


async def test_a_private_server_dies_pauses_and_restarts(redis_factory: type[RedisServer]) -> None:
    server = redis_factory(password="secret")
    server.start()
    client = redis.Redis.from_url(server.url, socket_timeout=0.2, socket_connect_timeout=0.2)
    try:
        await client.set("k", "v")
        server.pause()
        try:
            await client.get("k")
            raise AssertionError("a paused server answered")
        except redis.TimeoutError:
            pass
        server.resume()
        server.stop()
        try:
            await client.get("k")
            raise AssertionError("a dead server answered")
        except redis.ConnectionError:
            pass
        server.start()
        assert await client.get("k") is None  # no persistence: a restart starts empty
    finally:
        await client.aclose()
