"""The verdict ledger (docs/operating.md): every verdict, allows too, on a SHA-256 hash chain.

Pure: no I/O, no clock. `sidecar/store.py` keeps the entries in SQLite and the operator's
`quorumgate ledger verify|export` (sidecar/operator.py) checks and exports them; an
exported JSONL file is checked offline by the same `ChainVerifier`.

One entry per verdict, in execution order: height ascending, and inside a height the
transaction's position in the block (`index`, 0, 1, 2, ... with no gap). An entry's hash is
SHA-256 over its canonical bytes, built with `quorumgate.proto.canonical.Encoder` (the one
builder of hashed bytes) under the tag `b"qg/ledger/v1"` from the chain id and every field
but `hash` — including `prev_hash`, the hash of the entry before it (32 zero bytes for the
first). Editing any field of any entry therefore changes its hash, and editing the hash
breaks the next entry's link; honest sidecars executing one log hold byte-identical ledgers
and heads.

The ledger carries argument *names*, never values: a verdict has no values to give it, and
an operator's copy of the ledger must not become a copy of what agents sent. Reason codes
are for operators; nothing here is shown to an agent.

On a chain whose receipt version commits arguments (proto/chainversions.py
`commits_arguments`) an entry is of version 2: it also carries, for the call its
transaction proposed, one commitment per argument and the proposal's salt sealed to each
auditor it names (proto/commitments.py; docs/audit.md, "Argument commitments"), hashed
under `TAG_LEDGER_COMMITTED`. Version-1 entries keep their bytes, hash and JSON line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from quorumgate.proto import domains
from quorumgate.proto.canonical import HASH_BYTES, U32_MAX, U64_MAX, Encoder, sha256
from quorumgate.proto.commitments import (
    AUDITOR_KEY_BYTES,
    COMMITMENT_BYTES,
    KIND_HANDLE,
    KIND_TEXT,
    SALT_BYTES,
    SEAL_TO_MAX,
    SEALED_SALT_BYTES,
    Committed,
    SealedSalt,
    commitment,
    seal_or_none,
)
from quorumgate.proto.model import Proposal
from quorumgate.sidecar.engine.statements import Verdict

TAG_LEDGER = domains.LEDGER
TAG_LEDGER_COMMITTED = domains.LEDGER_WITH_COMMITMENTS
VERSION_NAMES_ONLY = 1
VERSION_COMMITTED = 2
GENESIS_PREV_HASH = bytes(HASH_BYTES)
# The longest JSONL line `from_json` reads. An entry holds at most a few kilobytes
# (a target is at most 2,048 characters, argument names at most 32 x 64 characters).
JSON_LINE_CHARS_MAX = 256 * 1024
# Text fields and blobs of one entry, bounded so that a hostile export cannot make the
# verifier build huge strings: far above what the engine ever produces.
ENTRY_TEXT_CHARS_MAX = 16 * 1024
ENTRY_BLOB_BYTES_MAX = 1024
ARGUMENT_NAMES_MAX = 1024

_INT_FIELDS = ("height", "index", "mandate_version")
_HEX_FIELDS = ("tx_id", "proposal_id", "target_digest", "card_digest", "prev_hash", "hash")
_TEXT_FIELDS = ("kind", "outcome", "reason", "principal", "canonical_target")
JSON_FIELDS = (
    "height", "index", "tx_id", "proposal_id", "kind", "outcome", "reason",
    "mandate_version", "principal", "canonical_target", "target_digest", "card_digest",
    "argument_names", "prev_hash", "hash",
)  # fmt: skip
# A version-2 line: those, then its version, commitments and sealed salts.
JSON_FIELDS_COMMITTED = (
    *JSON_FIELDS, "version", "commitments", "sealed_salts", "repeat", "halted",
)  # fmt: skip
# What the audit copy's `extension` column holds of a version-2 entry.
EXTENSION_FIELDS = ("version", "commitments", "sealed_salts", "repeat", "halted")


@dataclass(frozen=True, slots=True)
class LedgerExtra:
    """What a version-2 entry adds to its verdict: the commitments to the arguments of the
    call its transaction proposed, and that proposal's salt sealed to each auditor it
    names; both empty for any other transaction, or a call that carried no salt. And
    what the denial latch did with a call (docs/audit.md, "Repeat counts and halts"):
    the refusals it had counted before, and whether the run halted; 0 and false for any
    other transaction."""

    commitments: tuple[Committed, ...] = ()
    sealed_salts: tuple[SealedSalt, ...] = ()
    repeat: int = 0
    halted: bool = False


NO_EXTRA = LedgerExtra()


def extra_for(proposal: Proposal) -> LedgerExtra:
    """The commitments and sealed salts of one call, as every honest sidecar computes them
    from the proposal it judged (deterministic: the salt and the auditor keys are in the
    signed transaction)."""
    salt = proposal.commit_salt
    if salt is None or len(salt) != SALT_BYTES:
        return NO_EXTRA  # no salt, or not one: nothing to key a commitment with
    committed = tuple(
        Committed(
            arg.name,
            commitment(salt, arg.name, KIND_HANDLE, arg.handle)
            if arg.handle is not None
            else commitment(salt, arg.name, KIND_TEXT, arg.text or ""),
        )
        for arg in proposal.arguments
    )
    # The first SEAL_TO_MAX keys the call names; one that is no Ed25519 key gets no seal.
    seals = ((key, seal_or_none(salt, key)) for key in proposal.seal_to[:SEAL_TO_MAX])
    sealed = tuple(SealedSalt(key, box) for key, box in seals if box is not None)
    return LedgerExtra(committed, sealed)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One verdict on the chain. Kinds, outcomes and reasons are kept as the engine's code
    strings (not enums), so that an entry written by another build still verifies."""

    height: int
    index: int
    tx_id: bytes
    proposal_id: bytes
    kind: str
    outcome: str
    reason: str
    mandate_version: int
    principal: str
    canonical_target: str
    target_digest: bytes
    card_digest: bytes
    argument_names: tuple[str, ...]  # names only: a verdict never holds a value
    prev_hash: bytes
    hash: bytes
    version: int = VERSION_NAMES_ONLY
    commitments: tuple[Committed, ...] = ()  # version 2: one per argument, never a value
    sealed_salts: tuple[SealedSalt, ...] = ()  # version 2: the salt, sealed per auditor
    repeat: int = 0  # version 2: refusals the latch counted before (docs/audit.md)
    halted: bool = False  # version 2: the run was or became halted at this verdict

    def __post_init__(self) -> None:
        # Raised as ValueError, not asserted: entries are also read back from a database
        # file or an export that someone may have edited.
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if type(value) is not int:
                raise ValueError(f"{name} must be an integer")
        if not 0 <= self.height <= U64_MAX:
            raise ValueError("height out of range")
        if not 0 <= self.index <= U32_MAX:
            raise ValueError("index out of range")
        if not 0 <= self.mandate_version <= U64_MAX:
            raise ValueError("mandate_version out of range")
        for name in ("tx_id", "proposal_id", "target_digest", "card_digest"):
            value = getattr(self, name)
            if type(value) is not bytes or len(value) > ENTRY_BLOB_BYTES_MAX:
                raise ValueError(f"{name} must be at most {ENTRY_BLOB_BYTES_MAX} bytes")
        for name in ("prev_hash", "hash"):
            value = getattr(self, name)
            if type(value) is not bytes or len(value) != HASH_BYTES:
                raise ValueError(f"{name} must be {HASH_BYTES} bytes")
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            if type(value) is not str or len(value) > ENTRY_TEXT_CHARS_MAX:
                raise ValueError(f"{name} must be text of at most {ENTRY_TEXT_CHARS_MAX} chars")
        names = self.argument_names
        if type(names) is not tuple or len(names) > ARGUMENT_NAMES_MAX:
            raise ValueError(f"argument_names must be a tuple of at most {ARGUMENT_NAMES_MAX}")
        for name in names:
            if type(name) is not str or len(name) > ENTRY_TEXT_CHARS_MAX:
                raise ValueError("argument_names must hold short text")
        self._check_extra()

    def _check_extra(self) -> None:
        if self.version not in (VERSION_NAMES_ONLY, VERSION_COMMITTED):
            raise ValueError("version must be 1 or 2")
        if self.version == VERSION_NAMES_ONLY and (self.commitments or self.sealed_salts):
            raise ValueError("a version-1 entry carries no commitments")
        if type(self.repeat) is not int or not 0 <= self.repeat <= U32_MAX:
            raise ValueError("repeat must be an integer from 0 to 2**32 - 1")
        if type(self.halted) is not bool:
            raise ValueError("halted must be true or false")
        if self.version == VERSION_NAMES_ONLY and (self.repeat or self.halted):
            raise ValueError("a version-1 entry carries no repeat count")
        if type(self.commitments) is not tuple or len(self.commitments) > ARGUMENT_NAMES_MAX:
            raise ValueError(f"commitments must be a tuple of at most {ARGUMENT_NAMES_MAX}")
        for c in self.commitments:
            if type(c) is not Committed or type(c.name) is not str:
                raise ValueError("a commitment is a name and a digest")
            if len(c.name) > ENTRY_TEXT_CHARS_MAX or len(c.commitment) != COMMITMENT_BYTES:
                raise ValueError(f"a commitment is {COMMITMENT_BYTES} bytes")
        if type(self.sealed_salts) is not tuple or len(self.sealed_salts) > SEAL_TO_MAX:
            raise ValueError(f"sealed_salts must be a tuple of at most {SEAL_TO_MAX}")
        for sealed in self.sealed_salts:
            if type(sealed) is not SealedSalt or len(sealed.auditor_key) != AUDITOR_KEY_BYTES:
                raise ValueError(f"a sealed salt names a {AUDITOR_KEY_BYTES}-byte auditor key")
            if len(sealed.sealed) != SEALED_SALT_BYTES:
                raise ValueError(f"a sealed salt is {SEALED_SALT_BYTES} bytes")

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_verdict(
        cls,
        chain_id: str,
        height: int,
        index: int,
        verdict: Verdict,
        prev_hash: bytes,
        extra: LedgerExtra | None = None,
    ) -> LedgerEntry:
        """The entry for the `index`-th verdict of `height`, chained after `prev_hash`; of
        version 2, with `extra`'s commitments and sealed salts, when `extra` is given."""
        if len(prev_hash) != HASH_BYTES:
            raise ValueError(f"prev_hash must be {HASH_BYTES} bytes")
        fields: dict[str, Any] = dict(
            height=height,
            index=index,
            tx_id=verdict.tx_id,
            proposal_id=verdict.proposal_id,
            kind=verdict.kind.value,
            outcome=verdict.outcome.value,
            reason=verdict.reason.value,
            mandate_version=verdict.mandate_version,
            principal=verdict.principal,
            canonical_target=verdict.canonical_target,
            target_digest=verdict.target_digest,
            card_digest=verdict.card_digest,
            argument_names=verdict.argument_names,
            prev_hash=prev_hash,
        )
        if extra is not None:
            fields.update(
                version=VERSION_COMMITTED,
                commitments=extra.commitments,
                sealed_salts=extra.sealed_salts,
                repeat=extra.repeat,
                halted=extra.halted,
            )
        unhashed = cls(**fields, hash=GENESIS_PREV_HASH)
        return replace(unhashed, hash=unhashed.computed_hash(chain_id))

    @classmethod
    def chain(
        cls,
        chain_id: str,
        height: int,
        verdicts: Sequence[Verdict],
        prev_hash: bytes,
        extras: Sequence[LedgerExtra] | None = None,
    ) -> list[LedgerEntry]:
        """The entries of one height's verdicts, in order, the first chained after
        `prev_hash` and each after the one before (the last one's hash is the new head).
        With `extras` (one per verdict) the entries are of version 2."""
        if extras is not None and len(extras) != len(verdicts):
            raise ValueError("one ledger extra per verdict")
        entries: list[LedgerEntry] = []
        for index, verdict in enumerate(verdicts):
            extra = None if extras is None else extras[index]
            entry = cls.from_verdict(chain_id, height, index, verdict, prev_hash, extra)
            entries.append(entry)
            prev_hash = entry.hash
        return entries

    # ---------------------------------------------------------------- canonical bytes

    def canonical_bytes(self, chain_id: str) -> bytes:
        """What `hash` is the SHA-256 of: every field but `hash`, under `TAG_LEDGER` (or,
        for a version-2 entry, `TAG_LEDGER_COMMITTED` with its commitments and seals)."""
        committed = self.version == VERSION_COMMITTED
        enc = Encoder(TAG_LEDGER_COMMITTED if committed else TAG_LEDGER)
        enc.text(chain_id).u64(self.height).u32(self.index)
        enc.blob(self.tx_id).blob(self.proposal_id).text(self.kind).text(self.outcome)
        enc.text(self.reason).u64(self.mandate_version).text(self.principal)
        enc.text(self.canonical_target).blob(self.target_digest).blob(self.card_digest)
        enc.texts(self.argument_names)
        if committed:
            enc.u32(len(self.commitments))
            for c in self.commitments:
                enc.text(c.name).blob(c.commitment)
            enc.u32(len(self.sealed_salts))
            for sealed in self.sealed_salts:
                enc.blob(sealed.auditor_key).blob(sealed.sealed)
            enc.u32(self.repeat).boolean(self.halted)
        return bytes(enc.raw(self.prev_hash))

    def computed_hash(self, chain_id: str) -> bytes:
        return sha256(self.canonical_bytes(chain_id))

    # ---------------------------------------------------------------- JSON lines

    def to_json(self) -> str:
        """One line of JSON (no newline inside), bytes as lower-case hex, ASCII only. A
        version-2 line adds `version`, `commitments` ([name, hex]) and `sealed_salts`
        ([auditor key hex, sealed hex]); a version-1 line is as it always was."""
        obj: dict[str, Any] = {}
        for name in JSON_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bytes):
                obj[name] = value.hex()
            elif isinstance(value, tuple):
                obj[name] = list(value)
            else:
                obj[name] = value
        if self.version == VERSION_COMMITTED:
            obj.update(self.extension_fields())
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=True)

    def extension_fields(self) -> dict[str, Any]:
        """The version-2 fields as JSON values, in `EXTENSION_FIELDS` order: what `to_json`
        adds to a version-1 line, and the audit copy's `extension` column."""
        return {
            "version": self.version,
            "commitments": [[c.name, c.commitment.hex()] for c in self.commitments],
            "sealed_salts": [[s.auditor_key.hex(), s.sealed.hex()] for s in self.sealed_salts],
            "repeat": self.repeat,
            "halted": self.halted,
        }

    @classmethod
    def from_json(cls, line: str) -> LedgerEntry:
        """Parse one line of `to_json`; `ValueError` naming what is wrong otherwise.

        Strict: exactly the fields `to_json` writes, with their types. The hash is *not*
        checked here (that is `ChainVerifier`'s job, which names the entry)."""
        if len(line) > JSON_LINE_CHARS_MAX:
            raise ValueError(f"line longer than {JSON_LINE_CHARS_MAX} characters")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"not JSON: {err.msg} at column {err.colno}") from None
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        keys = set(obj)
        expected = set(JSON_FIELDS_COMMITTED if "version" in keys else JSON_FIELDS)
        if keys != expected:
            missing = sorted(expected - keys)
            extra = sorted(keys - expected)
            raise ValueError(f"wrong fields (missing {missing}, unexpected {extra[:5]})")
        values: dict[str, Any] = {}
        for name in _INT_FIELDS:
            value = obj[name]
            if type(value) is not int:
                raise ValueError(f"{name} must be an integer")
            values[name] = value
        for name in _HEX_FIELDS:
            values[name] = _hex(obj[name], name)
        for name in _TEXT_FIELDS:
            value = obj[name]
            if not isinstance(value, str):
                raise ValueError(f"{name} must be text")
            values[name] = value
        names = obj["argument_names"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("argument_names must be a list of text")
        values["argument_names"] = tuple(names)
        if "version" in keys:
            values.update(extra_from_json(obj))
        return cls(**values)


def _hex(value: object, name: str) -> bytes:
    if not isinstance(value, str) or len(value) > 2 * ENTRY_BLOB_BYTES_MAX:
        raise ValueError(f"{name} must be hex text")
    if value != value.lower():
        raise ValueError(f"{name} must be lower-case hex")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise ValueError(f"{name} is not hex") from None


def _pairs(value: object, name: str) -> list[tuple[object, object]]:
    if not isinstance(value, list) or not all(isinstance(p, list) and len(p) == 2 for p in value):
        raise ValueError(f"{name} must be a list of pairs")
    return [(p[0], p[1]) for p in value]


def extra_from_json(obj: dict[str, Any]) -> dict[str, Any]:
    """The version-2 fields of a parsed JSON object (a ledger line, or the copy's
    `extension` column): `version`, `commitments`, `sealed_salts`, `repeat` and `halted`
    as entry fields."""
    if type(obj.get("version")) is not int:
        raise ValueError("version must be an integer")
    if type(obj.get("repeat")) is not int:
        raise ValueError("repeat must be an integer")
    if type(obj.get("halted")) is not bool:
        raise ValueError("halted must be true or false")
    commitments = []
    for name, digest in _pairs(obj.get("commitments"), "commitments"):
        if not isinstance(name, str):
            raise ValueError("a commitment's name must be text")
        commitments.append(Committed(name, _hex(digest, "commitment")))
    sealed = [
        SealedSalt(_hex(key, "auditor key"), _hex(box, "sealed salt"))
        for key, box in _pairs(obj.get("sealed_salts"), "sealed_salts")
    ]
    return {
        "version": obj["version"],
        "commitments": tuple(commitments),
        "sealed_salts": tuple(sealed),
        "repeat": obj["repeat"],
        "halted": obj["halted"],
    }


def extra_from_column(extension: object) -> dict[str, Any]:
    """A stored `extension` column (`extra_to_json`'s text) as the entry fields of version
    2, none for ""; `ValueError` for text that is not one."""
    if not isinstance(extension, str):
        raise ValueError("extension is not text")
    if not extension:
        return {}
    if len(extension) > JSON_LINE_CHARS_MAX:
        raise ValueError(f"extension longer than {JSON_LINE_CHARS_MAX} characters")
    try:
        obj = json.loads(extension)
    except json.JSONDecodeError as err:
        raise ValueError(f"extension is not JSON: {err.msg}") from None
    if not isinstance(obj, dict) or set(obj) != set(EXTENSION_FIELDS):
        raise ValueError(f"extension is not an object of {', '.join(EXTENSION_FIELDS)}")
    return extra_from_json(obj)


def extra_to_json(entry: LedgerEntry) -> str:
    """The version-2 fields of `entry` as one JSON object ("" for a version-1 entry): what
    the audit copy keeps in its `extension` column."""
    if entry.version != VERSION_COMMITTED:
        return ""
    # Built from the fields, not cut from `to_json`'s line: a sidecar writes this column
    # for every verdict, and the line's encode and re-parse were about a twentieth of a
    # recording sidecar's CPU (docs/benchmarks.md, "What a block costs each process").
    return json.dumps(entry.extension_fields(), separators=(",", ":"), ensure_ascii=True)


# ==================================================================== verification


class ProblemKind(StrEnum):
    HASH_MISMATCH = "hash_mismatch"  # the stored hash is not the hash of the stored fields
    BROKEN_LINK = "broken_link"  # prev_hash is not the previous entry's hash
    OUT_OF_ORDER = "out_of_order"  # (height, index) does not follow the previous entry
    UNREADABLE = "unreadable"  # a row or line that is not an entry at all
    HEAD_MISMATCH = "head_mismatch"  # the chain ends elsewhere than its recorded head


@dataclass(frozen=True, slots=True)
class LedgerProblem:
    """The first bad entry of a ledger. `position` counts entries from 0 in ledger order
    (the line number minus one in an export); `height` and `index` are what the entry
    itself says (its claimed place, which may be the edited part), or -1 when unreadable."""

    position: int
    height: int
    index: int
    kind: ProblemKind
    detail: str

    def __str__(self) -> str:
        where = (
            f"height {self.height}, index {self.index}"
            if self.height >= 0 and self.index >= 0
            else "position unreadable"
        )
        return f"entry #{self.position} ({where}): {self.kind.value}: {self.detail}"


def _short(data: bytes) -> str:
    return data.hex()[:16]


class ChainVerifier:
    """Checks a ledger one entry at a time, in ledger order, in constant memory, so that a
    whole table or a large export is walked in bounded pages. `feed` returns the first
    problem found (and keeps returning it); `finish` checks where the chain ended."""

    def __init__(self, chain_id: str) -> None:
        self.chain_id = chain_id
        self.count = 0
        self.head = GENESIS_PREV_HASH
        self.last: tuple[int, int] | None = None  # (height, index) of the last good entry
        self.problem: LedgerProblem | None = None

    def feed(self, entry: LedgerEntry) -> LedgerProblem | None:
        if self.problem is not None:
            return self.problem
        position = self.count
        where = (entry.height, entry.index)

        def fail(kind: ProblemKind, detail: str) -> LedgerProblem:
            self.problem = LedgerProblem(position, entry.height, entry.index, kind, detail)
            return self.problem

        # The entry's own hash first: an edited field is named at the edited entry, even
        # when the edit also moved its claimed position.
        computed = entry.computed_hash(self.chain_id)
        if computed != entry.hash:
            hint = " (or the ledger belongs to another chain)" if position == 0 else ""
            return fail(
                ProblemKind.HASH_MISMATCH,
                f"stored hash {_short(entry.hash)}… but its fields hash to "
                f"{_short(computed)}…{hint}",
            )
        if self.last is None:
            if entry.height < 1 or entry.index != 0:
                return fail(
                    ProblemKind.OUT_OF_ORDER, "the first entry must be index 0 of a height >= 1"
                )
        else:
            height, index = self.last
            follows = (entry.height == height and entry.index == index + 1) or (
                entry.height > height and entry.index == 0
            )
            if not follows:
                return fail(
                    ProblemKind.OUT_OF_ORDER,
                    f"does not follow the previous entry (height {height}, index {index}); "
                    "an entry is missing, repeated or moved",
                )
        if entry.prev_hash != self.head:
            return fail(
                ProblemKind.BROKEN_LINK,
                f"prev_hash {_short(entry.prev_hash)}… but the previous entry's hash is "
                f"{_short(self.head)}…",
            )
        self.count += 1
        self.head = entry.hash
        self.last = where
        return None

    def unreadable(self, height: int, index: int, detail: str) -> LedgerProblem:
        """Record that the next entry could not be read at all."""
        if self.problem is None:
            self.problem = LedgerProblem(self.count, height, index, ProblemKind.UNREADABLE, detail)
        return self.problem

    def finish(
        self, expected_head: bytes | None = None, expected_count: int | None = None
    ) -> LedgerProblem | None:
        """After the last entry: the chain must end at `expected_head` with
        `expected_count` entries when those are known (a store records both), which is what
        catches entries cut off the end."""
        if self.problem is not None:
            return self.problem
        height, index = self.last if self.last is not None else (-1, -1)
        position = max(self.count - 1, 0)
        if expected_count is not None and expected_count != self.count:
            self.problem = LedgerProblem(
                position, height, index, ProblemKind.HEAD_MISMATCH,
                f"the chain has {self.count} entries but {expected_count} were recorded; "
                "entries are missing after this one",
            )  # fmt: skip
        elif expected_head is not None and expected_head != self.head:
            self.problem = LedgerProblem(
                position, height, index, ProblemKind.HEAD_MISMATCH,
                f"the chain ends at {_short(self.head)}… but the recorded head is "
                f"{_short(expected_head)}…",
            )  # fmt: skip
        return self.problem


def verify_chain(entries: Iterable[LedgerEntry], chain_id: str) -> LedgerProblem | None:
    """The first bad entry of `entries` (in ledger order), or None when the chain holds.

    Checks, per entry: its hash is the hash of its fields; its (height, index) directly
    follows the previous entry's (index + 1 in the same height, or index 0 of a later
    height; the first is index 0 of a height >= 1); its prev_hash is the previous entry's
    hash (32 zero bytes for the first)."""
    verifier = ChainVerifier(chain_id)
    for entry in entries:
        problem = verifier.feed(entry)
        if problem is not None:
            return problem
    return verifier.finish()


def chain_head(entries: Iterable[LedgerEntry]) -> bytes:
    """The hash of the last entry (the genesis value for none); no verification."""
    head = GENESIS_PREV_HASH
    for entry in entries:
        head = entry.hash
    return head
