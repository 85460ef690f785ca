"""The hardening control catalogue (tests/hardening/controls.py) is consistent: the generated table is
current, every control has exactly one test and every control test a control, the seed checklist is
covered, role task ids are catalogued, waivers and negative proofs refer to real things."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from tests.hardening import checks, controls

HARDENING = Path(controls.__file__).parent
REPO = controls.REPO
SEED = REPO.parent / "shared" / "seeds" / "go-llm-sandbox-setup.md"
CONTROL_TEST = re.compile(r"^test_(SBX_[A-Z]+_\d\d)_\w+$")


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _test_functions() -> dict[str, list[str]]:
    """{function name: [files]} for every test_* function of tests/hardening."""
    found: dict[str, list[str]] = {}
    for path in sorted(HARDENING.glob("test_*.py")):
        for name in _functions(path):
            if name.startswith("test_"):
                found.setdefault(name, []).append(path.name)
    return found


def test_docs_controls_md_is_current() -> None:
    doc = REPO / "docs" / "controls.md"
    assert doc.read_text() == controls.render_markdown(), (
        "docs/controls.md is stale: run `python -m tests.hardening.controls > docs/controls.md`"
    )


def test_ids_are_well_formed_and_unique() -> None:
    ids = [c.id for c in controls.CONTROLS]
    assert [i for i, n in Counter(ids).items() if n > 1] == []
    assert [i for i in ids if not controls.ID_PATTERN.match(i)] == []
    for c in controls.CONTROLS:
        assert c.title and c.checks and c.enforced, c.id
        for place in c.enforced:
            path = place.split(" (")[0]
            if "/" in path and not path.startswith("LXC"):
                assert (REPO / path).exists(), f"{c.id}: {path} does not exist"


def test_every_control_has_exactly_one_test_and_vice_versa() -> None:
    tests = _test_functions()
    per_id: Counter[str] = Counter()
    for name, files in tests.items():
        assert len(files) == 1, f"{name} is defined in {files}"
        m = CONTROL_TEST.match(name)
        if m:
            per_id[m.group(1).replace("_", "-")] += 1
        else:
            assert name.startswith("test_proof_"), f"{name}: a control test must be test_SBX_<FAM>_<NN>_..."
    ids = {c.id for c in controls.CONTROLS}
    assert sorted(ids - set(per_id)) == [], "controls without a test"
    assert sorted(set(per_id) - ids) == [], "tests without a control in the catalogue"
    assert [i for i, n in per_id.items() if n != 1] == [], "controls with more than one test"


def test_every_seed_checklist_item_is_covered() -> None:
    covered = {key for c in controls.CONTROLS for key in c.seed}
    assert sorted(covered - set(controls.SEED_CHECKLIST)) == [], "unknown seed keys"
    assert sorted(set(controls.SEED_CHECKLIST) - covered) == [], "seed items without a control"


def test_checklist_matches_the_seed_guide_when_present() -> None:
    ours = [text for key, text in controls.SEED_CHECKLIST.items() if key.startswith("7.")]
    if not SEED.exists():  # the seed lives beside the repository (../shared); CI may not have it
        assert len(ours) == 29
        return
    text = SEED.read_text()
    section = text[text.index("## 7. Hardening Checklist") : text.index("## 8. Monitoring")]
    theirs = [line[len("- [ ] ") :].strip() for line in section.splitlines() if line.startswith("- [ ] ")]
    assert ours == theirs


def test_role_task_ids_are_in_the_catalogue() -> None:
    used: set[str] = set()
    for path in (REPO / "roles").glob("*/tasks/**/*.yml"):
        used |= set(re.findall(r"\bSBX-[A-Z]+-\d\d\b", path.read_text()))
    assert used, "no control ids in role task names"
    assert sorted(used - set(controls.BY_ID)) == []


def test_waivers_are_real_and_their_tests_consult_them() -> None:
    waivers = controls.load_waivers()
    assert waivers, "waivers.yml is empty"
    sources = "".join(p.read_text() for p in HARDENING.glob("test_*.py"))
    for control, waiver in waivers.items():
        assert control in controls.BY_ID, control
        condition = getattr(checks, waiver.condition, None)
        assert callable(condition), f"{control}: no condition check {waiver.condition}"
        assert waiver.reason and waiver.applies_to, control
        assert f'waivers["{control}"]' in sources, f"the test of {control} does not consult its waiver"


def test_pve_waivers_are_real_and_their_tests_consult_them() -> None:
    """The PVE-only waivers (waivers.yml ``pve_waivers``: the catalogue's pve-node site) likewise."""
    waivers = controls.load_waivers(section="pve_waivers")
    assert waivers, "waivers.yml has no pve_waivers"
    sources = "".join(p.read_text() for p in HARDENING.glob("test_*.py"))
    for control, waiver in waivers.items():
        assert control in controls.BY_ID, control
        assert callable(getattr(checks, waiver.condition, None)), f"{control}: {waiver.condition}?"
        assert waiver.reason and waiver.applies_to, control
        assert f'pve_waivers["{control}"]' in sources, f"the test of {control} ignores its PVE waiver"


def test_at_least_five_controls_are_proven_to_fail() -> None:
    from tests.hardening import test_proofs

    funcs = _functions(HARDENING / "test_proofs.py")
    proofs = {name for name in funcs if name.startswith("test_proof_")}
    assert proofs == set(test_proofs.PROVES), "PROVES must list every proof test"
    assert len(set(test_proofs.PROVES.values())) >= 5
    for name, control in test_proofs.PROVES.items():
        assert control in controls.BY_ID, control
        source = ast.get_source_segment((HARDENING / "test_proofs.py").read_text(), funcs[name]) or ""
        expects = re.search(rf'expect_violation\(\s*"{control}"', source)
        assert expects, f"{name} does not expect a {control} violation"
