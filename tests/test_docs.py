"""The documentation site builds without a warning, and every page in docs/ is in it."""

import os
import re
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT

DOCS = ROOT / "docs"


def _nav_pages(nav) -> list[str]:
    """The page files of an mkdocs nav: a list of pages, titled pages and titled sections."""
    pages = []
    for entry in nav:
        for item in entry.values() if isinstance(entry, dict) else [entry]:
            pages += _nav_pages(item) if isinstance(item, list) else [item]
    return pages


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built with `mkdocs build --strict`, as `make docs` builds it."""
    site = tmp_path_factory.mktemp("docs") / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    return site


def test_every_page_is_in_the_nav():
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert len(nav) == len(set(nav)), "a page is listed twice"
    assert sorted(nav) == sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))


def test_every_page_is_rendered_with_its_title(site):
    for page in DOCS.rglob("*.md"):
        relative = page.relative_to(DOCS).with_suffix("")
        html = site / (relative.parent if relative.name == "index" else relative) / "index.html"
        assert html.is_file(), f"{page.name} was not rendered"
        title = re.search(r"^# (.+)$", page.read_text(), re.MULTILINE)
        if title:
            assert f">{title.group(1).replace('`', '')}<" in re.sub(r"</?code>", "", html.read_text())


def test_changelog_page_holds_every_release_with_working_links(site):
    releases = re.findall(r"^## (v\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    page = (site / "changelog" / "index.html").read_text()
    assert releases and all(release in page for release in releases)
    assert 'href="../updating/"' in page  # CHANGELOG.md's link to docs/updating.md, rewritten
