"""Pinned MCP tool definitions: what the owner's pin covers and how a listed tool compares
with it (`docs/mcp-gateway.md`, "The pin"). Pure: no I/O.

The pin is the SHA-256 of the whole tool object as the gateway serves it to the client —
every field the MCP SDK knows (name, title, description, input and output schemas,
annotations such as `readOnlyHint`, icons, execution, `_meta`), in RFC 8785 canonical
JSON, so one definition has one digest. A field the SDK does not know is dropped when the
upstream's listing is parsed and never reaches the client; when a later SDK knows it, the
digest changes and the owner pins again, which is the safe direction.

Pins made before the pin covered the whole object (name, description and input schema
only, under another domain tag) are recognised by name (`PinState.OLD_FORMAT`): such a
tool is hidden like a changed one, and `mcp-pin` says to re-pin it, never that it is
unchanged.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Any

import mcp_types as types
import rfc8785

from quorumgate.proto import domains

DEFINITION_DOMAIN = domains.MCP_TOOL  # the whole tool object
OLD_DEFINITION_DOMAIN = domains.MCP_TOOL_V1  # name, description and input schema only
OLD_PINNED_FIELDS = ("name", "description", "inputSchema")


class PinState(StrEnum):
    NOT_PINNED = "not_pinned"  # the owner pinned nothing: listed as the upstream defines it
    PINNED = "pinned"  # the definition is the one pinned
    CHANGED = "definition_changed"  # another definition than the one pinned
    OLD_FORMAT = "old_pin_format"  # pinned in the old format: re-pin
    UNPINNABLE = "unpinnable"  # no canonical JSON (a number RFC 8785 cannot write)


class UnpinnableTool(ValueError):
    """A tool definition with no RFC 8785 form: it can be neither pinned nor listed."""


def tool_wire(tool: types.Tool) -> dict[str, Any]:
    """The tool object as the gateway's server writes it (the SDK's own dump)."""
    return tool.model_dump(by_alias=True, mode="json", exclude_none=True)


def _digest(domain: bytes, value: Any) -> bytes:
    try:
        return hashlib.sha256(domain + rfc8785.dumps(value)).digest()
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError):
        raise UnpinnableTool("the tool definition has no canonical JSON") from None


def definition_digest(tool: types.Tool) -> bytes:
    """The pin of a tool: SHA-256 of its whole wire object in RFC 8785 JSON."""
    return _digest(DEFINITION_DOMAIN, tool_wire(tool))


def old_definition_digest(tool: types.Tool) -> bytes:
    """The pin as it was first made (name, description, input schema): only to recognise
    an old pin and say so."""
    wire = tool_wire(tool)
    return _digest(OLD_DEFINITION_DOMAIN, {key: wire.get(key) for key in OLD_PINNED_FIELDS})


def pin_state(pinned: bytes | None, tool: types.Tool) -> PinState:
    """How `tool`, as the upstream lists it now, stands with the owner's pin."""
    try:
        current = definition_digest(tool)
    except UnpinnableTool:
        return PinState.UNPINNABLE
    if pinned is None:
        return PinState.NOT_PINNED
    if pinned == current:
        return PinState.PINNED
    if pinned == old_definition_digest(tool):
        return PinState.OLD_FORMAT
    return PinState.CHANGED


def is_listable(state: PinState) -> bool:
    """Whether a tool in this state reaches the client (its calls are judged either way)."""
    return state in (PinState.PINNED, PinState.NOT_PINNED)
