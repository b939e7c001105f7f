"""`quorumgate policy explain` (docs/policies.md, "Why a call got its verdict"): the
explanation comes from the judge's own trace, so it agrees with the verdict the engine
gives without one, and it names the rule that decided."""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest

from quorumgate.cli import main
from quorumgate.proto.model import Outcome, ToolMode
from quorumgate.sidecar.policyexplain import explain_call, explain_with, run_policy_explain
from quorumgate.sidecar.policyfile import PolicyFileError, load_policy
from quorumgate.sidecar.policykit import EXIT_MALFORMED, EXIT_OK, _Runner, check_policy
from tests.engine.test_policykit import EXAMPLE, PAGE_CALLS, POLICIES_PAGE, RULES, SHARES, SMALL

PAYMENTS = """
[tools."payments.send"]
mode = "user_confirm"
schemes = ["iban"]
min_tier = "delegate"
args = { amount = "amount", currency = "text" }

[agents.billing]
allowed_tools = ["payments.send"]
delegation_policy = "attenuated"

[agents.billing.rules."payments.send"]
targets = [{ set = "payees", mode = "direct" }, "any"]
args = { amount = { max = 500 }, currency = { one_of = ["CHF", "EUR"] } }

[agents.helper]
allowed_tools = "unrestricted"

[sets.billing]
payees = [{ exact = "iban:DE89370400440532013000" }]

[delegations.billing-helper]
parent = "billing"
child = "helper"
run = "run-1"
expires_in_ms = 600000
"""
KNOWN = "iban:de89 3704 0044 0532 0130 00"
NEW = "iban:GB82WEST12345698765432"
EUR_120 = {"amount": "120", "currency": "EUR"}


def _guide_policy() -> str:
    text = POLICIES_PAGE.read_text()
    section = text[text.index("## What a tool may be called on") :]
    block = section[section.index("```toml\n") + len("```toml\n") : section.index("\n```\n")]
    return block.replace(
        'allowed_tools = ["http.get", "payments.send"]',
        'allowed_tools = ["http.get", "payments.send"]\nprincipal = "dana"',
    ) + PAGE_CALLS


POLICIES = {
    "example": EXAMPLE.read_text(),
    "small": SMALL,
    "rules": RULES,
    "shares": SHARES,
    "guide": _guide_policy(),
    "payments": PAYMENTS,
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_the_explanation_agrees_with_the_verdict_for_every_call(
    tmp_path: Path, name: str
) -> None:
    """Every call of every example, made in order with a trace, gets the verdict the test
    kit's untraced run gets; the mode the trace reports is the one the outcome shows; and
    the traced engine ends in the same state."""
    path = tmp_path / f"{name}.toml"
    path.write_text(POLICIES[name])
    report = check_policy(str(path))
    policy = load_policy(str(path))
    traced = _Runner(policy)
    traced.setup()
    plain = copy.deepcopy(traced)  # sealing an envelope is randomized: one setup for both
    for call, result in zip(policy.calls, report.results, strict=True):
        explanation = explain_with(traced, call)
        plain.propose(call)
        assert (explanation.outcome, explanation.reason) == (result.outcome, result.reason)
        assert explanation.decided_by
        if explanation.outcome == Outcome.DENY.value or explanation.mode is None:
            continue
        needs_confirmation = ToolMode(explanation.mode).needs_confirmation
        assert (explanation.outcome == Outcome.PENDING.value) == needs_confirmation, call.name
    assert traced.engine.state_root() == plain.engine.state_root()


def test_a_known_payee_is_decided_by_the_rule_that_names_direct(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(PAYMENTS)
    known = explain_call(str(path), agent="billing", tool="payments.send", target=KNOWN,
                         arguments=EUR_120)  # fmt: skip
    assert (known.outcome, known.mode) == ("allow", "direct")
    assert known.decided_by == 'agents.billing.rules."payments.send".targets[0] (mode = direct)'
    new = explain_call(str(path), agent="billing", tool="payments.send", target=NEW,
                       arguments=EUR_120)  # fmt: skip
    assert (new.outcome, new.mode) == ("pending", "user_confirm")
    assert new.decided_by.startswith('agents.billing.rules."payments.send".targets[1]')
    over = explain_call(str(path), agent="billing", tool="payments.send", target=NEW,
                        arguments={"amount": "500.01", "currency": "EUR"})  # fmt: skip
    assert (over.outcome, over.reason) == ("deny", "out_of_scope")
    assert over.decided_by == 'agents.billing.rules."payments.send".args.amount (out_of_scope)'
    assert "500.01" not in over.text() and "500.01" not in str(over.to_json())


def test_a_delegate_without_rules_is_shown_pinned_at_the_tools_mode(tmp_path: Path) -> None:
    """The delegator's `known payee -> direct` does not take effect for a delegate whose
    own mandate has no rule for the tool: the explanation lists the three layers, names
    the delegate's mandate as deciding, and says how to change it."""
    # authority version 2: a delegate's mandate without rules pins the tool's mode
    v2 = "[settings]\nauthority_version = 2\n" + PAYMENTS
    path = tmp_path / "p.toml"
    path.write_text(v2)
    e = explain_call(str(path), agent="helper", tool="payments.send", target=KNOWN,
                     arguments=EUR_120, via="billing-helper")  # fmt: skip
    assert (e.outcome, e.mode) == ("pending", "user_confirm")
    assert [layer.where for layer in e.layers] == [
        'agents.helper.rules."payments.send"',
        'delegations.billing-helper.rules."payments.send"',
        'agents.billing.rules."payments.send"',
    ]
    assert [layer.step.mode for layer in e.layers] == [
        ToolMode.USER_CONFIRM, None, ToolMode.DIRECT,
    ]  # fmt: skip
    assert e.decided_by.startswith('agents.helper.rules."payments.send": no rules for the tool')
    assert e.notes and "has no rules" in e.notes[0]
    # with a rule of its own naming direct, the delegator's rules decide
    path.write_text(v2.replace(
        'allowed_tools = "unrestricted"',
        'allowed_tools = "unrestricted"\n\n[agents.helper.rules."payments.send"]\n'
        'targets = [{ any = true, mode = "direct" }]',
    ))  # fmt: skip
    e = explain_call(str(path), agent="helper", tool="payments.send", target=KNOWN,
                     arguments=EUR_120, via="billing-helper")  # fmt: skip
    assert (e.outcome, e.mode, e.notes) == ("allow", "direct", ())


def test_a_delegate_without_rules_is_shown_deferring_on_a_new_chain(tmp_path: Path) -> None:
    """Authority version 3: the delegate's mandate names no mode, the delegator's known
    payee rule decides, and the text says so."""
    path = tmp_path / "p.toml"
    path.write_text(PAYMENTS)
    e = explain_call(str(path), agent="helper", tool="payments.send", target=KNOWN,
                     arguments=EUR_120, via="billing-helper")  # fmt: skip
    assert (e.outcome, e.mode, e.notes) == ("allow", "direct", ())
    assert [layer.step.mode for layer in e.layers] == [None, None, ToolMode.DIRECT]
    assert e.decided_by == 'agents.billing.rules."payments.send".targets[0] (mode = direct)'
    assert "names no mode: its delegators decide" in e.text()


def test_the_command_prints_the_deciding_rule_and_never_a_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.toml"
    path.write_text(PAYMENTS)
    code = main([
        "policy", "explain", str(path), "--agent", "billing", "--tool", "payments.send",
        "--target", KNOWN, "--arg", "amount=137", "--arg", "currency=EUR",
    ])  # fmt: skip
    text = capsys.readouterr().out
    assert code == EXIT_OK
    assert "verdict: allow (ok)" in text
    assert 'decided by: agents.billing.rules."payments.send".targets[0]' in text
    assert "137" not in text and "EUR" not in text


@pytest.mark.parametrize(
    "change",
    [{"agent": "nobody"}, {"via": "no-such-delegation"}, {"arguments": ["amount"]}],
)
def test_a_malformed_call_exits_2(tmp_path: Path, change: dict[str, object]) -> None:
    path = tmp_path / "p.toml"
    path.write_text(PAYMENTS)
    kwargs: dict[str, object] = {"agent": "billing", "tool": "payments.send", "target": KNOWN}
    kwargs.update(change)
    out = io.StringIO()
    assert run_policy_explain(str(path), out=out, **kwargs) == EXIT_MALFORMED  # type: ignore[arg-type]
    assert "malformed" in out.getvalue()
    with pytest.raises(PolicyFileError):
        explain_call(str(tmp_path / "absent.toml"), agent="billing", tool="x")
