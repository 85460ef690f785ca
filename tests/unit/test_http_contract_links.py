"""The published document's links (issue 35) and the contract fuzzer's stateful runs along them, against
the fake runtime of tests/unit/test_http_contract.py: a create's answer links to every route of the
sandbox it made and a started background command's to its process routes, and chains of calls along
them keep the contract and reach those routes with the ids and pids the server gave (tests/http_stateful.py).
"""

from __future__ import annotations

import re

import hypothesis
import pytest
from schemathesis.schemas import BaseSchema
from test_http_api import TOKEN
from test_http_contract import (  # noqa: F401 (fixtures)
    EXAMPLES,
    SEED_TREE,
    SNAPSHOT,
    TEMPLATES,
    VOLUME,
    Contract,
    contract,
    published_schema,
)

from tests.http_contract import Steering, load_published_schema
from tests.http_stateful import replay_seed, run_stateful, stateful_budget

# chains of linked calls: quick, rounds of 20 (about 3 s each) until the links reached every route they lead
# to (measured: 3-6 rounds), at most ROUNDS: the walk is random (each round its own draws, also under
# Hypothesis' "ci" profile), so the bound is far above the typical count and costs time only when the links
# really fail;
# $SANDBOX_RT_FUZZ_SCENARIOS: one run of that many, in full
STATEFUL = stateful_budget(20, 15)
ROUNDS = 1 if STATEFUL.full else 40


PROCESS_ROUTES = {
    "getProcess",
    "readProcessLogs",
    "writeProcessStdin",
    "closeProcessStdin",
    "waitProcess",
    "killProcess",
}
SANDBOX_ROUTES = {
    "getSandbox",
    "deleteSandbox",
    "execCommand",
    "extendSandbox",
    "readFile",
    "writeFile",
    "listFiles",
    "renameFile",
    "snapshotSandbox",
    "startProcess",
    "listProcesses",
}


def test_the_document_links_what_is_made_to_the_routes_that_use_it(
    published_schema: BaseSchema,  # noqa: F811
) -> None:
    """A create's answer links to every route of the sandbox it made, a started background command's to
    every route of that command; each link fills exactly its target's path parameters."""
    doc = published_schema.raw_schema
    operations = {o["operationId"]: (path, o) for path, item in doc["paths"].items() for o in item.values()}
    made = operations["createSandbox"][1]["responses"]["201"]["links"]
    started = operations["startProcess"][1]["responses"]["201"]["links"]
    on_sandbox = {n for n, (path, _) in operations.items() if path.startswith("/v1/sandboxes/{id}")}
    assert set(made) == {n for n in on_sandbox if "{pid}" not in operations[n][0]}
    assert set(made) >= SANDBOX_ROUTES
    assert set(started) == PROCESS_ROUTES
    for links in (made, started):
        for name, link in links.items():
            path = operations[link["operationId"]][0]
            assert {f"path.{p}" for p in re.findall(r"\{(\w+)\}", path)} == set(link["parameters"]), name
    wait = started["waitProcess"]["parameters"]
    assert wait == {"path.id": "$request.path.id", "path.pid": "$response.body#/pid"}


@pytest.fixture(scope="module")
def stateful_schema(contract: Contract) -> BaseSchema:  # noqa: F811
    # ids and pids are not steered: a linked call gets the values its link gives
    steer = Steering(
        sandbox_ids=lambda: (),
        snapshot_names=lambda: (SNAPSHOT,),
        file_paths=lambda: tuple(SEED_TREE),
        templates=lambda: TEMPLATES,
        volume_names=lambda: (VOLUME,),
    )
    return load_published_schema(
        contract.server.url, TOKEN, steer, max_examples=EXAMPLES, request_timeout=10, stateful=True
    )


def test_the_stateful_fuzzer_follows_the_links_to_the_process_routes(
    stateful_schema: BaseSchema,
    contract: Contract,  # noqa: F811
) -> None:
    """Chains of calls along the links keep the contract, and reach with a success every route of a
    sandbox a create made and of a background command a start made (with the pid it answered). Without
    links (the document before issue 35) there is no chain at all: Schemathesis finds no transition."""
    reached: set[str] = set()
    for n in range(ROUNDS):
        run = run_stateful(
            stateful_schema,
            scenarios=STATEFUL.scenarios,
            steps=STATEFUL.steps,
            timeout=10,
            teardown=contract.manager.reset,
            seed=replay_seed(n),
        )
        reached |= run.reached()
        if reached >= PROCESS_ROUTES | SANDBOX_ROUTES:
            break
    assert reached >= PROCESS_ROUTES | SANDBOX_ROUTES, (PROCESS_ROUTES | SANDBOX_ROUTES) - reached


def test_each_stateful_run_draws_afresh_under_the_ci_profile(
    stateful_schema: BaseSchema,
    contract: Contract,  # noqa: F811
) -> None:
    """Where $CI is set Hypothesis loads its "ci" profile, which derandomizes: before the fix every run drew
    the same chains, so the rounds above repeated the first one's reach and CI failed (stop 43)."""
    previous = hypothesis.settings._current_profile
    hypothesis.settings.load_profile("ci")
    try:
        runs = [
            tuple(
                (op, link)
                for op, _, link in run_stateful(
                    stateful_schema, scenarios=4, steps=6, timeout=10, teardown=contract.manager.reset
                ).calls
            )
            for _ in range(3)
        ]
    finally:
        hypothesis.settings.load_profile(previous or "default")
    assert len(set(runs)) > 1, runs[0]
