"""What the gateway checks in a result before the client sees it (`results.py`)."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest

from quorumgate.mcpgw.results import (
    RESULT_BYTES_MAX,
    contents_problem,
    result_problem,
    schema_problem,
)

SCHEMA = {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}
WITH_SCHEMA = types.Tool(name="stats", input_schema={"type": "object"}, output_schema=SCHEMA)
WITHOUT = types.Tool(name="stats", input_schema={"type": "object"})


def result(**wire: Any) -> types.CallToolResult:
    return types.CallToolResult.model_validate({"content": [], **wire})


def text(value: str) -> dict[str, str]:
    return {"type": "text", "text": value}


@pytest.mark.parametrize(
    ("tool", "wire", "problem"),
    [
        (WITH_SCHEMA, {"structuredContent": {"count": "many"}}, "type at $.count"),
        (WITH_SCHEMA, {"structuredContent": {}}, "required at $"),
        (WITH_SCHEMA, {"content": [text('{"count": 3}')]}, "no structured content"),
        (
            WITH_SCHEMA,
            {"content": [text('{"count": 4}')], "structuredContent": {"count": 3}},
            "not the structured content",
        ),
        (
            WITHOUT,
            {"content": [text('[{"count": 4}]')], "structuredContent": {"count": 3}},
            "not the structured content",
        ),
        (WITHOUT, {"content": [text("x" * RESULT_BYTES_MAX)]}, "RESULT_BYTES_MAX"),
        (WITHOUT, {"content": [text("x" * RESULT_BYTES_MAX)], "isError": True}, "RESULT_BYTES_MAX"),
    ],
)
def test_a_result_that_cannot_be_accounted_for(
    tool: types.Tool, wire: dict[str, Any], problem: str
) -> None:
    found = result_problem(tool, result(**wire))
    assert found is not None and problem in found
    assert "many" not in found  # the reason never carries a value of the result


@pytest.mark.parametrize(
    ("tool", "wire"),
    [
        (WITH_SCHEMA, {"structuredContent": {"count": 3}}),
        (WITH_SCHEMA, {"content": [text('{"count": 3}')], "structuredContent": {"count": 3}}),
        (WITH_SCHEMA, {"content": [text("Three files.")], "structuredContent": {"count": 3}}),
        (WITH_SCHEMA, {"content": [text("{not json")], "structuredContent": {"count": 3}}),
        (WITH_SCHEMA, {"content": [text("no count today")], "isError": True}),
        (WITHOUT, {"content": [text('{"any": "json"}')]}),
        (WITHOUT, {"content": [text("3")], "structuredContent": {"count": 3}}),
    ],
)
def test_a_result_that_accounts_for_itself(tool: types.Tool, wire: dict[str, Any]) -> None:
    assert result_problem(tool, result(**wire)) is None


def test_a_schema_that_is_no_schema_or_points_outside_itself_fails_closed() -> None:
    assert "not a valid JSON Schema" in str(schema_problem({"type": 12}, {}))
    remote = {"$ref": "https://schemas.example/count.json"}  # never fetched
    assert "does not resolve" in str(schema_problem(remote, {"count": 3}))
    local = {"$defs": {"n": {"type": "integer"}}, "properties": {"count": {"$ref": "#/$defs/n"}}}
    assert schema_problem(local, {"count": 3}) is None
    assert "type at $.count" in str(schema_problem(local, {"count": "3"}))


def test_a_read_is_released_only_with_the_contents_of_the_resource_judged() -> None:
    def read(*uris: str) -> types.ReadResourceResult:
        contents = [types.TextResourceContents(uri=uri, text="t") for uri in uris]
        return types.ReadResourceResult(contents=contents)

    def same(uri: str) -> bool:
        return uri == "file:///notes/a.txt"

    assert contents_problem(read("file:///notes/a.txt"), same) is None
    assert "another resource" in str(contents_problem(read("file:///etc/passwd"), same))
    assert "another resource" in str(
        contents_problem(read("file:///notes/a.txt", "file:///etc/passwd"), same)
    )
    assert "no contents" in str(contents_problem(read(), same))
