"""The version moves with what changed: one version number (refusion/version.py, read by pyproject.toml), the newest
release of CHANGELOG.md (Keep a Changelog, semantic versions), and docs that speak of versions, not of the project's
internal issue numbers."""

import re
from pathlib import Path

import pytest

from refusion.version import __version__

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
#: ``## [0.6.0] - 2026-12-07`` and ``## [Unreleased]``
HEADINGS = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", CHANGELOG, re.M)
SECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def semver(text):
    return tuple(int(n) for n in text.split("."))


def test_the_package_version_is_the_newest_release_of_the_changelog():
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    releases = [version for version, _ in HEADINGS if version != "Unreleased"]
    assert releases[0] == __version__


def test_pyproject_reads_the_version_from_the_one_place():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "refusion.version.__version__"}


def test_the_changelog_keeps_a_changelog_newest_first_with_dated_semantic_versions():
    assert HEADINGS[0] == ("Unreleased", "")
    releases = HEADINGS[1:]
    assert releases and all(date for _, date in releases), "every release has its date"
    versions = [semver(v) for v, _ in releases]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    dates = [date for _, date in releases]
    assert dates == sorted(dates, reverse=True)
    used = set(re.findall(r"^### (.+)$", CHANGELOG, re.M))
    assert used <= SECTIONS, used - SECTIONS


def test_the_docs_speak_of_versions_not_of_internal_issue_numbers():
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = [
        f"{page.name}: {match.group(0)!r}"
        for page in pages
        for match in re.finditer(r"\bissues?\s+\d+", page.read_text(), re.I)
    ]
    assert not found, found
