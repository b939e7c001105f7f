"""What the console shows while it is unlocked: the cluster's status, the principal's
open cards and the certified verdict stream, each followed by a task of its own.

A `Feeds` exists only between an unlock and the lock that follows (`console/app.py`): it
reads with clients made from the principal's key (and the owner's, on the operator's
machine), and is dropped with them, so a locked console holds no card and no verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import Proposal
from quorumgate.proto.tx import TxRejected, parse
from quorumgate.sdk.client import Client, Decision, OpenCard, QuorumGateError
from quorumgate.sdk.targets import certified_call
from quorumgate.sidecar.engine.statements import escape_for_card

log = logging.getLogger("quorumgate.console")

VERDICTS_KEPT = 500  # the newest certified verdicts the page can show
BLOCKS_CACHED = 256
STATUS_REFRESH_S = 1.0
CARDS_REFRESH_S = 1.0
REGISTRY_REFRESH_S = 5.0


@dataclass
class VerdictRow:
    height: int
    index: int
    kind: str
    outcome: str
    reason: str
    agent: str
    tool: str
    target: str
    signers: tuple[int, ...]
    proposal: str
    signer: bytes = b""  # the transaction's key: named from the registry when shown

    def as_dict(self, names: dict[bytes, str]) -> dict[str, Any]:
        doc = {**self.__dict__, "signers": list(self.signers)}
        doc["agent"] = names.get(self.signer, self.agent)
        doc.pop("signer")
        return doc


class Feeds:
    """The console's reads, made with `client` (the principal's key) and `reader` (the
    owner's when the cluster directory holds it, else the principal's client)."""

    def __init__(self, spec: ClusterSpec, client: Client, reader: Client) -> None:
        self.spec = spec
        self.client = client
        self.reader = reader
        self.verdicts: deque[VerdictRow] = deque(maxlen=VERDICTS_KEPT)
        self.cards: list[OpenCard] = []
        self.status: list[dict[str, Any]] = []
        self.agents_by_key: dict[bytes, str] = {}
        self._blocks: OrderedDict[int, list[bytes]] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._follow_status()),
            asyncio.create_task(self._follow_cards()),
            asyncio.create_task(self._follow_verdicts()),
            asyncio.create_task(self._follow_registry()),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def state(self) -> dict[str, Any]:
        """What the page shows: status, verdicts (newest first) and open cards."""
        cards = [
            {
                "proposal": c.card.proposal_id.hex(),
                "digest": c.card.digest.hex(),
                "tool": c.card.tool,
                "text": c.render(),
            }
            for c in self.cards
        ]
        return {
            "status": self.status,
            "verdicts": [v.as_dict(self.agents_by_key) for v in reversed(self.verdicts)],
            "cards": cards,
        }

    async def _follow_status(self) -> None:
        from quorumgate.ops.nodes import query_status

        while True:
            rows = await asyncio.gather(
                *(asyncio.to_thread(query_status, self.spec, i) for i in range(self.spec.n))
            )
            self.status = [
                {"node": s.index, "alive": s.alive, "height": s.height, "view": s.view,
                 "leader": s.leader}
                for s in rows
            ]  # fmt: skip
            await asyncio.sleep(STATUS_REFRESH_S)

    async def _follow_cards(self) -> None:
        while True:
            with contextlib.suppress(QuorumGateError):
                self.cards = await self.client.pending()
            await asyncio.sleep(CARDS_REFRESH_S)

    async def _follow_registry(self) -> None:
        reader = self.reader
        while True:
            try:
                registry = await reader.registry()
                names = {a.public_key: a.agent_id for a in registry.agents}
                names.update(
                    {p.public_key: f"principal {p.principal_id}" for p in registry.principals}
                )
                names[self.spec.owner_public_key] = "owner"
                self.agents_by_key = names
            except Exception:  # not readable with this key, or unreachable: keys shown as hex
                log.info("event=registry_unavailable")
            await asyncio.sleep(REGISTRY_REFRESH_S)

    async def _follow_verdicts(self) -> None:
        reader = self.reader
        start = 0
        while True:
            try:
                if not start:
                    statuses = await reader.sidecar_status()
                    top = max((s.executed_height for s in statuses.values()), default=1)
                    start = max(1, top - 100)
                async for decision in reader.certified_verdicts(start):
                    self.verdicts.append(await self._row(decision))
                    start = decision.height
            except QuorumGateError as err:
                log.info("event=verdicts_unavailable reason=%s", err.reason)
            except Exception:  # the stream broke: start again where it was
                log.exception("event=verdicts_stream_failed")
            await asyncio.sleep(STATUS_REFRESH_S)

    async def _row(self, decision: Decision) -> VerdictRow:
        leaf = decision.certificate.leaf
        agent, tool, target, signer = "-", "-", "-", b""
        tx = await self._transaction(leaf.height, leaf.index)
        if tx is not None:
            try:
                parsed = parse(tx, verify=False)
            except TxRejected:
                parsed = None
            if parsed is not None:
                signer = parsed.signer
                agent = self.agents_by_key.get(signer, signer.hex()[:12])
                payload = parsed.body.payload
                if isinstance(payload, Proposal):
                    tool, target = payload.tool, self._canonical(payload, agent, leaf.target_digest)
                else:
                    tool = f"({leaf.kind})"
        return VerdictRow(
            leaf.height, leaf.index, leaf.kind, leaf.outcome, leaf.reason, agent, tool, target,
            tuple(decision.signers), decision.proposal_id.hex()[:16], signer,
        )  # fmt: skip

    def _canonical(self, proposal: Proposal, agent: str, digest: bytes) -> str:
        """The canonical target the certificate names (checked against its digest)."""
        further = tuple((t.role, t.target) for t in proposal.targets)
        found = certified_call(
            proposal.tool, proposal.target, digest, version=self.spec.canonical_version,
            principal=agent, targets=further,
        )  # fmt: skip
        if found is None:
            return "(refused before canonical)"
        main, canonical_further = found
        lines = [
            main or "-",
            *(f"{role} {t}" for (role, _), t in zip(further, canonical_further, strict=True)),
        ]
        # shown as a card shows agent text: no character draws over or hides another
        return "\n".join(escape_for_card(line) for line in lines)

    async def _transaction(self, height: int, index: int) -> bytes | None:
        block = self._blocks.get(height)
        if block is None:
            block = await asyncio.to_thread(self._read_block, height)
            if block is None:
                return None
            self._blocks[height] = block
            while len(self._blocks) > BLOCKS_CACHED:
                self._blocks.popitem(last=False)
        return block[index] if 0 <= index < len(block) else None

    def _read_block(self, height: int) -> list[bytes] | None:
        """The committed block at `height` (read as the owner, whose key is in the
        cluster directory: the operator's console); None if no replica answers."""
        import grpc

        from quorumgate.proto import client_pb2 as cpb
        from quorumgate.proto import client_pb2_grpc as cpb_grpc
        from quorumgate.replica.wire import decode_block
        from quorumgate.runtime.channels import sync_channel
        from quorumgate.sdk.owner import owner_reader

        try:
            reader = owner_reader(self.spec)
        except Exception:  # no owner key here: the page shows no details
            return None
        for member in self.spec.members:
            with sync_channel(self.spec, member.index, reader=reader) as channel:
                call = cpb_grpc.ReplicaStub(channel).CommittedBlocks(
                    cpb.BlocksRequest(from_height=height), timeout=5
                )
                try:
                    for reply in call:
                        block = decode_block(self.spec.chain_id, reply.block.SerializeToString())
                        if block.height == height and block.hash == reply.hash:
                            return list(block.payload)
                        break
                except grpc.RpcError:
                    continue
                finally:
                    call.cancel()
        return None
