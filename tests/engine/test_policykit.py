"""The operator policy test kit (docs/policies.md): exit codes, reports, rule coverage."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from quorumgate.sidecar.policykit import (
    EXIT_FAILED,
    EXIT_MALFORMED,
    EXIT_OK,
    agent_key,
    run_policy_test,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "sidecar" / "examples" / "policy.toml"

SMALL = """
[tools."kb.search"]
mode = "read"

[tools."wire.transfer"]
mode = "direct"

[agents.alice]
allowed_tools = ["kb.search", "wire.transfer"]

[[calls]]
name = "alice searches"
agent = "alice"
tool = "kb.search"
target = "https://kb.example/"
expect = "allow"
"""


def _run(path: Path, json_output: bool = False) -> tuple[int, str]:
    out = io.StringIO()
    code = run_policy_test(str(path), json_output=json_output, out=out)
    return code, out.getvalue()


def test_the_shipped_example_passes() -> None:
    code, text = _run(EXAMPLE)
    assert code == EXIT_OK, text
    assert "FAIL" not in text
    assert "24 calls, 24 passed, 0 failed" in text


def test_json_report_is_machine_readable_and_deterministic() -> None:
    code, first = _run(EXAMPLE, json_output=True)
    _, second = _run(EXAMPLE, json_output=True)
    assert code == EXIT_OK
    assert first == second
    report = json.loads(first)
    assert report["ok"] is True and report["failed"] == 0
    assert {r["outcome"] for r in report["results"]} == {"allow", "deny", "flag", "pending"}


def test_a_failing_expectation_exits_1_and_names_the_call(tmp_path: Path) -> None:
    policy = tmp_path / "failing.toml"
    policy.write_text(
        SMALL
        + """
[[calls]]
name = "alice is wrongly expected to be refused"
agent = "alice"
tool = "wire.transfer"
target = "https://bank.example/"
expect = "deny"
"""
    )
    code, text = _run(policy)
    assert code == EXIT_FAILED
    assert "FAIL  alice is wrongly expected to be refused: expected deny, got allow (ok)" in text
    code, as_json = _run(policy, json_output=True)
    assert code == EXIT_FAILED and json.loads(as_json)["failed"] == 1


def test_a_wrong_reason_fails_even_when_the_outcome_matches(tmp_path: Path) -> None:
    policy = tmp_path / "reason.toml"
    policy.write_text(
        SMALL
        + """
[[calls]]
agent = "alice"
tool = "no.such.tool"
expect = "deny"
reason = "out_of_scope"
"""
    )
    code, text = _run(policy)
    assert code == EXIT_FAILED
    assert "expected deny (out_of_scope), got deny (unknown_tool)" in text


def test_a_rule_no_call_makes_fire_is_reported_as_a_warning(tmp_path: Path) -> None:
    policy = tmp_path / "coverage.toml"
    policy.write_text(SMALL)
    code, text = _run(policy)
    assert code == EXIT_OK  # a warning is not a failure
    assert 'WARN  agents.alice.allowed_tools["wire.transfer"]: no call makes this rule fire' in text
    assert 'allowed_tools["kb.search"]' not in text
    assert "agents.alice.enforcement (enforce): no call tries a tool outside the mandate" in text
    assert "tools.wire.transfer: no call uses this tool" in text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[agents.alice\nallowed_tools = []", "TOML syntax error"),
        (SMALL.replace('expect = "allow"', 'expect = "permit"'),
         "calls[0].expect: must be one of allow, flag, deny, pending; got 'permit'"),
        (SMALL.replace('expect = "allow"', 'expected = "allow"'),
         "calls[0]: unknown field 'expected'"),
        (SMALL.replace('["kb.search", "wire.transfer"]', '"kb.search"'),
         "agents.alice.allowed_tools: must be a list of tool names or \"unrestricted\""),
        (SMALL.replace('allowed_tools = ["kb.search", "wire.transfer"]\n', ""),
         "agents.alice.allowed_tools: is required"),
        (SMALL.replace('agent = "alice"', 'agent = "bob"'), "calls[0].agent: unknown agent 'bob'"),
        (SMALL.replace('mode = "read"', 'mode = "sometimes"'), "tools.kb.search.mode"),
        ("[settings]\nnot_a_limit = 3\n", "settings.not_a_limit: not an engine limit"),
    ],
)  # fmt: skip
def test_a_malformed_file_exits_2_with_a_message_naming_the_line_or_field(
    tmp_path: Path, content: str, message: str
) -> None:
    policy = tmp_path / "bad.toml"
    policy.write_text(content)
    code, text = _run(policy)
    assert code == EXIT_MALFORMED
    assert message in text, text


def test_toml_syntax_errors_name_the_line(tmp_path: Path) -> None:
    policy = tmp_path / "syntax.toml"
    policy.write_text('[tools."kb.search"]\nmode = read\n')
    code, text = _run(policy)
    assert code == EXIT_MALFORMED
    assert "line 2" in text, text


def test_a_missing_file_is_malformed_not_a_crash(tmp_path: Path) -> None:
    code, text = _run(tmp_path / "absent.toml")
    assert code == EXIT_MALFORMED and "no such file" in text


def test_keys_are_derived_from_names_deterministically() -> None:
    assert bytes(agent_key("alice").verify_key) == bytes(agent_key("alice").verify_key)
    assert bytes(agent_key("alice").verify_key) != bytes(agent_key("bob").verify_key)


def test_a_refused_delegation_setup_is_checked_against_its_expectation(tmp_path: Path) -> None:
    policy = tmp_path / "delegation.toml"
    policy.write_text(
        SMALL
        + """
[agents.bob]
allowed_tools = []

[delegations.alice-bob]
parent = "alice"
child = "bob"
"""
    )
    code, text = _run(policy)
    assert code == EXIT_FAILED
    assert "delegations.alice-bob: expected applied, got rejected (delegation_refused)" in text


RULES = """
[tools."http.get"]
mode = "read"

[tools."payments.send"]
mode = "user_confirm"
schemes = ["https"]
min_tier = "delegate"
args = { amount = "amount", currency = "text" }

[agents.billing]
allowed_tools = ["http.get", "payments.send"]
delegation_policy = "attenuated"

[agents.billing.rules."http.get"]
targets = [{ host_suffix = "example.com" }]

[agents.billing.rules."payments.send"]
targets = [{ set = "payees", mode = "direct" }, "any"]
args = { amount = { max = 500 }, currency = { one_of = ["CHF", "EUR"] } }

[agents.helper]
allowed_tools = "unrestricted"

[sets.billing]
payees = [{ prefix = "https://pay.example.com/acct/77" }]

[delegations.narrow]
parent = "billing"
child = "helper"
rules = { "http.get" = { targets = [{ host = "api.example.com" }] } }

[agents.clerk]
allowed_tools = ["payments.send"]

[agents.clerk.rules."payments.send"]
targets = [{ any = true, mode = "direct" }]
args = { amount = { max = "9.50" } }

[[calls]]
name = "the clerk pays small amounts directly"
agent = "clerk"
tool = "payments.send"
target = "https://pay.example.com/acct/1"
args = { amount = "9.5" }
expect = "allow"

[[calls]]
name = "an allowed site"
agent = "billing"
tool = "http.get"
target = "https://docs.example.com/"
expect = "allow"

[[calls]]
name = "the attacker's site"
agent = "billing"
tool = "http.get"
target = "https://evil.example/exfil"
run = "run-2"
expect = "deny"
reason = "out_of_scope"

[[calls]]
name = "a known payee, within the ceiling"
agent = "billing"
tool = "payments.send"
target = "https://pay.example.com/acct/77"
args = { amount = "120.50", currency = "EUR" }
expect = "allow"

[[calls]]
name = "a new payee"
agent = "billing"
tool = "payments.send"
target = "https://pay.example.com/acct/99"
args = { amount = "10", currency = "EUR" }
expect = "pending"

[[calls]]
name = "over the ceiling"
agent = "billing"
tool = "payments.send"
target = "https://pay.example.com/acct/77"
args = { amount = "500.01", currency = "EUR" }
run = "run-3"
expect = "deny"
reason = "out_of_scope"

[[calls]]
name = "the helper under the narrow grant"
agent = "helper"
tool = "http.get"
target = "https://docs.example.com/"
via = "narrow"
expect = "deny"
reason = "out_of_scope"
"""


def test_a_policy_with_target_rules_sets_and_ceilings(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(RULES)
    code, text = _run(path)
    assert code == EXIT_OK, text
    assert "7 calls, 7 passed, 0 failed" in text
    assert ".targets[" not in text  # every target rule is made to fire by some call


def test_a_target_rule_no_call_makes_fire_is_reported(tmp_path: Path) -> None:
    """The kit names each target rule that no call decides, as it does tools."""
    new_payee = RULES.index('[[calls]]\nname = "a new payee"')
    over = RULES.index('[[calls]]\nname = "over the ceiling"')
    path = tmp_path / "rules.toml"
    path.write_text(RULES[:new_payee] + RULES[over:])
    code, text = _run(path)
    assert code == EXIT_OK, text
    assert 'agents.billing.rules."payments.send".targets[1]: no call makes this rule fire' in text
    assert 'rules."payments.send".targets[0]' not in text  # the payee set still fires


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ('targets = [{ host_suffix = "example.com" }]', 'targets = [{ hostname = "x" }]'),
            "unknown field 'hostname'",
        ),
        (
            ('targets = [{ host_suffix = "example.com" }]', "targets = []"),
            'a non-empty list (["any"] for any target)',
        ),
        (("max = 500 }", "max = 500.5 }"), 'an integer, or a decimal as a string ("9.50")'),
        (
            ('[agents.billing.rules."http.get"]\ntargets = [{ host_suffix = "example.com" }]', ""),
            'no entry for http.get; write targets = ["any"]',
        ),
        (('mode = "direct" }', 'mode = "sometimes" }'), "mode: must be one of"),
        (("payees = [{ prefix", "Payees = [{ prefix"), "a set name matches"),
    ],
)
def test_malformed_rules_are_named(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    old, new = change
    assert old in RULES
    path = tmp_path / "bad.toml"
    path.write_text(RULES.replace(old, new, 1))
    code, text = _run(path)
    assert code == EXIT_MALFORMED, text
    assert message in text, text


def test_a_non_canonical_rule_value_is_refused_by_the_engine(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(RULES.replace('host_suffix = "example.com"', 'host_suffix = "Example.COM"'))
    code, text = _run(path)
    assert code == EXIT_MALFORMED, text
    assert "agents.billing: the engine refuses it (invalid_spec)" in text


SHARES = """
[tools."files.share"]
mode = "user_confirm"
schemes = ["file"]
min_tier = "delegate"
roles = { grantee = { schemes = ["mailto"], max = 4 } }

[tools."mail.search"]
mode = "read"
schemes = ["mailto"]
target_optional = true

[agents.clerk]
allowed_tools = ["files.share", "mail.search"]

[agents.clerk.rules."files.share"]
targets = [
    { prefix = "/shared", mode = "direct" },
    { set = "contacts", mode = "direct", role = "grantee" },
    { host_suffix = "example.com", role = "grantee" },
]

[agents.clerk.rules."mail.search"]
targets = ["any"]

[sets.clerk]
contacts = [{ exact = "mailto:ann@example.com" }]

[[calls]]
name = "a known contact: shared directly"
agent = "clerk"
tool = "files.share"
target = "/shared/q1.pdf"
also = { grantee = "mailto:ann@EXAMPLE.com" }
expect = "allow"

[[calls]]
name = "a new colleague among the grantees: confirmation"
agent = "clerk"
tool = "files.share"
target = "/shared/q1.pdf"
also = { grantee = ["mailto:ann@example.com", "mailto:new@sales.example.com"] }
expect = "pending"

[[calls]]
name = "an outsider: refused"
agent = "clerk"
tool = "files.share"
target = "/shared/q1.pdf"
also = { grantee = ["mailto:x@evil.example"] }
run = "run-2"
expect = "deny"
reason = "out_of_scope"

[[calls]]
name = "a search without a sender"
agent = "clerk"
tool = "mail.search"
expect = "allow"
"""


def test_a_policy_with_further_targets_by_role(tmp_path: Path) -> None:
    """Tools declare roles and optional targets, rules name the role
    they judge, calls carry further targets (`also`); each rule is seen to fire."""
    path = tmp_path / "shares.toml"
    path.write_text(SHARES)
    code, text = _run(path)
    assert code == EXIT_OK, text
    assert "4 calls, 4 passed, 0 failed" in text
    assert ".targets[" not in text
    # without the outsider, the grantee rule that lets new colleagues through still fires;
    # without the colleague it does not, and the kit says so
    colleague = SHARES.index('[[calls]]\nname = "a new colleague')
    outsider = SHARES.index('[[calls]]\nname = "an outsider')
    path.write_text(SHARES[:colleague] + SHARES[outsider:])
    code, text = _run(path)
    assert code == EXIT_OK, text
    assert 'agents.clerk.rules."files.share".targets[2]: no call makes this rule fire' in text
    path.write_text(
        SHARES.replace('role = "grantee" },\n    { host', 'role = "owner" },\n    { host')
    )
    code, text = _run(path)
    # a rule for a role the tool does not have never fires; the known contact now waits
    assert code == EXIT_FAILED and "targets[1]: no call makes this rule fire" in text
    path.write_text(SHARES.replace("max = 4", "max = 0"))
    code, text = _run(path)
    assert code == EXIT_MALFORMED and "tools.files.share.roles.grantee" in text


POLICIES_PAGE = Path(__file__).resolve().parents[2] / "docs" / "policies.md"
PAGE_CALLS = """
[principals]
dana = {}

[tools."http.get"]
mode = "read"

[tools."payments.send"]
mode = "user_confirm"
schemes = ["iban"]
min_tier = "delegate"
args = { amount = "amount", currency = "text" }

[[calls]]
name = "a known payee, however spaced"
agent = "billing"
tool = "payments.send"
target = "iban:de89 3704 0044 0532 0130 00"
args = { amount = "120", currency = "EUR" }
expect = "allow"

[[calls]]
name = "a new payee waits for the principal"
agent = "billing"
tool = "payments.send"
target = "iban:GB82WEST12345698765432"
args = { amount = "120", currency = "EUR" }
expect = "pending"
confirm = { by = "principal", expect = "allow" }

[[calls]]
name = "a mistyped IBAN"
agent = "billing"
tool = "payments.send"
target = "iban:GB82WEST12345698765433"
args = { amount = "120", currency = "EUR" }
run = "run-2"
expect = "deny"
reason = "malformed_target"

[[calls]]
name = "over the ceiling"
agent = "billing"
tool = "payments.send"
target = "iban:DE89370400440532013000"
args = { amount = "500.01", currency = "EUR" }
run = "run-3"
expect = "deny"
reason = "out_of_scope"

[[calls]]
name = "the vendor's documentation"
agent = "billing"
tool = "http.get"
target = "https://docs.vendor.example/api"
expect = "allow"
"""


def test_the_policy_guide_example_does_what_the_guide_says(tmp_path: Path) -> None:
    """docs/policies.md, "What a tool may be called on": the example mandate, run with the
    calls its text describes (the tools it names, billing acting for a principal)."""
    text = POLICIES_PAGE.read_text()
    section = text[text.index("## What a tool may be called on") :]
    block = section[section.index("```toml\n") + len("```toml\n") : section.index("\n```\n")]
    block = block.replace(
        'allowed_tools = ["http.get", "payments.send"]',
        'allowed_tools = ["http.get", "payments.send"]\nprincipal = "dana"',
    )
    path = tmp_path / "guide.toml"
    path.write_text(block + PAGE_CALLS)
    code, report = _run(path)
    assert code == EXIT_OK, report
    assert "5 calls, 5 passed, 0 failed" in report
