"""The cost per message of ThrottledConsumerMixin, beside the same consumer without it
(docs/benchmarks.md, "WebSocket messages (Django Channels)"). Not named channels.py: run from
bench/, that name would hide the channels package."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import harness
from harness import Case

# One SQLite database in memory for every thread: a sync consumer runs in another thread.
DATABASE = "file:bench-channels?mode=memory&cache=shared"


def consumers() -> dict[str, Any]:
    """The four consumers, made once Django is set up: echo, sync and async, with and without
    the mixin (scope "chat": one rule)."""
    from channels.generic.websocket import AsyncWebsocketConsumer, WebsocketConsumer

    from django_throttle.contrib.channels import ThrottledConsumerMixin

    class SyncEcho(WebsocketConsumer):
        def connect(self) -> None:
            self.accept()

        def receive(self, text_data: Any = None, bytes_data: Any = None) -> None:
            self.send(text_data=text_data)

    class AsyncEcho(AsyncWebsocketConsumer):
        async def connect(self) -> None:
            await self.accept()

        async def receive(self, text_data: Any = None, bytes_data: Any = None) -> None:
            await self.send(text_data=text_data)

    class SyncThrottled(ThrottledConsumerMixin, SyncEcho):
        throttle_scope = "chat"

    class AsyncThrottled(ThrottledConsumerMixin, AsyncEcho):
        throttle_scope = "chat"

    return {
        "async consumer": AsyncEcho,
        "async consumer + ThrottledConsumerMixin": AsyncThrottled,
        "sync consumer": SyncEcho,
        "sync consumer + ThrottledConsumerMixin": SyncThrottled,
    }


def case(name: str, consumer: Any, loop: asyncio.AbstractEventLoop) -> Case:
    """One open connection; a call sends a text frame and waits for its echo."""
    from channels.testing import WebsocketCommunicator

    talk = WebsocketCommunicator(consumer.as_asgi(), "/ws/")
    talk.scope["client"] = ("198.18.0.1", 40000)
    connected, _ = loop.run_until_complete(talk.connect())
    assert connected

    async def round_trip(_: int) -> None:
        await talk.send_to(text_data="hello")
        answer = await talk.receive_from(5)
        assert answer == "hello", answer

    opened.append(talk)
    return Case(name, lambda i: loop.run_until_complete(round_trip(i)))


def async_evalsha(url: str, loop: asyncio.AbstractEventLoop) -> Case:
    """redis.asyncio's EVALSHA of ``return 1``, awaited on the consumers' loop."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(url, socket_timeout=1.0)
    sha = loop.run_until_complete(client.script_load("return 1"))
    opened.append(client)
    return Case(
        "raw EVALSHA `return 1` (redis.asyncio)",
        lambda _: loop.run_until_complete(client.evalsha(sha, 0)),
    )


opened: list[Any] = []  # communicators and clients, closed before the loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 rounds x 500 messages")
    args = parser.parse_args()
    rounds, per_round = (3, 500) if args.quick else (7, 2000)
    with harness.RedisServer(cpu=harness.CPU) as server:
        harness.pin_client(harness.CPU)  # before the loop and any thread: they inherit CPU 0
        harness.configure_django(
            server.url, apps=["django_throttle"], migrate=True, database=DATABASE
        )
        harness.create_rules([("chat", "sliding_window_counter", 10**9, "hour")])
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            cases = [case(name, consumer, loop) for name, consumer in consumers().items()]
            # The floor of a decision in Redis, on each client.
            cases += [harness.raw_evalsha(server.url), async_evalsha(server.url, loop)]
            harness.print_machine("channels")
            harness.interleaved(cases, rounds, per_round, warmup=500)
        finally:
            for talk in opened:
                closing = talk.aclose() if hasattr(talk, "aclose") else talk.disconnect()
                loop.run_until_complete(closing)
            loop.close()
    print(
        "\n## A message through WebsocketCommunicator and its consumer, with and without "
        f"ThrottledConsumerMixin (one rule in Redis; {rounds} x {per_round} each)\n"
    )
    rows = []
    for plain, throttled in (cases[0:2], cases[2:4]):
        for c in (plain, throttled):
            added = c.median_us - plain.median_us if c is throttled else None
            rows.append(
                (
                    c.name,
                    f"{c.median_us:.1f}",
                    f"{c.p99_us:.1f}",
                    "-" if added is None else f"{added:.1f}",
                )
            )
    rows += [(c.name, f"{c.median_us:.1f}", f"{c.p99_us:.1f}", "-") for c in cases[4:]]
    harness.table(("case", "median µs", "p99 µs", "mixin adds µs"), rows)


if __name__ == "__main__":
    main()
