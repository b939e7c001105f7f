"""Target and argument rules (docs/policies.md): what an allowed tool may be called *on*.

A mandate (or a grant) may carry, per allowed tool, an ordered list of target rules over
the call's canonical target and a set of argument rules. The first target rule that
matches decides — and may name the mode a matching call runs in (a known payee: `direct`;
anyone else: `user_confirm`); no match is out of scope. Every argument rule must hold.
A tool without rules takes any target.

Matching is on canonical targets only (sidecar/engine/targets.py), so a rule cannot be
dodged by another spelling:

- `exact`: the target equals the value;
- `prefix`: the target is the value or continues it at a segment boundary (`/`, or `?`
  for a query): `/data/reports` matches `/data/reports/q1`, never `/data/reportsX`;
- `host`: the target's host (a URI's, or a `mailto:` address's domain) equals the value,
  on the scheme's default port (another port takes a `prefix` rule naming it);
- `host_suffix`: that host is the value or lies below it (`example.com` matches
  `api.example.com`, never `badexample.com`);
- `set`: any entry of the named set of the layer's agent (`SetEntries`, kept in the log);
- `any`: every target.

A rule applies to the call's main target, or (`role`) to its further targets in that role
(the recipients of a message, the grantee of a share): each target is judged alone, and a
target in a role no rule names is out of scope.

In `exact` and `prefix` values a path segment `CURRENT_USER` (and `principal:CURRENT_USER`)
stands for the caller, bound at match time. Rule values must already be canonical: the
engine refuses a mandate, grant or set whose values are not (`invalid_spec`), so that a
rule and a target are compared in one spelling. Pure functions, standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from quorumgate.proto import names
from quorumgate.proto.chainversions import targets_by_role
from quorumgate.proto.model import (
    ArgCheck,
    Argument,
    ArgumentRule,
    RuleKind,
    TargetRule,
    ToolMode,
    ToolRules,
)
from quorumgate.sidecar.engine.links import LINK_ROLE
from quorumgate.sidecar.engine.targets import (
    CANONICAL_VERSION_LATEST,
    TargetRefused,
    canonical_host,
    canonicalize_target,
)
from quorumgate.sidecar.engine.trace import TargetStep

MAILTO = "mailto:"
PRINCIPAL_CURRENT_USER = f"principal:{names.CURRENT_USER}"
_AUTHORITY_RE = re.compile(r"[a-z][a-z0-9+.-]*://([^/?#]*)")
# How strict a mode is: a grant may only make a call stricter, never relax it.
MODE_STRICTNESS = {
    ToolMode.READ: 0,
    ToolMode.DIRECT: 1,
    ToolMode.USER_CONFIRM: 2,
    ToolMode.OWNER_CONFIRM: 3,
}

Sets = Mapping[str, tuple[TargetRule, ...]]


def target_host(target: str) -> str | None:
    """The host a canonical target names: a URI's host (without port or user
    information, which canonical targets never carry), a mailto address's domain; None
    for paths, principals and other schemes without an authority."""
    if target.startswith(MAILTO):
        _, at, domain = target.rpartition("@")
        return domain if at else None
    match = _AUTHORITY_RE.match(target)
    if match is None:
        return None
    authority = match.group(1)
    if authority.startswith("["):
        return authority[: authority.find("]") + 1]
    return authority.partition(":")[0]


def _has_port(target: str) -> bool:
    match = _AUTHORITY_RE.match(target)
    if match is None:
        return False
    authority = match.group(1)
    return (
        ":" in authority[authority.find("]") + 1 :]
        if authority.startswith("[")
        else (":" in authority)
    )


def bind_current_user(value: str, principal: str) -> str:
    if value == PRINCIPAL_CURRENT_USER:
        return f"principal:{principal}"
    if names.CURRENT_USER not in value:
        return value
    return "/".join(principal if seg == names.CURRENT_USER else seg for seg in value.split("/"))


def _prefix_matches(prefix: str, target: str) -> bool:
    if target == prefix:
        return True
    if not target.startswith(prefix):
        return False
    if prefix.endswith("/"):
        return True
    return target[len(prefix)] in "/?"


def _host_suffix_matches(suffix: str, host: str) -> bool:
    return host == suffix or host.endswith("." + suffix)


def rule_matches(rule: TargetRule, target: str, principal: str, sets: Sets) -> bool:
    kind = rule.kind
    if kind is RuleKind.ANY:
        return True
    if kind is RuleKind.EXACT:
        return target == bind_current_user(rule.value, principal)
    if kind is RuleKind.PREFIX:
        return _prefix_matches(bind_current_user(rule.value, principal), target)
    if kind is RuleKind.SET:
        entries = sets.get(rule.value, ())
        return any(rule_matches(entry, target, principal, {}) for entry in entries)
    host = target_host(target)
    if host is None or _has_port(target):
        return False  # host rules admit the scheme's default port only
    if kind is RuleKind.HOST:
        return host == rule.value
    assert kind is RuleKind.HOST_SUFFIX, kind
    return _host_suffix_matches(rule.value, host)


def first_match(
    rules: ToolRules, target: str, principal: str, sets: Sets, role: str = ""
) -> TargetRule | None:
    """The first rule for targets in `role` ("" the main target) that matches `target`."""
    for rule in rules.targets:
        if rule.role == role and rule_matches(rule, target, principal, sets):
            return rule
    return None


def argument_holds(rule: ArgumentRule, arguments: tuple[Argument, ...]) -> bool:
    """The argument named by `rule` is present once, as a plain value, and satisfies it.
    Compared as given: a ceiling reads ASCII digits only (no other digits, signs or
    exponents), and `one_of` compares exactly."""
    found = [a for a in arguments if names.canonical_argument_name(a.name) == rule.name]
    if len(found) != 1 or found[0].text is None:
        return False
    value = found[0].text
    if rule.check is ArgCheck.MAX:
        return names.is_decimal(value) and names.decimal_at_most(value, rule.number)
    if rule.check is ArgCheck.ONE_OF:
        return value in rule.values
    assert rule.check is ArgCheck.MAX_CHARS, rule.check
    return len(value) <= rule.count


def stricter(a: ToolMode | None, b: ToolMode | None) -> ToolMode | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if MODE_STRICTNESS[a] >= MODE_STRICTNESS[b] else b


def _rule_mode(
    rule: TargetRule | None, default: ToolMode | None, exposed: bool
) -> tuple[ToolMode | None, bool]:
    """The mode a matching rule names (None for no rule) and whether its `when_exposed`
    mode made it stricter: in an exposed run the stricter of the two applies, so
    `when_exposed` never relaxes a rule (docs/provenance.md)."""
    if rule is None:
        return None, False
    mode = default if rule.mode is None else rule.mode
    if not exposed or rule.when_exposed is None:
        return mode, False
    exposed_mode = stricter(mode, rule.when_exposed)
    return exposed_mode, exposed_mode != mode


def judge_layer(
    rules: ToolRules | None,
    target: str,
    arguments: tuple[Argument, ...] | None,
    principal: str,
    sets: Sets,
    further_targets: tuple[tuple[str, str], ...] = (),
    default: ToolMode | None = None,
    links: tuple[str, ...] = (),
    steps: list[TargetStep] | None = None,
    failed: list[str] | None = None,
    exposed: bool = False,
    run_targets: frozenset[str] = frozenset(),
) -> tuple[bool, ToolMode | None]:
    """One layer's say on a call: (permitted, the mode it runs in for this layer).

    Every target is judged alone — the main one (`-` when there is none: only an `any`
    rule matches it) and each of its `further_targets`, (role, target) — by the first rule of
    its role that matches; a target no rule matches is out of scope. The mode is the
    strictest its targets' rules name, a rule without a mode counting as `default` (the
    tool's mode for a mandate, None for a grant, which never relaxes). `arguments` None
    skips the argument rules (a confirmation re-check: values are never kept in state).

    `links` (the canonical links inside the call's text, docs/engine.md "Links inside
    text") are judged by the rules of the `link` role, but a link no rule matches never
    puts the call out of scope: it sends the call to the principal's card
    (`user_confirm`), so a message to a known colleague carrying an unknown link is
    confirmed by a person rather than run directly.

    In an `exposed` run (docs/provenance.md) a matching rule's `when_exposed` mode applies
    too (the stricter of it and the rule's mode), except to the run's own `run_targets`,
    which are judged as in a clean run.

    `steps` and `failed`, when given, are appended to: how each target and each link
    met the rules, and the names of the argument rules that do not hold
    (sidecar/engine/trace.py)."""
    if rules is None:
        return True, None
    mode: ToolMode | None = None
    for role, each in (("", target), *further_targets):
        rule = first_match(rules, each, principal, sets, role)
        chosen, by_exposure = _rule_mode(rule, default, exposed and each not in run_targets)
        if steps is not None:
            # an equal rule earlier in the list would have matched first, so `index`
            # finds the one that did
            index = None if rule is None else rules.targets.index(rule)
            steps.append(TargetStep(role, each, index, rule, by_exposure))
        if rule is None:
            return False, None
        mode = stricter(mode, chosen)
    for link in links:
        rule = first_match(rules, link, principal, sets, LINK_ROLE)
        by_exposure = False
        if rule is None:
            mode = stricter(mode, ToolMode.USER_CONFIRM)
        else:
            chosen, by_exposure = _rule_mode(rule, default, exposed and link not in run_targets)
            mode = stricter(mode, chosen)
        if steps is not None:
            index = None if rule is None else rules.targets.index(rule)
            steps.append(TargetStep(LINK_ROLE, link, index, rule, by_exposure))
    if arguments is None:
        return True, mode
    if failed is not None:
        failed.extend(r.name for r in rules.arguments if not argument_holds(r, arguments))
        return (False, None) if failed else (True, mode)
    if not all(argument_holds(r, arguments) for r in rules.arguments):
        return False, None
    return True, mode


# ----------------------------------------------------------------------- rule values


def value_is_canonical(rule: TargetRule, version: int = CANONICAL_VERSION_LATEST) -> bool:
    """Whether a rule's value is already in the one spelling targets are compared in:
    `exact` and `prefix` values canonical targets (CURRENT_USER kept as written), hosts
    the canonical host (lower-case, IDNA A-labels, no port)."""
    kind, value = rule.kind, rule.value
    if kind in (RuleKind.ANY, RuleKind.SET):
        return True
    if kind in (RuleKind.HOST, RuleKind.HOST_SUFFIX):
        return canonical_host(value) == value
    scheme = "principal" if value.startswith("principal:") else None
    if value.startswith("/"):
        scheme = "file"
    elif scheme is None:
        head, colon, _ = value.partition(":")
        if not colon or not names.is_scheme(head):
            return False
        scheme = head
    try:
        canonical = canonicalize_target(
            value, principal=names.CURRENT_USER, schemes=(scheme,), version=version
        )
    except TargetRefused:
        return False
    return canonical == value


def rules_are_canonical(
    rules: tuple[ToolRules, ...], version: int = CANONICAL_VERSION_LATEST
) -> bool:
    return all(
        value_is_canonical(rule, version) and (targets_by_role(version) or rule.role == "")
        for entry in rules
        for rule in entry.targets
    )
