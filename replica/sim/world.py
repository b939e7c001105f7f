"""What the parts of a simulation see of it: the one seeded world they all act on.

`Simulation` is the only implementation; the parts name this protocol rather than the
class, so that no module of the simulator imports the one that assembles it."""

from __future__ import annotations

import random
from typing import Protocol

from quorumgate.proto.crypto import Signer
from quorumgate.replica.actions import Action
from quorumgate.replica.sim.network import Network
from quorumgate.replica.sim.node import NodeWorld, SimNode
from quorumgate.replica.types import Message


class World(NodeWorld, Protocol):
    """The simulation as the Byzantine members and the restore drill act on it."""

    rng: random.Random
    signers: list[Signer]
    honest: list[int]
    healed: bool
    tick: int
    network: Network

    def _apply(
        self, node: SimNode, actions: list[Action], crash_cut: int | None = None
    ) -> None: ...

    def _deliver_from(
        self,
        src: int,
        to: int | None,
        msg: Message,
        src_instance: int = 0,
        claimed: int | None = None,
    ) -> None: ...
