"""What each chain version turns on: the one table, and a predicate per behaviour.

A chain's semantics are fixed when it is created (docs/architecture/0004-chain-semantics-
fixed-at-init.md): `quorumgate init` writes four version numbers into cluster.json, and
every honest sidecar judges the chain's whole log by them, so that a replay years later
reaches the verdicts, artifacts and state roots the chain already certified. A file
without a field is that field's first version: the rules of chains made before the field
existed.

Code never compares a version number. It asks a predicate below (`probes_latch`,
`split_authority`, `receipts_expire`...), and each predicate reads `CHAIN_VERSIONS`: for
each version field, for each of its versions, the behaviours that version turns on. A
version keeps everything the versions before it turned on.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final


class Behaviour(enum.Enum):
    """One rule a chain version turns on (docs/engine.md describes each)."""

    # canonical_version: how targets are spelled and screened (sidecar/engine/targets.py)
    STRICT_FORMS = "strict_forms"
    PROBES_LATCH = "probes_latch"
    REFUSES_PLAINTEXT_SECRETS = "refuses_plaintext_secrets"
    IBAN_AND_TEL_FORMS = "iban_and_tel_forms"
    TARGETS_BY_ROLE = "targets_by_role"
    PINS_TOOL_DEFINITIONS = "pins_tool_definitions"
    SETTINGS_IN_LOG = "settings_in_log"
    LINKS_IN_TEXT = "links_in_text"
    ACCOUNT_FORM = "account_form"
    ESCAPES_CONTROLS = "escapes_controls"
    # authority_version: who may answer for a call (docs/engine.md, "Principals and
    # confirmation"; docs/architecture/0003-split-authority.md)
    SPLIT_AUTHORITY = "split_authority"
    ONLY_PRINCIPALS_ANSWER_CARDS = "only_principals_answer_cards"
    EXPIRED_CARDS_LEAVE_AT_ONCE = "expired_cards_leave_at_once"
    RUNS_OPENED_BY_THE_CHAIN = "runs_opened_by_the_chain"
    LATCH_ACROSS_RUNS = "latch_across_runs"
    ARGUMENTS_BY_DECLARATION = "arguments_by_declaration"
    REGISTRATION_GATES = "registration_gates"
    DELEGATES_DEFER_TO_DELEGATORS = "delegates_defer_to_delegators"
    RUNS_CARRY_PROVENANCE = "runs_carry_provenance"
    RUN_SCOPED_TARGETS = "run_scoped_targets"
    ROTATES_KEYS = "rotates_keys"
    # state_version: how the state root is computed (docs/sidecar.md, "The state root")
    STATE_HASH_TREE = "state_hash_tree"
    # receipt_version: what the sidecars' receipts sign
    # (docs/security/reads-and-certificates.md)
    RECEIPTS_EXPIRE = "receipts_expire"
    COMMITS_ARGUMENTS = "commits_arguments"
    # consensus_version: what the replicas' consensus does (docs/consensus/epochs.md)
    RUNS_EPOCHS = "runs_epochs"


B = Behaviour
# For each version field, each version -> what it turns on beyond the version before it.
CHAIN_VERSIONS: Final[Mapping[str, Mapping[int, frozenset[Behaviour]]]] = {
    "canonical_version": {
        # NFKC and Unicode digits folded before anything else, paths taken literally.
        1: frozenset(),
        # One order of operations (percent-decode, then NFC), compatibility characters
        # and non-ASCII digits refused rather than merged, paths and file: URIs decoded
        # alike, `mailto:` one canonical address, only characters assigned in the pinned
        # Unicode version; calls that probe what they may not know count toward the latch
        # (and calls to invented tools are ordered, so each is in the ledger); values
        # shaped like secrets are refused in targets and plain arguments, at admission
        # and at execution.
        2: frozenset({B.STRICT_FORMS, B.PROBES_LATCH, B.REFUSES_PLAINTEXT_SECRETS}),
        # The `iban:` and `tel:` forms; further targets in roles a tool declares (and a
        # main target a tool may leave out); tool definitions pinned by digest; limits the
        # owner sets in the log.
        3: frozenset(
            {B.IBAN_AND_TEL_FORMS, B.TARGETS_BY_ROLE, B.PINS_TOOL_DEFINITIONS, B.SETTINGS_IN_LOG}
        ),
        # The links (http/https URIs, e-mail addresses, global phone numbers) inside
        # arguments a tool declares as text are further targets in the `link` role: a
        # link no rule names sends the call to the principal's card, which lists them;
        # the `account:` form for account numbers that are not IBANs; control and format
        # characters in a name written as `%XX` escapes rather than refused.
        4: frozenset({B.LINKS_IN_TEXT, B.ACCOUNT_FORM, B.ESCAPES_CONTROLS}),
    },
    "authority_version": {
        # The proposer, its master or the owner confirms; no reject; runs named by the
        # agent; the latch counts per run; tools declare neither arguments nor overrides.
        1: frozenset(),
        # Principals, a key class of the people agents act for; only the card's principal
        # (or a deputy it names) or the owner answers a card, and may reject it; an
        # expired card leaves the state at once; an agent acts only in runs its own
        # transactions opened; a pair refused in enough runs is refused in every run;
        # tools that declare their arguments are judged by declaration; registration
        # checks the static gates (a confirm tier stated, a `direct` override explicit).
        2: frozenset(
            {
                B.SPLIT_AUTHORITY,
                B.ONLY_PRINCIPALS_ANSWER_CARDS,
                B.EXPIRED_CARDS_LEAVE_AT_ONCE,
                B.RUNS_OPENED_BY_THE_CHAIN,
                B.LATCH_ACROSS_RUNS,
                B.ARGUMENTS_BY_DECLARATION,
                B.REGISTRATION_GATES,
            }
        ),
        # A delegate whose own mandate has no rules for a tool names no mode for it: its
        # delegators' rules decide the mode, and every layer still must permit the call
        # (docs/policies.md, "A delegate without rules defers").
        3: frozenset({B.DELEGATES_DEFER_TO_DELEGATORS}),
        # A tool may declare that its results carry untrusted content; a run in which
        # such a call was allowed is exposed from then on (its delegates' calls too), and
        # a target rule may name a stricter mode for exposed runs (`when_exposed`); a
        # principal (or the owner) may name a run's own targets, which an exposed run
        # still calls as a clean one would (docs/provenance.md).
        4: frozenset({B.RUNS_CARRY_PROVENANCE, B.RUN_SCOPED_TARGETS}),
        # Agents, principals and the owner rotate their keys in the log (`RotateKey`):
        # signed by the old key (or the owner), with the new key's proof of possession;
        # the old key is refused from then on, and the owner's key lives in the state
        # (docs/engine.md, "Rotating keys").
        5: frozenset({B.ROTATES_KEYS}),
    },
    "state_version": {
        # SHA-256 over the whole canonical state bytes.
        1: frozenset(),
        # A hash tree over per-entry hashes, so a block costs what it changes.
        2: frozenset({B.STATE_HASH_TREE}),
    },
    "receipt_version": {
        # The block statement: chain, height, verdict root, state root, leaf count.
        1: frozenset(),
        # That, the block time and the end of the certificate's validity window, which
        # executors enforce.
        2: frozenset({B.RECEIPTS_EXPIRE}),
        # That, and ledger entries of version 2: a commitment per argument of a call and
        # its salt sealed to the auditors the call names (docs/audit.md, "Argument
        # commitments").
        3: frozenset({B.COMMITS_ARGUMENTS}),
    },
    "consensus_version": {
        # One member set and its keys for the chain's whole life (the cluster file's).
        1: frozenset(),
        # A reconfiguration record the owner signed, once committed, ends the epoch and
        # names the next member set (docs/consensus/epochs.md, "The live replica").
        2: frozenset({B.RUNS_EPOCHS}),
    },
}
del B


def _enabled(field: str) -> dict[int, frozenset[Behaviour]]:
    """Each version of `field` -> everything it turns on, its predecessors' included."""
    out: dict[int, frozenset[Behaviour]] = {}
    so_far: frozenset[Behaviour] = frozenset()
    for version in sorted(CHAIN_VERSIONS[field]):
        so_far |= CHAIN_VERSIONS[field][version]
        out[version] = so_far
    return out


_ENABLED: Final = {field: _enabled(field) for field in CHAIN_VERSIONS}

CANONICAL_VERSIONS: Final = tuple(sorted(CHAIN_VERSIONS["canonical_version"]))
AUTHORITY_VERSIONS: Final = tuple(sorted(CHAIN_VERSIONS["authority_version"]))
STATE_VERSIONS: Final = tuple(sorted(CHAIN_VERSIONS["state_version"]))
RECEIPT_VERSIONS: Final = tuple(sorted(CHAIN_VERSIONS["receipt_version"]))
CONSENSUS_VERSIONS: Final = tuple(sorted(CHAIN_VERSIONS["consensus_version"]))
# What `init` writes: each field's latest version.
CANONICAL_VERSION_NEW: Final = CANONICAL_VERSIONS[-1]
AUTHORITY_VERSION_NEW: Final = AUTHORITY_VERSIONS[-1]
STATE_VERSION_NEW: Final = STATE_VERSIONS[-1]
RECEIPT_VERSION_NEW: Final = RECEIPT_VERSIONS[-1]
CONSENSUS_VERSION_NEW: Final = CONSENSUS_VERSIONS[-1]
# A file without the field: the rules of chains made before it existed.
VERSION_ABSENT: Final = 1


def turns_on(field: str, version: int, behaviour: Behaviour) -> bool:
    """Whether a chain of `version` of `field` has `behaviour`. A version the table does
    not know turns nothing on (the cluster file and `EngineConfig` refuse such a version
    by name; a predicate is not where that is decided)."""
    return behaviour in _ENABLED[field].get(version, frozenset())


# ---- canonical_version


def strict_forms(canonical_version: int) -> bool:
    """Targets take canonical version 2's forms (one order of operations, refusals
    instead of merges, the pinned Unicode version); else version 1's NFKC folding. The
    configuration fingerprint names the canonical and Unicode versions from then on."""
    return turns_on("canonical_version", canonical_version, Behaviour.STRICT_FORMS)


def probes_latch(canonical_version: int) -> bool:
    """A call that probes what it may not know (an invented tool, another principal's
    target, a handle not its own) counts toward the latch like a scope denial, and a
    call to an invented tool is ordered rather than refused at admission."""
    return turns_on("canonical_version", canonical_version, Behaviour.PROBES_LATCH)


def refuses_plaintext_secrets(canonical_version: int) -> bool:
    """A value shaped like a secret is refused in a target or plain argument, and an
    argument named like a credential must be an envelope handle (sidecar/engine/secrets.py)."""
    return turns_on("canonical_version", canonical_version, Behaviour.REFUSES_PLAINTEXT_SECRETS)


def iban_and_tel_forms(canonical_version: int) -> bool:
    """`iban:` and `tel:` targets have forms of their own (else they are generic URIs)."""
    return turns_on("canonical_version", canonical_version, Behaviour.IBAN_AND_TEL_FORMS)


def targets_by_role(canonical_version: int) -> bool:
    """A call may carry further targets in roles its tool declares, a tool may make its
    main target optional, and rules may judge a role."""
    return turns_on("canonical_version", canonical_version, Behaviour.TARGETS_BY_ROLE)


def pins_tool_definitions(canonical_version: int) -> bool:
    """A tool may be registered with the digest of its definition, and a call made on
    another definition is refused."""
    return turns_on("canonical_version", canonical_version, Behaviour.PINS_TOOL_DEFINITIONS)


def settings_in_log(canonical_version: int) -> bool:
    """The owner may change limits in the log (`SetSettings`), over cluster.json's."""
    return turns_on("canonical_version", canonical_version, Behaviour.SETTINGS_IN_LOG)


def links_in_text(canonical_version: int) -> bool:
    """The links inside arguments declared as text are judged as targets in the `link`
    role (sidecar/engine/links.py; docs/engine.md, "Links inside text")."""
    return turns_on("canonical_version", canonical_version, Behaviour.LINKS_IN_TEXT)


def account_form(canonical_version: int) -> bool:
    """`account:<issuer>/<number>` targets have a form of their own (else a generic URI)."""
    return turns_on("canonical_version", canonical_version, Behaviour.ACCOUNT_FORM)


def escapes_controls(canonical_version: int) -> bool:
    """A control, format or line-separator character in a path or a URI's path or query
    is written as its `%XX` escape (one form, shown safely) instead of refusing the
    target; NUL, backslash and hosts keep their refusals."""
    return turns_on("canonical_version", canonical_version, Behaviour.ESCAPES_CONTROLS)


# ---- authority_version


def split_authority(authority_version: int) -> bool:
    """The chain has principals: the people agents act for, a key class of their own,
    never an agent's or the owner's key."""
    return turns_on("authority_version", authority_version, Behaviour.SPLIT_AUTHORITY)


def only_principals_answer_cards(authority_version: int) -> bool:
    """A card names who alone answers it: the run's principal (or a deputy it names) for
    `user_confirm`, the owner for `owner_confirm`, never an agent; the answer may reject,
    and a key lists the open cards it may answer. Else the proposer, its master or the
    owner confirms."""
    return turns_on("authority_version", authority_version, Behaviour.ONLY_PRINCIPALS_ANSWER_CARDS)


def expired_cards_leave_at_once(authority_version: int) -> bool:
    """A card leaves the state at the first block past its expiry (a late answer finds
    no proposal), rather than after the retention time of expired entries."""
    return turns_on("authority_version", authority_version, Behaviour.EXPIRED_CARDS_LEAVE_AT_ONCE)


def runs_opened_by_the_chain(authority_version: int) -> bool:
    """On its own mandate an agent acts only in a run one of its own transactions opened
    (`n<nonce>`, proto/runs.py), never in one it names; a delegation chain starts in such a
    run too."""
    return turns_on("authority_version", authority_version, Behaviour.RUNS_OPENED_BY_THE_CHAIN)


def latch_across_runs(authority_version: int) -> bool:
    """An (agent, tool) pair refused in `latch_cross_run_threshold` runs is refused in
    every run, so a fresh run id does not reset the latch."""
    return turns_on("authority_version", authority_version, Behaviour.LATCH_ACROSS_RUNS)


def arguments_by_declaration(authority_version: int) -> bool:
    """A tool may declare its plain arguments by role and a `direct` override, and a tool
    that declares its arguments is judged by declaration rather than by argument names."""
    return turns_on("authority_version", authority_version, Behaviour.ARGUMENTS_BY_DECLARATION)


def registration_gates(authority_version: int) -> bool:
    """Registering a tool checks the static gates: a confirm-gated tool states the tier
    that may confirm it, and a `direct` tool that takes a recipient, an amount or a
    credential needs an explicit override (applied with reason `direct_override`)."""
    return turns_on("authority_version", authority_version, Behaviour.REGISTRATION_GATES)


def delegates_defer_to_delegators(authority_version: int) -> bool:
    """Under a grant, a mandate without rules for the tool names no mode (a delegator's
    rule that runs a known payee directly then holds for its delegate); only the run
    owner's mandate falls back to the tool's registered mode. Else every mandate on the
    chain without rules names the tool's mode, so a delegate is pinned at it."""
    return turns_on("authority_version", authority_version, Behaviour.DELEGATES_DEFER_TO_DELEGATORS)


def runs_carry_provenance(authority_version: int) -> bool:
    """A tool may be registered with `untrusted_results`; a run in which a call of such a
    tool is allowed (or confirmed) becomes exposed, for good, and a target rule's
    `when_exposed` mode applies to the calls of an exposed run (docs/provenance.md). Else
    the flag and `when_exposed` are not part of the chain's transactions at all."""
    return turns_on("authority_version", authority_version, Behaviour.RUNS_CARRY_PROVENANCE)


def run_scoped_targets(authority_version: int) -> bool:
    """The run owner's principal (or the owner) may name a run's own targets
    (`SetRunTargets`): calls on them are judged as in a clean run even once the run is
    exposed (docs/provenance.md). Else that transaction is not part of the chain's."""
    return turns_on("authority_version", authority_version, Behaviour.RUN_SCOPED_TARGETS)


def rotates_keys(authority_version: int) -> bool:
    """An agent, a principal or the owner may rotate its key (`RotateKey`, docs/engine.md,
    "Rotating keys"); a retired key signs nothing and is never registered again, and the
    owner's key is the state's (cluster.json's only seeds it). Else a `RotateKey` is a
    field the chain's decoder does not know: `malformed`."""
    return turns_on("authority_version", authority_version, Behaviour.ROTATES_KEYS)


# ---- state_version


def state_hash_tree(state_version: int) -> bool:
    """The state root is the hash tree over per-entry hashes (sidecar/engine/statetree.py),
    else SHA-256 of the whole state bytes."""
    return turns_on("state_version", state_version, Behaviour.STATE_HASH_TREE)


# ---- receipt_version


def receipts_expire(receipt_version: int) -> bool:
    """Whether certificates of a chain of this receipt version carry a signed validity
    window (block time and the end of the window) that executors enforce."""
    return turns_on("receipt_version", receipt_version, Behaviour.RECEIPTS_EXPIRE)


def commits_arguments(receipt_version: int) -> bool:
    """Whether a chain's ledger entries carry a commitment per argument of a call, keyed
    by the call's salt, and that salt sealed to the auditors the call names
    (proto/commitments.py), rather than argument names alone."""
    return turns_on("receipt_version", receipt_version, Behaviour.COMMITS_ARGUMENTS)


# ---- consensus_version


def runs_epochs(consensus_version: int) -> bool:
    """Whether the replicas end an epoch at a committed reconfiguration record signed by
    the owner and go on with the member set it names (docs/consensus/epochs.md). Else a
    record is not a transaction at all: refused at admission and in a block."""
    return turns_on("consensus_version", consensus_version, Behaviour.RUNS_EPOCHS)
