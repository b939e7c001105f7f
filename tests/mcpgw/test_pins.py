"""The pin of an MCP tool covers the whole tool object the client receives (`pins.py`)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import mcp_types as types
import pytest

from quorumgate.mcpgw.pins import (
    PinState,
    definition_digest,
    is_listable,
    old_definition_digest,
    pin_state,
    tool_wire,
)

WIRE: dict[str, Any] = {
    "name": "lookup",
    "title": "Look a file up",
    "description": "Read a file's first line",
    "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
    "outputSchema": {"type": "object", "properties": {"line": {"type": "string"}}},
    "annotations": {"title": "Lookup", "readOnlyHint": True, "openWorldHint": False},
    "icons": [{"src": "https://icons.example/a.png", "mimeType": "image/png"}],
    "execution": {"taskSupport": "forbidden"},
    "_meta": {"vendor.example/tier": "basic"},
}


def tool(wire: dict[str, Any]) -> types.Tool:
    return types.Tool.model_validate(wire)


EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "name": lambda w: w.update(name="lookup2"),
    "title": lambda w: w.update(title="Look a file up and delete it"),
    "title removed": lambda w: w.pop("title"),
    "description": lambda w: w.update(description="Read a file. Then mail it."),
    "inputSchema": lambda w: w["inputSchema"]["properties"].update(to={"type": "string"}),
    "outputSchema": lambda w: w["outputSchema"].update(required=["line"]),
    "annotations.title": lambda w: w["annotations"].update(title="Safe lookup"),
    "readOnlyHint": lambda w: w["annotations"].update(readOnlyHint=False),
    "destructiveHint added": lambda w: w["annotations"].update(destructiveHint=True),
    "icons": lambda w: w["icons"][0].update(src="https://evil.example/a.png"),
    "execution": lambda w: w["execution"].update(taskSupport="required"),
    "_meta": lambda w: w["_meta"].update({"vendor.example/tier": "admin"}),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_change_in_any_field_is_another_definition(edit: str) -> None:
    changed = copy.deepcopy(WIRE)
    EDITS[edit](changed)
    pinned = definition_digest(tool(WIRE))
    assert definition_digest(tool(changed)) != pinned
    assert pin_state(pinned, tool(changed)) is PinState.CHANGED
    assert not is_listable(PinState.CHANGED)


def test_one_definition_has_one_digest_whatever_the_order_of_its_keys() -> None:
    reordered = {key: WIRE[key] for key in reversed(list(WIRE))}
    reordered["inputSchema"] = {"properties": WIRE["inputSchema"]["properties"], "type": "object"}
    assert definition_digest(tool(reordered)) == definition_digest(tool(WIRE))
    assert pin_state(definition_digest(tool(WIRE)), tool(reordered)) is PinState.PINNED


def test_the_digest_is_of_what_the_client_receives() -> None:
    """A field the SDK does not know is dropped on the way in, so it is neither served nor
    digested; everything served is digested."""
    unknown = {**WIRE, "futureField": {"a": 1}}
    assert "futureField" not in tool_wire(tool(unknown))
    assert definition_digest(tool(unknown)) == definition_digest(tool(WIRE))
    assert set(tool_wire(tool(WIRE))) == set(WIRE)


def test_a_pin_of_the_old_format_is_recognised_and_never_passes() -> None:
    current = tool(WIRE)
    old = old_definition_digest(current)
    assert old != definition_digest(current)
    assert pin_state(old, current) is PinState.OLD_FORMAT and not is_listable(PinState.OLD_FORMAT)
    # once the three fields it covered change too, it is simply another definition
    edited = copy.deepcopy(WIRE)
    edited["description"] = "Read a file. Then mail it."
    assert pin_state(old, tool(edited)) is PinState.CHANGED


def test_no_pin_lists_the_tool_and_no_canonical_json_hides_it() -> None:
    assert pin_state(None, tool(WIRE)) is PinState.NOT_PINNED and is_listable(PinState.NOT_PINNED)
    huge = {**WIRE, "inputSchema": {"type": "object", "maximum": 2**64}}  # beyond I-JSON
    assert pin_state(None, tool(huge)) is PinState.UNPINNABLE
    assert not is_listable(PinState.UNPINNABLE)
