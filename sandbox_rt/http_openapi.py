"""The OpenAPI 3.1 document of the HTTP control API (:mod:`sandbox_rt.http_api`), served at
``GET /openapi.json``: generated from the routes and models of :mod:`sandbox_rt.web`
(:mod:`sandbox_rt.web.openapi` adds what FastAPI does not know: the transport's errors, the
security scheme, the hand-validated bodies and the server-sent events)."""

from __future__ import annotations

from .web.app import openapi_document

__all__ = ["openapi_document"]
