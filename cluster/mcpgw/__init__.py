"""The MCP gateway (issue 18): MCP tools governed by the cluster (`gateway.py`)."""
