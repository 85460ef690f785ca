"""Templates from code (issue 27): what a build costs, what a cache hit costs, and whether a sandbox
made from a built template starts as fast as one of the default template, measured in the same run.

    python -m benchmarks --only templates

- ``template_build``: ``Manager.build_template`` of a small definition (a copied file, an env
  variable, a working directory, a command) with ``skip_cache=True``: build sandbox, pyinfra steps,
  hardening checks, the template stored (a reflinked copy of the base's root plus the delta);
- ``template_cache_hit``: the same definition again (the content hash matches: no work);
- ``create_from_built`` / ``create_from_default``: ``create()`` to SSH-ready from the built template
  and from the default one, samples alternating (the built one's root is a full tree like the
  default's, so the two should be within noise).
The registry is a private one (a temp state dir): the host's template names never see the run's.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

from sandbox_rt import Manager, Template
from sandbox_rt.templates import remove_template

from .context import Bench
from .stats import compare, summary, timed

__all__ = ["run"]

WHAT = {
    "template_build": "build_template of a 4-step definition (skip_cache)",
    "template_cache_hit": "build_template of the same definition again (cache hit)",
    "create_from_built": "create() to SSH-ready from the built template",
    "create_from_default": "create() to SSH-ready from the default template",
}


def _definition(b: Bench) -> Template:
    payload = b.tmp / "template-payload.txt"
    payload.write_text("benchmark payload\n" * 100)
    return (
        Template()
        .copy(payload, "/opt/bench/payload.txt")
        .env(BENCH_RUN=b.run_id)
        .workdir("/srv/bench")
        .run("cp /opt/bench/payload.txt copied.txt && wc -l copied.txt")
    )


def run(b: Bench) -> dict[str, Any]:
    state = b.tmp / "template-state"
    mgr = Manager(dataclasses.replace(b.settings, state_dir=state))
    name = f"bench-{b.run_id}-{secrets.token_hex(2)}"
    definition = _definition(b)
    builds = max(1, b.opts.runs // 5)
    res: dict[str, list[float]] = {k: [] for k in WHAT}
    try:
        for _ in range(builds):
            b.checkpoint()
            res["template_build"].append(timed(lambda: mgr.build_template(definition, name, skip_cache=True)))
        for _ in range(max(b.opts.runs, 5)):
            res["template_cache_hit"].append(timed(lambda: mgr.build_template(definition, name)))
        for _ in range(b.opts.runs):
            b.checkpoint()
            for template, measure in ((name, "create_from_built"), (None, "create_from_default")):
                sb = None

                def make(t: str | None = template) -> None:
                    nonlocal sb
                    sb = b.create(mgr, template=t)

                res[measure].append(timed(make))
                assert sb is not None
                sb.destroy()
    finally:
        b.sweep(mgr)
        remove_template(mgr, name)
    measures = {k: summary(v, WHAT[k]) for k, v in res.items()}
    comparisons = [
        compare(measures, "create_from_built", "create_from_default", against="variant"),
        compare(measures, "template_cache_hit", "template_build", against="variant"),
    ]
    return {"measures": measures, "comparisons": comparisons, "facts": {"builds": builds, "steps": 4}}
