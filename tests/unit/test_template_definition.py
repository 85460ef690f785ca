"""Templates from code, fast: the builder's typed steps and their checks, the build's egress list, the
cache key (what changes it and what does not), and that defining a template never imports pyinfra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandbox_rt import ConfigError, Template
from sandbox_rt.templates.cache import cache_key
from sandbox_rt.templates.steps import APT_SOURCES, PIP_SOURCES, AptInstall, Copy, Env, PipInstall


def _deploy_a() -> None:
    pass


def _deploy_b() -> None:
    print("different body")


def test_steps_chain_in_order_and_describe_themselves(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    t = (
        Template()
        .from_template("default")
        .apt_install("jq", "curl=7.88.1-10")
        .pip_install(["requests==2.31.0"], index_url="https://mirror.example/simple")
        .npm_install("@scope/tool@1.2.3")
        .copy(tmp_path / "f", "/opt/f")
        .env(B="2", A="1")
        .workdir("/srv")
        .run("make all")
        .deploy(_deploy_a)
    )
    assert [s.describe() for s in t.steps] == [
        "apt_install(jq, curl=7.88.1-10)",
        "pip_install(requests==2.31.0) from https://mirror.example/simple",
        "npm_install(@scope/tool@1.2.3)",
        f"copy({tmp_path / 'f'} -> /opt/f)",
        "env(A, B)",
        "workdir(/srv)",
        "run(make all)",
        "deploy(_deploy_a)",
    ]
    assert isinstance(t.steps[4], Env) and t.steps[4].values == (("A", "1"), ("B", "2"))


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda t: t.apt_install("jq; rm -rf /"), "not a apt package"),
        (lambda t: t.apt_install("-o=APT::X"), "not a apt package"),
        (lambda t: t.apt_install([]), "at least one"),
        (lambda t: t.pip_install("--index-url=http://evil"), "not a pip package"),
        (lambda t: t.pip_install("x", index_url="file:///etc"), r"http\(s\) URL"),
        (lambda t: t.npm_install("../../x"), "not a npm package"),
        (lambda t: t.run(""), "not a shell command"),
        (lambda t: t.copy("/nonexistent/for/sure", "/x"), "cannot read"),
        (lambda t: t.copy("/etc/hostname", "relative/path"), "absolute path"),
        (lambda t: t.copy("/etc/hostname", "/a/../etc/x"), "'..'"),
        (lambda t: t.env(**{"BAD-NAME": "x"}), "variable name"),
        (lambda t: t.env(X="line\nbreak"), "one line"),
        (lambda t: t.env(X="$(id)"), "one line"),
        (lambda t: t.workdir("tmp"), "absolute path"),
        (lambda t: t.deploy("not callable"), "not callable"),  # type: ignore[arg-type]
        (lambda t: t.allow("not an address!"), "egress"),
        (lambda t: t.run("true").from_template("default"), "must come before"),
        (lambda t: t.from_template("Bad_Name"), "template name"),
    ],
)
def test_bad_steps_are_config_errors(build: Any, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        build(Template())


def test_the_egress_list_is_what_the_steps_download_from() -> None:
    t = (
        Template()
        .apt_install("jq")
        .pip_install("x", index_url="http://10.1.2.3:8080/simple")
        .npm_install("y")
    )
    assert t.egress() == [*APT_SOURCES, "10.1.2.3", "registry.npmjs.org"]
    assert Template().pip_install("x").egress() == list(PIP_SOURCES)
    assert Template().run("make").egress() == []  # a plain command reaches nothing
    assert Template().deploy(_deploy_a, egress=["192.0.2.7"]).allow("example.org").egress() == [
        "192.0.2.7",
        "example.org",
    ]


def test_the_same_definition_has_the_same_key(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d/a").write_text("1")

    def make() -> Template:
        return Template().apt_install("jq").copy(tmp_path / "d", "/opt/d").deploy(_deploy_a)

    assert cache_key(make(), "base-1") == cache_key(make(), "base-1")


def test_the_key_changes_with_anything_that_changes_the_result(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d/a").write_text("1")
    base = Template().apt_install("jq").copy(tmp_path / "d", "/opt/d").deploy(_deploy_a)
    key = cache_key(base, "base-1")
    assert cache_key(base, "base-2") != key  # another base template (or a rebuilt one)
    assert (
        cache_key(
            Template().apt_install("jq", "curl").copy(tmp_path / "d", "/opt/d").deploy(_deploy_a), "base-1"
        )
        != key
    )
    assert (
        cache_key(Template().apt_install("jq").copy(tmp_path / "d", "/opt/e").deploy(_deploy_a), "base-1")
        != key
    )
    assert (
        cache_key(Template().apt_install("jq").copy(tmp_path / "d", "/opt/d").deploy(_deploy_b), "base-1")
        != key
    )
    (tmp_path / "d/a").write_text("2")  # a copied file's bytes
    assert cache_key(base, "base-1") != key
    (tmp_path / "d/a").write_text("1")
    assert cache_key(base, "base-1") == key
    (tmp_path / "d/a").chmod(0o755)  # its mode
    assert cache_key(base, "base-1") != key
    (tmp_path / "d/a").chmod(0o644)
    (tmp_path / "d/new").write_text("")  # a new file
    assert cache_key(base, "base-1") != key
    # step order matters
    a = Template().run("a").run("b")
    b = Template().run("b").run("a")
    assert cache_key(a, "x") != cache_key(b, "x")


def test_a_copied_directory_with_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d/link").symlink_to("/etc/passwd")
    step = Copy(tmp_path / "d", "/opt/d")
    with pytest.raises(ConfigError, match="not a regular file"):
        step.fingerprint()


def test_steps_are_values() -> None:
    assert AptInstall(("jq",)) == AptInstall(("jq",))
    assert PipInstall(("x",)).egress() == PIP_SOURCES
    with pytest.raises(AttributeError):
        AptInstall(("jq",)).packages = ("x",)  # type: ignore[misc]


def test_defining_a_template_does_not_import_pyinfra() -> None:
    code = (
        "import sys, sandbox_rt\n"
        "t = sandbox_rt.Template().apt_install('jq').run('true')\n"
        "import sandbox_rt.cli\n"
        "print('pyinfra' in sys.modules, 'gevent' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]
