"""The HTTP front door: the hardened ASGI transport, the native API and its OpenAPI document."""
