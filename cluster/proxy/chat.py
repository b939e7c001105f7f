"""OpenAI Chat Completions, read as the `openai` SDK reads it (its `_streaming.py`, and the
`ChatCompletionStreamState` / `accumulate_delta` that assemble a stream): the tool calls
it hands an agent are each choice's `tool_calls` (a `function` with a name and arguments
as JSON *text*, or a `custom` tool with free text input) and the legacy `function_call`.

In a stream the SDK finds a choice, and a call in a choice, by *list position*: an index
it has is merged into, any other is appended at the end, whatever its number; every text
field of a call (id, name, arguments) is the concatenation of all its fragments; it stops
reading at a `[DONE]` data line and raises on a chunk with an `error`. The proxy assembles
the same way, refuses (`Unreadable`) an index that would land elsewhere than its number,
a fragment that is not text, and a fragment for a choice that already finished, and holds
every chunk from the first call fragment on until each choice with calls has finished
(or `[DONE]`): then it sends each released call whole, in one chunk with the arguments
`decide` returned, and the held chunks without call fragments.

A call that is not released is removed, the fixed sentence is added to the choice's
text, and when none is left, `finish_reason: tool_calls` becomes `stop`. A custom tool's
input is not a JSON object, so it is never released.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quorumgate.proto.model import DENIAL_TEXT
from quorumgate.proxy.enforce import (
    Decide,
    Outbox,
    Released,
    ToolCall,
    Unreadable,
    arguments_of,
    decide_all,
    is_index,
    load_json,
    need,
)
from quorumgate.proxy.sse import SseEvent, done_frame, dumps, frame

CHUNK_OBJECT = "chat.completion.chunk"
LEGACY = "function_call"


def _is_text(value: object) -> bool:
    return isinstance(value, str)


def _entry_call(entry: object) -> ToolCall:
    """One `tool_calls` entry of a whole message, as the SDK types it (`type` decides)."""
    need(isinstance(entry, dict), "a tool call that is not an object")
    assert isinstance(entry, dict)
    need(_is_text(entry.get("id")), "a tool call without a text id")
    kind = entry.get("type", "function")
    function, custom = entry.get("function"), entry.get("custom")
    need(function is None or custom is None, "a tool call that is both function and custom")
    if kind == "function" and isinstance(function, dict):
        name, text = function.get("name"), function.get("arguments")
        need(
            _is_text(name) and _is_text(text),
            "a function call whose name or arguments are not text",
        )
        return ToolCall(entry["id"], name, arguments_of(text))
    if kind == "custom" and isinstance(custom, dict):
        need(_is_text(custom.get("name")) and _is_text(custom.get("input")), "a bad custom call")
        return ToolCall(entry["id"], custom["name"], None)
    raise Unreadable("a tool call of a kind the proxy does not know")


def _legacy_call(value: object) -> ToolCall:
    need(isinstance(value, dict), "a function_call that is not an object")
    assert isinstance(value, dict)
    name, text = value.get("name"), value.get("arguments")
    need(_is_text(name) and _is_text(text), "a function_call whose name or arguments are not text")
    return ToolCall(LEGACY, name, arguments_of(text))


def _with_denial(text: object) -> str:
    return DENIAL_TEXT if not isinstance(text, str) or not text else f"{text}\n{DENIAL_TEXT}"


async def enforce_completion(body: object, decide: Decide) -> int:
    """Rewrite a Chat Completions response in place; returns how many calls were withheld."""
    need(isinstance(body, dict), "a completion that is not a JSON object")
    assert isinstance(body, dict)
    choices = body.get("choices")
    need(choices is None or isinstance(choices, list), "choices that are not a list")
    withheld = 0
    for choice in choices or []:
        need(isinstance(choice, dict) and isinstance(choice.get("message"), dict), "a bad choice")
        withheld += await _enforce_message(choice, decide)
    return withheld


async def _enforce_message(choice: dict[str, Any], decide: Decide) -> int:
    message = choice["message"]
    entries = message.get("tool_calls")
    need(entries is None or isinstance(entries, list), "tool_calls that are not a list")
    calls = [_entry_call(entry) for entry in entries or []]
    legacy = message.get(LEGACY)
    if legacy is not None:
        calls.append(_legacy_call(legacy))
    if not calls:
        return 0
    released = await decide_all(calls, decide)
    kept = []
    for entry, arguments in zip(entries or [], released, strict=False):
        if arguments is not None:
            kept.append({**entry, "function": {**entry["function"], "arguments": dumps(arguments)}})
    if entries is not None:
        message["tool_calls"] = kept or None
        if not kept:
            message.pop("tool_calls")
    if legacy is not None:
        if released[-1] is None:
            message.pop(LEGACY)
        else:
            message[LEGACY] = {**legacy, "arguments": dumps(released[-1])}
    withheld = released.count(None)
    if withheld:
        message["content"] = _with_denial(message.get("content"))
        nothing_left = not kept and LEGACY not in message
        if nothing_left and choice.get("finish_reason") in ("tool_calls", LEGACY):
            choice["finish_reason"] = "stop"
    return withheld


# ---------------------------------------------------------------------------- streams


@dataclass
class _Call:
    id: str = ""
    kind: str = "function"
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    custom: bool = False


@dataclass
class _Choice:
    calls: list[_Call] = field(default_factory=list)
    legacy: _Call | None = None
    finished: bool = False  # a finish_reason came
    decided: bool = False  # its calls were decided (and no fragment may follow)
    released: list[Released] = field(default_factory=list)


def _append(call: _Call, key: str, value: object, size: list[int]) -> None:
    """One text fragment of a call, concatenated as the SDK does (null adds nothing)."""
    if value is None:
        return
    need(_is_text(value), f"a tool call {key} fragment that is not text")
    assert isinstance(value, str)
    size[0] += len(value)
    if key == "id":
        call.id += value
    elif key == "name":
        call.name += value
    else:
        call.arguments.append(value)


class CompletionStream:
    """Chat Completions stream enforcement: `feed` each decoded event, send what it
    returns, in order; `finished` once the SDK reads no further (`[DONE]`, an error)."""

    def __init__(self, decide: Decide) -> None:
        self.decide = decide
        self.choices: list[_Choice] = []
        self.first = True
        self.held: list[dict[str, Any]] = []  # chunks, without their call fragments
        self.out = Outbox()
        self.finished = False
        self.withheld = 0

    async def feed(self, event: SseEvent) -> list[bytes]:
        # the SDK reads every event's data as a chunk, whatever the event's name (a name
        # of the Assistants API's `thread.` events is read another way: not a completion)
        need(not (event.event or "").startswith("thread."), "an Assistants event")
        if event.data.startswith("[DONE]"):
            self.finished = True
            return [*(await self._release()), done_frame()]
        chunk = load_json(event.data)
        need(isinstance(chunk, dict), "a chunk that is not a JSON object")
        if chunk.get("error"):
            self.finished = True
            return [*(await self._release()), frame(None, {"error": chunk["error"]})]
        carries = self._take_calls(chunk)
        if not carries and not self.held:
            return [frame(None, chunk)]
        self.held.append(chunk)
        need(len(self.held) <= 65_536, "too many chunks held")
        waiting = [c for c in self.choices if (c.calls or c.legacy) and not c.decided]
        if waiting and all(c.finished for c in waiting):
            return await self._release()
        return []

    def _take_calls(self, chunk: dict[str, Any]) -> bool:
        """Assembles the chunk's call fragments (removing them from it); True if it had any."""
        choices = chunk.get("choices")
        need(choices is None or isinstance(choices, list), "choices that are not a list")
        choices = choices or []
        need(all(isinstance(c, dict) for c in choices), "a choice that is not an object")
        indices = [c.get("index") for c in choices]
        need(all(is_index(i) for i in indices), "a choice without a list index")
        # the SDK's stream state skips chunks of another kind; an agent reading chunks
        # itself does not: only the kind both read may carry choices
        need(
            not choices or chunk.get("object") == CHUNK_OBJECT, "choices in a chunk of another kind"
        )
        if self.first:
            # the SDK's first snapshot puts each choice at its index: they must be 0..n-1
            need(sorted(indices) == list(range(len(indices))), "first choices out of order")
            self.choices = [_Choice() for _ in indices]
            self.first = False
        carries = False
        size = [0]
        for choice in choices:
            index = choice["index"]
            need(index <= len(self.choices), "a choice index past the end")  # appended elsewhere
            if index == len(self.choices):
                self.choices.append(_Choice())
            carries |= self._take_choice(self.choices[index], choice, chunk, size)
        self.out.count(size[0])
        return carries

    def _take_choice(
        self, state: _Choice, choice: dict[str, Any], chunk: dict[str, Any], size: list[int]
    ) -> bool:
        delta = choice.get("delta")
        need(isinstance(delta, dict), "a choice without a delta")
        entries, legacy = delta.pop("tool_calls", None), delta.pop(LEGACY, None)
        carries = entries is not None or legacy is not None
        if carries:
            need(
                not state.finished and not state.decided,
                "a call fragment after its choice finished",
            )
        need(entries is None or isinstance(entries, list), "tool_calls that are not a list")
        for entry in entries or []:
            need(
                isinstance(entry, dict) and is_index(entry.get("index")),
                "a call without a list index",
            )
            index = entry["index"]
            need(index <= len(state.calls), "a call index past the end")  # the SDK appends it
            if index == len(state.calls):
                state.calls.append(_Call())
            self._take_entry(state.calls[index], entry, size)
        if legacy is not None:
            need(isinstance(legacy, dict), "a function_call that is not an object")
            state.legacy = state.legacy or _Call(id=LEGACY)
            _append(state.legacy, "name", legacy.get("name"), size)
            _append(state.legacy, "arguments", legacy.get("arguments"), size)
        finish = choice.get("finish_reason")
        need(finish is None or _is_text(finish), "a finish_reason that is not text")
        if finish:
            state.finished = True
        return carries

    @staticmethod
    def _take_entry(call: _Call, entry: dict[str, Any], size: list[int]) -> None:
        _append(call, "id", entry.get("id"), size)
        kind = entry.get("type")
        need(kind is None or kind in ("function", "custom"), "a tool call of another kind")
        if kind is not None:
            call.kind = kind  # the SDK keeps the last type it was sent
        function, custom = entry.get("function"), entry.get("custom")
        need(function is None or isinstance(function, dict), "a function that is not an object")
        need(custom is None or isinstance(custom, dict), "a custom call that is not an object")
        if custom is not None:
            call.custom = True
            _append(call, "name", custom.get("name"), size)
            _append(call, "id", None, size)
            need(custom.get("input") is None or _is_text(custom.get("input")), "bad custom input")
        if function is not None:
            _append(call, "name", function.get("name"), size)
            _append(call, "arguments", function.get("arguments"), size)

    async def _release(self) -> list[bytes]:
        """Decides every held call and sends the calls released, then the held chunks."""
        if not self.held:
            return []
        waiting = [
            (i, c) for i, c in enumerate(self.choices) if (c.calls or c.legacy) and not c.decided
        ]
        calls: list[ToolCall] = []
        for _, state in waiting:
            calls += [_stream_call(call) for call in state.calls]
            if state.legacy is not None:
                calls.append(_stream_call(state.legacy))
        released = await decide_all(calls, self.decide)
        out: list[bytes] = []
        template = self.held[0]
        at = 0
        for index, state in waiting:
            count = len(state.calls) + (state.legacy is not None)
            state.released, at = released[at : at + count], at + count
            state.decided = True
            out += _call_chunks(template, index, state)
        self.withheld += released.count(None)
        for chunk in self.held:
            out.append(frame(None, self._finished(chunk)))
        self.held = []
        return out

    def _finished(self, chunk: dict[str, Any]) -> dict[str, Any]:
        """A held chunk as it leaves: a choice whose calls were all withheld stops."""
        for choice in chunk.get("choices") or []:
            state = self.choices[choice["index"]]
            nothing_left = state.decided and all(r is None for r in state.released)
            if nothing_left and choice.get("finish_reason") in ("tool_calls", LEGACY):
                choice["finish_reason"] = "stop"
        return chunk

    def close(self) -> list[bytes]:
        """The stream ended without finishing its calls: they are dropped, never sent."""
        self.held = []
        return []


def _stream_call(call: _Call) -> ToolCall:
    if call.custom or call.kind == "custom":
        return ToolCall(call.id, call.name, None)
    return ToolCall(call.id, call.name, arguments_of("".join(call.arguments)))


def _call_chunks(template: dict[str, Any], index: int, state: _Choice) -> list[bytes]:
    """One chunk per released call of a choice (numbered as the SDK will list them), and
    the fixed sentence when one was withheld."""
    base = {k: template[k] for k in ("id", "object", "created", "model") if k in template}

    def chunk(delta: dict[str, Any]) -> bytes:
        return frame(
            None, {**base, "choices": [{"index": index, "delta": delta, "finish_reason": None}]}
        )

    out = []
    position = 0
    for call, arguments in zip(state.calls, state.released, strict=False):
        if arguments is None:
            continue
        entry = {"index": position, "id": call.id, "type": "function",
                 "function": {"name": call.name, "arguments": dumps(arguments)}}  # fmt: skip
        out.append(chunk({"tool_calls": [entry]}))
        position += 1
    if state.legacy is not None and state.released[-1] is not None:
        legacy = {"name": state.legacy.name, "arguments": dumps(state.released[-1])}
        out.append(chunk({LEGACY: legacy}))
    if any(r is None for r in state.released):
        out.append(chunk({"content": DENIAL_TEXT}))
    return out


def stream_error_frame(message: str) -> bytes:
    """A chunk the SDK raises on (it reads `error` before anything else)."""
    return frame(None, {"error": {"message": message, "type": "api_error", "code": None}})
