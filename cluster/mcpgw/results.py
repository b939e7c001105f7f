"""What the gateway checks in an upstream's answer before the client sees it
(`docs/mcp-gateway.md`, "Results"). Pure: no I/O.

A certified call has run; its result still reaches the client only if the gateway can
account for it: at most RESULT_BYTES_MAX bytes, structured content that conforms to the
output schema of the definition the call was judged on (MCP 2025-06-18, "Structured
Content": a client validates it, and so does the gateway, against the pinned schema), and
no text block that reads as JSON yet says something else than the structured content (the
model reads the text, a program the structured content: both must be one result). The
answer for anything else is `isError` with RESULT_WITHHELD; the reason, which never holds
a value from the result, is for the operator's log.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import mcp_types as types
import rfc8785

RESULT_BYTES_MAX = 4 * 1024 * 1024  # one tool result or resource read, as JSON
RESULT_WITHHELD = "The tool's result could not be checked, so it was not delivered."
SCHEMA_VALIDATORS_MAX = 256  # compiled output-schema validators kept (TOOLS_MAX of them)


def withheld(text: str = RESULT_WITHHELD) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def wire_bytes(result: types.Result) -> int:
    return len(result.model_dump_json(by_alias=True, exclude_none=True).encode())


def result_problem(tool: types.Tool, result: types.CallToolResult) -> str | None:
    """Why `result` of a call of `tool` (its definition as judged) cannot be released, or
    None. A tool's own error result (`isError`) is released as it is: it has no
    structured content to check."""
    if wire_bytes(result) > RESULT_BYTES_MAX:
        return f"larger than RESULT_BYTES_MAX ({RESULT_BYTES_MAX} bytes)"
    if result.is_error:
        return None
    structured = result.structured_content
    if tool.output_schema is not None:
        if structured is None:
            return "no structured content, and the tool declares an output schema"
        problem = schema_problem(tool.output_schema, structured)
        if problem is not None:
            return problem
    if structured is not None:
        for block in result.content:
            if isinstance(block, types.TextContent) and _disagrees(block.text, structured):
                return "a JSON text block that is not the structured content"
    return None


def _disagrees(text: str, structured: object) -> bool:
    """A text block that is a JSON object or array other than the structured content (a
    sentence, or a bare number or word, is a summary and says nothing structured)."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return False
    try:
        return bool(json.loads(stripped) != structured)
    except ValueError:
        return False  # prose that happens to open with a bracket


def schema_problem(schema: dict[str, Any], instance: object) -> str | None:
    """Why `instance` does not conform to JSON Schema `schema` — the keyword and where,
    never the value — or None. `$ref`s resolve inside the schema only: nothing is fetched."""
    from jsonschema.exceptions import best_match
    from referencing.exceptions import Unresolvable

    try:
        validator = _validator(rfc8785.dumps(schema))
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError):
        return "the declared output schema has no canonical JSON"
    if isinstance(validator, str):
        return validator
    try:
        error = best_match(validator.iter_errors(instance))
    except Unresolvable:
        return "the declared output schema has a $ref that does not resolve"
    if error is None:
        return None
    return f"breaks the output schema: {error.validator} at {error.json_path}"


@functools.lru_cache(maxsize=SCHEMA_VALIDATORS_MAX)
def _validator(schema_json: bytes) -> Any:
    """The compiled validator of a schema (its RFC 8785 bytes), or why there is none.
    Compiling costs far more than validating, and a tool's schema rarely changes."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for
    from referencing import Registry

    schema = json.loads(schema_json)
    validator_class = validator_for(schema)
    try:
        validator_class.check_schema(schema)
    except SchemaError:
        return "the declared output schema is not a valid JSON Schema"
    return validator_class(schema, registry=Registry())


def contents_problem(result: types.ReadResourceResult, same_resource: Any) -> str | None:
    """Why a resource read's `result` cannot be released, or None: too large, or contents
    of a resource other than the one judged (`same_resource(uri)` says whether a URI is
    it, in its canonical form)."""
    if wire_bytes(result) > RESULT_BYTES_MAX:
        return f"larger than RESULT_BYTES_MAX ({RESULT_BYTES_MAX} bytes)"
    if not result.contents:
        return "no contents"
    if not all(same_resource(content.uri) for content in result.contents):
        return "contents of another resource than the one judged"
    return None
