"""Stateful runs of the contract fuzzer (issue 35): chains of calls along the links of the published
OpenAPI document (a create's answer to every route of the sandbox it made, a started background
command's to its process routes), each answer held to the document by tests/http_contract.py's checks
and none a success on a sandbox the scenario destroyed. Without links the fuzzer never reached a process
route with a pid that exists.

Not Schemathesis' own use_after_free and ensure_resource_availability: they take a route's path for its
resource, but a 404 on a sandbox's routes may name a file or a process, and a DELETE of .../files
removes a file, not the routes below it.

Quick by default (what CI runs); ``SANDBOX_RT_FUZZ_SCENARIOS`` (and ``SANDBOX_RT_FUZZ_STEPS``) make the
full run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hypothesis
from schemathesis import Case
from schemathesis.generation.stateful import run_state_machine_as_test
from schemathesis.generation.stateful.state_machine import StepInput, StepOutput
from schemathesis.schemas import BaseSchema

from tests.http_contract import SEED_ENV, check_answer, whole_number

__all__ = [
    "SCENARIOS_ENV",
    "STEPS_ENV",
    "StatefulBudget",
    "StatefulRun",
    "replay_seed",
    "run_stateful",
    "stateful_budget",
]

SCENARIOS_ENV = "SANDBOX_RT_FUZZ_SCENARIOS"  # stateful scenarios (chains of linked calls); default: quick
STEPS_ENV = "SANDBOX_RT_FUZZ_STEPS"  # calls per stateful scenario at most; default: quick


@dataclass(frozen=True)
class StatefulBudget:
    scenarios: int  # chains of linked calls
    steps: int  # calls per chain at most
    full: bool  # the opt-in run: all its scenarios, not only until every linked route was reached


def stateful_budget(scenarios: int, steps: int) -> StatefulBudget:
    """A stateful run's size: ``$SANDBOX_RT_FUZZ_SCENARIOS`` (and ``$SANDBOX_RT_FUZZ_STEPS``) make the full
    run (opt-in, e.g. nightly); else the quick defaults given, which CI runs."""
    full = bool(os.environ.get(SCENARIOS_ENV, "").strip())
    return StatefulBudget(whole_number(SCENARIOS_ENV, scenarios), whole_number(STEPS_ENV, steps), full)


def replay_seed(run: int) -> int | None:
    """The seed of the ``run``-th stateful run when ``$SANDBOX_RT_FUZZ_SEED`` replays a failure (that seed
    plus ``run``), else None: each run draws afresh."""
    base = os.environ.get(SEED_ENV, "").strip()
    return None if not base else int(base) + run


@dataclass
class StatefulRun:
    """Every call of a stateful run: (operationId, HTTP status, the link it followed or None)."""

    calls: list[tuple[str, int, str | None]]
    failure: BaseException | None = None  # the first check that failed, as it happened

    def reached(self, *, status_below: int = 300) -> set[str]:
        """The operations a followed link reached with an answer below ``status_below``."""
        return {op for op, status, link in self.calls if link is not None and status < status_below}


def run_stateful(
    schema: BaseSchema,
    *,
    scenarios: int,
    steps: int,
    timeout: float,
    teardown: Callable[[], None] | None = None,
    seed: int | None = None,
) -> StatefulRun:
    """``scenarios`` chains of at most ``steps`` calls, from an operation that makes something along the
    document's links (``schema`` from ``load_published_schema(..., stateful=True)``), each answer held by
    :func:`check_answer`, none a success on a sandbox the scenario destroyed; ``teardown`` after each
    scenario. Raises what a check raises.

    Each run draws afresh (``seed``: replays one run), also where ``$CI`` makes Hypothesis load its "ci"
    profile, which derandomizes: there every run drew the same chains, so repeating runs until the links
    had reached every route repeated the first run's reach (CI's failure of stop 43)."""
    log = StatefulRun([])
    machine: Any = schema.as_state_machine()

    class ContractWorkflow(machine):  # type: ignore[misc, valid-type]
        def setup(self) -> None:
            self.destroyed: set[str] = set()

        def step(self, input: StepInput) -> StepOutput:
            try:
                output: StepOutput = super().step(input)
            except BaseException as exc:
                log.failure = log.failure or exc
                raise
            link = input.transition.id if input.transition is not None and input.is_applied else None
            operation = str(output.case.operation.definition.raw.get("operationId"))
            status, sid = output.response.status_code, (output.case.path_parameters or {}).get("id")
            log.calls.append((operation, status, link))
            if sid in self.destroyed and status < 300:
                label = output.case.operation.label
                log.failure = log.failure or AssertionError(f"{label} answered {status} on destroyed {sid}")
                raise log.failure
            if operation == "deleteSandbox" and status == 204:
                self.destroyed.add(str(sid))
            return output

        def call(self, case: Case[Any], **kwargs: Any) -> Any:
            return case.call(timeout=timeout, **kwargs)

        def validate_response(self, response: Any, case: Case[Any], *args: Any, **kwargs: Any) -> None:
            check_answer(case, response)

        def teardown(self) -> None:
            try:
                if teardown is not None:
                    teardown()
            finally:
                super().teardown()

    settings = hypothesis.settings(
        max_examples=scenarios,
        stateful_step_count=steps,
        phases=[hypothesis.Phase.generate],  # no shrinking: a failure is reported as it happened
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    if seed is not None:
        hypothesis.seed(seed)(ContractWorkflow)
    for _ in range(_FLAKY_RESTARTS + 1):
        try:
            run_state_machine_as_test(ContractWorkflow, settings=settings)
            return log
        except Exception as exc:
            # the first check that failed, as it happened: Hypothesis replays a failing scenario to report
            # it, and against a server whose state moved on the replay differs (Flaky) and hides it
            if log.failure is not None:
                raise log.failure from None
            # no check failed: Hypothesis found its own draws inconsistent, as the server's state (a bundle
            # filled in one run, empty in another) steers them. What ran kept the contract: run again, as
            # Schemathesis' own runner does
            if not (isinstance(exc, hypothesis.errors.Flaky) or _inconsistent_replay(exc)):
                raise
    return log


_FLAKY_RESTARTS = 3  # runs restarted at most after Hypothesis found its draws inconsistent


def _inconsistent_replay(exc: BaseException) -> bool:
    """Hypothesis asserts instead of raising Flaky when a replay draws past a value an earlier run refused
    (what Schemathesis' engine checks too: the assertion comes from Hypothesis' data tree)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = "" if tb is None else str(tb.tb_frame.f_globals.get("__name__", ""))
    return isinstance(exc, AssertionError) and module.startswith("hypothesis.internal.conjecture")
