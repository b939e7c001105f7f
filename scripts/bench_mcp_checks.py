#!/usr/bin/env python3
"""What the MCP gateway's own checks cost per listing and per call (`cluster/mcpgw/`):
the pin of a tool (the whole object, against the old three-field pin) and the check of a
result against its output schema (the compiled validator kept, against compiling it per
call). Medians of RUNS runs, ratios to the baseline measured in the same run.

    .venv/bin/python scripts/bench_mcp_checks.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import mcp_types as types

from quorumgate.mcpgw import results
from quorumgate.mcpgw.pins import definition_digest, old_definition_digest

RUNS = 7
TOOL = types.Tool.model_validate(
    {
        "name": "lookup",
        "title": "Look a file up",
        "description": "Read a file's first line",
        "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
        "outputSchema": {"type": "object", "properties": {"line": {"type": "string"}}},
        "annotations": {"readOnlyHint": True, "destructiveHint": False},
        "icons": [{"src": "https://icons.example/lookup.png"}],
        "_meta": {"vendor.example/tier": "basic"},
    }
)
SCHEMA = {
    "type": "object",
    "properties": {
        "count": {"type": "integer"},
        "names": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["count"],
}
STATS = types.Tool(name="stats", input_schema={"type": "object"}, output_schema=SCHEMA)
RESULT = types.CallToolResult(
    content=[types.TextContent(type="text", text="20 files")],
    structured_content={"count": 20, "names": [f"f{i}.txt" for i in range(20)]},
)


def median_us(work: Callable[[], object], n: int) -> float:
    runs = []
    for _ in range(RUNS):
        start = time.perf_counter()
        for _ in range(n):
            work()
        runs.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(runs)


def compiled_per_call() -> object:
    results._validator.cache_clear()
    return results.result_problem(STATS, RESULT)


def main() -> None:
    old = median_us(lambda: old_definition_digest(TOOL), 2000)
    whole = median_us(lambda: definition_digest(TOOL), 2000)
    print(f"pin, name/description/inputSchema: {old:8.1f} us")
    print(f"pin, the whole tool object:         {whole:8.1f} us  ({whole / old:.2f}x)")
    compiling = median_us(compiled_per_call, 200)
    kept = median_us(lambda: results.result_problem(STATS, RESULT), 2000)
    print(f"result check, compiling the schema: {compiling:8.1f} us")
    print(f"result check, validator kept:       {kept:8.1f} us  ({kept / compiling:.2f}x)")


if __name__ == "__main__":
    main()
