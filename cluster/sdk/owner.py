"""The operator's own transactions, for setting up a cluster's governance from scripts:
register tools and agents, set mandates. Signed with `DIR/owner.key`; the next nonce comes
from the sidecars (`Account`), so nothing is persisted here.

The client SDK (cluster/sdk/client.py) is the full interface for agents and owners; this is the
small synchronous piece `bench` and the main job need before any agent can act.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import OWNER_KEY_FILE, ClusterSpec, read_seed
from quorumgate.proto.model import (
    Admin,
    AdminOp,
    Enforcement,
    Mandate,
    RegisterAgent,
    RegisterTool,
    SetMandate,
    ToolMode,
    ToolSpec,
    canonical_tool_list,
)
from quorumgate.proto.tx import build
from quorumgate.replica.wire import SUBMIT_BATCH_TXS_MAX
from quorumgate.runtime.channels import Reader, sync_channel
from quorumgate.sdk.polling import poll_for

APPLY_WAIT_S = 30.0
POLL_S = 0.05
RPC_TIMEOUT_S = 2.0


def owner_reader(spec: ClusterSpec) -> Reader:
    """The owner's key as a reader of committed data (runtime/readauth.py)."""
    return Reader.of(SigningKey(read_seed(spec.directory / OWNER_KEY_FILE)))


class OwnerError(Exception):
    pass


def next_nonce(spec: ClusterSpec, signer: bytes) -> tuple[bool, int]:
    """(known, next nonce) for `signer`, the highest that f+1 sidecars agree is at least."""
    answers = _accounts(spec, signer)
    # f+1 answers include an honest one; an honest sidecar never reports a nonce lower
    # than it executed, so the highest answer is safe to count up from.
    known = sum(1 for k, _ in answers if k) >= spec.f + 1
    return known, max(n for _, n in answers) if known else 1


def executed_by_f_plus_one(answers: Sequence[tuple[bool, int]], f: int, nonce: int) -> bool:
    """Whether at least f+1 of the sidecars' `answers` (known, next nonce) executed the
    transaction signed at `nonce`: then an honest one did, and every read that asks f+1
    sidecars to agree finds its effect. One sidecar ahead is not enough: the f+1 that
    answer a later read first may all be behind it."""
    return sum(1 for _, next_nonce in answers if next_nonce > nonce) >= f + 1


def _accounts(spec: ClusterSpec, signer: bytes) -> list[tuple[bool, int]]:
    """Every answering sidecar's (known, next nonce) for `signer`; at least f+1 of them."""
    answers: list[tuple[bool, int]] = []
    reader = owner_reader(spec)  # an account answers its own key and the cluster's roles
    for m in spec.members:
        with sync_channel(spec, m.index, "sidecar", reader=reader) as channel:
            stub = spb_grpc.SidecarStub(channel)
            try:
                reply = stub.Account(spb.AccountRequest(signer=signer), timeout=RPC_TIMEOUT_S)
            except grpc.RpcError:
                continue
        answers.append((reply.known, reply.next_nonce))
    if len(answers) < spec.f + 1:
        raise OwnerError(f"only {len(answers)} sidecars answered; {spec.f + 1} needed")
    return answers


class OwnerSession:
    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.key = SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))
        _, self._nonce = next_nonce(spec, bytes(self.key.verify_key))

    def submit(self, ops: Sequence[AdminOp]) -> None:
        """Submit owner transactions, in order, and wait until f+1 sidecars executed them
    all (`executed_by_f_plus_one`)."""
        requests = []
        last_nonce = self._nonce
        for op in ops:
            data = build(self.spec.chain_id, self._nonce, Admin(op=op), self.key)
            requests.append(cpb.SubmitRequest(tx=data, request_id=self._nonce))
            last_nonce = self._nonce
            self._nonce += 1
        with sync_channel(self.spec, 0) as channel:
            stub = cpb_grpc.ReplicaStub(channel)
            batches = [
                cpb.SubmitBatch(requests=requests[i : i + SUBMIT_BATCH_TXS_MAX])
                for i in range(0, len(requests), SUBMIT_BATCH_TXS_MAX)
            ]
            for reply_batch in stub.SubmitStream(iter(batches), timeout=APPLY_WAIT_S):
                for reply in reply_batch.replies:
                    if not reply.accepted:
                        raise OwnerError(f"owner transaction refused: {reply.reason}")
        signer = bytes(self.key.verify_key)
        f = self.spec.f

        def executed() -> bool:
            return executed_by_f_plus_one(_accounts(self.spec, signer), f, last_nonce)

        if poll_for(executed, APPLY_WAIT_S, POLL_S):
            return
        raise OwnerError(f"owner transactions not executed within {APPLY_WAIT_S:.0f} s")


def tool_op(
    name: str, *, mode: ToolMode = ToolMode.DIRECT, schemes: Sequence[str] = ("https",)
) -> AdminOp:
    return RegisterTool(spec=ToolSpec(name=name, mode=mode, target_schemes=tuple(sorted(schemes))))


def agent_ops(agent_id: str, public_key: bytes, tools: Sequence[str] | None) -> list[AdminOp]:
    mandate = Mandate(
        allowed_tools=None if tools is None else canonical_tool_list(list(tools)),
        enforcement=Enforcement.ENFORCE,
    )
    return [
        RegisterAgent(agent_id=agent_id, public_key=public_key),
        SetMandate(agent_id=agent_id, mandate=mandate),
    ]
