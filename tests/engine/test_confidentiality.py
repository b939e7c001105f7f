"""Confidentiality: a planted secret appears in no output of the engine
(docs/security/threat-model.md).

Two kinds of planted value: a sealed envelope's plaintext (which must not exist anywhere in
the cluster) and plain argument values (which the log carries, but which must never enter
state, verdicts, artifacts or any string the engine produces).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

from quorumgate.proto import tx, tx_pb2
from quorumgate.proto.model import (
    Argument,
    DelegationPolicy,
    EnvelopeArg,
    Outcome,
    Reason,
    Tier,
    ToolMode,
)
from quorumgate.sidecar.engine.core import Engine
from tests.engine.harness import World

SEALED_SECRET = b"SEALED-PLAINTEXT-5f1e9c-do-not-leak"
ARGUMENT_SECRET = "ARGUMENT-VALUE-8b2d41-do-not-leak"


def _forms(secret: bytes) -> list[bytes]:
    """The secret as bytes, hex and base64: a leak in any common encoding counts."""
    return [secret, secret.hex().encode(), base64.b64encode(secret), secret.lower()]


def _outputs(world: World, engine: Engine) -> Iterator[bytes | str]:
    yield engine.state_bytes()
    yield repr(engine.state)
    for result in world.results:
        yield repr(result)
        yield result.state_root
        for verdict in result.verdicts:
            yield repr(verdict)
            yield str(verdict)
            yield verdict.statement(world.config.chain_id, result.height)
            yield verdict.agent_message
            if verdict.card is not None:
                yield verdict.card.to_bytes()
                yield verdict.card.render()
        for artifact in result.artifacts:
            yield artifact.to_bytes()
            yield repr(artifact)
    for _, _, txs in world.log:
        for data in txs:
            yield repr(engine.admission_check(data))
            try:
                parsed = tx.parse(data)
            except tx.TxRejected as exc:
                yield str(exc)
                continue
            yield repr(parsed.body.payload)
            yield str(parsed.body.payload)


def _run_a_busy_log() -> World:
    world = World()
    world.add_sink("payments")
    world.add_tool(
        "payments.charge",
        mode=ToolMode.USER_CONFIRM,
        sink="payments",
        min_tier=Tier.MASTER,
        envelope_args=(EnvelopeArg(name="card", kind="card"),),
    )
    world.add_tool("kb.search")
    world.add_tool("notes.write", schemes=("file",))
    world.add_agent("alice", None, policy=DelegationPolicy.ATTENUATED)
    world.add_agent("helper", ["kb.search"])
    world.add_agent("mallory", [])
    sealed = world.seal(world.keys["alice"], "card", SEALED_SECRET, ["payments"])
    handle = sealed.subject
    secret_arg = Argument(name="memo", text=ARGUMENT_SECRET)
    pending = world.propose(
        "alice", "payments.charge", args=[Argument(name="card", handle=handle), secret_arg]
    )
    world.confirm(world.keys["alice"], pending.proposal_id, pending.card_digest)
    world.propose("alice", "kb.search", args=[secret_arg])
    world.propose(
        "alice", "notes.write", "/tmp/x", args=[Argument(name="password", text=ARGUMENT_SECRET)]
    )
    world.propose("mallory", "payments.charge", args=[Argument(name="card", handle=handle)])
    world.propose("mallory", "kb.search", args=[secret_arg])
    world.propose("mallory", "kb.search", args=[secret_arg])
    world.propose("mallory", "kb.search", args=[Argument(name="user_id", text=ARGUMENT_SECRET)])
    grant = world.delegate("alice", "helper", tools=["kb.search"]).tx_id
    world.propose("helper", "kb.search", args=[secret_arg], grant=grant)
    world.propose("helper", "payments.charge", args=[secret_arg], grant=grant)
    # secrets inside signed transactions that do not decode: their errors must not quote them
    key = world.keys["alice"]
    bad_run = tx_pb2.TxBody(chain_id=world.config.chain_id, nonce=world.next_nonce(key))
    bad_run.proposal.run_id = "bad run id!"
    bad_run.proposal.tool = "kb.search"
    bad_run.proposal.arguments.add(name="memo", text=ARGUMENT_SECRET)
    garbage = b"\x12\x00" + ARGUMENT_SECRET.encode()
    for body in (bad_run.SerializeToString(), garbage):
        world.block([tx.encode_signed(tx.sign_body(body, key))])
    assert world.results[-2].verdicts[0].reason is Reason.MALFORMED
    return world


def test_planted_secrets_appear_in_no_output_byte_string_or_string() -> None:
    world = _run_a_busy_log()
    assert any(v.outcome is Outcome.ALLOW for r in world.results for v in r.verdicts)
    assert any(r.artifacts for r in world.results)
    checked = 0
    for output in _outputs(world, world.engine):
        data = output.encode("utf-8") if isinstance(output, str) else output
        for form in _forms(SEALED_SECRET) + _forms(ARGUMENT_SECRET.encode()):
            assert form not in data, f"secret leaked into {type(output).__name__}"
        checked += 1
    assert checked > 100


def test_the_check_itself_would_catch_a_leak() -> None:
    """Guard against a vacuous grep: the log does carry the values, and the grep finds them."""
    world = _run_a_busy_log()
    carried = b"".join(data for _, _, txs in world.log for data in txs)
    assert ARGUMENT_SECRET.encode() in carried
    assert SEALED_SECRET not in carried  # sealed values travel only as ciphertext


def test_a_replayed_engine_holds_no_secret_either() -> None:
    world = _run_a_busy_log()
    rebuilt = Engine.from_state_bytes(world.config, world.engine.state_bytes())
    for form in _forms(SEALED_SECRET) + _forms(ARGUMENT_SECRET.encode()):
        assert form not in rebuilt.state_bytes()
