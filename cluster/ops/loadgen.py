"""Signed proposals for load: what `quorumgate bench`, drills and live tests submit.

Each agent key signs proposals with consecutive nonces; the target and one argument are
padded so a serialized transaction is about `TX_BYTES_TARGET` bytes (the 256-byte
proposals of docs/benchmarks.md). The argument is a bench payload, not a secret.

`Load` is the load generator the drills and the live tests share: agents submitting from
background threads to a `quorumgate.ops.live.LiveCluster`, and what became of each
proposal. How persistent its delivery is, is a `Delivery`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from nacl.signing import SigningKey

from quorumgate.proto.model import Argument
from quorumgate.proto.model import Proposal as CallProposal
from quorumgate.proto.runs import run_for_nonce
from quorumgate.proto.tx import build, tx_id

TX_BYTES_TARGET = 256
BENCH_TOOL = "bench.echo"
ALLOWED_TARGET = "https://bench.example/items/{label}"
DENIED_TARGET = "http://bench.example/items/{label}"  # the tool allows https only


@dataclass
class LoadAgent:
    """One agent key and its next nonce."""

    key: SigningKey
    chain_id: str
    # The agent's run: named after the nonce of its first proposal (`n<k>`), which is what
    # chains of authority version 2 require (proto/runs.py) and a valid label on others.
    run_id: str | None = None
    next_nonce: int = 1

    def run_for(self, nonce: int) -> str:
        """The run this agent's proposal with `nonce` acts in (opened by the first)."""
        if self.run_id is None:
            self.run_id = run_for_nonce(nonce)
        return self.run_id

    @staticmethod
    def from_seed(chain_id: str, name: str) -> LoadAgent:
        seed = hashlib.sha256(f"quorumgate-load/{chain_id}/{name}".encode()).digest()
        return LoadAgent(SigningKey(seed), chain_id)

    @property
    def public_key(self) -> bytes:
        return bytes(self.key.verify_key)

    def proposal(self, seq: int | None = None, *, denied: bool = False) -> tuple[bytes, bytes]:
        """(transaction bytes, transaction id) of the next proposal; `denied` names a target
        the load tool refuses (`http://`), so that the engine denies it."""
        nonce = self.next_nonce
        self.next_nonce += 1
        label = seq if seq is not None else nonce
        target = (DENIED_TARGET if denied else ALLOWED_TARGET).format(label=label)
        pad = max(0, TX_BYTES_TARGET - 151 - len(target))
        call = CallProposal(
            run_id=self.run_for(nonce),
            tool=BENCH_TOOL,
            target=target,
            arguments=(Argument("note", text="x" * pad),),
        )
        data = build(self.chain_id, nonce, call, self.key)
        return data, tx_id(self.public_key, nonce)
