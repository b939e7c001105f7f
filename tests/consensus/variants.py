"""Deliberately broken consensus rules, to test the tester: the seeded simulator must catch
each of them (tests/consensus/test_tester.py, scripts/catch_rates.py). They never ship.

As relab/hotstuff's broken twins do, each variant overrides one method of an honest
component (the core's safety rules, or the core itself) and plugs into the simulator as
the core its honest members run: `SimOptions(unsafe=VARIANTS[name])`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from quorumgate.proto.crypto import Signer, Verifier
from quorumgate.proto.membership import Membership, OwnerRecords
from quorumgate.replica.core import Core
from quorumgate.replica.epochs import boundary_index
from quorumgate.replica.safety import SafetyError, SafetyRules, Signed
from quorumgate.replica.types import (
    Block,
    Proposal,
    QuorumCert,
    RemoteError,
    Timeout,
    TimeoutCert,
    Vote,
)


class NoSafeToVoteRules(SafetyRules):
    """Broken on purpose: Rule 2 (safe to vote) never refuses."""

    def _check_safe_to_vote(self, block: Block, tc: TimeoutCert | None) -> None:
        pass


class TcIgnoresHighQcRules(SafetyRules):
    """Broken on purpose: Rule 2's TC branch forgets the TC's highest QC — any block of the
    view after a TC is voted for, whatever QC it extends (the classic 2-chain mistake)."""

    def _check_safe_to_vote(self, block: Block, tc: TimeoutCert | None) -> None:
        if tc is not None and tc.view + 1 == block.view:
            return
        super()._check_safe_to_vote(block, tc)


class ThreeChainLockRules(SafetyRules):
    """Broken on purpose: HotStuff's 3-chain voting rules (safeNode: a justify at least as
    new as the lock; lock on the parent's justify) kept under the 2-chain commit count: the
    shortcut that looks like "one round fewer" and is not (docs/consensus/simulator.md).
    Its lock lags one view behind the 2-chain's."""

    def _check_safe_to_vote(self, block: Block, tc: TimeoutCert | None) -> None:
        if block.justify.view < self._state.locked_qc.view:
            raise SafetyError(2, f"justify view {block.justify.view} below the lock")

    def vote(
        self,
        block: Block,
        parent: Block,
        high_qc: QuorumCert | None = None,
        high_tc: TimeoutCert | None = None,
    ) -> Signed[Vote]:
        before = self._state.locked_qc
        signed = super().vote(block, parent, high_qc, high_tc)
        lock = parent.justify if parent.justify.view > before.view else before
        self._state = replace(self._state, locked_qc=lock)
        return signed

    def timeout(
        self, view: int, high_qc: QuorumCert, high_tc: TimeoutCert | None
    ) -> Signed[Timeout]:
        before = self._state.locked_qc
        signed = super().timeout(view, high_qc, high_tc)
        self._state = replace(self._state, locked_qc=before)  # a 3-chain timeout locks nothing
        return signed


class DoubleVoteSafetyRules(SafetyRules):
    """Broken on purpose: Rule 1 forgotten — votes again in a view it already voted in."""

    def vote(
        self,
        block: Block,
        parent: Block,
        high_qc: QuorumCert | None = None,
        high_tc: TimeoutCert | None = None,
    ) -> Signed[Vote]:
        state = self._state
        if state.last_voted_view >= block.view:
            self._state = replace(
                state, last_vote=None, last_timeout=None, last_voted_view=block.view - 1
            )
        return super().vote(block, parent, high_qc, high_tc)


class NoSafeToVoteCore(Core):
    safety_rules_cls = NoSafeToVoteRules


class TcIgnoresHighQcCore(Core):
    safety_rules_cls = TcIgnoresHighQcRules


class ThreeChainLockCore(Core):
    safety_rules_cls = ThreeChainLockRules


class DoubleVoteCore(Core):
    """Broken on purpose: votes for a second block in a view (its safety rules skip Rule 1
    and it takes a leader's second proposal for a view instead of counting it)."""

    safety_rules_cls = DoubleVoteSafetyRules

    def _on_proposal(self, sender: int, proposal: Proposal) -> None:
        self._proposal_seen.pop(proposal.block.view, None)
        super()._on_proposal(sender, proposal)


class NoFenceCore(Core):
    """Broken on purpose: Rule 6 forgotten — a replica restored from old data neither asks
    its peers which views it signed in nor fences the ones its own signatures show."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["fence_on_start"] = False
        kwargs["restored"] = False
        super().__init__(*args, **kwargs)

    def _fence_on_own_signatures(self, qc: QuorumCert, tc: TimeoutCert | None) -> None:
        pass

    def _echo_of_own(self, voter: int, view: int, kind: str) -> None:
        if voter == self.me:
            raise RemoteError("own_echo", f"view {view}")


class ReportedFenceCore(Core):
    """Broken on purpose: Rule 6 as it was — a restore is fenced as a plain start is, at the
    highest view its peers saw it sign in (capped at the certified view + 2), and after
    `fence_wait_ticks` on f+1 answers. A vote or timeout still in flight when they
    answered is in no report, so the restored replica signs again in that view."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["restored"] = False
        super().__init__(*args, **kwargs)


class EpochOnCertifiedCore(Core):
    """Broken on purpose: starts the next epoch as soon as a QC certifies a block carrying
    a member-set change — locked, not committed (docs/consensus/epochs.md, "Where an epoch
    ends"). Members that missed that QC may still commit another block at that height in
    the old epoch, and the new epoch builds on a block the old one never committed."""

    def _try_commit(self, qc: QuorumCert) -> None:
        if self.epochs and self.ended is None and qc.block_hash in self.tree:
            chain = self.tree.uncommitted_chain(qc.block_hash)
            cut = boundary_index(chain, self.membership)
            if cut is not None:
                self._end_epoch(chain, cut, (*chain[cut + 1 :], chain[-1]), qc)
                return
        super()._try_commit(qc)


class RetiredKeyVerifier(Verifier):
    """A verifier that, when a signature does not hold under a member's key, tries the
    key that member held at genesis (`aliases`: current key -> genesis key)."""

    __slots__ = ("_aliases",)

    def __init__(self, verifier: Verifier, aliases: dict[bytes, bytes]) -> None:
        super().__init__(verifier._cache_max, verifier._verify)
        self._aliases = aliases

    def verify(self, public_key: bytes, message: bytes, signature: bytes) -> bool:
        if super().verify(public_key, message, signature):
            return True
        old = self._aliases.get(public_key)
        return old is not None and super().verify(old, message, signature)


# chain id -> member -> the key it held in epoch 0, as the first core of each chain saw it
# (the same for every run of one seed: genesis keys are drawn from the chain id).
GENESIS_KEYS: dict[str, dict[int, bytes]] = {}


class RetiredKeyCountsCore(Core):
    """Broken on purpose: keeps the key table it was configured with at genesis beside the
    one of the epoch it runs, so a signature by a key a member was rotated or replaced
    away from still counts as that member's (docs/consensus/epochs.md, "Signatures name
    their epoch"). Whoever holds the retired key — the rotated member's old machine, or
    whoever it leaked to — votes as one more member than f. Only a Byzantine schedule
    across a boundary can show it: without a change there is no retired key, and
    without an adversary nobody signs with one."""

    def __init__(self, membership: Membership, me: int, signer: Signer, **kwargs: Any) -> None:
        genesis = GENESIS_KEYS.setdefault(membership.chain_id, {})
        if membership.epoch == 0:
            for member in membership.members:
                genesis.setdefault(member.index, member.public_key)
        aliases = {
            m.public_key: genesis[m.index]
            for m in membership.members
            if genesis.get(m.index, m.public_key) != m.public_key
        }
        kwargs["verifier"] = RetiredKeyVerifier(kwargs["verifier"], aliases)
        super().__init__(membership, me, signer, **kwargs)


class FenceIgnoresEpochsCore(Core):
    """Broken on purpose: a declared restore is fenced only in the first epoch; a core of
    any later epoch starts as a plain start, as the shell once started the next epoch's
    core after a boundary (docs/consensus/fencing.md, "Across an epoch boundary"). A
    replica restored from a backup of an earlier epoch then signs again, with that
    epoch's fresh safety state, in views of the later one it signed in and forgot."""

    def __init__(self, membership: Membership, me: int, signer: Signer, **kwargs: Any) -> None:
        if membership.epoch > 0:
            kwargs["restored"] = False
        super().__init__(membership, me, signer, **kwargs)


# chain id -> the reader of epoch 0's records, as the first core of each chain got it
# (the same for every run of one seed: the owner's first key is drawn from the chain id).
GENESIS_RECORDS: dict[str, OwnerRecords] = {}


class OwnerKeyIgnoredCore(Core):
    """Broken on purpose: reads every epoch's records with the record key of epoch 0, as
    a replica would that took the cluster file's owner key for good and never moved it on
    at an `owner` record (docs/consensus/epochs.md, "The record key"). Whoever kept a copy
    of the key the owner rotated away can then hand members' seats to keys of their own;
    and the records the new key signs are refused. Only runs that commit an `owner`
    record can show it: without one, epoch 0's key is the key in force throughout."""

    def __init__(self, membership: Membership, me: int, signer: Signer, **kwargs: Any) -> None:
        records = kwargs.get("owner_records")
        if records is not None:
            if membership.epoch == 0:
                GENESIS_RECORDS.setdefault(membership.chain_id, records)
            kwargs["owner_records"] = GENESIS_RECORDS.get(membership.chain_id, records)
        super().__init__(membership, me, signer, **kwargs)


# Broken epoch rules: caught by the reconfiguration scenarios (tests/consensus/test_epochs.py;
# the retired key by those with Byzantine members, tests/consensus/test_epoch_adversary.py).
EPOCH_VARIANTS: dict[str, type[Core]] = {
    "epoch_on_certified": EpochOnCertifiedCore,
    "retired_key_counts": RetiredKeyCountsCore,
}
# A broken restore across a boundary: only the scenario that restores across one catches
# it (tests/consensus/test_boundary_restores.py); every other scenario runs no such restore.
BOUNDARY_RESTORE_VARIANTS: dict[str, type[Core]] = {
    "fence_ignores_epochs": FenceIgnoresEpochsCore,
}

# A broken record key: only the reconfiguration scenarios that draw an `owner` record
# catch it (tests/consensus/test_owner_scenarios.py); every other run has one key.
OWNER_VARIANTS: dict[str, type[Core]] = {
    "owner_key_ignored": OwnerKeyIgnoredCore,
}

# The variants by the name the scripts and the tests give them, in the order they report.
VARIANTS: dict[str, type[Core]] = {
    "no_safe_to_vote": NoSafeToVoteCore,
    "tc_ignores_high_qc": TcIgnoresHighQcCore,
    "three_chain_lock": ThreeChainLockCore,
    "double_vote": DoubleVoteCore,
    "no_fence": NoFenceCore,
    "reported_fence": ReportedFenceCore,
}
UNSAFE_VARIANTS = tuple(VARIANTS)
