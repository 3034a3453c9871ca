"""The README's two set-up commands are true: CI runs the test command, and packaging lists every package;
the README stays short (the rest lives under docs/)."""

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def setup_commands():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def test_readme_has_exactly_two_setup_commands():
    commands = setup_commands()
    assert len(commands) == 2
    assert commands[0].startswith("pip install torch==2.13.0 -e . && refusion generate ")


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert setup_commands()[1] in ci.splitlines()


def test_every_package_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "refusion").rglob("__init__.py")}
    assert found <= listed, found - listed
    assert config["package-dir"]["refusion_kernels"] == "kernels/refusion_kernels"
    assert not (ROOT / "kernels" / "__init__.py").exists()  # a package `kernels` at the root shadows PyPI's


def test_readme_is_under_200_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_links_to_docs_pages_that_exist():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((docs/[^)#]*)", readme)
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, missing
