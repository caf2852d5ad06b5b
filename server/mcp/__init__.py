"""The MCP endpoint (`/mcp`, streamable HTTP): the reference client's tools, waiting, sweeps,
forks, curves, and run resources, built on the official `mcp` SDK over our services."""
