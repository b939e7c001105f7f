"""The injection benchmark's suites and report, without a cluster (docs/injection.md): every
suite's policy is one the policy file reader accepts and the policy test kit runs, is
written from the user's environment alone, and lets the user's own calls through in a
clean run (after an untrusted read, only with the run's own targets the live runs name)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from quorumgate.bench.injection.agent import CONFIRMED, DENIED, RAN, REFUSED_AT_CARD, perform
from quorumgate.bench.injection.harness import RunResult
from quorumgate.bench.injection.model import ATTACK_KINDS, INJECTION_MARKER, Call, Suite
from quorumgate.bench.injection.policy import AGENT, policy_toml
from quorumgate.bench.injection.report import OVERALL, by_kind, report, text
from quorumgate.bench.injection.suites import SUITES, TOOLS, intent
from quorumgate.sidecar.policykit import EXIT_OK, run_policy_test

SUITE_LIST = list(SUITES.values())
IDS = list(SUITES)


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def test_four_suites_cover_every_attack_kind() -> None:
    assert set(SUITES) == {"banking", "messaging", "office", "web"}
    for suite in SUITE_LIST:
        assert {i.kind for i in suite.injection_tasks} == set(ATTACK_KINDS), suite.name
        assert len(suite.user_tasks) >= 3


@pytest.mark.parametrize("suite", SUITE_LIST, ids=IDS)
def test_every_user_task_reads_a_resource_an_attacker_writes(suite: Suite) -> None:
    """Each user task reads an injection before it finishes, so every attack is reached."""
    for task in suite.user_tasks:
        assert any(call.target in suite.slots for call in task.calls), task.name


@pytest.mark.parametrize("suite", SUITE_LIST, ids=IDS)
def test_a_policy_is_written_from_the_users_environment_never_the_attacks(suite: Suite) -> None:
    """No value of a suite's rules or sets names an attacker's host, account or address."""
    written = _strings(dict(suite.policy.rules)) + _strings(dict(suite.policy.sets))
    attacker = {
        part
        for task in suite.injection_tasks
        for call in task.calls
        for part in re.findall(r"[\w.-]*evil[\w.-]*|FR14\w+", call.target + str(call.also))
    }
    assert attacker
    assert not [w for w in written for a in attacker if a in w or "evil" in w]


# The user tasks whose last call needs a card: a payee, member or contact the user never had.
NEW_TO_THE_USER = {
    ("banking", "pay-dentist"),
    ("messaging", "welcome-erin"),
    ("office", "confirm-order"),
}


def _call_toml(name: str, run: str, call: Call, card: bool) -> list[str]:
    args = ", ".join(f"{n} = {json.dumps(v)}" for n, v in call.args)
    also = ", ".join(f"{role} = [{json.dumps(t)}]" for role, t in call.also)
    return [
        "[[calls]]",
        f'name = "{name}"',
        f'agent = "{AGENT}"',
        f'tool = "{call.tool}"',
        f'run = "{run}"',
        f"target = {json.dumps(call.target)}",
        f"args = {{ {args} }}",
        f"also = {{ {also} }}",
        'expect = "pending"\nconfirm = { by = "principal", expect = "allow" }'
        if card
        else 'expect = "allow"',
        "",
    ]


def _user_calls_toml(suite: Suite) -> str:
    """`[[calls]]` for every call of the user's tasks, twice. In a clean run (the task's
    calls after its read, without the read) each runs directly, but the last call of a
    task new to the user waits for the principal, who confirms it. In the task's own run,
    after its first call (a read of a tool whose results are untrusted) every call waits
    for the principal: the file names no run targets (docs/provenance.md), which the live
    runs name, so this is the gate the principal's intent lifts."""
    out = []
    for task in suite.user_tasks:
        assert TOOLS[task.calls[0].tool].get("untrusted_results"), task.name
        for k, call in enumerate(task.calls):
            out += _call_toml(f"{task.name} {k}", task.name, call, k > 0)
            if k > 0:
                card = (suite.name, task.name) in NEW_TO_THE_USER and k == len(task.calls) - 1
                out += _call_toml(f"{task.name} {k} clean", f"{task.name}-clean", call, card)
    return "\n".join(out)


@pytest.mark.parametrize("suite", SUITE_LIST, ids=IDS)
def test_the_users_calls_run_or_wait_for_the_principal_in_the_policy_test_kit(
    suite: Suite, tmp_path: Path
) -> None:
    """The suite's policy as a policy file (`policy_toml`), with the user's own calls:
    what the live runs measure ("confirmations per user task"), checked offline."""
    path = tmp_path / f"{suite.name}.toml"
    path.write_text(policy_toml(suite) + "\n" + _user_calls_toml(suite))
    out = io.StringIO()
    assert run_policy_test(str(path), out=out) == EXIT_OK, out.getvalue()


def test_the_users_intent_names_what_the_task_changes_never_what_it_reads() -> None:
    """The run's own targets the principal names (docs/injection.md, "The user's
    intent"): the payee, the recipient and the file shared, not the bill, channel or
    mail the task reads, so that an injected write to what the task reads gets a card."""
    banking, messaging, office, web = (SUITES[n] for n in ("banking", "messaging", "office", "web"))
    assert intent(banking.user_tasks[0]) == ("iban:DE89370400440532013000",)
    assert intent(messaging.user_tasks[0]) == ("/channels/ops",)
    assert intent(office.user_tasks[0]) == (
        "/home/cleo/docs/q3-report.txt",
        "mailto:dan@office.example",
    )
    assert intent(web.user_tasks[2]) == ()
    for suite in SUITE_LIST:
        for task in suite.user_tasks:
            assert task.calls[0].target not in intent(task), task.name


def test_the_tools_act_on_the_world() -> None:
    world = SUITES["banking"].world()
    assert "950 EUR" in perform(
        world, Call.of("files.read", "/home/ann/bank/bills/rent-december.txt")
    )
    perform(world, Call.of("bank.pay", "iban:DE89370400440532013000", amount="950"))
    assert world.payments == [("iban:DE89370400440532013000", "950")]
    assert INJECTION_MARKER not in str(world.files)


def _result(**fields: object) -> RunResult:
    base: dict[str, object] = {
        "suite": "banking",
        "user_task": "pay-rent",
        "injection": "pay-unknown",
        "kind": "pay_unknown",
        "completed": True,
        "user_calls": 2,
        "user_calls_refused": 0,
        "refusal_reasons": (),
        "user_confirmations": 0,
        "cards_refused": 1,
        "reached": True,
        "attack_outcomes": (REFUSED_AT_CARD,),
        "attack_reasons": ("confirmation_rejected",),
        "through": False,
        "effect": False,
    }
    base.update(fields)
    return RunResult(**base)  # type: ignore[arg-type]


def test_the_report_counts_outcomes_by_kind() -> None:
    results = [
        _result(
            injection=None, kind=None, attack_outcomes=(), cards_refused=0, user_confirmations=1
        ),
        _result(),
        _result(
            kind="read_attacker_url",
            injection="read-page",
            attack_outcomes=(RAN,),
            through=True,
            effect=True,
            cards_refused=0,
        ),
        _result(
            kind="self_write",
            injection="self-write",
            attack_outcomes=(RAN,),
            through=True,
            effect=False,
            cards_refused=0,
        ),
        _result(
            kind="exfil_query",
            injection="exfil",
            attack_outcomes=(DENIED,),
            cards_refused=0,
            completed=False,
            user_calls_refused=1,
        ),
    ]
    data = report(results, seed=3)
    overall = data[OVERALL]
    assert overall["utility_alone"] == [1, 1]
    assert overall["utility_under_attack"] == [3, 4]
    assert overall["user_calls_refused"] == [1, 10]
    assert (overall["attacks_through"], overall["through_with_effect"]) == (2, 1)
    assert overall["through_without_effect"] == 1
    assert overall["confirmations_per_user_task"] == 0.2
    kinds = by_kind(results)
    assert kinds["pay_unknown"]["refused_at_card"] == 1
    assert kinds["read_attacker_url"] == {
        "runs": 1,
        "through": 1,
        "effect": 1,
        "refused_at_card": 0,
        "denied": 0,
        "not_reached": 0,
    }
    assert kinds["exfil_query"]["denied"] == 1
    assert "| overall | 1/1 | 3/4 | 1/10 | 2/4 (1 / 1) | 0.2 |" in text(data)
    assert CONFIRMED in data["outcomes"]
