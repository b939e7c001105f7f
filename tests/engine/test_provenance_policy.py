"""The provenance page's policy (docs/provenance.md) as `policy test` and `policy explain`
run it, and the grammar's spellings: the policy file, the SDK builders and the codec."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumgate.proto import codec
from quorumgate.proto.model import RuleKind, TargetRule, ToolMode
from quorumgate.sdk.builders import tool_rules, tool_spec
from quorumgate.sidecar.policyexplain import explain_call, rule_text
from quorumgate.sidecar.policyfile import PolicyFileError, parse_target_rule
from quorumgate.sidecar.policykit import check_policy

PAGE = Path(__file__).resolve().parents[2] / "docs" / "provenance.md"


def _page_policy(tmp_path: Path) -> Path:
    text = PAGE.read_text()
    block = text[text.index("```toml\n") + len("```toml\n") :]
    path = tmp_path / "policy.toml"
    path.write_text(block[: block.index("\n```\n")] + "\n")
    return path


def test_the_pages_policy_passes_its_own_calls(tmp_path: Path) -> None:
    report = check_policy(str(_page_policy(tmp_path)))
    assert report.ok, [r for r in report.results if not r.passed] or report.setup_failures
    assert len(report.results) == 5


def test_explain_shows_the_exposure_and_the_rule_that_applied_because_of_it(
    tmp_path: Path,
) -> None:
    path = str(_page_policy(tmp_path))
    after = [("web.fetch", "https://evil.example/post")]
    exposed = explain_call(
        path, agent="assistant", tool="mail.send", target="mailto:bob@corp.example", after=after
    )
    assert exposed.outcome == "pending" and exposed.exposed_by is not None
    assert exposed.exposed_by[1] == "web.fetch"
    text = exposed.text()
    assert "run: exposed since height" in text and "by a call of web.fetch" in text
    assert "(its when_exposed applies: the run is exposed)" in text
    assert exposed.decided_by == (
        'agents.assistant.rules."mail.send".targets[0] (when_exposed = user_confirm: '
        "the run is exposed)"
    )
    assert exposed.to_json()["layers"][0]["targets"][0]["by_exposure"] is True
    clean = explain_call(
        path, agent="assistant", tool="mail.send", target="mailto:bob@corp.example"
    )
    assert clean.outcome == "allow" and clean.exposed_by is None
    assert "run: exposed" not in clean.text()


def test_when_exposed_is_spelled_alike_in_the_file_the_sdk_and_the_codec() -> None:
    rule = parse_target_rule(
        {"set": "colleagues", "mode": "direct", "when_exposed": "user_confirm"}, "r"
    )
    assert rule == TargetRule(
        RuleKind.SET, "colleagues", ToolMode.DIRECT, "", ToolMode.USER_CONFIRM
    )
    assert rule_text(rule) == (
        '{ set = "colleagues", mode = "direct", when_exposed = "user_confirm" }'
    )
    entry = tool_rules("web.fetch", [{"any": True, "when_exposed": "user_confirm"}])
    assert entry.targets[0].when_exposed is ToolMode.USER_CONFIRM
    with pytest.raises(PolicyFileError, match="when_exposed"):
        parse_target_rule({"any": True, "when_exposed": "later"}, "r")
    spec = tool_spec("web.fetch", "read", schemes=["https"], untrusted_results=True)
    assert codec.decode_tool_spec(codec.encode_tool_spec(spec)) == spec
    pb = codec._encode_target_rule(rule)
    assert codec._decode_target_rule(pb) == rule
