"""What the core asks its shell to do, in order.

The contract, after etcd-io/raft's `Ready` ("state must reach stable storage before
messages are sent"):

1. The shell performs the actions of one core call in list order.
2. `PersistSafety` must be durable (fsync) before the shell performs any later action.
3. A `Send` carries `safety_epoch`: the shell may send it only when its last durable
   `SafetyState.epoch` is at least that. `check_send_allowed` is the one place that says
   so; shells call it, and it refuses loudly rather than letting an unpersisted vote out.
4. `StoreBlock` precedes any `Commit` naming that block; a `Commit` is reported to
   clients and sidecars only after it is durable.
"""

from __future__ import annotations

from dataclasses import dataclass

from quorumgate.replica.safety import SafetyState
from quorumgate.replica.types import Block, CommitProof, Message


@dataclass(frozen=True, slots=True)
class PersistSafety:
    state: SafetyState


@dataclass(frozen=True, slots=True)
class StoreBlock:
    block: Block


@dataclass(frozen=True, slots=True)
class Send:
    """Send `message` to member `to`, or to every other member when `to` is None."""

    to: int | None
    message: Message
    safety_epoch: int = 0


@dataclass(frozen=True, slots=True)
class Commit:
    """`blocks` (height order) are committed; `proof` is the 2-chain for the last one."""

    blocks: tuple[Block, ...]
    proof: CommitProof


@dataclass(frozen=True, slots=True)
class ScheduleTimeout:
    """The pacemaker armed view `view`'s timer for `ticks` ticks (for logs and metrics;
    the shell keeps calling `on_tick` at its fixed interval)."""

    view: int
    ticks: int
    leader: int


Action = PersistSafety | StoreBlock | Send | Commit | ScheduleTimeout


class UnpersistedSend(AssertionError):
    """The shell tried to send a signature whose safety state is not yet durable."""


def check_send_allowed(send: Send, durable_epoch: int) -> None:
    if send.safety_epoch > durable_epoch:
        raise UnpersistedSend(
            f"send needs safety epoch {send.safety_epoch} durable, only {durable_epoch} is"
        )
