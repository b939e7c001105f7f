"""What the engine says about a block: verdicts, confirmation cards, rejection artifacts.

Each has canonical bytes built with `quorumgate.proto.canonical.Encoder` (one module
owns how bytes are built; the domain tags of the engine's own statements live here). None
of them can hold an argument value: verdicts and artifacts carry argument *names*, cards
carry names, handle references and a digest of the signed body (docs/engine.md).
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from quorumgate.proto import domains, names
from quorumgate.proto.canonical import Encoder
from quorumgate.proto.model import (
    DENIAL_TEXT,
    Outcome,
    Proposal,
    Reason,
    Tier,
    ToolMode,
    TxKind,
)
from quorumgate.proto.tx import TxRejected, parse

TAG_CARD = domains.CARD
TAG_VERDICT = domains.VERDICT
TAG_ARTIFACT = domains.ARTIFACT
TAG_HANDLE = domains.HANDLE

# Stands for the owner wherever a verdict names its principal; never a valid agent id.
OWNER_PRINCIPAL = "@owner"

# The BRAH paper, §6.4: the card opens with a fixed header written by the system, not by the agent.
CARD_HEADER = "Official confirmation form: confirming approves exactly the call listed here."


def target_digest(canonical_target: str) -> bytes:
    """SHA-256 of the UTF-8 canonical target `"<tool> <target>"` (receipts carry this)."""
    return hashlib.sha256(canonical_target.encode("utf-8")).digest()


def handle_for(tx_id: bytes, kind: str) -> str:
    """`h_<kind>_<16 hex>`, derived from the SealEnvelope's transaction id, so
    that a handle is unique per transaction and no one chooses another's handle."""
    return f"h_{kind}_{Encoder(TAG_HANDLE).raw(tx_id).digest()[:8].hex()}"


@dataclass(frozen=True)
class ConfirmationCard:
    """What you see is what you sign (the BRAH paper, §6.4): built by the engine from the
    canonical, bound parameters of a pending proposal; a Confirm names its digest."""

    chain_id: str
    proposal_id: bytes
    principal: str
    tier: Tier
    delegate_of: str  # "" when the principal acts on its own mandate
    tool: str
    mode: ToolMode
    min_tier: Tier
    canonical_target: str
    argument_names: tuple[str, ...]
    handles: tuple[tuple[str, str], ...]  # (argument name, handle), by argument name
    body_digest: bytes  # SHA-256 of the signed TxBody bytes: binds the values unseen
    created_height: int
    expires_at_ms: int
    # Split authority: who alone may answer the card, `principal:<id>` or
    # OWNER_PRINCIPAL. Empty on cards of chains where the proposer's side answers, whose
    # bytes stay as they were. The argument values are not in the card (nor in the state,
    # the store or any verdict): `body_digest` binds them, and `card_values` reads them
    # from the signed proposal for the person who answers.
    confirmer: str = ""
    # The canonical links inside the call's text arguments (chains with `links_in_text`,
    # docs/engine.md "Links inside text"), so the person sees where the message sends its
    # reader. Encoded only when there are any: cards without links keep their bytes.
    links: tuple[str, ...] = ()
    # The run had taken in untrusted content when the call was held (docs/provenance.md):
    # the height and tool of the call that exposed it (tool `-`, height 0: its record was
    # evicted). Encoded only when set: other cards keep their bytes.
    exposed_by: tuple[int, str] | None = None

    def to_bytes(self) -> bytes:
        enc = Encoder(TAG_CARD)
        enc.text(self.chain_id).raw(self.proposal_id).text(self.principal)
        enc.text(self.tier.value).text(self.delegate_of).text(self.tool)
        enc.text(self.mode.value).text(self.min_tier.value).text(self.canonical_target)
        enc.texts(self.argument_names)
        enc.u32(len(self.handles))
        for name, handle in self.handles:
            enc.text(name).text(handle)
        enc.raw(self.body_digest).u64(self.created_height).u64(self.expires_at_ms)
        if self.confirmer or self.links or self.exposed_by:
            enc.text(self.confirmer)
        if self.links or self.exposed_by:
            enc.texts(self.links)
        if self.exposed_by is not None:
            enc.u64(self.exposed_by[0]).text(self.exposed_by[1])
        return bytes(enc)

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.to_bytes()).digest()

    def render(self, values: Sequence[tuple[str, str]] | None = None) -> str:
        """The card as a person reads it; every line is generated here, none by an agent.
        `values` (from `card_values`, read by whoever alone may answer) are shown one argument per
        line. Text that came from the agent (target, values) is quoted with every control,
        format, separator, combining mark and non-ASCII space character escaped
        (`escape_for_card`), so it cannot forge a line, hide a character or draw over one."""
        if self.confirmer:
            return self._render_v2(values)
        who = "the owner" if self.mode is ToolMode.OWNER_CONFIRM else self.principal
        lines = [
            CARD_HEADER,
            f"Tool: {self.tool}",
            *(
                self._target_lines()
                if "\n" in self.canonical_target or self.links
                else [f"Target: {self.canonical_target}"]
            ),
            f"Requested by: {self.principal} ({self.tier.value})"
            + (f" on behalf of {self.delegate_of}" if self.delegate_of else ""),
            f"Arguments: {', '.join(self.argument_names) or '(none)'}",
            f"To be confirmed by: {who}, tier {self.min_tier.value} or above",
            f"Proposal: {self.proposal_id.hex()}",
            f"Card digest: {self.digest.hex()}",
        ]
        return "\n".join(lines)

    def _target_lines(self) -> list[str]:
        """`Target:` and one `Target (<role>):` line per further target, each quoted."""
        head, *further = self.canonical_target.split("\n")
        lines = [f"Target: {quote_for_card(head.removeprefix(self.tool + ' '))}"]
        for line in further:
            role, _, target = line.partition(" ")
            lines.append(f"Target ({quote_for_card(role)}): {quote_for_card(target)}")
        lines += [f"Link in the text: {quote_for_card(link)}" for link in self.links]
        return lines

    def _exposure_lines(self) -> list[str]:
        """Why an exposed run asks (docs/provenance.md): it has read untrusted content."""
        if self.exposed_by is None:
            return []
        height, tool = self.exposed_by
        if height == 0 and tool == "-":
            return ["Run exposed: it has read untrusted content (call no longer on record)"]
        return [f"Run exposed: it has read untrusted content since tool {tool} at height {height}"]

    def _render_v2(self, values: Sequence[tuple[str, str]] | None) -> str:
        if self.confirmer == OWNER_PRINCIPAL:
            who = "the owner"
        else:
            who = "principal " + self.confirmer.removeprefix(PRINCIPAL_PREFIX)
        lines = [
            CARD_HEADER,
            f"Tool: {self.tool}",
            *self._target_lines(),
            f"Requested by: agent {self.principal} ({self.tier.value})"
            + (f" on behalf of agent {self.delegate_of}" if self.delegate_of else ""),
            *self._exposure_lines(),
        ]
        if values is None:
            names_only = ", ".join(self.argument_names) or "(none)"
            lines.append(f"Arguments: {names_only} (values not shown: read the card with them)")
        elif not values:
            lines.append("Arguments: (none)")
        else:
            lines.append(f"Arguments ({len(values)}):")
            for name, value in values:
                shown = value if value.startswith(HANDLE_VALUE_PREFIX) else quote_for_card(value)
                lines.append(f"  {name} = {shown}")
        lines += [
            f"To be confirmed or rejected by: {who} only"
            + ("" if self.confirmer == OWNER_PRINCIPAL else " (or a deputy it names)"),
            f"Proposal: {self.proposal_id.hex()}",
            f"Card digest: {self.digest.hex()}",
        ]
        return "\n".join(lines)


# A card's confirmer names a principal as `principal:<id>`, the owner as OWNER_PRINCIPAL.
PRINCIPAL_PREFIX = "principal:"
# How a card shows an envelope argument: the handle, never the sealed value.
HANDLE_VALUE_PREFIX = "handle:"


class CardMismatch(ValueError):
    """A transaction that is not the signed proposal a card binds."""


def card_values(card: ConfirmationCard, transaction: bytes) -> tuple[tuple[str, str], ...]:
    """Every argument of the proposal `card` binds, as the person answering it judges it:
    (canonical name, value) in name order; a plain value as signed, a handle as
    `handle:<h>` (never its sealed value). `transaction` is the signed proposal; it must
    verify, have the card's proposal id, and hash to the card's `body_digest`, else
    `CardMismatch` (so a sidecar cannot show one call and have another confirmed)."""
    try:
        parsed = parse(transaction, verify=True)
    except TxRejected as err:
        raise CardMismatch("the transaction does not verify") from err
    if parsed.tx_id != card.proposal_id or parsed.body.chain_id != card.chain_id:
        raise CardMismatch("the transaction is not the card's proposal")
    if hashlib.sha256(parsed.signed.body).digest() != card.body_digest:
        raise CardMismatch("the transaction's body is not the one the card binds")
    payload = parsed.body.payload
    if not isinstance(payload, Proposal):
        raise CardMismatch("the transaction is not a proposal")
    out = []
    for arg in payload.arguments:
        name = names.canonical_argument_name(arg.name) or "!"
        value = HANDLE_VALUE_PREFIX + arg.handle if arg.handle is not None else (arg.text or "")
        out.append((name, value))
    return tuple(sorted(out))


# Unicode general categories whose characters a card shows as escapes, by first letter:
# C* (controls, format characters such as bidi overrides and zero-width joiners,
# surrogates, private use, unassigned), Z* (separators; the ASCII space excepted) and M*
# (combining marks: Mn, Mc, Me draw over or around the character before them, so a mark
# can strike a digit through or change how a quote looks). Unicode Standard Annex #44,
# "General Category Values".
ESCAPED_CATEGORY_CLASSES = "CZM"


def escape_for_card(text: str) -> str:
    """`text` with `\\`, `"` and every character of ESCAPED_CATEGORY_CLASSES (the ASCII
    space excepted) escaped as `\\u{...}`: what a person reads is each code point that was
    signed, and nothing draws over its neighbours."""
    out = []
    for ch in text:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch != " " and unicodedata.category(ch)[0] in ESCAPED_CATEGORY_CLASSES:
            out.append(f"\\u{{{ord(ch):x}}}")
        else:
            out.append(ch)
    return "".join(out)


def quote_for_card(text: str) -> str:
    """`text` in double quotes, escaped by `escape_for_card`."""
    return f'"{escape_for_card(text)}"'


@dataclass(frozen=True)
class Verdict:
    """The engine's answer for one transaction of a block (docs/engine.md, "Verdicts and reasons").

    For a Proposal: allow / flag / deny / pending. A Confirm that settles a proposal
    answers for that proposal (`proposal_id`): allow / flag, or deny when the call no
    longer passes; a Confirm that cannot settle anything is rejected. Other kinds are
    applied or rejected. `reason` is for operators; an agent only ever sees
    `agent_message`.
    """

    tx_id: bytes
    kind: TxKind
    outcome: Outcome
    reason: Reason
    mandate_version: int = 0
    principal: str = ""
    tier: Tier | None = None
    delegate_of: str = ""
    canonical_target: str = ""
    target_digest: bytes = b""
    argument_names: tuple[str, ...] = ()
    proposal_id: bytes = b""
    card: ConfirmationCard | None = None
    card_digest: bytes = b""
    subject: str = ""  # handle for SealEnvelope, name for Admin, child for Delegate
    body_digest: bytes = b""  # sha256 of the signed TxBody (receipts bind the arguments)

    @property
    def agent_message(self) -> str:
        """What the agent is told: one fixed sentence for every refusal, whatever the reason."""
        return DENIAL_TEXT if self.outcome in (Outcome.DENY, Outcome.REJECTED) else ""

    @property
    def is_proposal_denial(self) -> bool:
        return self.outcome is Outcome.DENY and bool(self.proposal_id)

    def statement(self, chain_id: str, height: int) -> bytes:
        """Ledger-ready canonical bytes of this verdict at `height`."""
        enc = Encoder(TAG_VERDICT).text(chain_id).u64(height)
        enc.raw(self.tx_id).text(self.kind.value).text(self.outcome.value)
        enc.text(self.reason.value).u64(self.mandate_version).text(self.principal)
        enc.text(self.tier.value if self.tier is not None else "").text(self.delegate_of)
        enc.text(self.canonical_target).blob(self.target_digest)
        enc.texts(self.argument_names).blob(self.proposal_id).blob(self.card_digest)
        enc.text(self.subject)
        return bytes(enc)


@dataclass(frozen=True)
class ArtifactDenial:
    proposal_id: bytes
    principal: str
    reason: Reason
    mandate_version: int
    argument_names: tuple[str, ...]


@dataclass(frozen=True)
class RejectionArtifact:
    """One per (height, canonical target) with at least one deny, listing
    those denials in block order. `to_bytes()` is what the sidecar writes, idempotently."""

    chain_id: str
    height: int
    canonical_target: str
    denials: tuple[ArtifactDenial, ...]

    def __post_init__(self) -> None:
        assert self.denials, "an artifact exists only for at least one denial"

    @property
    def key(self) -> tuple[int, str]:
        return (self.height, self.canonical_target)

    def to_bytes(self) -> bytes:
        enc = Encoder(TAG_ARTIFACT).text(self.chain_id).u64(self.height)
        enc.text(self.canonical_target).raw(target_digest(self.canonical_target))
        enc.u32(len(self.denials))
        for denial in self.denials:
            enc.raw(denial.proposal_id).text(denial.principal).text(denial.reason.value)
            enc.u64(denial.mandate_version).texts(denial.argument_names)
        return bytes(enc)


def build_artifacts(chain_id: str, height: int, verdicts: list[Verdict]) -> list[RejectionArtifact]:
    """Group this height's proposal denials by canonical target, in block order."""
    groups: dict[str, list[ArtifactDenial]] = {}
    for verdict in verdicts:
        if not verdict.is_proposal_denial:
            continue
        groups.setdefault(verdict.canonical_target, []).append(
            ArtifactDenial(
                proposal_id=verdict.proposal_id,
                principal=verdict.principal,
                reason=verdict.reason,
                mandate_version=verdict.mandate_version,
                argument_names=verdict.argument_names,
            )
        )
    # dict order is first-denial order in the block: deterministic for one log
    return [
        RejectionArtifact(chain_id, height, target, tuple(denials))
        for target, denials in groups.items()
    ]


@dataclass(frozen=True)
class LatchFact:
    """What the denial latch did with one proposal's verdict (docs/audit.md, "Repeat
    counts and halts"): `repeat`, the refusals of the agent's tool its run's bucket held
    before this verdict; `halted`, whether the run was halted already or this verdict
    halted it. A side output: it changes no verdict and no state byte."""

    repeat: int = 0
    halted: bool = False


NO_LATCH_FACT = LatchFact()


class LatchNotes:
    """Where the latch notes its fact for the transaction being judged (reset by the
    engine before each one); never part of the replicated state."""

    def __init__(self) -> None:
        self.fact: LatchFact | None = None


@dataclass(frozen=True)
class BlockResult:
    height: int
    block_time_ms: int
    verdicts: tuple[Verdict, ...]
    artifacts: tuple[RejectionArtifact, ...]
    state_root: bytes
    # one per verdict, in order (a side output read by the ledger, sidecar/execution.py)
    latch_facts: tuple[LatchFact, ...] = ()
    # (transaction id, the call it proposes) for each transaction of the block that parsed
    # to a proposal, in block order, whatever its verdict: a side output, so the ledger's
    # argument commitments (docs/audit.md) need not parse the block a second time
    calls: tuple[tuple[bytes, Proposal], ...] = ()


@dataclass(frozen=True)
class AdmissionResult:
    """The mempool's cheap early answer (never mutates engine state)."""

    accepted: bool
    reason: Reason
    tx_id: bytes
    kind: TxKind

    @property
    def agent_message(self) -> str:
        return "" if self.accepted else DENIAL_TEXT
