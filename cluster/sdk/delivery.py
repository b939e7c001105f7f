"""How a client's transactions reach the replicas, and how the sidecars' answers are gathered.

- **Channels.** `ChannelPool` holds one gRPC channel per replica and per sidecar, made in the
  event loop that first needs them; clients of many keys can share one pool.
- **Idempotent delivery.** `deliver` offers the same signed bytes to the replicas in turn: on
  UNAVAILABLE or DEADLINE_EXCEEDED the *same bytes* go to the next replica
  (`SUBMIT_ROUNDS_MAX` rounds over all of them). A transaction's id is
  `sha256(signer || nonce)`, so a copy that did land is the same proposal, and a later
  "replayed" answer to a copy of bytes that may have landed means they did.
  RESOURCE_EXHAUSTED (a full mempool) is retried with exponential back-off from
  `BACKOFF_S_MIN` to `BACKOFF_S_MAX`, at most `OVERLOAD_RETRIES_MAX` times.
- **Reads.** `gather_answers` asks every sidecar at once and returns when enough answered;
  `raise_if_read_refused` turns f+1 refusals of a read into `ReadNotAuthorized`
  (docs/security/reads-and-certificates.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.runtime.channels import aio_channel
from quorumgate.sdk.errors import (
    ClusterUnavailable,
    Overloaded,
    ReadNotAuthorized,
    Refused,
    Replayed,
)

__all__ = [
    "ChannelPool",
    "Channels",
    "FreshReplay",
    "ReplicaRotation",
    "cancel_all",
    "deliver",
    "gather_answers",
    "raise_if_read_refused",
    "raise_if_refused",
]

T = TypeVar("T")

RPC_TIMEOUT_S = 2.0  # one unary call to one replica or sidecar
SUBMIT_ROUNDS_MAX = 3  # rounds over every replica on UNAVAILABLE / DEADLINE_EXCEEDED
OVERLOAD_RETRIES_MAX = 8  # RESOURCE_EXHAUSTED answers retried before `Overloaded`
BACKOFF_S_MIN = 0.05
BACKOFF_S_MAX = 1.0

TRANSPORT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
READ_REFUSAL_CODES = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
REASON_TRAILER = "qg-reason"

log = logging.getLogger("quorumgate.client")


class FreshReplay(Exception):
    """ALREADY_EXISTS for bytes no earlier attempt could have delivered: the nonce is held
    by another transaction, so the caller signs again with a fresh one."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------------------- channels


class Channels:
    """One channel per replica and per sidecar."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.replica_channels = [aio_channel(spec, m.index) for m in spec.members]
        self.sidecar_channels = [aio_channel(spec, m.index, "sidecar") for m in spec.members]
        self.replicas = [cpb_grpc.ReplicaStub(c) for c in self.replica_channels]
        self.sidecars = [spb_grpc.SidecarStub(c) for c in self.sidecar_channels]

    async def close(self) -> None:
        for channel in (*self.replica_channels, *self.sidecar_channels):
            await channel.close()

    async def resize(self, spec: ClusterSpec) -> None:
        """As many members as `spec` has: channels to each member an `add` brought, and
        those to each member a `remove` took out closed (the highest indexes: a live
        `remove` renumbers no one)."""
        while len(self.replicas) > spec.n:
            self.replicas.pop()
            self.sidecars.pop()
            for channel in (self.replica_channels.pop(), self.sidecar_channels.pop()):
                await channel.close()
        while len(self.replicas) < spec.n:
            index = len(self.replicas)
            self.replica_channels.append(aio_channel(spec, index))
            self.sidecar_channels.append(aio_channel(spec, index, "sidecar"))
            self.replicas.append(cpb_grpc.ReplicaStub(self.replica_channels[index]))
            self.sidecars.append(spb_grpc.SidecarStub(self.sidecar_channels[index]))

    async def relink(self, spec: ClusterSpec, index: int) -> None:
        """New channels to member `index`'s replica and sidecar where `spec` has them (a
        new machine after a `replace`); the old ones are closed."""
        old = self.replica_channels[index], self.sidecar_channels[index]
        self.replica_channels[index] = aio_channel(spec, index)
        self.sidecar_channels[index] = aio_channel(spec, index, "sidecar")
        self.replicas[index] = cpb_grpc.ReplicaStub(self.replica_channels[index])
        self.sidecars[index] = spb_grpc.SidecarStub(self.sidecar_channels[index])
        for channel in old:
            await channel.close()


class ChannelPool:
    """gRPC channels to every replica and sidecar of one cluster, made in the event loop
    that first needs them and usable from that loop only. Clients of many keys can share
    one pool (`Client(..., pool=pool)`, `Client.with_key`): an orchestrator with a hundred
    agents then holds 2n channels, not 200n. A client closes only a pool it made itself;
    whoever made a shared pool closes it."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self._channels: Channels | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> Channels:
        loop = asyncio.get_running_loop()
        if self._channels is None:
            self._channels = Channels(self.spec)
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError(
                "a Client (and its channel pool) is bound to the event loop that first used "
                "it; use one client per loop, or SyncClient from threads"
            )
        return self._channels

    async def close(self) -> None:
        if self._channels is not None:
            await self._channels.close()
            self._channels = None

    async def follow(self, spec: ClusterSpec) -> list[int]:
        """Reach the cluster as `spec` describes it (`Client.epochs` found members
        replaced by new machines): the channels of each member whose address or TLS
        certificate changed are made anew. Returns those members."""
        moved = [
            m.index
            for m in spec.members[: self.spec.n]
            if (m.host, m.replica_port, m.sidecar_port, m.tls_cert)
            != (
                (o := self.spec.member(m.index)).host,
                o.replica_port,
                o.sidecar_port,
                o.tls_cert,
            )
        ]
        grown = [m.index for m in spec.members[self.spec.n :]]  # (an `add`'s members)
        self.spec = spec
        if self._channels is not None:
            for index in moved:
                await self._channels.relink(spec, index)
            await self._channels.resize(spec)
        return moved + grown


class ReplicaRotation:
    """Every replica once per `order()`, starting one further each call, so that one
    client's submissions spread over the replicas."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._cursor = 0

    def order(self) -> list[int]:
        start = self._cursor % self.n
        self._cursor += 1
        return [(start + k) % self.n for k in range(self.n)]


async def cancel_all(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel every task and wait until each has finished (whatever it raised)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# ---------------------------------------------------------------------------- submitting


def reason_of(err: grpc.aio.AioRpcError | grpc.RpcError) -> str:
    """The replica's reason code for a refusal (its `qg-reason` trailer), or ""."""
    trailers: Any = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == REASON_TRAILER:
            return str(value)
    return ""


def never_connected(err: grpc.aio.AioRpcError) -> bool:
    """UNAVAILABLE before any connection: the bytes certainly did not arrive."""
    details = (err.details() or "").lower()
    return err.code() is grpc.StatusCode.UNAVAILABLE and (
        "failed to connect" in details or "connection refused" in details
    )


class _Attempts:
    """What one delivery has learnt so far, across replicas and rounds."""

    def __init__(self) -> None:
        self.uncertain = False  # an earlier attempt may have delivered these bytes
        self.overloads = 0
        self.backoff = BACKOFF_S_MIN
        self.replayed_by: set[int] = set()  # replicas that answered "replayed" for the bytes

    async def pause(self) -> None:
        await asyncio.sleep(self.backoff)
        self.backoff = min(self.backoff * 2, BACKOFF_S_MAX)


async def deliver(
    replicas: Sequence[cpb_grpc.ReplicaStub],
    data: bytes,
    rotation: ReplicaRotation,
    rpc_timeout_s: float,
) -> None:
    """Offer the same bytes to replicas until one admits them (module docstring). Raises
    `FreshReplay` when the nonce is certainly held by another transaction."""
    attempts = _Attempts()
    for _round in range(SUBMIT_ROUNDS_MAX):
        for index in rotation.order():
            if index in attempts.replayed_by:
                continue
            if await _offer(replicas, index, data, attempts, rpc_timeout_s):
                return
        await attempts.pause()
    if attempts.replayed_by and not attempts.uncertain:
        raise FreshReplay("replayed")
    raise ClusterUnavailable("replicas_unreachable" if not attempts.uncertain else "no_admission")


async def _offer(
    replicas: Sequence[cpb_grpc.ReplicaStub],
    index: int,
    data: bytes,
    attempts: _Attempts,
    rpc_timeout_s: float,
) -> bool:
    """Offer the bytes to replica `index`, again after each back-pressure pause: True once
    they are (or certainly were) admitted, False to move on to the next replica."""
    while True:
        try:
            await replicas[index].Submit(cpb.SubmitRequest(tx=data), timeout=rpc_timeout_s)
            return True
        except grpc.aio.AioRpcError as err:
            failure = err
        code = failure.code()
        reason = reason_of(failure)
        if code in TRANSPORT_CODES:
            if not never_connected(failure):
                attempts.uncertain = True
            log.debug("event=submit_retry replica=%d code=%s", index, code.name)
            return False  # the next replica
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            attempts.overloads += 1
            if attempts.overloads > OVERLOAD_RETRIES_MAX:
                raise Overloaded(reason or "overloaded", code.name)
            log.debug("event=submit_backoff replica=%d delay_s=%.3f", index, attempts.backoff)
            await attempts.pause()
            continue  # the same replica again, after the pause
        if code is grpc.StatusCode.ALREADY_EXISTS:
            if attempts.uncertain and reason != "conflicting_nonce":
                return True  # our own earlier copy landed: the same transaction
            if attempts.uncertain:
                raise Replayed(reason, code.name)
            if reason == "conflicting_nonce":
                raise FreshReplay(reason)  # another transaction holds it
            # "replayed": spent, or only ahead of a replica that lags behind the cluster
            # (its window has not moved yet): ask the others
            attempts.replayed_by.add(index)
            if len(attempts.replayed_by) == len(replicas):
                raise FreshReplay(reason)
            return False
        raise Refused(reason or code.name.lower(), code.name)


# ---------------------------------------------------------------------------- reading


async def gather_answers(
    sidecars: Sequence[spb_grpc.SidecarStub],
    call: Callable[[spb_grpc.SidecarStub], Coroutine[Any, Any, T]],
    *,
    enough: int,
    refused: dict[int, grpc.StatusCode] | None = None,
) -> dict[int, T]:
    """Ask every sidecar at once; return as soon as `enough` answered (or all tried).
    `refused` collects the sidecars that refused the read (`READ_REFUSAL_CODES`)."""
    tasks = {asyncio.ensure_future(call(stub)): i for i, stub in enumerate(sidecars)}
    answers: dict[int, T] = {}
    try:
        pending = set(tasks)
        while pending and len(answers) < enough:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                err = task.exception()
                if err is None:
                    answers[tasks[task]] = task.result()
                elif (
                    refused is not None
                    and isinstance(err, grpc.aio.AioRpcError)
                    and err.code() in READ_REFUSAL_CODES
                ):
                    refused[tasks[task]] = err.code()
    finally:
        await cancel_all(list(tasks))
    return answers


def raise_if_refused(
    replies: Sequence[object],
    statuses: Mapping[int, spb.SidecarStatusReply],
    height: int,
    needed: int,
) -> None:
    """`ReadNotAuthorized` when f+1 sidecars that had executed `height` before they were
    asked refused the read: one of them is honest, and a key registered at or below the
    height asked (the f+1-th highest executed one) is known to every honest sidecar there,
    so the refusal is not a sidecar still behind the key's registration."""
    codes = [
        reply.code()
        for i, reply in enumerate(replies)
        if isinstance(reply, grpc.aio.AioRpcError)
        and reply.code() in READ_REFUSAL_CODES
        and i in statuses
        and statuses[i].executed_height >= height
    ]
    raise_if_read_refused(codes, needed)


def raise_if_read_refused(codes: Sequence[grpc.StatusCode], needed: int) -> None:
    """`ReadNotAuthorized` when `needed` (f+1) sidecars refused the read: PERMISSION_DENIED
    if any of them said so, else UNAUTHENTICATED (none could verify the statement)."""
    if len(codes) >= needed:
        denied = grpc.StatusCode.PERMISSION_DENIED in codes
        code = grpc.StatusCode.PERMISSION_DENIED if denied else grpc.StatusCode.UNAUTHENTICATED
        raise ReadNotAuthorized("read_not_authorized", code.name)
