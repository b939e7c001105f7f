"""Every policy example of the policy guide (docs/policies.md) runs as written.

The first `toml` block is the billing mandate `test_policykit.py` runs with the calls its
text describes; the second is "The examples' tools"; every later block is a policy file
with `[[calls]]` that the test kit runs together with those tools, and each expectation
must hold. The explanation the guide prints is the one `policy explain` gives, and the
authority version 2 case of "A delegate without rules defers" decides as its table says.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from quorumgate.cli import main
from quorumgate.sidecar.policyfile import load_policy
from quorumgate.sidecar.policykit import EXIT_FAILED, EXIT_OK, run_policy_test
from tests.engine.test_policykit import PAGE_CALLS, POLICIES_PAGE

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
BLOCKS = [body for lang, body in FENCE.findall(POLICIES_PAGE.read_text()) if lang == "toml"]
TOOLS = BLOCKS[1]
EXAMPLES = BLOCKS[2:]


def _heading(block: str) -> str:
    text = POLICIES_PAGE.read_text()
    before = text[: text.index(block)]
    return before[before.rindex("\n## ") + 4 :].split("\n", 1)[0]


def _run(path: Path, text: str) -> tuple[int, str]:
    path.write_text(text)
    out = io.StringIO()
    return run_policy_test(str(path), out=out), out.getvalue()


def test_the_guide_has_one_example_per_rule() -> None:
    assert "[tools." in TOOLS and "[[calls]]" not in TOOLS
    headings = [_heading(block) for block in EXAMPLES]
    for rule in ("Target rules", "Named sets", "Modes", "Argument rules", "by role",
                 "`link` role", "`account:`", "control characters", "grant's rules",
                 "defers"):  # fmt: skip
        assert any(rule in heading for heading in headings), rule


@pytest.mark.parametrize("block", EXAMPLES, ids=[_heading(b) for b in EXAMPLES])
def test_every_example_does_what_its_calls_say(block: str, tmp_path: Path) -> None:
    assert "[[calls]]" in block and "[tools." not in block
    code, report = _run(tmp_path / "example.toml", TOOLS + "\n" + block)
    assert code == EXIT_OK, report
    assert " 0 failed" in report


def test_on_authority_version_2_the_helper_waits_for_a_known_payee(tmp_path: Path) -> None:
    [defer] = [b for b in EXAMPLES if "defers" in _heading(b)]
    code, report = _run(
        tmp_path / "v2.toml", "[settings]\nauthority_version = 2\n\n" + TOOLS + "\n" + defer
    )
    assert code == EXIT_FAILED, report
    assert "FAIL  the helper pays a known payee" in report
    assert "expected allow, got pending" in report


def test_the_explanation_shown_is_the_one_policy_explain_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = POLICIES_PAGE.read_text()
    section = text[text.index("## Why a call got its verdict") :]
    shown = section[section.index("```text\n") + len("```text\n") :]
    shown = shown[: shown.index("```")]
    path = tmp_path / "guide.toml"
    path.write_text(
        BLOCKS[0].replace(
            'allowed_tools = ["http.get", "payments.send"]',
            'allowed_tools = ["http.get", "payments.send"]\nprincipal = "dana"',
        )
        + PAGE_CALLS
    )
    argv = ["policy", "explain", str(path), "--agent", "billing", "--tool", "payments.send",
            "--target", "iban:de89 3704 0044 0532 0130 00", "--arg", "amount=120",
            "--arg", "currency=EUR"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out == shown


def test_the_python_mandate_is_the_files_billing_mandate(tmp_path: Path) -> None:
    """ "Policies from Python": `mandate(...)` with `tool_rules(...)` in the file's own words
    is the mandate the policy file's reader makes of the billing block."""
    text = POLICIES_PAGE.read_text()
    section = text[text.index("## Policies from Python") :]
    [source] = [b for lang, b in FENCE.findall(section) if lang == "python"][:1]
    namespace: dict[str, object] = {}
    exec(compile(source, "docs/policies.md", "exec"), namespace)
    path = tmp_path / "billing.toml"
    path.write_text(BLOCKS[0] + PAGE_CALLS)
    assert namespace["billing"] == load_policy(str(path)).agents["billing"]
