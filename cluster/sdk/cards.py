"""Is this card the call I asked for? `card_matches` compares a confirmation card with the
call a person meant, in the engine's one spelling of targets (docs/policies.md, "Checking
a card against what you meant").

A card shows the canonical call (sidecar/engine/targets.py), so the target a person
meant is put in that spelling too, by the same canonicalizer, and then compared exactly:
`iban:de89 3704 ...` and `iban:DE893704...` are one account, while a look-alike is another
target, whatever it looks like: a Cyrillic a (U+0430) makes the host an `xn--` name, a path or a
mailbox in another case is another path or mailbox, and `pay.example.com.evil.example` is
not `pay.example.com`. A meant host written with a final dot is refused outright rather
than matched: the canonicalizer drops that dot, and a person who typed it should see the
name they meant, not a rewritten one. Argument values are compared only when the card
carries them (`OpenCard`); a difference names the argument, never its values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from quorumgate.proto import names
from quorumgate.sdk.values import OpenCard
from quorumgate.sidecar.engine.statements import ConfirmationCard
from quorumgate.sidecar.engine.targets import (
    CANONICAL_VERSION_LATEST,
    NO_TARGET,
    TargetRefused,
    canonicalize_target,
    split_call,
)

__all__ = ["card_matches"]

_AUTHORITY_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)")


def _scheme_of(target: str) -> str | None:
    if target.startswith("/"):
        return "file"
    head, colon, _ = target.partition(":")
    return head.lower() if colon and names.is_scheme(head.lower()) else None


def _host_ends_with_dot(target: str) -> bool:
    match = _AUTHORITY_RE.match(target)
    if match is not None:
        host = match.group(1).rpartition("@")[2]
        host = host if host.startswith("[") else host.partition(":")[0]
        return host.endswith(".")
    if target.lower().startswith("mailto:"):
        return target.rstrip().endswith(".")
    return False


def _canonical(target: str, principal: str, version: int) -> str | None:
    """The engine's spelling of a target a person meant, or None when it has none."""
    if target == "":
        return NO_TARGET
    scheme = _scheme_of(target.strip())
    if scheme is None or _host_ends_with_dot(target.strip()):
        return None
    try:
        return canonicalize_target(
            target, principal=principal, schemes=(scheme,), version=version, optional=True
        )
    except TargetRefused:
        return None


def card_matches(
    card: ConfirmationCard | OpenCard,
    *,
    tool: str,
    target: str = "",
    further_targets: Sequence[tuple[str, str]] = (),
    arguments: Mapping[str, str] | None = None,
    version: int = CANONICAL_VERSION_LATEST,
) -> tuple[str, ...]:
    """What differs between `card` and the call a person meant: the tool, the target (in
    the engine's canonical spelling, chain canonical `version`), the further (role,
    target) pairs, and, when `arguments` is given, the argument names (and, on an
    `OpenCard`, their values). An empty tuple: the card is that call."""
    values = card.values if isinstance(card, OpenCard) else None
    shown = card.card if isinstance(card, OpenCard) else card
    out: list[str] = []
    meant_tool = names.canonical_tool_name(tool)
    if meant_tool != shown.tool:
        out.append(f"tool: the card's is {shown.tool}, not {tool}")
        return tuple(out)
    card_target, card_further = split_call(shown.tool, shown.canonical_target)
    meant = _canonical(target, shown.principal, version)
    if meant is None:
        out.append(f"target: {target!r} has no canonical form (or its host ends with a dot)")
    elif meant != card_target:
        out.append(f"target: the card's is {card_target}, not {meant}")
    meant_further: set[tuple[str, str]] = set()
    for role, each in further_targets:
        canonical = _canonical(each, shown.principal, version)
        if canonical is None:
            out.append(f"{role} target: {each!r} has no canonical form")
        else:
            meant_further.add((role, canonical))
    if meant_further != set(card_further) and len(meant_further) == len(further_targets):
        listed = ", ".join(f"{role} {each}" for role, each in card_further) or "none"
        out.append(f"further targets: the card's are {listed}")
    if arguments is not None:
        out += _argument_differences(shown, values, arguments)
    return tuple(out)


def _argument_differences(
    card: ConfirmationCard,
    values: tuple[tuple[str, str], ...] | None,
    arguments: Mapping[str, str],
) -> list[str]:
    meant = {names.canonical_argument_name(n) or n: value for n, value in arguments.items()}
    out = []
    shown_names = set(card.argument_names) | {name for name, _ in card.handles}
    if set(meant) != shown_names:
        missing, extra = sorted(set(meant) - shown_names), sorted(shown_names - set(meant))
        out.append(
            f"arguments: the card has {', '.join(extra) or 'none'} besides, "
            f"lacks {', '.join(missing) or 'none'}"
        )
    if values is not None:
        shown_values = dict(values)
        for name in sorted(set(meant) & set(shown_values)):
            if shown_values[name] != meant[name]:
                out.append(f"argument {name}: the card's value is not the one meant")
    return out
