"""One helper for "which canonical target does this certificate name" (issue 16, item 4):
the SDK's governed tools and the tool executor both check a call's target against a
certificate with `certified_target`, so the body and the executor act on the same
canonical spelling the sidecars judged, never on the raw one."""

from __future__ import annotations

from quorumgate.proto import names
from quorumgate.sidecar.engine.statements import target_digest
from quorumgate.sidecar.engine.targets import (
    NO_TARGET,
    TargetRefused,
    canonical_call,
    canonicalize_target,
)

__all__ = ["binds_caller", "certified_target"]


def binds_caller(raw: str) -> bool:
    """Whether `raw` can only be canonicalized knowing the caller (`CURRENT_USER`, or no
    target for a status tool): the caller's agent id is needed then."""
    text = raw.strip(" ")
    return text == "" or names.CURRENT_USER.casefold() in raw.casefold()


def certified_target(
    tool: str,
    raw: str,
    certified_digest: bytes,
    *,
    version: int,
    principal: str = names.CURRENT_USER,
) -> str | None:
    """The canonical form of `raw` (canonicalized the chain's way: its `canonical_version`)
    whose digest, with the canonical tool name, is `certified_digest`; "" for a call
    without a target; None when no canonical form of `raw` is the certified one.
    `principal` is the caller's agent id where the target binds to the caller."""
    tool = names.canonical_tool_name(tool) or tool
    text = raw.strip(" ")
    head = text.split(":", 1)[0].lower()
    scheme = "file" if text.startswith("/") else head
    candidates: list[tuple[tuple[str, ...], bool]] = [((scheme, "principal"), False)]
    if text == "":
        candidates = [((), False), ((), True)]  # no target, or a status tool's caller
    for schemes, binds in candidates:
        try:
            canonical = canonicalize_target(
                raw, principal=principal, schemes=schemes, binds_caller=binds, version=version
            )
        except TargetRefused:
            continue
        if target_digest(canonical_call(tool, canonical)) == certified_digest:
            return "" if canonical == NO_TARGET else canonical
    return None
