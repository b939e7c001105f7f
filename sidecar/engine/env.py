"""What every step of judging one transaction works on, and the shapes of its answers.

`Env` is the chain's configuration, the replicated state (which judging changes) and the
block being executed: block time is the only time. `Caller` is who is asking, derived
from the verified key and the log, never from a field. `Refusal` stops judging with a
reason; `rejected` and `applied` are the verdicts of the kinds that are not proposals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quorumgate.proto.model import Outcome, Reason, Tier
from quorumgate.proto.tx import ParsedTx
from quorumgate.sidecar.engine.config import EngineConfig, setting
from quorumgate.sidecar.engine.state import AgentRecord, EngineState, RunKey
from quorumgate.sidecar.engine.statements import OWNER_PRINCIPAL, LatchNotes, Verdict


@dataclass(frozen=True)
class Env:
    """The chain's configuration, its state, and the height and time of the block."""

    config: EngineConfig
    state: EngineState
    height: int
    now_ms: int
    # the latch's side output for the transaction being judged (never state)
    notes: LatchNotes = field(default_factory=LatchNotes, compare=False)

    def setting(self, name: str) -> int:
        """A setting's value: the log's, else cluster.json's."""
        return setting(self.config, self.state.settings, name)


class Refusal(Exception):
    """Control flow inside one transaction: stop judging, answer with this reason."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(reason.value)
        self.reason = reason


@dataclass(frozen=True)
class Caller:
    """Who is asking (the BRAH paper's Γ): the principal is the registered agent whose key
    verified the signature; the tier is `master` on its own mandate and `delegate` under
    a grant; `delegate_of` and the run's owner come from the grant chain in the log."""

    principal: str
    tier: Tier
    delegate_of: str
    run_owner: str
    run_id: str

    @property
    def run_key(self) -> RunKey:
        return (self.run_owner, self.run_id)


def principal_name(record: AgentRecord | None) -> str:
    """The signer as verdicts name it: an agent's id, or the owner."""
    return OWNER_PRINCIPAL if record is None else record.agent_id


def rejected(
    parsed: ParsedTx,
    reason: Reason,
    *,
    principal: str = "",
    subject: str = "",
    version: int = 0,
) -> Verdict:
    return Verdict(
        tx_id=parsed.tx_id,
        kind=parsed.kind,
        outcome=Outcome.REJECTED,
        reason=reason,
        mandate_version=version,
        principal=principal,
        subject=subject,
    )


def applied(parsed: ParsedTx, *, principal: str, subject: str = "", version: int = 0) -> Verdict:
    return Verdict(
        tx_id=parsed.tx_id,
        kind=parsed.kind,
        outcome=Outcome.APPLIED,
        reason=Reason.OK,
        mandate_version=version,
        principal=principal,
        subject=subject,
    )
