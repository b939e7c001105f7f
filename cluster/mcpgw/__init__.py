"""The MCP gateway: MCP tools governed by the cluster (`docs/mcp-gateway.md`)."""
