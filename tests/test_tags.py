"""`make tags`: in a clone of the template, every release named in CHANGELOG.md gets its tag.

Each test clones this repository and puts the working tree's Makefile and CHANGELOG.md on top,
so that what is tested is the target as it is now, with the releases as they are listed now.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

from conftest import ROOT

RELEASE = re.compile(r"^## (v\d+\.\d+\.\d+) \(commit ([0-9a-f]{7,40})\)", re.MULTILINE)
RELEASES = RELEASE.findall((ROOT / "CHANGELOG.md").read_text())
# Annotated tags need a tagger; the machine running the tests may have no git identity. Nothing
# of the `make test` that may be running this reaches the inner make (its level, its jobserver).
ENV = {
    **{
        key: value
        for key, value in os.environ.items()
        if not key.startswith("GIT_") and key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
    },
    "GIT_COMMITTER_NAME": "make tags test",
    "GIT_COMMITTER_EMAIL": "make-tags@example.com",
}


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=60)


def _git(repo: Path, *args: str) -> str:
    done = _run(repo, "git", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _clone(tmp_path: Path, *options: str) -> Path:
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "--quiet", *options, ROOT.as_uri(), str(clone))
    for name in ("Makefile", "CHANGELOG.md"):
        shutil.copyfile(ROOT / name, clone / name)
    return clone


def _make_tags(clone: Path) -> subprocess.CompletedProcess:
    return _run(clone, "make", "tags")


def test_the_releases_are_read_from_the_changelog():
    assert [tag for tag, _ in RELEASES][-2:] == ["v0.2.0", "v0.1.0"]


def test_every_release_is_tagged_once(tmp_path):
    clone = _clone(tmp_path)
    first = _make_tags(clone)
    assert first.returncode == 0, first.stderr
    for tag, commit in RELEASES:
        assert _git(clone, "rev-parse", f"{tag}^{{commit}}").startswith(commit), tag
        assert _git(clone, "cat-file", "-t", tag) == "tag", f"{tag} is not annotated"
        assert f"tagged {tag}: commit {commit}" in first.stdout
    tags = _git(clone, "show-ref", "--tags")

    second = _make_tags(clone)
    assert second.returncode == 0, second.stderr
    assert second.stdout == second.stderr == ""
    assert _git(clone, "show-ref", "--tags") == tags  # the same tag objects: none made again


def test_a_tag_already_on_its_commit_is_kept(tmp_path):
    clone = _clone(tmp_path)
    tag, commit = RELEASES[-1]
    _git(clone, "tag", tag, commit)  # lightweight, as someone may have made it by hand
    done = _make_tags(clone)
    assert done.returncode == 0, done.stderr
    assert _git(clone, "cat-file", "-t", tag) == "commit"
    assert _git(clone, "rev-parse", f"{tag}^{{commit}}").startswith(commit)


def test_a_tag_on_another_commit_is_refused_and_not_moved(tmp_path):
    clone = _clone(tmp_path)
    tag, commit = RELEASES[-1]
    elsewhere = _git(clone, "rev-parse", "HEAD")
    assert not elsewhere.startswith(commit)
    _git(clone, "tag", tag, elsewhere)
    done = _make_tags(clone)
    assert done.returncode != 0
    message = (
        f"make tags: {tag} already tags commit {_git(clone, 'rev-parse', '--short', elsewhere)},"
        f" not {commit} as CHANGELOG.md says; a tag is never moved"
    )
    assert message in done.stderr.splitlines(), done.stderr
    assert _git(clone, "rev-parse", f"{tag}^{{commit}}") == elsewhere


def test_a_release_commit_missing_from_a_shallow_clone_is_named(tmp_path):
    clone = _clone(tmp_path, "--depth=1")
    done = _make_tags(clone)
    assert done.returncode != 0
    tag, commit = RELEASES[0]
    assert f"make tags: {tag}: commit {commit} is not in this clone" in done.stderr, done.stderr
    assert _git(clone, "tag", "--list") == ""
