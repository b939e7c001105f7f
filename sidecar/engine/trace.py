"""What judging a proposal consulted, recorded when asked (`quorumgate policy explain`).

A trace is written by the judging code itself (sidecar/engine/judge.py, scope.py,
rules.py) as it decides, never by a second reading of the rules: an explanation computed
beside the judge could drift from it, and one that drifts explains a verdict nobody got
(docs/policies.md, "Why a call got its verdict"). Recording never changes a decision:
every hook only appends, and a judge without a trace (every replicated execution) records
nothing. The trace holds names, canonical targets and rule values, never argument values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from quorumgate.proto.model import TargetRule, ToolMode


class Exposed(Protocol):
    """A run's exposure as the trace reads it (sidecar/engine/provenance.py `Exposure`)."""

    @property
    def height(self) -> int: ...

    @property
    def tool(self) -> str: ...


@dataclass(frozen=True)
class TargetStep:
    """How one target of the call met one layer's rules for the tool: the first rule of
    its role that matched (its index in the layer's list), or none (out of scope)."""

    role: str  # "": the main target
    target: str
    index: int | None
    rule: TargetRule | None
    # the rule's `when_exposed` mode made the target stricter (docs/provenance.md)
    by_exposure: bool = False


@dataclass(frozen=True)
class LayerStep:
    """One layer's say: whose mandate (or grant) it is, whether it has rules for the tool,
    how each target met them, which argument rules failed (by name), and the mode this
    layer names (None: a grant, which names none unless its rule does)."""

    agent: str
    is_grant: bool
    has_rules: bool
    targets: tuple[TargetStep, ...]
    failed_arguments: tuple[str, ...]
    permitted: bool
    mode: ToolMode | None


@dataclass(frozen=True)
class Trace:
    """Filled while one proposal is judged; `layers` in the order they were judged (the
    agent's own mandate, then per grant up the chain the grant and its grantor's
    mandate). The recorder is a frozen dataclass over lists: the fields are appended to,
    never rebound."""

    layers: list[LayerStep] = field(default_factory=list)
    scope: list[tuple[tuple[str, ...] | None, bool, bool]] = field(default_factory=list)
    modes: list[ToolMode] = field(default_factory=list)  # the tool's, then the result
    # the run's exposure when judged (height, tool), and its own targets
    # (docs/provenance.md); empty on a clean run or a chain without provenance
    exposure: list[tuple[int, str]] = field(default_factory=list)
    run_targets: list[str] = field(default_factory=list)

    def record_scope(self, scope: tuple[str, ...] | None, enforce: bool, permitted: bool) -> None:
        self.scope.append((scope, enforce, permitted))

    def record_provenance(self, exposure: Exposed | None, run_targets: frozenset[str]) -> None:
        if exposure is not None:
            self.exposure.append((exposure.height, exposure.tool))
        self.run_targets.extend(sorted(run_targets))

    def record_modes(self, registered: ToolMode, result: ToolMode) -> None:
        self.modes.extend((registered, result))
