"""The vendored-agent example (examples/vendored_agent.py) on a live cluster: the unmodified loop's
injected mail is withheld, the fetch runs, and the mail tool is never called."""

from __future__ import annotations

from quorumgate.examples.vendored_agent import INVOICE_URL, run_vendored
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.sdk.sync import SyncClient


def test_the_vendored_agents_injected_call_is_withheld(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    lines: list[str] = []
    report = run_vendored(cluster, say=lines.append)
    assert report.fetched == [INVOICE_URL] and report.outbox == []
    assert report.decisions == {"released (ok)": 1.0, "withheld (out_of_scope)": 1.0}
    assert f"model: {DENIAL_TEXT}" in report.transcript
    assert "tool call: send_mail" not in report.transcript  # the loop never saw the call
