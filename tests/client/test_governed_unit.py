"""`governed_tool` without a cluster: what each call proposes, what the wrapper keeps of the
function, and what the agent-facing exceptions print."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import inspect
from decimal import Decimal
from typing import Any

import pytest
from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import ClusterSpec, MemberSpec
from quorumgate.proto.model import DENIAL_TEXT, Argument, Proposal
from quorumgate.sdk.client import Client, Handle
from quorumgate.sdk.governed import (
    FAIL_OPEN_MARKER,
    ActionDenied,
    AgentBinding,
    ArgumentMappingError,
    CertificateUnavailable,
    FailOpenQueue,
    FailOpenRecord,
    Gate,
    RunHalted,
    _Options,
    agent_context,
    build_proposal,
    current_binding,
    default_tool_name,
    governed_tool,
    proposal_from_dict,
)

HANDLE = "h_card_0123456789abcdef"


def _spec() -> ClusterSpec:
    members = tuple(
        MemberSpec(i, "127.0.0.1", 1 + 4 * i, 2 + 4 * i, 3 + 4 * i, 4 + 4 * i, bytes(32), bytes(32))
        for i in range(4)
    )
    return ClusterSpec(
        directory=__import__("pathlib").Path("."),
        chain_id="qg-unit",
        owner_public_key=bytes(32),
        members=members,
    )


def _binding(run_id: str = "run-1", grant: bytes | None = None) -> AgentBinding:
    return AgentBinding(Client(_spec(), SigningKey.generate()), run_id, grant)


def _propose(fn: Any, *args: Any, **kwargs: Any) -> Proposal:
    options: _Options = fn.__qg_options__
    return build_proposal(options, inspect.signature(fn), args, kwargs, _binding())


def options_of(fn: Any, **overrides: Any) -> Any:
    """Attach the decorator's options to a plain function, for `_propose`."""
    fields = {
        "name": overrides.pop("name", default_tool_name(fn)),
        "target": overrides.pop("target", None),
        "envelopes": frozenset(overrides.pop("envelopes", ())),
        "exclude": frozenset(overrides.pop("exclude", ())),
        "posture": None,
        "deadline_s": None,
    }
    fn.__qg_options__ = _Options(**fields)
    return fn


class Color(enum.Enum):
    RED = "red"


def test_arguments_map_to_names_with_text_or_handles() -> None:
    def transfer(
        account: str,
        amount: int,
        rate: float,
        exact: Decimal,
        urgent: bool,
        color: Color,
        card: str,
        note: str | None = None,
        *extra: str,
        **more: str,
    ) -> None: ...

    options_of(
        transfer,
        name="bank.transfer",
        target=lambda a: f"https://bank/{a['account']}",
        envelopes=("card",),
    )
    proposal = _propose(
        transfer, "acc-1", 5, 0.5, Decimal("1.10"), True, Color.RED, HANDLE, None, "x", "y", z="w"
    )
    assert (proposal.tool, proposal.target, proposal.run_id) == (
        "bank.transfer",
        "https://bank/acc-1",
        "run-1",
    )
    got = [(a.name, a.text, a.handle) for a in proposal.arguments]
    assert got == [
        ("account", "acc-1", None),
        ("amount", "5", None),
        ("rate", "0.5", None),
        ("exact", "1.10", None),
        ("urgent", "true", None),
        ("color", "red", None),
        ("card", None, HANDLE),
        ("extra.0", "x", None),
        ("extra.1", "y", None),
        ("z", "w", None),
    ]  # note=None is omitted


def test_target_parameter_default_and_exclusions() -> None:
    def read(self: object, target: str, ctx: object, query: str, h: Handle) -> None: ...

    options_of(read, exclude=("ctx",))
    proposal = _propose(read, object(), "/docs/a", object(), "q", Handle(HANDLE))
    assert proposal.tool == "read" and proposal.target == "/docs/a"
    assert [(a.name, a.is_handle) for a in proposal.arguments] == [("query", False), ("h", True)]

    def status() -> None: ...

    options_of(status)
    assert _propose(status).target == "" and _propose(status).arguments == ()
    assert default_tool_name(lambda: None) == "<lambda>"

    def read_file(path: str) -> None: ...

    assert default_tool_name(read_file) == "read-file"


@pytest.mark.parametrize(
    ("call", "kwargs"),
    [
        ("raw value for an envelope", {"card": "4111111111111111", "note": "n"}),
        ("bytes", {"card": HANDLE, "note": b"SECRET-VALUE"}),
        ("object", {"card": HANDLE, "note": object()}),
        ("too large", {"card": HANDLE, "note": "SECRET-VALUE" * 5000}),
        ("not a handle", {"card": Handle("SECRET-VALUE"), "note": "n"}),
    ],
)
def test_unmappable_arguments_are_refused_without_naming_the_value(
    call: str, kwargs: dict[str, Any]
) -> None:
    def pay(card: str, note: Any) -> None: ...

    options_of(pay, envelopes=("card",))
    with pytest.raises(ArgumentMappingError) as err:
        _propose(pay, **kwargs)
    for text in (str(err.value), repr(err.value)):
        assert "SECRET-VALUE" not in text and "4111" not in text


def test_decorator_keeps_name_signature_docstring_and_kind() -> None:
    @governed_tool
    def plain(url: str, n: int = 3) -> str:
        """Plain doc."""
        return url

    @governed_tool(name="web.get", target="url", posture="fail_open", deadline_s=2)
    async def fancy(url: str, *, q: str) -> str:
        """Fancy doc."""
        return url

    assert (plain.__name__, plain.__doc__) == ("plain", "Plain doc.")
    # annotations are strings here (`from __future__ import annotations`), as in callers
    assert str(inspect.signature(plain)) == "(url: 'str', n: 'int' = 3) -> 'str'"
    assert inspect.signature(plain) == inspect.signature(plain.__wrapped__)  # type: ignore[attr-defined]
    assert (fancy.__name__, fancy.__doc__) == ("fancy", "Fancy doc.")
    assert list(inspect.signature(fancy).parameters) == ["url", "q"]
    assert inspect.iscoroutinefunction(fancy) and not inspect.iscoroutinefunction(plain)
    with pytest.raises(ArgumentMappingError):
        governed_tool(target="nope")(plain.__wrapped__)  # type: ignore[attr-defined]


def test_denials_print_the_fixed_sentence_only() -> None:
    for err in (
        ActionDenied("out_of_scope"),
        RunHalted("run_halted"),
        CertificateUnavailable(TimeoutError(), None),
    ):
        assert str(err) == repr(err) == DENIAL_TEXT
        assert err.args == (DENIAL_TEXT,)
        assert err.reason not in str(err)
    assert RunHalted("run_halted").halted and not ActionDenied("suspended").halted


def test_fail_open_queue_is_bounded_and_marks_its_records() -> None:
    queue = FailOpenQueue(limit=2)
    record = FailOpenRecord(
        tool="web.get",
        target="https://x/",
        run_id="r",
        grant=None,
        arguments=tuple(Argument(f"a{k}", text="SECRET") for k in range(40)),
        cause="replicas_unreachable",
        original=b"\x07" * 32,
        ran_at_ms=5,
    )
    assert queue.add(record) and queue.add(record) and not queue.add(record)
    assert len(queue) == 2
    marker = record.marker_proposal()
    assert len(marker.arguments) == 32 and marker.arguments[-1].name == FAIL_OPEN_MARKER
    assert (
        marker.arguments[-1].text == f"cause=replicas_unreachable;original={'07' * 32};ran_at_ms=5"
    )
    assert "SECRET" not in repr(record) and "SECRET" not in repr(marker)


async def test_bindings_are_per_task_and_per_thread() -> None:
    a, b = _binding("run-a"), _binding("run-b")
    seen: dict[str, str | None] = {}

    async def task(binding: AgentBinding, name: str) -> None:
        with agent_context(binding.client, run_id=binding.run_id):
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            current = current_binding()
            seen[name] = current.run_id if current else None

    await asyncio.gather(task(a, "a"), task(b, "b"))
    assert seen == {"a": "run-a", "b": "run-b"}
    assert current_binding() is None
    with agent_context(a.client, run_id="run-outer"):
        inner = await asyncio.to_thread(current_binding)  # copies the context: same binding
        fresh = await asyncio.get_running_loop().run_in_executor(
            None, contextvars.Context().run, current_binding
        )
    assert inner is not None and inner.run_id == "run-outer" and fresh is None
    with pytest.raises(ValueError):
        agent_context(a.client, run_id="bad run id!").__enter__()


# ---------------------------------------------------------------------------- structured values


def test_structured_values_are_canonical_json_equal_values_equal_text() -> None:
    """RFC 8785: key order, spacing and number spelling do not change the text, so one
    value is one argument whatever dict order the caller built it in."""

    def post(url: str, payload: Any, tags: Any) -> None: ...

    options_of(post, target="url")
    a = _propose(post, "https://x.example/", {"b": [1, 2.50, True], "a": None}, ("x", "y"))
    b = _propose(post, "https://x.example/", {"a": None, "b": [1, 2.5, True]}, ["x", "y"])
    assert a.arguments == b.arguments
    assert [(x.name, x.text) for x in a.arguments] == [
        ("payload", '{"a":null,"b":[1,2.5,true]}'),
        ("tags", '["x","y"]'),
    ]


@pytest.mark.parametrize(
    "value",
    [{1: "SECRET-VALUE"}, [float("nan")], [2**60], {"k": b"SECRET-VALUE"}, [Decimal("1.5")]],
)
def test_a_structured_value_that_is_not_json_is_refused_without_the_value(value: Any) -> None:
    def post(payload: Any) -> None: ...

    options_of(post)
    with pytest.raises(ArgumentMappingError) as err:
        _propose(post, value)
    assert "SECRET-VALUE" not in str(err.value) and "payload" in str(err.value)


def test_by_name_arguments_may_use_any_name_and_the_target_is_taken_out() -> None:
    """A by-name call is never spread into a signature of ours: `body`, `tool`, `self`,
    `arguments`, `fn` are ordinary argument names (a tool with a `body` argument crashed
    an earlier wrapper with TypeError)."""
    options = _Options("mail.send", "to", frozenset(), frozenset(), None, None)
    arguments = {
        "to": "mailto:bob@example.com",
        "body": "hi",
        "tool": "t",
        "self": "s",
        "arguments": ["a", "b"],
        "fn": 1,
        "skipped": None,
    }
    proposal = proposal_from_dict(options, arguments, _binding())
    assert proposal.target == "mailto:bob@example.com" and proposal.tool == "mail.send"
    assert [(a.name, a.text) for a in proposal.arguments] == [
        ("arguments", '["a","b"]'),
        ("body", "hi"),
        ("fn", "1"),
        ("self", "s"),
        ("tool", "t"),
    ]
    assert arguments["to"] == "mailto:bob@example.com"  # the caller's dict is not changed


def test_a_gate_refuses_a_tool_it_does_not_know_before_anything_leaves() -> None:
    gate = Gate()
    gate.tool("files.read", lambda path: path, target="path")
    assert gate.tools == ["files.read"]
    with (
        agent_context(_binding().client, run_id="run-1"),
        pytest.raises(ArgumentMappingError, match="not registered"),
    ):
        gate.call("files.write", {"path": "/a"})
