"""The orchestrator example against a live 4-node cluster: its outcomes."""

from __future__ import annotations

import re
import sqlite3
import urllib.request

from quorumgate.examples.multi_agent import CARD_NUMBER, run_example
from quorumgate.proto.clusterfile import ClusterSpec, public_key_of
from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.proto.sealedkey import read_sealed
from tests.support.cluster import cluster_text

HEX_SEED = re.compile(r"(?<![0-9a-fA-F])[0-9a-fA-F]{64}(?![0-9a-fA-F])")


def test_the_example_refuses_the_injection_gates_the_payment_and_seals_the_card(
    cluster: ClusterSpec,
) -> None:
    lines: list[str] = []
    report = run_example(cluster, say=lines.append)
    steps = [(s.agent, s.tool, s.outcome, s.reason) for s in report.steps]
    assert steps == [
        ("researcher", "files.read", "allow", "ok"),
        ("researcher", "mail.send", "deny", "out_of_scope"),  # the injected call
        ("accountant", "payments.transfer", "pending", "confirmation_required"),
        ("planner", "confirm", "rejected", "confirmer_not_authorized"),  # an agent key
        ("principal", "confirm", "allow", "ok"),  # the principal confirmed the card
        ("accountant", "payments.transfer", "allow", "ok"),
        ("accountant", "files.write", "allow", "ok"),
    ]
    for step in report.steps:
        assert len(step.signers) >= cluster.f + 1, step
        assert len(set(step.signers)) == len(step.signers)
    # The agent was told one fixed sentence, and nothing about why.
    assert report.said_to_agent == [DENIAL_TEXT]
    assert not any("out_of_scope" in line for line in lines)
    # The payment ran once, through the executor, which kept only the last 4 digits.
    assert report.payments == [
        (1, "https://pay.acme.example/invoices/1042", "120.00", CARD_NUMBER[-4:])
    ]
    payments = sqlite3.connect(cluster.directory / "example" / "payments.db")
    assert payments.execute("SELECT COUNT(*) FROM payments").fetchone() == (1,)
    # The card number exists in plaintext nowhere: no database, WAL, log or output of any
    # replica, sidecar or tool, and no metrics page (only sealed ciphertext travelled).
    digits = CARD_NUMBER.replace(" ", "")
    text = cluster_text(cluster)
    for form in (CARD_NUMBER, digits, digits.encode().hex()):
        assert form not in text
        assert all(form not in line for line in lines)
    for member in cluster.members:
        for port in (member.metrics_port, member.sidecar_metrics_port):
            page = urllib.request.urlopen(f"http://{member.host}:{port}/metrics", timeout=5)
            assert digits not in page.read().decode()
    # The principal's key is on disk only sealed with its passphrase: no file under the
    # cluster directory, key files included, holds a seed that gives its public key.
    principal = read_sealed(cluster.directory / "example" / "principal.key").public_key
    seeds = set()
    for path in cluster.directory.rglob("*"):
        if path.is_file():
            seeds |= set(HEX_SEED.findall(path.read_bytes().decode("latin-1")))
    assert seeds and all(public_key_of(bytes.fromhex(s)) != principal for s in seeds)
