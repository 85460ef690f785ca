"""The egress API's ``/policy`` (GET, PATCH merge, DELETE by target), served under the sandbox's
egress route and its execd route alike, onto its internet flag and egress allow-list
(:mod:`.egress_policy`: exactly, or a 400)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from ...errors import ConfigError
from ..errors import json_type
from ..params import Ctx, SandboxId
from .egress_policy import Rule, merge_rules, policy_document, remove_targets, rules_of, to_egress
from .execd_models import MAX_ITEMS, NetworkRuleBody, model_of, read_json
from .execd_runtime import EGRESS_PREFIX, EXECD_PREFIX, ExecdSandbox, execd_router, sandbox_of

__all__ = ["routers"]


def _array(body: Any, what: str) -> list[Any]:
    if not isinstance(body, list) or not body:
        raise ConfigError(f"the {what} body must be a non-empty array, not {json_type(body)}")
    if len(body) > MAX_ITEMS:
        raise ConfigError(f"the {what} body has {len(body)} items; at most {MAX_ITEMS} are allowed")
    return body


def _apply(sb: ExecdSandbox, internet: bool, rules: list[Rule]) -> dict[str, Any]:
    """Enforce ``rules`` under the current default (a PATCH or DELETE never changes it)."""
    _, egress = to_egress("allow" if internet else "deny", rules)
    return policy_document(internet, sb.set_egress(egress))


def get_policy(ctx: Ctx, id: SandboxId) -> dict[str, Any]:
    status = sandbox_of(ctx, id).status()
    return policy_document(status.internet, status.egress)


def patch_policy(
    ctx: Ctx, id: SandboxId, body: Annotated[Any, Depends(read_json("policy"))]
) -> dict[str, Any]:
    items = [model_of(NetworkRuleBody, r, f"rule {n}") for n, r in enumerate(_array(body, "policy"))]
    incoming = [Rule(i.action, i.target) for i in items]
    sb = sandbox_of(ctx, id)
    status = sb.status()
    return _apply(sb, status.internet, merge_rules(rules_of(status.egress), incoming))


def delete_policy(
    ctx: Ctx, id: SandboxId, body: Annotated[Any, Depends(read_json("policy"))]
) -> dict[str, Any]:
    targets = _array(body, "policy")
    if not all(isinstance(t, str) for t in targets):
        raise ConfigError("the policy body must be an array of targets (strings)")
    sb = sandbox_of(ctx, id)
    status = sb.status()
    return _apply(sb, status.internet, remove_targets(rules_of(status.egress), targets))


def _router(prefix: str) -> APIRouter:
    router = execd_router(prefix)
    router.add_api_route("/policy", get_policy, methods=["GET"], summary="The egress policy enforced now")
    router.add_api_route(
        "/policy", patch_policy, methods=["PATCH"], summary="Merge egress rules (400 if inexact)"
    )
    router.add_api_route(
        "/policy", delete_policy, methods=["DELETE"], summary="Remove egress rules by target"
    )
    return router


routers = (_router(EGRESS_PREFIX), _router(EXECD_PREFIX))
