"""The injection benchmark's figures: per suite and overall, and per attack kind
(docs/injection.md, "Today's figures")."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

from quorumgate.bench.injection.agent import CONFIRMED, DENIED, RAN, REFUSED_AT_CARD
from quorumgate.bench.injection.harness import RunResult
from quorumgate.bench.injection.model import ATTACK_KINDS

OVERALL = "overall"


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole}" if whole else "-"


def summary(results: Sequence[RunResult]) -> dict[str, Any]:
    """Counts for one group of runs: utility alone and under attack, the user's own calls
    refused, attacks that got through (with and without effect), confirmations."""
    alone = [r for r in results if r.injection is None]
    attacked = [r for r in results if r.injection is not None]
    through = [r for r in attacked if r.through]
    return {
        "runs": len(results),
        "utility_alone": [sum(r.completed for r in alone), len(alone)],
        "utility_under_attack": [sum(r.completed for r in attacked), len(attacked)],
        "user_calls_refused": [
            sum(r.user_calls_refused for r in results),
            sum(r.user_calls for r in results),
        ],
        "attacks": len(attacked),
        "attacks_reached": sum(r.reached for r in attacked),
        "attacks_through": len(through),
        "through_with_effect": sum(r.effect for r in through),
        "through_without_effect": sum(not r.effect for r in through),
        "effect_without_through": sum(r.effect and not r.through for r in attacked),
        "user_confirmations": sum(r.user_confirmations for r in results),
        "confirmations_per_user_task": round(
            sum(r.user_confirmations for r in results) / len(results), 3
        )
        if results
        else 0.0,
        "attack_cards_refused": sum(r.cards_refused for r in attacked),
    }


def by_kind(results: Iterable[RunResult]) -> dict[str, dict[str, int]]:
    """Per attack kind: how each attack ended (the worst of its calls for the user)."""
    out = {
        kind: {
            "runs": 0,
            "through": 0,
            "effect": 0,
            "refused_at_card": 0,
            "denied": 0,
            "not_reached": 0,
        }
        for kind in ATTACK_KINDS
    }
    for r in results:
        if r.kind is None:
            continue
        row = out[r.kind]
        row["runs"] += 1
        row["effect"] += r.effect
        if not r.reached:
            row["not_reached"] += 1
        elif r.through:
            row["through"] += 1
        elif REFUSED_AT_CARD in r.attack_outcomes:
            row["refused_at_card"] += 1
        else:
            row["denied"] += 1
    return out


def report(results: Sequence[RunResult], seed: int) -> dict[str, Any]:
    suites = sorted({r.suite for r in results})
    return {
        "seed": seed,
        "suites": {s: summary([r for r in results if r.suite == s]) for s in suites},
        OVERALL: summary(results),
        "by_kind": by_kind(results),
        "by_suite_and_kind": {s: by_kind(r for r in results if r.suite == s) for s in suites},
        "runs": [asdict(r) for r in results],
        "outcomes": [RAN, CONFIRMED, REFUSED_AT_CARD, DENIED],
    }


def text(data: dict[str, Any]) -> str:
    """Two markdown tables: per suite, and per attack kind."""
    lines = [
        "| suite | utility alone | utility under attack | user calls refused | attacks "
        "through (with effect / without) | confirmations per user task |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    rows = [*data["suites"].items(), (OVERALL, data[OVERALL])]
    for name, s in rows:
        lines.append(
            f"| {name} | {_share(*s['utility_alone'])} | {_share(*s['utility_under_attack'])} "
            f"| {_share(*s['user_calls_refused'])} | {_share(s['attacks_through'], s['attacks'])} "
            f"({s['through_with_effect']} / {s['through_without_effect']}) "
            f"| {s['confirmations_per_user_task']} |"
        )
    lines += [
        "",
        "| attack kind | runs | through | with effect | refused at card | denied | not reached |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, k in data["by_kind"].items():
        lines.append(
            f"| {kind} | {k['runs']} | {k['through']} | {k['effect']} | {k['refused_at_card']} "
            f"| {k['denied']} | {k['not_reached']} |"
        )
    return "\n".join(lines)
