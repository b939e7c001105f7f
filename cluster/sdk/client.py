"""The QuorumGate client: submit signed transactions, await verdict certificates.

Async first. `Client` holds one signing key (an agent's or the owner's), the
cluster file, and gRPC channels to every replica and every sidecar; it must be used from
one event loop (its channels are made on first use, in that loop). `SyncClient`
(`quorumgate.sdk.sync`) is the blocking wrapper for callers without a loop.

    async with Client.from_files("run/c4", key_file="agent.key") as qg:
        decision = await qg.propose("files.read", "/docs/a.txt", run_id="run-1")
        if decision.allowed: ...

What it promises:

- **Nonces.** Started from the sidecars' `Account.next_nonce` (f+1 of them asked, the
  largest answer taken) and counted up in memory; nothing is persisted. A nonce refused on
  arrival is given back, so a client never drifts past the engine's window
  (`quorumgate.sdk.nonces`), and `submit_many` signs no further ahead than the window
  allows: it waits for the cluster to execute before it signs more. One key should be
  driven by one client at a time: two clients counting the same key's nonces collide, and
  a collision costs a fresh nonce (`RESIGN_ON_REPLAY_MAX`), never a wrong answer.
- **Idempotent delivery.** A transaction is signed once and the same bytes are offered to
  the replicas in turn until one admits them (`quorumgate.sdk.delivery`).
- **Certificates.** `await_certificate` long-polls `GetReceipt` on every sidecar (each
  answers as soon as it has executed the verdict, or after `RECEIPT_WAIT_S`; one that does
  not wait is asked again with bounded back-off, `RECEIPT_POLL_S_MIN`..`RECEIPT_POLL_S_MAX`)
  until f+1 distinct sidecars return the same signed leaf, then assembles and checks the
  certificate against the cluster file's receipt keys (`quorumgate.sdk.certificates`).
  A receipt signed for another member's index or with a bad signature is dropped on arrival, so up
  to f lying sidecars can delay an answer but never change it.
- **What an agent may see.** Reason codes are for operators (docs/engine.md). They sit on
  attributes (`Decision.reason`, `QuorumGateError.reason`) and never in the `str()` or
  `repr()` of a decision or an exception. No argument value is ever logged or printed.

Refusals are typed (`quorumgate.sdk.errors`): `Refused` (with `Replayed`, `Overloaded` and
`ReadNotAuthorized`: a read f+1 sidecars refused this key, PERMISSION_DENIED),
`ClusterUnavailable`, `CertificateTimeout`, `InvalidCertificate`, `TransactionRejected` (an
administrative or agent transaction the engine did not apply).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from nacl.public import PublicKey, SealedBox
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto import tx as txlib
from quorumgate.proto.chainversions import commits_arguments, runs_opened_by_the_chain
from quorumgate.proto.clusterfile import OWNER_KEY_FILE, ClusterSpec, load_cluster, read_seed
from quorumgate.proto.commitments import call_salt
from quorumgate.proto.model import (
    Admin,
    AdminOp,
    Argument,
    Confirm,
    Delegate,
    KeyHolder,
    Mandate,
    Outcome,
    Proposal,
    RegisterAgent,
    RegisterPrincipal,
    RegisterSink,
    RegisterTool,
    Resume,
    Revoke,
    RoleTarget,
    SealedValue,
    SealEnvelope,
    SetEntries,
    SetMandate,
    SetRunTargets,
    SetSettings,
    Suspend,
    TargetRule,
    ToolRules,
    ToolSpec,
    TxBody,
    TxPayload,
    canonical_tool_list,
)
from quorumgate.proto.runs import RunLabels, opened_run
from quorumgate.runtime.readauth import (
    METHOD_ACCOUNT,
    METHOD_EPOCH_ENDS,
    METHOD_GET_RECEIPT,
    METHOD_PENDING,
    METHOD_RECEIPTS,
    METHOD_REGISTRY,
    read_auth_metadata,
)
from quorumgate.sdk.builders import call_arguments
from quorumgate.sdk.certificates import (
    agreed_cards,
    certify,
    receipt_or_none,
    receipt_signature_ok,
)
from quorumgate.sdk.delivery import (
    READ_REFUSAL_CODES,
    RPC_TIMEOUT_S,
    ChannelPool,
    Channels,
    FreshReplay,
    ReplicaRotation,
    cancel_all,
    deliver,
    gather_answers,
    raise_if_read_refused,
    raise_if_refused,
)
from quorumgate.sdk.epochs import EpochFollower, Epochs
from quorumgate.sdk.errors import (
    CertificateTimeout,
    ClusterUnavailable,
    EpochsUnverified,
    InvalidCertificate,
    Overloaded,
    QuorumGateError,
    ReadNotAuthorized,
    Refused,
    Replayed,
    TransactionRejected,
)
from quorumgate.sdk.nonces import NonceLedger
from quorumgate.sdk.registry import Registry, registry_from_pb
from quorumgate.sdk.values import Decision, Grant, Handle, OpenCard, Submitted, grant_id
from quorumgate.sidecar.engine.statements import ConfirmationCard, handle_for
from quorumgate.sidecar.receipts import Receipt, ReceiptEpochs

__all__ = ["Client", "required_key"]

# ---------------------------------------------------------------------------- limits

RESIGN_ON_REPLAY_MAX = 4  # fresh nonces tried when a first delivery is refused as replayed
RECEIPT_POLL_S_MIN = 0.005
RECEIPT_POLL_S_MAX = 0.1  # the commit itself takes ~60 ms on loopback: poll well within that
RECEIPT_WAIT_S = 1.0  # one GetReceipt long poll (the sidecars cap it at 1 s too)
NEWER_VERDICT_WAIT_S = 2.0  # how long a newer verdict, not yet certified, is waited for
CERTIFICATE_DEADLINE_S = 10.0  # default wait for f+1 agreeing receipts
# Transactions `submit_many` keeps on one stream before reading replies; well below the
# engine's nonce window (1024), which refuses nonces further ahead of the executed ones.
SUBMIT_MANY_BATCH_MAX = 512
WINDOW_WAIT_S_DEFAULT = 30.0  # submit_many: longest wait for the nonce window to move
RECEIPTS_PER_PROPOSAL_MAX = 64  # receipts held while waiting (one per sidecar is enough)
# Client.epochs: how many times it follows members to new machines before it gives up
# (each round needs a checked answer that moves at least one member).
EPOCHS_FOLLOW_ROUNDS_MAX = 4
RECEIPT_KEYS_REMEMBERED_MAX = 65_536  # (height, index) keys `certified_verdicts` holds
OWN_NONCES_REMEMBERED_MAX = 65_536  # proposal ids this client signed, with their nonces
DELEGATION_TTL_S_DEFAULT = 3600.0
NO_TARGET = ""  # what a tool that takes no target is proposed with

log = logging.getLogger("quorumgate.client")


def required_key(key_file: str | Path | None, client: str) -> SigningKey:
    """The signing key in `key_file`, which `client.from_files` insists on (see there)."""
    if key_file is None:
        raise ValueError(
            f"{client}.from_files needs the key file to sign with (an agent's, a "
            f"principal's...); to sign as the cluster owner, use {client}.as_owner(directory)"
        )
    return SigningKey(read_seed(Path(key_file)))


class Client:
    """See the module docstring. One signing key, one event loop."""

    def __init__(
        self,
        spec: ClusterSpec,
        key: SigningKey,
        *,
        rpc_timeout_s: float = RPC_TIMEOUT_S,
        certificate_deadline_s: float = CERTIFICATE_DEADLINE_S,
        pool: ChannelPool | None = None,
    ) -> None:
        if pool is not None and pool.spec.chain_id != spec.chain_id:
            raise ValueError("the channel pool belongs to another cluster")
        self.spec = spec
        # The cluster file's description, the trusted start of the chain of epochs;
        # `spec` follows the members replaced since (`epochs`).
        self._cluster_file = spec
        self.key = key
        self.public_key = bytes(key.verify_key)
        self.rpc_timeout_s = rpc_timeout_s
        self.certificate_deadline_s = certificate_deadline_s
        self.pool = pool if pool is not None else ChannelPool(spec)
        self._owns_pool = pool is None
        # proposal id -> nonce of what this client signed: proves "mine" to GetReceipt
        self._own_nonces: OrderedDict[bytes, int] = OrderedDict()
        self._run_labels = RunLabels()  # run label -> the run its first transaction opened
        # proposal id -> (tx id, nonce) of this client's Confirm of it: its verdict answers
        # for the proposal, and this proves it is ours to read
        self._confirmations: OrderedDict[bytes, tuple[bytes, int]] = OrderedDict()
        self._nonces = NonceLedger()
        self._nonce_lock: asyncio.Lock | None = None
        self._rotation = ReplicaRotation(spec.n)
        self._agent_id: str | None = None  # found by `agent_id`, then remembered
        # the owner's key: cluster.json's, or the one this client rotated it to
        self._owner_key = spec.owner_public_key
        # The chain of epochs checked so far, from cluster.json's members (`epochs`, made
        # on first use).
        self._epochs: EpochFollower | None = None
        # Each epoch's heights and receipt keys, what receipts and certificates are checked
        # against (docs/consensus/epochs.md, "Receipt keys"): cluster.json's epoch 0 until
        # `epochs` checks more, or the application sets them (a key that may not read the
        # epoch ends: an agent's, given the operator's `quorumgate epochs --json` file).
        self.receipt_epochs: ReceiptEpochs = ReceiptEpochs.genesis(spec.receipt_keys)

    @classmethod
    def from_files(
        cls, directory: str | Path, key_file: str | Path | None = None, **options: Any
    ) -> Client:
        """The cluster in `directory`, signing with the key in `key_file`. The key is not
        optional: a client that silently fell back to the owner's key would let a script
        that forgot its agent key administer the cluster. Sign as the owner only on
        purpose, with `as_owner`."""
        spec = load_cluster(Path(directory))
        return cls(spec, required_key(key_file, "Client"), **options)

    @classmethod
    def as_owner(cls, directory: str | Path, **options: Any) -> Client:
        """The cluster in `directory`, signing as its owner (`DIR/owner.key`)."""
        spec = load_cluster(Path(directory))
        return cls(spec, SigningKey(read_seed(spec.directory / OWNER_KEY_FILE)), **options)

    @property
    def is_owner(self) -> bool:
        return self.public_key == self._owner_key

    def __repr__(self) -> str:
        return f"Client(chain={self.spec.chain_id}, signer={self.public_key.hex()[:16]})"

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def with_key(self, key: SigningKey) -> Client:
        """A client for another key (another agent, a principal...) sharing this one's
        channels and timeouts. Close this client last: it owns the channels."""
        other = Client(
            self._cluster_file,
            key,
            rpc_timeout_s=self.rpc_timeout_s,
            certificate_deadline_s=self.certificate_deadline_s,
            pool=self.pool,
        )
        other.spec = self.spec  # (the members replaced that this client found)
        return other

    async def close(self) -> None:
        if self._owns_pool:
            await self.pool.close()

    def _ch(self) -> Channels:
        return self.pool.get()

    def _read_auth(self, method: str) -> tuple[tuple[str, str], ...]:
        """This client's signed read statement for one call (runtime/readauth.py)."""
        return read_auth_metadata(
            self.spec.chain_id,
            method,
            self.public_key,
            lambda message: bytes(self.key.sign(message).signature),
            int(time.time() * 1000),
        )

    def _remember_nonce(self, proposal_id: bytes, nonce: int) -> None:
        self._own_nonces[proposal_id] = nonce
        while len(self._own_nonces) > OWN_NONCES_REMEMBERED_MAX:
            self._own_nonces.popitem(last=False)

    # ------------------------------------------------------------------ reads

    async def sync_nonce(self) -> int:
        """Ask f+1 sidecars for this key's next executed nonce (the largest answer; it never
        goes back) and return the nonce this client signs with next."""
        needed = self.spec.f + 1
        refused: dict[int, grpc.StatusCode] = {}
        answers = await gather_answers(
            self._ch().sidecars,
            lambda stub: stub.Account(
                spb.AccountRequest(signer=self.public_key),
                timeout=self.rpc_timeout_s,
                metadata=self._read_auth(METHOD_ACCOUNT),
            ),
            enough=needed,
            refused=refused,
        )
        if len(answers) < needed:
            raise_if_read_refused(list(refused.values()), needed)
            raise ClusterUnavailable("sidecars_unreachable")
        self._nonces.sync(max(a.next_nonce for a in answers.values()))
        return self._nonces.next

    async def _take_nonce(self) -> int:
        if self._nonce_lock is None:
            self._nonce_lock = asyncio.Lock()
        async with self._nonce_lock:
            if not self._nonces.synced:
                await self.sync_nonce()
            return self._nonces.take()

    async def _wait_for_window(self, wanted: int, deadline_s: float) -> int:
        """Wait (polling the sidecars, bounded by `deadline_s`) until `wanted` more nonces
        fit in the engine's window; return how many fit then (0 if none by the deadline)."""
        if not self._nonces.synced:
            await self.sync_nonce()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        delay = RECEIPT_POLL_S_MIN
        while self._nonces.room() < wanted and loop.time() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECEIPT_POLL_S_MAX)
            await self.sync_nonce()
        return min(wanted, self._nonces.room())

    async def replica_status(self) -> dict[int, cpb.StatusReply]:
        """Status of every replica that answers, by member index."""
        stubs = self._ch().replicas

        async def one(stub: cpb_grpc.ReplicaStub) -> cpb.StatusReply:
            reply: cpb.StatusReply = await stub.Status(
                cpb.StatusRequest(), timeout=self.rpc_timeout_s
            )
            return reply

        results = await asyncio.gather(*(one(s) for s in stubs), return_exceptions=True)
        return {i: r for i, r in enumerate(results) if isinstance(r, cpb.StatusReply)}

    async def epochs(self) -> Epochs:
        """The member set of every epoch up to the newest one a replica proves, checked
        link by link from cluster.json's members (`quorumgate.sdk.epochs`; docs/consensus/
        epochs.md, "Followers: the chain of epochs"). Every replica is asked for its stored
        epoch ends; at least f+1 must answer (at least one honest replica among them).
        Each answer is checked from the chain this client checked before, so a later call
        checks only the new links; the longest that checks is kept, and one that does not
        is named in `Epochs.refused`. The epoch ends carry committed blocks: they answer
        the owner, the members and auditors only (`ReadNotAuthorized` otherwise).
        Raises `EpochsUnverified` when no answer checks."""
        async def ask(stub: cpb_grpc.ReplicaStub) -> cpb.EpochEndsReply:
            reply: cpb.EpochEndsReply = await stub.EpochEnds(
                cpb.EpochEndsRequest(),
                timeout=self.rpc_timeout_s,
                metadata=self._read_auth(METHOD_EPOCH_ENDS),
            )
            return reply

        needed = self.spec.f + 1
        for _ in range(EPOCHS_FOLLOW_ROUNDS_MAX):
            stubs = self._ch().replicas
            results = await asyncio.gather(*(ask(s) for s in stubs), return_exceptions=True)
            answers = {
                i: tuple(r.ends)
                for i, r in enumerate(results)
                if isinstance(r, cpb.EpochEndsReply)
            }
            unanswered = [i for i in range(len(results)) if i not in answers]
            if len(answers) >= needed:
                return await self._take_epochs(answers, unanswered)
            # Fewer than f+1 answer where this client looks for them: members may have
            # moved to new machines. An answer that checks is safe to follow whoever gives
            # it (each link is certified by a quorum of the epoch before it); the f+1 are
            # asked again where the checked chain says the members are, so that no single
            # replica can hold the client back on an old epoch.
            if not answers or not await self._follows_some(answers, unanswered):
                break
        codes = [
            r.code()
            for r in results
            if isinstance(r, grpc.aio.AioRpcError) and r.code() in READ_REFUSAL_CODES
        ]
        if len(codes) >= needed:
            raise ReadNotAuthorized("read_refused", codes[0].name)
        raise ClusterUnavailable("replicas_unreachable")

    async def _follows_some(
        self, answers: dict[int, tuple[cpb.StoredEpochEnd, ...]], unanswered: list[int]
    ) -> bool:
        """Whether the answers of fewer than f+1 replicas check and move this client to
        members at new machines (then it asks again)."""
        before = self.spec.members
        try:
            await self._take_epochs(answers, unanswered)
        except EpochsUnverified:
            return False
        return bool(self.spec.members != before)

    async def _take_epochs(
        self, answers: dict[int, tuple[cpb.StoredEpochEnd, ...]], unanswered: list[int]
    ) -> Epochs:
        if self._epochs is None:
            # The records are checked with cluster.json's owner key in epoch 0, and after an
            # owner record with the key it names, as the replicas check them (docs/
            # consensus/epochs.md, "Followers: the chain of epochs", "The record key").
            spec = self._cluster_file
            owner = spec.record_reader()
            self._epochs = EpochFollower(
                spec.membership(),
                owner if spec.runs_epochs else None,
                receipt_keys=spec.receipt_keys,
            )
        found = self._epochs.take(answers, unanswered)
        for replica, why in sorted(found.refused.items()):
            log.warning("replica %d's chain of epochs does not check: %s", replica, why)
        self.receipt_epochs = found.receipt_epochs
        # Members replaced by new machines (docs/consensus/epochs.md, "Replacing a
        # member"): this client reaches them, and checks their receipts, as the checked
        # chain's records describe them.
        now = found.cluster(self._cluster_file)
        if now.members != self.spec.members:
            moved = await self.pool.follow(now)
            self.spec = now
            log.info(
                "the cluster of epoch %d: members %s at new machines", found.current.epoch, moved
            )
        return found

    async def _learn_receipt_epochs(self) -> ReceiptEpochs | None:
        """The receipt epochs after asking the replicas (`epochs`), or None when this key
        may not read them or they cannot be had now: a receipt that names an epoch this
        client does not know is then dropped, as one it cannot check."""
        try:
            return (await self.epochs()).receipt_epochs
        except (ReadNotAuthorized, ClusterUnavailable, EpochsUnverified) as err:
            log.warning("event=receipt_epochs_unknown why=%s", type(err).__name__)
            return None

    async def sidecar_status(self) -> dict[int, spb.SidecarStatusReply]:
        """Status of every sidecar that answers, by member index."""
        stubs = self._ch().sidecars

        async def one(stub: spb_grpc.SidecarStub) -> spb.SidecarStatusReply:
            reply: spb.SidecarStatusReply = await stub.Status(
                spb.SidecarStatusRequest(), timeout=self.rpc_timeout_s
            )
            return reply

        results = await asyncio.gather(*(one(s) for s in stubs), return_exceptions=True)
        return {i: r for i, r in enumerate(results) if isinstance(r, spb.SidecarStatusReply)}

    async def registry(self, deadline_s: float | None = None) -> Registry:
        """Agents, mandates, tools and sinks as of one executed height, from the sidecars'
        `Registry` RPC: accepted when f+1 of them return the same content with the same
        height and state root (at least one of them honest). The height asked for is the
        highest that f+1 sidecars have executed; if the registry changes meanwhile, the
        client asks again, until `deadline_s` (then `ClusterUnavailable`). It holds what
        this key may read (`Registry.scope`); a key that may read none of it gets
        `ReadNotAuthorized` as soon as f+1 sidecars at that height refused it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.certificate_deadline_s if deadline_s is None else deadline_s)
        needed = self.spec.f + 1
        delay = RECEIPT_POLL_S_MIN
        while True:
            statuses = await self.sidecar_status()
            heights = sorted((s.executed_height for s in statuses.values()), reverse=True)
            if len(heights) >= needed:
                found = await self._registry_at(max(1, heights[needed - 1]), statuses)
                if found is not None:
                    return found
            if loop.time() >= deadline:
                raise ClusterUnavailable("registry_no_agreement")
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECEIPT_POLL_S_MAX)

    async def _registry_at(
        self, height: int, statuses: Mapping[int, spb.SidecarStatusReply]
    ) -> Registry | None:
        """The registry at `height` if f+1 sidecars return the same one (None if not yet);
        `ReadNotAuthorized` if f+1 that had executed it refused this key."""
        needed = self.spec.f + 1

        async def ask(stub: spb_grpc.SidecarStub) -> spb.RegistryReply:
            reply: spb.RegistryReply = await stub.Registry(
                spb.RegistryRequest(height=height),
                timeout=self.rpc_timeout_s,
                metadata=self._read_auth(METHOD_REGISTRY),
            )
            return reply

        stubs = self._ch().sidecars
        replies = await asyncio.gather(*(ask(s) for s in stubs), return_exceptions=True)
        raise_if_refused(replies, statuses, height, needed)
        groups: dict[tuple[int, bytes, str, bytes], list[int]] = {}
        for i, reply in enumerate(replies):
            if isinstance(reply, spb.RegistryReply) and reply.height == height:
                content = reply.content.SerializeToString(deterministic=True)
                group = (reply.height, reply.state_root, reply.scope, content)
                groups.setdefault(group, []).append(i)
        for members in groups.values():
            if len(members) >= needed:
                agreed = replies[members[0]]
                assert isinstance(agreed, spb.RegistryReply)
                try:
                    return registry_from_pb(agreed, tuple(members))
                except ValueError as err:
                    raise InvalidCertificate("registry_undecodable") from err
        return None

    async def agent_id(self) -> str | None:
        """The agent id this client's key is registered under, read from the registry f+1
        sidecars agree on (None if the key is no agent's). Once found it is remembered:
        an agent's id and key stay bound for the life of the registration, so the client
        does not ask the cluster again for each governed call."""
        if self._agent_id is not None:
            return self._agent_id
        registry = await self.registry()
        found = next((a.agent_id for a in registry.agents if a.public_key == self.public_key), None)
        if found is not None:
            self._agent_id = found
        return found

    # ------------------------------------------------------------------ submitting

    async def _deliver(self, data: bytes) -> None:
        """Offer the same bytes to the replicas until one admits them
        (`quorumgate.sdk.delivery.deliver`)."""
        await deliver(self._ch().replicas, data, self._rotation, self.rpc_timeout_s)

    async def submit_record(self, data: bytes) -> None:
        """Offer an owner-signed reconfiguration record (proto/membership.py `sign_record`)
        to the replicas until one admits it. It is the consensus core's: no sidecar
        certifies a verdict for it, the next epoch is its outcome (docs/consensus/
        epochs.md, "The live replica")."""
        await self._deliver(data)

    def bind_run(self, payload: TxPayload, nonce: int) -> TxPayload:
        """Runs by label: on chains of authority version 2 a run is named after the nonce
        of its owner's transaction that opened it (`quorumgate.proto.runs`), so a label this
        client has not used yet becomes the run this transaction opens, and one it has used
        stays in its run (`run_of`). A payload under a grant already names the grant's run
        (`run_under`); a run id `n<k>` passes as it is."""
        if not runs_opened_by_the_chain(self.spec.authority_version) or not isinstance(
            payload, Proposal | Delegate
        ):
            return payload
        grant = payload.grant if isinstance(payload, Proposal) else payload.parent_grant
        if grant is not None:
            return payload
        run = self._run_labels.bind(payload.run_id, nonce)
        return payload if run == payload.run_id else replace(payload, run_id=run)

    def salted(self, payload: TxPayload, nonce: int) -> TxPayload:
        """On a chain that commits arguments, a call signed at `nonce` carries its salt
        (`call_salt`: secret to anyone without this client's key, and the same again for
        the same nonce) and the keys of the auditors cluster.json lists, so the ledger
        holds a commitment to each argument that only those auditors can open
        (docs/audit.md, "Argument commitments"). A call that carries a salt keeps it."""
        if not commits_arguments(self.spec.receipt_version) or not isinstance(payload, Proposal):
            return payload
        if payload.commit_salt is not None:
            return payload
        salt = call_salt(bytes(self.key), self.spec.chain_id, nonce)
        auditors = tuple(a.public_key for a in self.spec.auditors)
        return replace(payload, commit_salt=salt, seal_to=auditors)

    def run_under(self, grant: Grant | bytes | None, run_id: str) -> str:
        """The run id a call under `grant` carries. Where the chain opens runs
        (`runs_opened_by_the_chain`), a grant is for one run, which a `Grant` names: the
        call acts in that run, whatever label `run_id` is. A plain grant id does not say
        its run, and an older chain names runs by label: then `run_id` as it is."""
        by_chain = runs_opened_by_the_chain(self.spec.authority_version)
        if not by_chain or not isinstance(grant, Grant):
            return run_id
        return grant.run_id or run_id

    def run_of(self, label: str) -> str | None:
        """The run id a label names for this client (the label itself on a chain of
        authority version 1; None before the label's first transaction)."""
        if not runs_opened_by_the_chain(self.spec.authority_version):
            return label
        return label if opened_run(label) is not None else self._run_labels.get(label)

    async def submit(self, payload: TxPayload) -> Submitted:
        """Sign `payload` with the next nonce and deliver it; return once a replica admitted
        it. Use `await_certificate` (or `decide`) for the verdict."""
        kind = TxBody(chain_id=self.spec.chain_id, nonce=1, payload=payload).kind
        for _attempt in range(RESIGN_ON_REPLAY_MAX + 1):
            nonce = await self._take_nonce()
            bound = self.salted(self.bind_run(payload, nonce), nonce)
            data = txlib.build(self.spec.chain_id, nonce, bound, self.key)
            proposal_id = txlib.tx_id(self.public_key, nonce)
            settled = False
            try:
                await self._deliver(data)
            except FreshReplay:
                log.info("event=nonce_taken nonce=%d action=resign", nonce)
                await self.sync_nonce()
                self._nonces.held_elsewhere(nonce)
                settled = True
                continue
            except ClusterUnavailable as err:
                if err.reason == "replicas_unreachable":
                    self._nonces.refused(nonce)
                    settled = True
                err.proposal_id = proposal_id
                raise
            except Refused as err:
                if type(err) is Refused:
                    self._nonces.refused(nonce)  # refused on arrival: certainly not admitted
                    settled = True
                err.proposal_id = proposal_id
                raise
            finally:
                if not settled:  # admitted, or it may have been: the nonce is spent
                    self._nonces.delivered(nonce)
            log.debug(
                "event=submitted kind=%s proposal=%s nonce=%d",
                kind.value,
                proposal_id.hex()[:16],
                nonce,
            )
            self._remember_nonce(proposal_id, nonce)
            return Submitted(proposal_id, nonce, kind, self.public_key, data)
        raise Replayed("replayed", grpc.StatusCode.ALREADY_EXISTS.name)

    async def submit_many(
        self, payloads: Iterable[TxPayload], *, window_wait_s: float = WINDOW_WAIT_S_DEFAULT
    ) -> list[Submitted | QuorumGateError]:
        """Sign and stream many transactions (`SubmitStream`), in batches of at most
        `SUBMIT_MANY_BATCH_MAX`; one result per payload, in order: a `Submitted` or the
        error for that one. A batch whose stream breaks is delivered one by one, with the
        same bytes, through the retrying path.

        It never signs past the engine's nonce window (`NONCE_WINDOW` nonces above what
        the cluster executed): when the window is full it waits for execution to move it,
        up to `window_wait_s` at a time; payloads still waiting then are answered
        `Overloaded("nonce_window_full")`, unsigned, and cost no nonce.

        Order: the payloads are signed with ascending nonces and streamed in that order to
        one replica, and any one leader proposes a signer's transactions in nonce order,
        so they usually execute in order. The cluster does not promise it: the engine
        accepts nonces out of order within the window, and a leader may propose a later
        transaction before an earlier one reaches it (a retry through another replica).
        When one operation depends on another (register a tool, then call it), await the
        first one's certificate before submitting the second, as `OwnerSession` does."""
        items = list(payloads)
        results: list[Submitted | QuorumGateError] = []
        start = 0
        while start < len(items):
            wanted = min(SUBMIT_MANY_BATCH_MAX, len(items) - start)
            fits = await self._wait_for_window(wanted, window_wait_s)
            if fits == 0:
                for _ in items[start:]:
                    results.append(Overloaded("nonce_window_full", "RESOURCE_EXHAUSTED"))
                break
            batch = items[start : start + fits]
            results.extend(await self._submit_batch(batch))
            start += fits
        return results

    async def _submit_batch(self, batch: list[TxPayload]) -> list[Submitted | QuorumGateError]:
        """Sign a batch, stream it to one replica, and settle each transaction by its
        reply: admitted, refused, or delivered again one by one (`_settle`)."""
        signed: list[Submitted] = []
        for payload in batch:
            nonce = await self._take_nonce()
            bound = self.salted(self.bind_run(payload, nonce), nonce)
            data = txlib.build(self.spec.chain_id, nonce, bound, self.key)
            kind = TxBody(chain_id=self.spec.chain_id, nonce=nonce, payload=payload).kind
            sub = Submitted(txlib.tx_id(self.public_key, nonce), nonce, kind, self.public_key, data)
            signed.append(sub)
        replies = await self._stream_batch(signed)
        return [await self._settle(sub, replies.get(k)) for k, sub in enumerate(signed)]

    async def _stream_batch(self, signed: Sequence[Submitted]) -> dict[int, cpb.SubmitReply]:
        """Stream signed transactions to the next replica (`SubmitStream`) and collect its
        replies by position in the batch; a broken stream leaves the rest unanswered."""
        requests = [cpb.SubmitRequest(tx=sub.tx, request_id=k) for k, sub in enumerate(signed)]
        replies: dict[int, cpb.SubmitReply] = {}
        index = self._rotation.order()[0]
        try:
            stream = (
                self._ch()
                .replicas[index]
                .SubmitStream(
                    iter([cpb.SubmitBatch(requests=requests)]),
                    timeout=self.rpc_timeout_s + 0.01 * len(signed),
                )
            )
            async for reply_batch in stream:
                for reply in reply_batch.replies:
                    replies[reply.request_id] = reply
        except grpc.aio.AioRpcError as err:
            log.debug("event=submit_stream_broken replica=%d code=%s", index, err.code().name)
        return replies

    async def _settle(
        self, sub: Submitted, reply: cpb.SubmitReply | None
    ) -> Submitted | QuorumGateError:
        """One streamed transaction's outcome, its nonce accounted for either way."""
        if reply is not None and reply.accepted:
            self._nonces.delivered(sub.nonce)
            self._remember_nonce(sub.proposal_id, sub.nonce)
            return sub
        code = grpc.StatusCode.UNAVAILABLE
        if reply is not None:
            code = next((c for c in grpc.StatusCode if c.value[0] == reply.code), code)
        if reply is not None and code not in (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.ALREADY_EXISTS,
        ):
            self._nonces.refused(sub.nonce)
            return Refused(reply.reason, code.name, proposal_id=sub.proposal_id)
        # No answer, back-pressure, or "replayed" from one replica (which may only lag
        # behind the others): the same bytes through the retrying path.
        try:
            await self._deliver(sub.tx)
        except FreshReplay as err:
            await self.sync_nonce()
            self._nonces.held_elsewhere(sub.nonce)
            return Replayed(err.reason, proposal_id=sub.proposal_id)
        except QuorumGateError as err:
            if isinstance(err, ClusterUnavailable) and err.reason == "replicas_unreachable":
                self._nonces.refused(sub.nonce)
            else:
                self._nonces.delivered(sub.nonce)
            err.proposal_id = sub.proposal_id
            return err
        self._nonces.delivered(sub.nonce)
        self._remember_nonce(sub.proposal_id, sub.nonce)
        return sub

    # ------------------------------------------------------------------ certificates

    async def await_certificate(
        self,
        proposal_id: bytes,
        deadline_s: float | None = None,
        *,
        settled: bool = False,
        from_tx: bytes | None = None,
        nonce: int | None = None,
    ) -> Decision:
        """Poll every sidecar's `GetReceipt` until f+1 distinct sidecars return the same
        signed leaf for `proposal_id`; return it verified. `settled`: wait past a pending
        verdict (for a confirmed call). `from_tx`: only a verdict from that transaction.
        `nonce`: the proposal's, when this client signed it in an earlier life (a client
        remembers the nonces it signed; it proves the verdict is ours to read)."""
        deadline_s = self.certificate_deadline_s if deadline_s is None else deadline_s
        own_nonce = nonce if nonce is not None else self._own_nonces.get(proposal_id, 0)
        confirmed = self._confirmations.get(proposal_id)
        own = [spb.OwnTx(tx_id=confirmed[0], nonce=confirmed[1])] if confirmed else []
        wait = _ReceiptWait(
            self.spec,
            self._ch().sidecars,
            lambda: self._read_auth(METHOD_GET_RECEIPT),
            self.rpc_timeout_s,
            proposal_id,
            asyncio.get_running_loop().time() + deadline_s,
            settled=settled,
            from_tx=from_tx,
            own_nonce=own_nonce,
            own=own,
            epochs=self.receipt_epochs,
            learn_epochs=self._learn_receipt_epochs,
        )
        return await wait.certified()

    async def await_transaction(
        self, tx_id: bytes, from_height: int, deadline_s: float | None = None
    ) -> Decision:
        """The certified verdict of transaction `tx_id`, read from the sidecars' `Receipts`
        streams from `from_height` on. For a Confirm: its verdict answers the proposal it
        names, and a refused Confirm never supersedes that proposal's own verdict, so it
        cannot be found by `GetReceipt`."""
        deadline_s = self.certificate_deadline_s if deadline_s is None else deadline_s
        needed = self.spec.f + 1
        found: dict[int, Receipt] = {}
        done = asyncio.Event()

        nonce = self._own_nonces.get(tx_id, 0)
        request = spb.ReceiptsRequest(
            from_height=from_height, own=[spb.OwnTx(tx_id=tx_id, nonce=nonce)] if nonce else []
        )

        async def follow(i: int, stub: spb_grpc.SidecarStub) -> None:
            stream = stub.Receipts(request, metadata=self._read_auth(METHOD_RECEIPTS))
            try:
                async for batch in stream:
                    for message in batch.receipts:
                        if message.leaf.tx_id != tx_id:
                            continue
                        receipt = receipt_or_none(message)
                        epochs = self.receipt_epochs
                        if receipt is not None and receipt_signature_ok(
                            self.spec, receipt, i, epochs
                        ):
                            found[i] = receipt
                            proposal_id = receipt.leaf.proposal_id
                            if certify(self.spec, proposal_id, list(found.values()), {}, epochs):
                                done.set()
                        return
            finally:
                stream.cancel()

        tasks = [asyncio.ensure_future(follow(i, s)) for i, s in enumerate(self._ch().sidecars)]
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), deadline_s)
        finally:
            await cancel_all(tasks)
        for receipt in found.values():
            decision = certify(
                self.spec, receipt.leaf.proposal_id, list(found.values()), {}, self.receipt_epochs
            )
            if decision is not None:
                return decision
        raise CertificateTimeout(tx_id, len(found), needed)

    async def decide(self, payload: TxPayload, deadline_s: float | None = None) -> Decision:
        """Submit and wait for the certified verdict."""
        submitted = await self.submit(payload)
        return await self.await_certificate(submitted.proposal_id, deadline_s)

    async def _applied(self, payload: TxPayload, deadline_s: float | None) -> Decision:
        decision = await self.decide(payload, deadline_s)
        if decision.outcome is not Outcome.APPLIED:
            raise TransactionRejected(decision)
        return decision

    # ------------------------------------------------------------------ agent calls

    async def propose(
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
        """Propose one tool call and return its certified verdict (allow / flag / deny /
        pending). A denial is a normal return here; `governed_tool` turns it into
        `ActionDenied`. `grant`: the delegation to act under (its run: `run_under`).
        `targets`: further (role, target) pairs, in roles the tool declares."""
        payload = Proposal(
            run_id=self.run_under(grant, run_id),
            tool=tool,
            target=target,
            arguments=call_arguments(arguments),
            grant=None if grant is None else grant_id(grant),
            targets=tuple(RoleTarget(role, value) for role, value in targets),
        )
        return await self.decide(payload, deadline_s)

    async def pending_card(
        self, proposal_id: bytes, deadline_s: float | None = None
    ) -> ConfirmationCard:
        """The certified confirmation card of a pending proposal."""
        decision = await self.await_certificate(proposal_id, deadline_s)
        if decision.card is None:
            raise TransactionRejected(decision)
        return decision.card

    async def pending(self, deadline_s: float | None = None) -> list[OpenCard]:
        """The open confirmation cards this key alone may answer (a principal's, or the
        owner's: docs/security/approvals.md), in proposal-id order: each card that f+1
        sidecars return byte for byte, with its values read from the signed proposal it
        binds. Asks again while fewer than f+1 sidecars answer, until `deadline_s` (then
        `ClusterUnavailable`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.certificate_deadline_s if deadline_s is None else deadline_s)
        needed = self.spec.f + 1
        delay = RECEIPT_POLL_S_MIN
        while True:
            refused: dict[int, grpc.StatusCode] = {}
            answers = await gather_answers(
                self._ch().sidecars,
                lambda stub: stub.Pending(
                    spb.PendingRequest(),
                    timeout=self.rpc_timeout_s,
                    metadata=self._read_auth(METHOD_PENDING),
                ),
                enough=self.spec.n,
                refused=refused,
            )
            if len(answers) >= needed:
                return agreed_cards(answers, needed)
            raise_if_read_refused(list(refused.values()), needed)
            if loop.time() >= deadline:
                raise ClusterUnavailable("sidecars_unreachable")
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECEIPT_POLL_S_MAX)

    async def reject(
        self,
        proposal_id: bytes,
        card_digest: bytes | None = None,
        deadline_s: float | None = None,
    ) -> Decision:
        """Decline a pending proposal (docs/security/approvals.md): the card leaves the
        state and the call is denied (`confirmation_rejected`); `TransactionRejected` if
        this key may not answer it, or the digest is wrong. Without `card_digest`, the open
        card is read first."""
        return await self.confirm(proposal_id, card_digest, deadline_s, reject=True)

    async def confirm(
        self,
        proposal_id: bytes,
        card_digest: bytes | None = None,
        deadline_s: float | None = None,
        *,
        reject: bool = False,
    ) -> Decision:
        """Sign a Confirm for a pending proposal (docs/engine.md, "Principals and
        confirmation") and return the verdict it
        produced: allow / flag / deny for the call, or `TransactionRejected` (wrong card,
        expired, not this confirmer's to confirm). Without `card_digest`, the card is
        fetched first (from this key's open cards, else the proposal's certificate):
        confirm only what you have shown the principal."""
        if card_digest is None:
            mine = [c for c in await self.pending(deadline_s) if c.proposal_id == proposal_id]
            if mine:
                card_digest = mine[0].card.digest
            else:
                card_digest = (await self.pending_card(proposal_id, deadline_s)).digest
        statuses = await self.sidecar_status()
        if len(statuses) < self.spec.f + 1:
            raise ClusterUnavailable("sidecars_unreachable", proposal_id=proposal_id)
        from_height = min(s.executed_height for s in statuses.values()) + 1
        answer = Confirm(proposal_id=proposal_id, card_digest=card_digest, reject=reject)
        submitted = await self.submit(answer)
        self._confirmations[proposal_id] = (submitted.proposal_id, submitted.nonce)
        while len(self._confirmations) > OWN_NONCES_REMEMBERED_MAX:
            self._confirmations.popitem(last=False)
        decision = await self.await_transaction(submitted.proposal_id, from_height, deadline_s)
        if decision.outcome is Outcome.REJECTED:
            raise TransactionRejected(decision)
        return decision

    async def delegate(
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
        """Grant a child agent an attenuated scope for one run (docs/engine.md, the
        `delegate` transaction); returns the `Grant` the child's proposals carry: the grant
        id and the run id the grant is for. `run_id` is a label of this client's runs (or,
        under `parent_grant`, the parent's run). Expiry is in block time, which tracks the
        replicas' clocks. `rules`, target and argument rules per tool in any order (each
        for a tool of `tools`, when given), narrow the grant further: every call under it
        must also satisfy them, and a grant's rule can make a call stricter, never looser
        (docs/policies.md)."""
        payload = Delegate(
            child=child_public_key,
            run_id=self.run_under(parent_grant, run_id),
            tools=None if tools is None else canonical_tool_list(list(tools)),
            expires_at_ms=int(time.time() * 1000 + ttl_s * 1000),
            parent_grant=None if parent_grant is None else grant_id(parent_grant),
            rules=tuple(sorted(rules, key=lambda entry: entry.tool)),
        )
        decision = await self._applied(payload, deadline_s)
        if isinstance(parent_grant, Grant):
            run = parent_grant.run_id or run_id
        elif parent_grant is not None:
            run = run_id
        else:
            run = self.run_of(run_id) or run_id
        return Grant(decision.proposal_id, run)

    async def revoke(self, grant: Grant | bytes, deadline_s: float | None = None) -> Decision:
        return await self._applied(Revoke(grant=grant_id(grant)), deadline_s)

    async def seal_envelope(
        self,
        kind: str,
        value: bytes | str,
        sinks: Mapping[str, bytes],
        *,
        owner_principal: str | None = None,
        deadline_s: float | None = None,
    ) -> Handle:
        """Seal `value` to each sink's X25519 public key (PyNaCl SealedBox) and register
        the handle (docs/engine.md, the `seal_envelope` transaction). Agents seal for
        themselves (unverified kinds); the owner seals for `owner_principal` (verified).
        The value never leaves this process unsealed."""
        plaintext = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        sealed = tuple(
            SealedValue(sink=sink, ciphertext=SealedBox(PublicKey(key)).encrypt(plaintext))
            for sink, key in sorted(sinks.items())
        )
        payload = SealEnvelope(kind=kind, sealed=sealed, owner_principal=owner_principal)
        decision = await self._applied(payload, deadline_s)
        return Handle(handle_for(decision.proposal_id, kind))

    # ------------------------------------------------------------------ owner

    async def admin(self, op: AdminOp, deadline_s: float | None = None) -> Decision:
        """One owner operation; `TransactionRejected` unless it was applied."""
        return await self._applied(Admin(op=op), deadline_s)

    async def register_tool(self, spec: ToolSpec, deadline_s: float | None = None) -> Decision:
        return await self.admin(RegisterTool(spec=spec), deadline_s)

    async def register_agent(
        self,
        agent_id: str,
        public_key: bytes,
        deadline_s: float | None = None,
        *,
        principal: str = "",
    ) -> Decision:
        """Register an agent; `principal` names the person it acts for (who alone answers
        its cards); without one, the owner does."""
        op = RegisterAgent(agent_id=agent_id, public_key=public_key, principal=principal)
        return await self.admin(op, deadline_s)

    async def set_entries(
        self,
        agent_id: str,
        name: str,
        entries: Sequence[TargetRule],
        deadline_s: float | None = None,
    ) -> Decision:
        """Replace an agent's named set (`payees`, `allowed_domains`...; no entries deletes
        it), read by `set` rules. Signed by the owner, or by the principal the agent acts
        for (a principal keeps its agents' sets: after confirming a payment to a new payee
        it can add the payee, so the next payment runs directly)."""
        unique = {(e.kind.value, e.value): e for e in entries}
        op = SetEntries(
            principal=agent_id, name=name, entries=tuple(unique[k] for k in sorted(unique))
        )
        return await self._applied(Admin(op=op), deadline_s)

    async def set_run_targets(
        self,
        agent_id: str,
        run_id: str,
        targets: Sequence[str],
        deadline_s: float | None = None,
    ) -> Decision:
        """Name the own targets of an agent's run (docs/provenance.md): the pages, people
        and accounts the task is about, judged as in a clean run even once the run has read
        untrusted content. Replaces the run's list; none clears it. Signed by the principal
        the agent acts for (or a deputy it names) or the owner, never by an agent; at most
        RUN_TARGETS_MAX, each canonicalized by the engine (`malformed_target` otherwise)."""
        op = SetRunTargets(agent_id=agent_id, run_id=run_id, targets=tuple(sorted(set(targets))))
        return await self._applied(Admin(op=op), deadline_s)

    async def set_settings(
        self,
        values: Mapping[str, int] | None = None,
        *,
        clear: Sequence[str] = (),
        deadline_s: float | None = None,
    ) -> Decision:
        """Set settings in the log (owner; `SETTING_NAMES`: latch thresholds, quotas, the
        confirmation and certificate TTLs, grant limits), or put the `clear`ed ones back to
        cluster.json's values. Applied or rejected as one operation."""
        op = SetSettings(values=tuple(sorted((values or {}).items())), clear=tuple(sorted(clear)))
        return await self._applied(Admin(op=op), deadline_s)

    async def register_principal(
        self,
        principal_id: str,
        public_key: bytes,
        deadline_s: float | None = None,
        *,
        deputies: Sequence[str] = (),
    ) -> Decision:
        """Register a principal: a person who answers the cards of the agents acting for
        them; its key is never an agent's, a sink's or the owner's. `deputies`: other
        principals who may answer its cards too (replaces the list). Signed by the owner,
        or by the principal itself (its own id and key) to name its deputies."""
        op = RegisterPrincipal(
            principal_id=principal_id,
            public_key=public_key,
            deputies=tuple(sorted(set(deputies))),
        )
        return await self._applied(Admin(op=op), deadline_s)

    async def rotate_key(
        self,
        holder: KeyHolder | str,
        subject_id: str,
        new_key: SigningKey,
        *,
        old_public_key: bytes | None = None,
        deadline_s: float | None = None,
    ) -> Decision:
        """Replace the key of an agent, a principal (`holder` "agent" / "principal", its
        id) or the owner ("owner", id "") with `new_key` (docs/engine.md, "Rotating keys";
        authority version 5). Signed by this client: the holder itself, or the owner for
        an agent or a principal, which then names the key it replaces in
        `old_public_key`. `new_key` signs the proof that it is held. Once applied, a
        client that rotated its own key signs with `new_key` from then on (its nonces
        continue: the identity keeps its nonce window), and the old key is refused."""
        holder = KeyHolder(holder)
        old = self.public_key if old_public_key is None else old_public_key
        op = txlib.rotate_key_op(self.spec.chain_id, holder, subject_id, old, new_key)
        decision = await self._applied(Admin(op=op), deadline_s)
        if old == self.public_key:
            if holder is KeyHolder.OWNER:
                self._owner_key = bytes(new_key.verify_key)
            self.key = new_key
            self.public_key = bytes(new_key.verify_key)
        return decision

    async def register_sink(
        self, sink_id: str, public_key: bytes, deadline_s: float | None = None
    ) -> Decision:
        return await self.admin(RegisterSink(sink_id=sink_id, public_key=public_key), deadline_s)

    async def set_mandate(
        self, agent_id: str, mandate: Mandate, deadline_s: float | None = None
    ) -> Decision:
        return await self.admin(SetMandate(agent_id=agent_id, mandate=mandate), deadline_s)

    async def suspend(self, agent_id: str, deadline_s: float | None = None) -> Decision:
        return await self.admin(Suspend(agent_id=agent_id), deadline_s)

    async def resume(self, agent_id: str, deadline_s: float | None = None) -> Decision:
        return await self.admin(Resume(agent_id=agent_id), deadline_s)

    # ------------------------------------------------------------------ verdict stream

    async def certified_verdicts(
        self, from_height: int = 1, *, idle_s: float | None = None
    ) -> AsyncIterator[Decision]:
        """Every verdict from `from_height` on that f+1 sidecars certify, as it becomes
        certified. With `idle_s`, stop once no sidecar has sent anything for that long
        (what has been executed so far); without, follow forever."""
        queue: asyncio.Queue[tuple[int, Receipt] | None] = asyncio.Queue(
            maxsize=SUBMIT_MANY_BATCH_MAX
        )

        async def follow(i: int, stub: spb_grpc.SidecarStub) -> None:
            stream = stub.Receipts(
                spb.ReceiptsRequest(from_height=max(1, from_height)),
                metadata=self._read_auth(METHOD_RECEIPTS),
            )
            try:
                async for batch in stream:
                    for message in batch.receipts:
                        receipt = receipt_or_none(message)
                        if receipt is not None:
                            await queue.put((i, receipt))
            except grpc.aio.AioRpcError as err:
                log.info("event=receipts_stream_closed sidecar=%d code=%s", i, err.code().name)
            finally:
                stream.cancel()

        tasks = [asyncio.ensure_future(follow(i, s)) for i, s in enumerate(self._ch().sidecars)]
        # (height, index) -> receipts by sidecar; emitted keys are remembered, bounded by
        # dropping keys far below the newest height seen
        waiting: OrderedDict[tuple[int, int], dict[int, Receipt]] = OrderedDict()
        emitted: OrderedDict[tuple[int, int], None] = OrderedDict()
        try:
            while True:
                try:
                    item = (
                        await asyncio.wait_for(queue.get(), idle_s) if idle_s else await queue.get()
                    )
                except TimeoutError:
                    return
                if item is None:
                    return
                i, receipt = item
                key = (receipt.leaf.height, receipt.leaf.index)
                epochs = self.receipt_epochs
                if key in emitted or not receipt_signature_ok(self.spec, receipt, i, epochs):
                    continue
                bucket = waiting.setdefault(key, {})
                bucket[i] = receipt
                decision = certify(
                    self.spec, receipt.leaf.proposal_id, list(bucket.values()), {}, epochs
                )
                if decision is None:
                    continue
                del waiting[key]
                emitted[key] = None
                while len(emitted) > RECEIPT_KEYS_REMEMBERED_MAX:
                    emitted.popitem(last=False)
                while len(waiting) > RECEIPT_KEYS_REMEMBERED_MAX:
                    waiting.popitem(last=False)
                yield decision
        finally:
            await cancel_all(tasks)


# ---------------------------------------------------------------------------- sync wrapper


class _ReceiptWait:
    """One `Client.await_certificate`: every sidecar long-polled at once, each answer taken
    in as it comes, until f+1 distinct sidecars sign the same verdict for the proposal."""

    def __init__(
        self,
        spec: ClusterSpec,
        sidecars: Sequence[spb_grpc.SidecarStub],
        read_auth: Callable[[], tuple[tuple[str, str], ...]],
        rpc_timeout_s: float,
        proposal_id: bytes,
        deadline: float,
        *,
        settled: bool,
        from_tx: bytes | None,
        own_nonce: int,
        own: list[spb.OwnTx],
        epochs: ReceiptEpochs | None = None,
        learn_epochs: Callable[[], Awaitable[ReceiptEpochs | None]] | None = None,
    ) -> None:
        self.spec = spec
        # what receipts are checked against, and how to learn an epoch a receipt names
        # that this client does not know yet (once per wait)
        self.epochs = epochs or ReceiptEpochs.genesis(spec.receipt_keys)
        self.learn_epochs = learn_epochs
        self.unknown_epoch = False
        self.sidecars = sidecars
        self.read_auth = read_auth  # a fresh signed read statement for each call
        self.rpc_timeout_s = rpc_timeout_s
        self.proposal_id = proposal_id
        self.deadline = deadline  # on the running loop's clock
        self.settled = settled  # wait past a pending verdict
        self.from_tx = from_tx  # only a verdict from that transaction
        self.own_nonce = own_nonce
        self.own = own  # proof that a Confirm of the proposal is this client's
        self.loop = asyncio.get_running_loop()
        self.latest: dict[int, Receipt] = {}  # each sidecar's newest wanted receipt
        self.cards: dict[bytes, bytes] = {}  # confirmation cards by digest
        self.answered: set[int] = set()
        self.refusing: set[int] = set()  # sidecars whose last answer was "not yours to read"
        self.changed = asyncio.Event()

    async def certified(self) -> Decision:
        """The certified verdict, checked; `ReadNotAuthorized`, `ClusterUnavailable` or
        `CertificateTimeout` when there is none to be had by the deadline."""
        needed = self.spec.f + 1
        loop = self.loop
        newer_deadline: float | None = None
        tasks = [asyncio.create_task(self.follow(i)) for i in range(self.spec.n)]
        try:
            while True:
                if len(self.refusing) >= needed and not (self.own_nonce or self.own):
                    # f+1 sidecars say this key may not read this verdict, and it holds no
                    # proof that would let it once they have executed further
                    raise ReadNotAuthorized(
                        "read_not_authorized", "PERMISSION_DENIED", proposal_id=self.proposal_id
                    )
                if self.unknown_epoch and self.learn_epochs is not None:
                    learn, self.learn_epochs = self.learn_epochs, None
                    self.epochs = await learn() or self.epochs
                    # what was taken before is checked again with what was learned
                    self.latest = {
                        i: r
                        for i, r in self.latest.items()
                        if receipt_signature_ok(self.spec, r, i, self.epochs)
                    }
                receipts = list(self.latest.values())
                decision = certify(self.spec, self.proposal_id, receipts, self.cards, self.epochs)
                if decision is not None:
                    # Sidecars run at different heights: a newer verdict for this proposal
                    # (a confirmation after a pending one) may be certified by fewer of
                    # them yet. Wait a little for it rather than answer with the older one.
                    # A pending verdict is the one a later transaction supersedes (the
                    # principal's answer), and the f+1 behind may agree on it after f+1
                    # ahead certified the answer: it waits for 2f+1 answers, among which
                    # is one of those ahead.
                    newest = max(r.leaf.height for r in self.latest.values())
                    heard = not decision.pending or len(self.latest) >= self.spec.n - self.spec.f
                    if decision.height >= newest and heard:
                        return decision
                    if newer_deadline is None:
                        newer_deadline = min(self.deadline, loop.time() + NEWER_VERDICT_WAIT_S)
                    if loop.time() >= newer_deadline:
                        return decision
                # the short wait for a newer verdict applies only while an older one is in
                # hand; without any, the caller's deadline
                until = newer_deadline if decision is not None and newer_deadline else self.deadline
                remaining = until - loop.time()
                if remaining <= 0:
                    if len(self.answered) < needed:
                        raise ClusterUnavailable(
                            "sidecars_unreachable", proposal_id=self.proposal_id
                        )
                    raise CertificateTimeout(self.proposal_id, len(self.latest), needed)
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), remaining)
        finally:
            await cancel_all(tasks)

    async def follow(self, i: int) -> None:
        """Long-poll sidecar i (`GetReceipt` with `wait_ms`): each answer comes as soon as
        it has executed the verdict (or a newer one than the last it sent), so the
        certificate is noticed when it exists, not at the next poll. A sidecar that answers
        at once without waiting (an error, an older version) is asked again after a growing
        pause, as the poll did."""
        loop = self.loop
        stub = self.sidecars[i]
        known = 0  # the height of the newest receipt this sidecar sent
        delay = RECEIPT_POLL_S_MIN
        while True:
            remaining = self.deadline - loop.time()
            if remaining <= 0:
                return
            wait_ms = int(min(remaining, RECEIPT_WAIT_S) * 1000)
            request = spb.ReceiptRequest(
                proposal_id=self.proposal_id,
                nonce=self.own_nonce,
                own=self.own,
                wait_ms=wait_ms,
                newer_than=known,
            )
            asked = loop.time()
            try:
                reply: spb.ReceiptReply = await stub.GetReceipt(
                    request,
                    timeout=max(0.05, min(self.rpc_timeout_s + wait_ms / 1000, remaining)),
                    metadata=self.read_auth(),
                )
            except grpc.aio.AioRpcError as err:
                if err.code() in READ_REFUSAL_CODES:
                    self.refusing.add(i)
                    self.changed.set()
                await asyncio.sleep(min(delay, max(0.0, self.deadline - loop.time())))
                delay = min(delay * 2, RECEIPT_POLL_S_MAX)
                continue
            self.refusing.discard(i)
            self.answered.add(i)
            found = self.absorb(i, reply)
            news = found is not None and found > known
            if found is not None:
                known = max(known, found)
            self.changed.set()
            # an answer that brought nothing new without waiting (polling, or a sidecar
            # that does not long-poll): ask again only after a growing pause
            quick = wait_ms == 0 or loop.time() - asked < wait_ms / 2000
            if quick and not news:
                await asyncio.sleep(min(delay, max(0.0, self.deadline - loop.time())))
                delay = min(delay * 2, RECEIPT_POLL_S_MAX)

    def absorb(self, i: int, reply: spb.ReceiptReply) -> int | None:
        """Take sidecar i's answer into `latest` (when it is a verdict the caller waits
        for) and `cards`; returns the height of the receipt it carried, if any."""
        if not reply.found:
            return None
        receipt = receipt_or_none(reply.receipt)
        if receipt is None:
            log.warning("event=receipt_dropped sidecar=%d why=bad_receipt", i)
            return None
        leaf = receipt.leaf
        if leaf.proposal_id != self.proposal_id:
            log.warning("event=receipt_dropped sidecar=%d why=bad_receipt", i)
            return None
        if receipt.block.epoch > self.epochs.current.epoch and self.learn_epochs is not None:
            self.unknown_epoch = True  # learned in `certified` (once), then checked again
            self.changed.set()
        if not receipt_signature_ok(self.spec, receipt, i, self.epochs):
            why = "unknown_epoch" if self.unknown_epoch else "bad_receipt"
            log.warning("event=receipt_dropped sidecar=%d why=%s", i, why)
            return None
        if self.settled and leaf.outcome == Outcome.PENDING.value:
            return leaf.height  # wait for a newer one
        if self.from_tx is not None and leaf.tx_id != self.from_tx:
            return leaf.height
        self.latest[i] = receipt
        if reply.card and len(self.cards) < RECEIPTS_PER_PROPOSAL_MAX:
            self.cards[hashlib.sha256(reply.card).digest()] = bytes(reply.card)
        return leaf.height
