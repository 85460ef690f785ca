"""The OpenSandbox dialect of the HTTP API (issue 25): the lifecycle API and execd, served by the
host over SSH, on their own port beside the native API, over the same runtime."""
