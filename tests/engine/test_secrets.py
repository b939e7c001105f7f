"""Secrets only in envelopes (docs/engine.md): a value shaped like a secret
is refused in a target or a plain argument (`secret_in_plaintext`), before ordering by the
admission check and again at execution, and no verdict, artifact or card keeps it. Each
attack is shown first as a version 1 chain still decides it."""

from __future__ import annotations

import pytest

from quorumgate.proto import tx
from quorumgate.proto.model import Argument, EnvelopeArg, Outcome, Proposal, Reason, ToolMode
from quorumgate.sidecar.engine.secrets import luhn_valid, secret_shape
from tests.engine.harness import CHAIN, World

# Published test values of each shape (no live secret is in this repository).
CARD = "4111 1111 1111 1111"  # the Visa test number
TOKEN_URL = (
    "https://api.example.com/v1/export?token=sk_live_4eC39HqLyjWDarjtT1zdp7dc&password=hunter2"
)
SHAPES = {
    "card_number": ["4111111111111111", "5500-0000-0000-0004", "3782 822463 10005"],
    "stripe_key": ["sk_live_4eC39HqLyjWDarjtT1zdp7dc"],
    "github_token": ["ghp_" + "a1B2" * 9],
    "aws_key_id": ["AKIAIOSFODNN7EXAMPLE"],
    "model_api_key": ["sk-ant-api03-" + "x1" * 20, "sk-proj-" + "Ab3" * 12],
    "jwt": ["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9"],
    "private_key": ["-----BEGIN RSA PRIVATE KEY-----"],
}
NOT_SECRETS = [
    "order 4111111111111112",  # fails the Luhn check
    "1234567890123",  # no card brand starts 1
    "invoice 2026-12-01",
    "sk-short",
    "the token was rotated",
    # digit runs inside longer tokens: a hex id (this one holds a Luhn-valid
    # 5860936822510560, which made a fail-open marker look like a card) and base64
    "original=cdf0371c71d015ef51b4f51bc1cbd5026874254261b673dc5860936822510560",
    "aGVsbG8=4111111111111111abc",
    "https://x.example/sk-products-and-services-overview-for-customers",
]


def world(version: int = 2) -> World:
    w = World(overrides={"canonical_version": version})
    w.add_tool("http.get", mode=ToolMode.READ)
    w.add_tool("crm.note", schemes=())
    w.add_agent("a", None)
    return w


@pytest.mark.parametrize(("shape", "value"), [(s, v) for s, vs in SHAPES.items() for v in vs])
def test_each_shape_is_recognized(shape: str, value: str) -> None:
    assert secret_shape(f"see {value} here") == shape


@pytest.mark.parametrize("value", NOT_SECRETS)
def test_ordinary_values_are_not_taken_for_secrets(value: str) -> None:
    assert secret_shape(value) is None


def test_luhn() -> None:
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")
    assert luhn_valid("79927398713")


def test_a_credential_in_a_target_is_refused_and_never_stored() -> None:
    old = world(version=1)
    assert old.propose("a", "http.get", TOKEN_URL).outcome is Outcome.ALLOW  # stored verbatim
    w = world()
    denied = w.propose("a", "http.get", TOKEN_URL)
    assert (denied.outcome, denied.reason) == (Outcome.DENY, Reason.SECRET_IN_PLAINTEXT)
    assert "sk_live" not in denied.canonical_target and "hunter2" not in denied.canonical_target
    (artifact,) = w.results[-1].artifacts
    assert b"sk_live" not in artifact.to_bytes() and b"hunter2" not in artifact.to_bytes()
    # a credential-named parameter alone, whatever its value, and a card number in a path
    for k, target in enumerate(
        (
            "https://x.example/login?Pass_Word=anything",
            "https://x.example/cb?client_secret=abc",
            "https://x.example/cards/4111111111111111",
            "https://x.example/cards/4111%201111%201111%201111",
        )
    ):
        verdict = w.propose("a", "http.get", target, run=f"r{k}")
        assert verdict.reason is Reason.SECRET_IN_PLAINTEXT, target


def test_a_raw_card_number_or_cvv_in_an_argument_is_refused() -> None:
    old = world(version=1)
    raw = [Argument("credit_card", text=CARD), Argument("cvv", text="123")]
    assert old.propose("a", "crm.note", "", args=raw).outcome is Outcome.ALLOW
    w = world()
    by_shape = w.propose("a", "crm.note", "", args=[Argument("note", text=f"card {CARD}")])
    assert by_shape.reason is Reason.SECRET_IN_PLAINTEXT
    by_name = w.propose("a", "crm.note", "", args=[Argument("cvv", text="123")], run="r2")
    assert by_name.reason is Reason.ENVELOPE_REQUIRED
    by_name = w.propose("a", "crm.note", "", args=[Argument("creditCard", text="x")], run="r3")
    assert by_name.reason is Reason.ENVELOPE_REQUIRED
    fine = w.propose("a", "crm.note", "", args=[Argument("note", text="call back")], run="r4")
    assert fine.outcome is Outcome.ALLOW


def test_admission_refuses_a_secret_before_it_is_ordered() -> None:
    """The replica asks its sidecar before a transaction enters the mempool: a refused
    one is never proposed in a block (by an honest leader)."""
    w = world()
    key = w.keys["a"]
    for k, proposal in enumerate(
        (
            Proposal(run_id="r", tool="http.get", target=TOKEN_URL),
            Proposal(
                run_id="r",
                tool="crm.note",
                target="",
                arguments=(Argument("note", text=f"card {CARD}"),),
            ),
        )
    ):
        signed = tx.build(CHAIN, 100 + k, proposal, key)
        result = w.engine.admission_check(signed)
        assert (result.accepted, result.reason) == (False, Reason.SECRET_IN_PLAINTEXT), k
    # a credential-named argument, or one the tool declares an envelope, given raw
    w.add_sink("payments")
    w.add_tool("payments.charge", sink="payments", envelope_args=(EnvelopeArg("card", "card"),))
    for k, (tool, arg) in enumerate((("crm.note", "cvv"), ("payments.charge", "card"))):
        proposal = Proposal(run_id="r", tool=tool, target="", arguments=(Argument(arg, text="1"),))
        result = w.engine.admission_check(tx.build(CHAIN, 150 + k, proposal, key))
        assert (result.accepted, result.reason) == (False, Reason.ENVELOPE_REQUIRED), arg
    clean = tx.build(CHAIN, 200, Proposal(run_id="r", tool="http.get", target="https://x/"), key)
    assert w.engine.admission_check(clean).accepted
