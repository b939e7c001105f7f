"""`policy explain` shows the links inside a call's text and the `link` rule each met
(docs/policies.md, "Links inside messages"): the policy guide's own example."""

from __future__ import annotations

from pathlib import Path

from quorumgate.sidecar.policyexplain import explain_call
from tests.engine.test_policy_guide import EXAMPLES, TOOLS, _heading


def _guide_policy(tmp_path: Path) -> str:
    """The examples' tools and the `link` role's example, as the guide's test runs them."""
    (block,) = [b for b in EXAMPLES if "`link` role" in _heading(b)]
    path = tmp_path / "policy.toml"
    path.write_text(TOOLS + "\n" + block)
    return str(path)


def _explain(path: str, body: str):  # type: ignore[no-untyped-def]
    return explain_call(
        path,
        agent="assistant",
        tool="chat.post",
        target="mailto:carol@corp.example",
        arguments={"body": body},
    )


def test_an_unknown_link_is_shown_as_what_sent_the_call_to_the_card(tmp_path: Path) -> None:
    path = _guide_policy(tmp_path)
    unknown = _explain(path, "Log in again at https://login.evil.example/sso")
    assert unknown.outcome == "pending"
    text = unknown.text()
    assert "https://login.evil.example/sso (link): no link rule matches -> user_confirm" in text
    assert unknown.decided_by == (
        'agents.assistant.rules."chat.post": no link rule matches '
        "https://login.evil.example/sso, so the principal's card (user_confirm)"
    )
    links = [t for t in unknown.to_json()["layers"][0]["targets"] if t["role"] == "link"]
    assert links == [
        {
            "role": "link",
            "target": "https://login.evil.example/sso",
            "rule": None,
            "rule_text": None,
            "by_exposure": False,
        }
    ]


def test_a_known_link_names_the_link_rule_it_met(tmp_path: Path) -> None:
    path = _guide_policy(tmp_path)
    known = _explain(path, "Notes: https://wiki.corp.example/q3")
    assert known.outcome == "allow"
    assert (
        'https://wiki.corp.example/q3 (link): targets[1] { host_suffix = "corp.example", '
        'mode = "direct", role = "link" } matches'
    ) in known.text()
    # the body's value is never shown: only the links found in it
    assert "Notes:" not in known.text()
