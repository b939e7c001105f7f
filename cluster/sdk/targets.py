"""One helper for "which canonical target does this certificate name": the SDK's governed
tools and the tool executor both check a call's target against a certificate with
`certified_target`, so the body and the executor act on the same canonical spelling the
sidecars judged, never on the raw one."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from quorumgate.proto import names
from quorumgate.proto.chainversions import strict_forms
from quorumgate.sidecar.engine.statements import target_digest
from quorumgate.sidecar.engine.targets import (
    NO_TARGET,
    TargetRefused,
    canonical_call,
    canonicalize_target,
)

__all__ = ["binds_caller", "certified_call", "certified_target", "release_form"]


def binds_caller(raw: str, targets: Sequence[tuple[str, str]] = ()) -> bool:
    """Whether `raw` (or a further target) can only be canonicalized knowing the caller
    (`CURRENT_USER`, or no target for a status tool): the caller's agent id is needed."""
    text = raw.strip(" ")
    current = names.CURRENT_USER.casefold()
    return (
        text == ""
        or current in raw.casefold()
        or any(current in each.casefold() for _, each in targets)
    )


def _schemes_of(text: str) -> tuple[str, ...]:
    head = text.split(":", 1)[0].lower()
    return ("file" if text.startswith("/") else head, "principal")


def certified_call(
    tool: str,
    raw: str,
    certified_digest: bytes,
    *,
    version: int,
    principal: str = names.CURRENT_USER,
    targets: Sequence[tuple[str, str]] = (),
) -> tuple[str, tuple[str, ...]] | None:
    """The canonical forms of a call's main target `raw` and of its further (role, raw)
    `targets` (canonicalized the chain's way: its `canonical_version`) whose digest, with
    the canonical tool name, is `certified_digest`: the main target ("" for none) and each
    further target's canonical form, in the order given; None when they are not the
    certified ones. `principal` is the caller's agent id where a target binds to it."""
    tool = names.canonical_tool_name(tool) or tool
    canonical_further: list[str] = []
    for _, each in targets:
        try:
            canonical_further.append(
                canonicalize_target(
                    each, principal=principal, schemes=_schemes_of(each.strip(" ")), version=version
                )
            )
        except TargetRefused:
            return None
    further = tuple(
        (role, canonical) for (role, _), canonical in zip(targets, canonical_further, strict=True)
    )
    text = raw.strip(" ")
    candidates: list[tuple[tuple[str, ...], bool]] = [(_schemes_of(text), False)]
    if text == "":
        candidates = [((), False), ((), True)]  # no target, or a status tool's caller
    for schemes, binds in candidates:
        try:
            canonical = canonicalize_target(
                raw, principal=principal, schemes=schemes, binds_caller=binds, version=version
            )
        except TargetRefused:
            continue
        if target_digest(canonical_call(tool, canonical, further)) == certified_digest:
            return ("" if canonical == NO_TARGET else canonical), tuple(canonical_further)
    return None


def certified_target(
    tool: str,
    raw: str,
    certified_digest: bytes,
    *,
    version: int,
    principal: str = names.CURRENT_USER,
) -> str | None:
    """`certified_call` for a call with one target: its canonical form, "" for none."""
    found = certified_call(tool, raw, certified_digest, version=version, principal=principal)
    return None if found is None else found[0]


def release_form(canonical: str, raw: str, *, version: int, scheme_added: str | None = None) -> str:
    """The certified `canonical` form of a target written `raw`, spelled for the tool that
    acts on it: "" for no target; a URI, `mailto:` address, number or principal as it is
    (ASCII, hosts in their IDNA A-labels, E.164 numbers, IBANs without spaces: what every
    resolver reads alike); a path as the path it names (from canonical version 2 on, a
    path writes `%` as `%25`, so that the form canonicalizes to itself: the tool gets the
    `%`), and as a `file:` URI (RFC 8089, everything but `/` percent-encoded) when `raw`
    was one. Without `scheme_added` when the caller wrote the value without that scheme
    and it was added only to name the target (`bob@example.com` for `mailto:`)."""
    if canonical in ("", NO_TARGET):
        return ""
    form = canonical
    if canonical.startswith("/"):
        path = canonical.replace("%25", "%") if strict_forms(version) else canonical
        form = "file://" + quote(path, safe="/") if raw.strip(" ")[:5].lower() == "file:" else path
    if scheme_added and form[: len(scheme_added) + 1].lower() == scheme_added + ":":
        return form[len(scheme_added) + 1 :]
    return form
