"""The notifier's loop (docs/notifications.md): follow the certified cards, send each new
one to its principal's webhook and mailbox with retries, remember what was delivered.

It is a reader outside the judge: it holds no key that answers a card and sends nothing to
the cluster but signed reads, so a slow or failing receiver delays only its own message,
never a verdict.

Restarts: the state file (`NotifyState`) keeps the (card digest, channel) pairs delivered
and the height to resume from, which stays at the oldest card whose delivery is not done.
A card delivered before a restart is not sent again; one whose delivery was under way is
sent again with the same `webhook-id` (the card digest) and `Message-ID`, so a receiver
drops the repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from quorumgate.notify.cards import CardFollower, Notice
from quorumgate.notify.config import NotifyConfig, NotifyConfigError, Route
from quorumgate.notify.send import SendFailed, mail_message, post_webhook, send_mail
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sdk.client import Client

log = logging.getLogger("quorumgate.notify")

DELIVERY_TRIES_MAX = 8  # tries of one message before it counts as failed
RETRY_WAIT_S_MIN = 0.5  # the wait after the first failed try; doubled after each
RETRY_WAIT_S_MAX = 60.0
DELIVERIES_AT_ONCE_MAX = 8  # messages being sent at one time
QUEUE_MESSAGES_MAX = 1000  # messages waiting or under way; past it a new one fails at once
DELIVERED_REMEMBERED_MAX = 10_000  # (card, channel) pairs the state file keeps
FIRST_RUN_BACK_HEIGHTS = 1000  # a first run also announces cards this far back (if open)
FOLLOW_RETRY_S = 1.0  # before reading the verdict stream again after it broke
# The verdict stream is opened anew after this long without a verdict, so a sidecar that
# restarted (and closed its stream) is followed again.
FOLLOW_IDLE_S = 5.0
STOP_S_MAX = 15.0  # a stop waits this long at most for the notifier's tasks to end
STOP_POLL_S = 0.1
STATE_SAVE_VERDICTS = 100  # verdicts read between two writes of the state file (at most)
STATE_VERSION = 1
WEBHOOK, EMAIL = "webhook", "email"


class NotifyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.delivered = Counter(
            "qg_notify_delivered", "Messages delivered, by channel", ["channel"], registry=r
        )
        self.failed = Counter(
            "qg_notify_failed", "Messages given up on, by channel", ["channel"], registry=r
        )
        self.retries = Counter(
            "qg_notify_retries", "Tries after a failed one, by channel", ["channel"], registry=r
        )
        self.queue = Gauge("qg_notify_queue_size", "Messages waiting or being sent", registry=r)


@dataclass
class NotifyState:
    """What survives a restart: the resume height and the pairs delivered, oldest first."""

    chain_id: str
    next_height: int = 0
    delivered: OrderedDict[str, None] | None = None

    @classmethod
    def load(cls, path: Path, chain_id: str) -> NotifyState:
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(chain_id, 0, OrderedDict())
        except (OSError, ValueError) as err:
            raise NotifyConfigError("state_file", f"{path} is not readable JSON") from err
        if (
            not isinstance(doc, dict)
            or doc.get("version") != STATE_VERSION
            or doc.get("chain") != chain_id
        ):
            raise NotifyConfigError("state_file", f"{path} is not this cluster's notifier state")
        pairs = OrderedDict((str(p), None) for p in doc.get("delivered", []))
        return cls(chain_id, int(doc.get("next_height", 0)), pairs)

    def save(self, path: Path) -> None:
        """Written whole to a temporary file, then renamed over the old one."""
        doc = {
            "version": STATE_VERSION,
            "chain": self.chain_id,
            "next_height": self.next_height,
            "delivered": list(self.delivered or ()),
        }
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(doc, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)

    def done(self, pair: str) -> bool:
        return pair in (self.delivered or {})

    def mark(self, pair: str) -> None:
        assert self.delivered is not None
        self.delivered[pair] = None
        while len(self.delivered) > DELIVERED_REMEMBERED_MAX:
            self.delivered.popitem(last=False)


class Notifier:
    """One notifier: `run` follows the cluster until `stop` is set."""

    def __init__(self, spec: ClusterSpec, client: Client, config: NotifyConfig) -> None:
        self.spec = spec
        self.config = config
        self.follower = CardFollower(spec, client)
        self.metrics = NotifyMetrics()
        self.state = NotifyState.load(config.state_file, spec.chain_id)
        self._slots = asyncio.Semaphore(DELIVERIES_AT_ONCE_MAX)
        self._under_way: dict[str, int] = {}  # pair -> the height its card was certified at
        self._tasks: set[asyncio.Task[None]] = set()
        self._seen_height = 0
        self._verdicts_unsaved = 0
        self._stopping = False

    async def run(self, stop: asyncio.Event) -> None:
        follow = asyncio.create_task(self._follow())
        waiter = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({follow, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._stopping = True
            await self._cancel([follow, waiter, *self._tasks])
            self._save()

    async def _cancel(self, tasks: list[asyncio.Task[None]]) -> None:
        """Cancel `tasks` and wait for them, STOP_S_MAX at most. A cancellation can be lost
        in Python 3.11's `asyncio.wait_for` when its awaitable completes at the same moment,
        so it is repeated (and `_follow` also checks `_stopping` on its own)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_S_MAX
        pending = set(tasks)
        while pending and loop.time() < deadline:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=STOP_POLL_S)
        if pending:
            log.warning("event=stop_incomplete tasks=%d", len(pending))

    async def _follow(self) -> None:
        while not self._stopping:
            try:
                start = self._resume_height() or await self.follower.start_height(
                    FIRST_RUN_BACK_HEIGHTS
                )
                stream = self.follower.follow(start, FOLLOW_IDLE_S, self._known)
                async with contextlib.aclosing(stream):
                    await self._take(stream)
            except Exception:  # the stream broke (a restart of the cluster): read again
                log.exception("event=follow_failed")
            if not self._stopping:
                await asyncio.sleep(FOLLOW_RETRY_S)

    async def _take(self, stream: AsyncIterator[tuple[int, Notice | None]]) -> None:
        async for height, notice in stream:
            if self._stopping:
                return
            self._seen_height = max(self._seen_height, height)
            self._verdicts_unsaved += 1
            if notice is not None:
                self.announce(notice)
            if notice is not None or self._verdicts_unsaved >= STATE_SAVE_VERDICTS:
                self._save()

    def announce(self, notice: Notice) -> None:
        """Queue a notice's messages to its principal's channels (those not yet delivered)."""
        route = self.config.route(notice.principal)
        if route is None:
            return  # not a principal this notifier serves
        channels = [c for c, on in ((WEBHOOK, route.webhook), (EMAIL, route.email)) if on]
        for channel in channels:
            pair = f"{notice.digest}:{channel}"
            if self.state.done(pair) or pair in self._under_way:
                continue
            if len(self._under_way) >= QUEUE_MESSAGES_MAX:
                self.metrics.failed.labels(channel).inc()
                log.warning("event=queue_full channel=%s", channel)
                continue
            self._under_way[pair] = notice.height
            task = asyncio.create_task(self._deliver(pair, channel, route, notice))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.metrics.queue.set(len(self._under_way))

    async def _deliver(self, pair: str, channel: str, route: Route, notice: Notice) -> None:
        """Try until delivered or DELIVERY_TRIES_MAX; then the pair is done either way. A
        stop (cancellation) leaves it under way, so the saved resume point keeps its card."""
        if await self._tries(channel, route, notice):
            self.metrics.delivered.labels(channel).inc()
            self.state.mark(pair)
        else:
            self.metrics.failed.labels(channel).inc()
        self._under_way.pop(pair, None)
        self.metrics.queue.set(len(self._under_way))
        self._save()

    async def _tries(self, channel: str, route: Route, notice: Notice) -> bool:
        wait = RETRY_WAIT_S_MIN
        for attempt in range(1, DELIVERY_TRIES_MAX + 1):
            try:
                async with self._slots:
                    await asyncio.to_thread(self._send_once, channel, route, notice)
                return True
            except SendFailed as err:
                log.info("event=send_failed channel=%s try=%d cause=%s", channel, attempt, err)
            if attempt < DELIVERY_TRIES_MAX:
                self.metrics.retries.labels(channel).inc()
                await asyncio.sleep(wait)
                wait = min(wait * 2, RETRY_WAIT_S_MAX)
        return False

    def _send_once(self, channel: str, route: Route, notice: Notice) -> None:
        console = self.config.console_url
        if channel == WEBHOOK:
            post_webhook(route, notice, notice.body(console), int(time.time()))
        else:
            smtp = self.config.smtp
            assert smtp is not None  # the configuration requires it for an address
            send_mail(smtp, mail_message(smtp, route, notice, console))

    def _known(self, digest: bytes) -> bool:
        """A card announced already: a message of it delivered or under way."""
        prefix = digest.hex() + ":"
        pairs = (*self._under_way, *(self.state.delivered or ()))
        return any(pair.startswith(prefix) for pair in pairs)

    def _resume_height(self) -> int:
        """The oldest card still under way, else the newest height read, read again in
        case the stream broke inside it (0: nothing read yet)."""
        if not self._seen_height:
            return self.state.next_height
        return min([*self._under_way.values(), self._seen_height])

    def _save(self) -> None:
        self.state.next_height = self._resume_height()
        self._verdicts_unsaved = 0
        try:
            self.state.save(self.config.state_file)
        except OSError as err:
            log.warning("event=state_not_saved cause=%s", err.strerror)
