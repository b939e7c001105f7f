"""The proxy's enforcement core, shared by the three APIs (`messages.py` Anthropic
Messages, `chat.py` OpenAI Chat Completions, `responses.py` OpenAI Responses): every tool
call a model response asks for goes through `decide`, and only the calls it releases reach
the agent, with the arguments `decide` returns (the targets in the canonical form the
cluster judged). Pure of I/O: the caller supplies `decide` (which proposes the call to
the cluster) and moves the bytes.

Each API's module reads a response the way the official SDK reads it, refuses
(`Unreadable`) what it cannot account for, and writes what it passes on in one canonical
spelling (compact ASCII JSON, `sse.frame`), so that the agent's SDK, whichever it is,
reads exactly what was judged (docs/proxy.md). Nothing of a denial's reason reaches the
agent: the fixed sentence is all there is.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import rfc8785

from quorumgate.proto import limits, names
from quorumgate.proto.model import Argument, Proposal, RoleTarget
from quorumgate.proxy.config import AgentConfig, ToolMapping
from quorumgate.proxy.sse import StreamUnreadable

log = logging.getLogger("quorumgate.proxy")

SESSION_LABEL_PREFIX = "s-"
HELD_BYTES_MAX = 8 * 1024 * 1024  # what a stream holds while its calls wait for decisions
HELD_EVENTS_MAX = 65_536
RESPONSE_SESSIONS_MAX = 65_536  # Responses ids remembered for `previous_response_id`


class DenialBlock(StrEnum):
    TOOL_RESULT = "tool_result"
    TEXT = "text"


@dataclass(frozen=True, repr=False)
class ToolCall:
    """One tool call a response asks for. `arguments` None: not a JSON object."""

    id: str
    name: str
    arguments: dict[str, Any] | None

    def __repr__(self) -> str:
        return f"ToolCall(id={self.id!r}, name={self.name!r})"  # never the arguments


Released = dict[str, Any] | None  # the arguments to release the call with; None: withhold
Decide = Callable[[ToolCall], Awaitable[Released]]


class MappingError(ValueError):
    """A tool call that cannot become a proposal (its message names no value)."""


# A response the proxy cannot read as the SDK would: refused, never passed on. The message
# says what was wrong, with no content of the response in it. One class for the SSE
# decoder's refusals and the API modules' (`sse.StreamUnreadable`).
Unreadable = StreamUnreadable


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        # RFC 8259 section 4: with duplicate names, parsers disagree on which one counts
        raise Unreadable("a JSON object with a name twice")
    return out


def _no_constant(name: str) -> None:
    raise Unreadable(f"a JSON {name}, which is not JSON (RFC 8259 section 6)")


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constant)


def load_json(text: str | bytes) -> Any:
    """JSON as Python's `json` (the SDKs' parser) reads it, and refused wherever another
    reader could read it otherwise: duplicate names, NaN and the infinities."""
    try:
        if isinstance(text, bytes):  # as json.loads reads bytes: UTF-8, -16 or -32
            text = text.decode(json.detect_encoding(text), "surrogatepass")
        return _DECODER.decode(text)
    except (ValueError, RecursionError) as err:
        if isinstance(err, Unreadable):
            raise
        raise Unreadable("not JSON") from None


def arguments_of(text: str) -> dict[str, Any] | None:
    """A call's arguments from the JSON text the model wrote: an object, or None (not
    JSON, not an object, or JSON another reader could read otherwise)."""
    if text == "":
        return {}
    try:
        value = load_json(text)
    except Unreadable:
        return None
    return value if isinstance(value, dict) else None


def is_index(value: object) -> bool:
    """A list position as the SDKs use one: an int (never a bool, which Python indexes
    with too), not negative (Python's -1 is the last entry)."""
    return type(value) is int and value >= 0


def need(condition: bool, why: str) -> None:
    if not condition:
        raise Unreadable(why)


# ---------------------------------------------------------------------------- proposals


def _argument_text(value: object) -> str:
    if isinstance(value, str):
        return value
    try:
        return rfc8785.dumps(value).decode()  # one spelling for equal values (RFC 8785)
    except (rfc8785.CanonicalizationError, TypeError, RecursionError):
        raise MappingError("an argument that is not a JSON value") from None


def _target(value: object, scheme: str | None, what: str) -> tuple[str, str | None]:
    """The target text of an argument, and the scheme this prefixed (None: none)."""
    if value is None:
        return "", None
    if not isinstance(value, str):
        raise MappingError(f"{what}: a target must be text")
    if scheme and scheme != "file" and not value.lower().startswith(scheme + ":"):
        return f"{scheme}:{value}", scheme
    return value, None


@dataclass(frozen=True)
class TargetSpot:
    """Where a proposal's target came from in the call's arguments: the argument, its
    position when the argument is a list, and the scheme the proxy prefixed."""

    argument: str
    position: int | None
    scheme_added: str | None


@dataclass(frozen=True)
class Built:
    proposal: Proposal
    main: TargetSpot | None  # None: the call has no main target
    further: tuple[TargetSpot, ...]  # one per proposal.targets entry, in order


def build_proposal(mapping: ToolMapping, call: ToolCall, run_label: str) -> Proposal:
    """The proposal of a tool call under its mapping (`build_call`)."""
    return build_call(mapping, call, run_label).proposal


def build_call(mapping: ToolMapping, call: ToolCall, run_label: str) -> Built:
    """The proposal of a tool call under its mapping: the main target from its argument
    (with the scheme prefixed where the model left it out), further targets by role, and
    every other argument as text (JSON values as RFC 8785 text; a capability handle as a
    handle); and where each target came from, so the released call can carry the
    canonical forms. Raises MappingError."""
    if call.arguments is None:
        raise MappingError("the tool input is not a JSON object")
    values = dict(call.arguments)
    raw = values.pop(mapping.target, None) if mapping.target else None
    target, added = _target(raw, mapping.scheme, "target")
    main = TargetSpot(mapping.target, None, added) if mapping.target and raw is not None else None
    further: list[RoleTarget] = []
    spots: list[TargetSpot] = []
    for role, argument in mapping.roles:
        value = values.pop(argument, None)
        items = [] if value is None else [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise MappingError(f"{role}: targets must be text or a list of text")
        for position, item in enumerate(items):
            text, _ = _target(item, None, role)
            further.append(RoleTarget(role, text))
            spots.append(TargetSpot(argument, None if isinstance(value, str) else position, None))
    arguments: list[Argument] = []
    for name in sorted(values):
        if name in mapping.exclude or values[name] is None:
            continue
        value = values[name]
        if isinstance(value, str) and names.HANDLE_RE.fullmatch(value):
            arguments.append(Argument(name, handle=value))
        else:
            arguments.append(Argument(name, text=_argument_text(value)))
    if len(arguments) > limits.ARGUMENTS_MAX or len(further) > limits.TARGETS_PER_CALL_MAX:
        raise MappingError("more arguments or targets than a proposal takes")
    try:
        proposal = Proposal(
            run_id=run_label,
            tool=mapping.tool,
            target=target,
            arguments=tuple(arguments),
            targets=tuple(further),
        )
    except ValueError:
        raise MappingError("a name or value too large for a proposal") from None
    return Built(proposal, main, tuple(spots))


def released_arguments(
    call: ToolCall, built: Built, main: str | None, further: Sequence[str]
) -> dict[str, Any]:
    """The call's arguments with each target replaced by its release form (`main`, and
    `further` in proposal order: the forms `quorumgate.sdk.targets.release_form` gives)."""
    assert call.arguments is not None
    out = json.loads(json.dumps(call.arguments))  # a copy: the call stays as judged
    if built.main is not None and main is not None:
        out[built.main.argument] = main
    for spot, value in zip(built.further, further, strict=True):
        if spot.position is None:
            out[spot.argument] = value
        else:
            out[spot.argument][spot.position] = value
    return out


def session_label(agent: AgentConfig, body: Mapping[str, Any], headers: Mapping[str, str]) -> str:
    """The run label of a request's conversation (the latch bucket is the session, not the
    request): see the agents file's `session`. A run id `n<k>` passes as it is."""
    rule = agent.session
    if rule.startswith("header:"):
        value = headers.get(rule[len("header:") :])
        if value:
            if names.is_run_id(value) and value.startswith("n") and value[1:].isdigit():
                return value
            return SESSION_LABEL_PREFIX + _digest(value)
    elif rule == "metadata":
        metadata = body.get("metadata")
        value = metadata.get("user_id") if isinstance(metadata, dict) else body.get("user")
        if isinstance(value, str) and value:
            return SESSION_LABEL_PREFIX + _digest(value)
    return SESSION_LABEL_PREFIX + _digest(_conversation_head(body))


def _conversation_head(body: Mapping[str, Any]) -> object:
    """The system prompt and the messages up to and including the first user message (a
    Responses request: its instructions and input, a text input being one user message)."""
    messages = body.get("messages", body.get("input"))
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    head: list[object] = []
    if isinstance(messages, list):
        for message in messages:
            head.append(message)
            if isinstance(message, dict) and message.get("role") == "user":
                break
    if "input" in body and "messages" not in body:
        return {"instructions": body.get("instructions"), "head": head}
    return {"system": body.get("system"), "head": head}


class ResponseSessions:
    """Which session a Responses id was answered in, for a later request that continues
    it by `previous_response_id` (it sends only the new input). Bounded: the oldest ids
    are forgotten first, and a forgotten id starts a session of its own."""

    def __init__(self, size_max: int = RESPONSE_SESSIONS_MAX) -> None:
        self.size_max = size_max
        self._labels: OrderedDict[str, str] = OrderedDict()

    def remember(self, response_id: object, label: str) -> None:
        if isinstance(response_id, str) and response_id and label:
            self._labels[response_id] = label
            self._labels.move_to_end(response_id)
            while len(self._labels) > self.size_max:
                self._labels.popitem(last=False)

    def label_of(self, body: Mapping[str, Any]) -> str | None:
        previous = body.get("previous_response_id")
        if not isinstance(previous, str) or not previous:
            return None
        return self._labels.get(previous) or SESSION_LABEL_PREFIX + _digest(previous)


def _digest(value: object) -> str:
    try:
        data = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, RecursionError):
        data = repr(value).encode()
    return hashlib.sha256(data).hexdigest()[:24]


async def decide_all(calls: Sequence[ToolCall], decide: Decide) -> list[Released]:
    """Every call decided, concurrently; a decider that fails withholds, and a call whose
    arguments are not a JSON object is never released (nothing judged them)."""
    results = await asyncio.gather(*(decide(c) for c in calls), return_exceptions=True)
    for call, result in zip(calls, results, strict=True):
        if isinstance(result, BaseException):  # the type only: no argument value is logged
            log.warning("event=decider_failed tool=%s error=%s", call.name, type(result).__name__)
    return [
        r if isinstance(r, dict) and c.arguments is not None else None
        for c, r in zip(calls, results, strict=True)
    ]


class Slot:
    """A held call's place in an `Outbox`: its frames once it is decided."""

    def __init__(self) -> None:
        self.frames: list[bytes] | None = None


Entry = bytes | Slot | Callable[[], list[bytes]]


class Outbox:
    """What a stream sends, in the order it must leave: a held call keeps its place (a
    `Slot`) and what follows it waits until it is decided; an entry can also be a function
    that writes its frames when it leaves (a stop reason that depends on the decisions).
    Bounded: more than HELD_EVENTS_MAX entries or HELD_BYTES_MAX bytes waiting is refused."""

    def __init__(self) -> None:
        self._entries: list[Entry] = []
        self._bytes = 0

    def put(self, entry: Entry) -> None:
        self._entries.append(entry)
        if isinstance(entry, bytes):
            self._bytes += len(entry)
        need(len(self._entries) <= HELD_EVENTS_MAX, f"more than {HELD_EVENTS_MAX} events held")
        need(self._bytes <= HELD_BYTES_MAX, f"more than {HELD_BYTES_MAX} bytes held")

    def count(self, size: int) -> None:
        """Bytes a held call keeps outside the outbox (its argument fragments)."""
        self._bytes += size
        need(self._bytes <= HELD_BYTES_MAX, f"more than {HELD_BYTES_MAX} bytes held")

    def flush(self) -> list[bytes]:
        out: list[bytes] = []
        taken = 0
        for entry in self._entries:
            if isinstance(entry, Slot):
                if entry.frames is None:
                    break
                out += entry.frames
            elif isinstance(entry, bytes):
                out.append(entry)
            else:
                out += entry()
            taken += 1
        del self._entries[:taken]
        if not self._entries:
            self._bytes = 0
        return out

    def drop(self) -> None:
        self._entries.clear()
        self._bytes = 0
