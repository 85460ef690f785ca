"""The MCP server (``sandbox-rt mcp``): a front door onto the runtime, a thin translation onto the same
:class:`~sandbox_rt.Manager` / :class:`~sandbox_rt.Sandbox` that maps the one error tree to its own
answers in one place. :mod:`.server` holds the options and tools, :mod:`.answers` the results and
the error mapping, :mod:`.sessions` which session holds what, :mod:`.transport` stdio and HTTP.

Importing this package imports nothing more (the MCP SDK comes with :mod:`.server`)."""
