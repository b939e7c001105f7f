"""`SyncClient`: the blocking face of `Client`, for callers without an event loop.

It runs its own event loop in a daemon thread and hands every call to it
(`run_coroutine_threadsafe`), so channels live as long as the client and a blocking caller
never needs a loop of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import OWNER_KEY_FILE, ClusterSpec, load_cluster, read_seed
from quorumgate.proto.model import (
    AdminOp,
    Argument,
    Mandate,
    TargetRule,
    ToolRules,
    ToolSpec,
    TxPayload,
)
from quorumgate.sdk.client import DELEGATION_TTL_S_DEFAULT, NO_TARGET, Client, required_key
from quorumgate.sdk.epochs import Epochs
from quorumgate.sdk.errors import ClusterUnavailable, QuorumGateError
from quorumgate.sdk.registry import Registry
from quorumgate.sdk.values import Decision, Grant, Handle, OpenCard, Submitted
from quorumgate.sidecar.engine.statements import ConfirmationCard

__all__ = ["SyncClient"]

T = TypeVar("T")

# A SyncClient call never blocks longer than this, whatever the coroutine's own deadlines
# (they are all shorter); a safety net against a stuck channel, not a tuning knob.
SYNC_CALL_TIMEOUT_S = 300.0


class _LoopThread:
    """One event loop run forever by one daemon thread: where a SyncClient's coroutines,
    and those of every client sharing it (`SyncClient.with_key`), run."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="quorumgate-client", daemon=True
        )
        self.thread.start()
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class SyncClient:
    """Blocking wrapper around `Client`: one daemon thread runs one event loop
    for the client's whole life, and each method hands its coroutine to it and waits.
    Safe to call from any number of threads; never from inside the client's own loop.
    `aio` is the wrapped async client (bound to that loop); `bridge` awaits one of its
    coroutines from another event loop."""

    def __init__(
        self,
        spec: ClusterSpec,
        key: SigningKey,
        *,
        share: SyncClient | None = None,
        **options: Any,
    ) -> None:
        """A client of the cluster in `spec` signing with `key`; `options` as for `Client`.
        With `share`, it runs on that client's thread and event loop and uses its channels
        (what `with_key` makes): closing it then frees nothing, and `share` is closed last."""
        if share is None:
            self._runner = _LoopThread()
            self.aio = Client(spec, key, **options)
        else:
            if options or share.spec.chain_id != spec.chain_id:
                raise ValueError("a client sharing another's takes its cluster and options")
            self._runner = share._runner
            self.aio = share.aio.with_key(key)
        self._owns_runner = share is None
        self._closed = False

    def with_key(self, key: SigningKey) -> SyncClient:
        """A client for another key sharing this one's thread, event loop and channels
        (see `Client.with_key`). Closing it frees nothing; close this client last."""
        return SyncClient(self.spec, key, share=self)

    @classmethod
    def from_files(
        cls, directory: str | Path, key_file: str | Path | None = None, **options: Any
    ) -> SyncClient:
        """As `Client.from_files`: the key file is required."""
        spec = load_cluster(Path(directory))
        return cls(spec, required_key(key_file, "SyncClient"), **options)

    @classmethod
    def as_owner(cls, directory: str | Path, **options: Any) -> SyncClient:
        """The cluster in `directory`, signing as its owner (`DIR/owner.key`)."""
        spec = load_cluster(Path(directory))
        return cls(spec, SigningKey(read_seed(spec.directory / OWNER_KEY_FILE)), **options)

    @property
    def spec(self) -> ClusterSpec:
        return self.aio.spec

    @property
    def public_key(self) -> bytes:
        return self.aio.public_key

    def __repr__(self) -> str:
        return f"SyncClient(chain={self.spec.chain_id}, signer={self.public_key.hex()[:16]})"

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one coroutine of `aio` on the client's loop and wait for its result."""
        if self._closed or self._runner.stopped:
            coro.close()
            raise RuntimeError("SyncClient is closed")
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._runner.loop:
            coro.close()
            raise RuntimeError("SyncClient called from its own event loop")
        future = asyncio.run_coroutine_threadsafe(coro, self._runner.loop)
        try:
            return future.result(timeout=SYNC_CALL_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ClusterUnavailable("client_call_timeout") from None

    async def bridge(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await one coroutine of `aio` from another event loop."""
        future = asyncio.run_coroutine_threadsafe(coro, self._runner.loop)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        if self._closed:
            return
        if not self._owns_runner:  # the loop and the channels are the shared client's
            self._closed = True
            return
        asyncio.run_coroutine_threadsafe(self.aio.close(), self._runner.loop).result()
        self._closed = True
        self._runner.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # one blocking method per async one; each is `run(self.aio.<method>(...))`

    def sync_nonce(self) -> int:
        return self.run(self.aio.sync_nonce())

    def submit(self, payload: TxPayload) -> Submitted:
        return self.run(self.aio.submit(payload))

    def submit_many(self, payloads: Iterable[TxPayload]) -> list[Submitted | QuorumGateError]:
        return self.run(self.aio.submit_many(list(payloads)))

    def await_certificate(
        self,
        proposal_id: bytes,
        deadline_s: float | None = None,
        *,
        settled: bool = False,
        nonce: int | None = None,
    ) -> Decision:
        return self.run(
            self.aio.await_certificate(proposal_id, deadline_s, settled=settled, nonce=nonce)
        )

    def decide(self, payload: TxPayload, deadline_s: float | None = None) -> Decision:
        return self.run(self.aio.decide(payload, deadline_s))

    def propose(
        self,
        tool: str,
        target: str = NO_TARGET,
        arguments: Sequence[Argument] | Mapping[str, str | Handle] = (),
        *,
        run_id: str,
        grant: Grant | bytes | None = None,
        deadline_s: float | None = None,
        targets: Sequence[tuple[str, str]] = (),
    ) -> Decision:
        return self.run(
            self.aio.propose(
                tool,
                target,
                arguments,
                run_id=run_id,
                grant=grant,
                deadline_s=deadline_s,
                targets=targets,
            )
        )

    def registry(self, deadline_s: float | None = None) -> Registry:
        return self.run(self.aio.registry(deadline_s))

    def epochs(self) -> Epochs:
        return self.run(self.aio.epochs())

    def pending_card(self, proposal_id: bytes, deadline_s: float | None = None) -> ConfirmationCard:
        return self.run(self.aio.pending_card(proposal_id, deadline_s))

    def confirm(
        self, proposal_id: bytes, card_digest: bytes | None = None, deadline_s: float | None = None
    ) -> Decision:
        return self.run(self.aio.confirm(proposal_id, card_digest, deadline_s))

    def reject(
        self, proposal_id: bytes, card_digest: bytes | None = None, deadline_s: float | None = None
    ) -> Decision:
        return self.run(self.aio.reject(proposal_id, card_digest, deadline_s))

    def pending(self, deadline_s: float | None = None) -> list[OpenCard]:
        return self.run(self.aio.pending(deadline_s))

    def delegate(
        self,
        child_public_key: bytes,
        run_id: str,
        tools: Sequence[str] | None = None,
        *,
        ttl_s: float = DELEGATION_TTL_S_DEFAULT,
        parent_grant: Grant | bytes | None = None,
        deadline_s: float | None = None,
        rules: Sequence[ToolRules] = (),
    ) -> Grant:
        return self.run(
            self.aio.delegate(
                child_public_key,
                run_id,
                tools,
                ttl_s=ttl_s,
                parent_grant=parent_grant,
                deadline_s=deadline_s,
                rules=rules,
            )
        )

    def revoke(self, grant: Grant | bytes, deadline_s: float | None = None) -> Decision:
        return self.run(self.aio.revoke(grant, deadline_s))

    def run_of(self, label: str) -> str | None:
        return self.aio.run_of(label)

    def run_under(self, grant: Grant | bytes | None, run_id: str) -> str:
        return self.aio.run_under(grant, run_id)

    def agent_id(self) -> str | None:
        return self.run(self.aio.agent_id())

    def seal_envelope(
        self,
        kind: str,
        value: bytes | str,
        sinks: Mapping[str, bytes],
        *,
        owner_principal: str | None = None,
        deadline_s: float | None = None,
    ) -> Handle:
        return self.run(
            self.aio.seal_envelope(
                kind, value, sinks, owner_principal=owner_principal, deadline_s=deadline_s
            )
        )

    def admin(self, op: AdminOp, deadline_s: float | None = None) -> Decision:
        return self.run(self.aio.admin(op, deadline_s))

    def register_tool(self, spec: ToolSpec, deadline_s: float | None = None) -> Decision:
        return self.run(self.aio.register_tool(spec, deadline_s))

    def register_agent(
        self,
        agent_id: str,
        public_key: bytes,
        deadline_s: float | None = None,
        *,
        principal: str = "",
    ) -> Decision:
        return self.run(
            self.aio.register_agent(agent_id, public_key, deadline_s, principal=principal)
        )

    def register_principal(
        self,
        principal_id: str,
        public_key: bytes,
        deadline_s: float | None = None,
        *,
        deputies: Sequence[str] = (),
    ) -> Decision:
        return self.run(
            self.aio.register_principal(principal_id, public_key, deadline_s, deputies=deputies)
        )

    def rotate_key(
        self,
        holder: str,
        subject_id: str,
        new_key: SigningKey,
        *,
        old_public_key: bytes | None = None,
        deadline_s: float | None = None,
    ) -> Decision:
        return self.run(
            self.aio.rotate_key(
                holder, subject_id, new_key, old_public_key=old_public_key, deadline_s=deadline_s
            )
        )

    def set_entries(
        self,
        agent_id: str,
        name: str,
        entries: Sequence[TargetRule],
        deadline_s: float | None = None,
    ) -> Decision:
        return self.run(self.aio.set_entries(agent_id, name, entries, deadline_s))

    def set_run_targets(
        self,
        agent_id: str,
        run_id: str,
        targets: Sequence[str],
        deadline_s: float | None = None,
    ) -> Decision:
        return self.run(self.aio.set_run_targets(agent_id, run_id, targets, deadline_s))

    def set_settings(
        self,
        values: Mapping[str, int] | None = None,
        *,
        clear: Sequence[str] = (),
        deadline_s: float | None = None,
    ) -> Decision:
        return self.run(self.aio.set_settings(values, clear=clear, deadline_s=deadline_s))

    def register_sink(
        self, sink_id: str, public_key: bytes, deadline_s: float | None = None
    ) -> Decision:
        return self.run(self.aio.register_sink(sink_id, public_key, deadline_s))

    def set_mandate(
        self, agent_id: str, mandate: Mandate, deadline_s: float | None = None
    ) -> Decision:
        return self.run(self.aio.set_mandate(agent_id, mandate, deadline_s))

    def suspend(self, agent_id: str, deadline_s: float | None = None) -> Decision:
        return self.run(self.aio.suspend(agent_id, deadline_s))

    def resume(self, agent_id: str, deadline_s: float | None = None) -> Decision:
        return self.run(self.aio.resume(agent_id, deadline_s))
