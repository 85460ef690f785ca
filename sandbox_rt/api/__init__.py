"""Front doors onto the runtime (DESIGN §2): each is a thin translation onto the same
:class:`~sandbox_rt.Manager` / :class:`~sandbox_rt.Sandbox` that maps the one error tree to its own
answers in one place. :mod:`sandbox_rt.api.mcp` is the MCP server (``sandbox-rt mcp``)."""
