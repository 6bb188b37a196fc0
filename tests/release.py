"""The template's releases, as CHANGELOG.md names them, and whether users get what the template holds.

`copier copy` and `copier update` take the newest release, so a change to what projects contain
reaches users only once it is released. Run as a script (`make release-check`), this fails when
`copier.yml`, `template/` or `migrations/` differ from the newest release's commit: the change
waits, unreleased, whatever CHANGELOG.md says of it. `--warn` (`make test-fast`) prints the same
message as a warning and succeeds. See docs/releasing.md.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASE = re.compile(r"^## (v\d+\.\d+\.\d+) \((?:commit ([0-9a-f]{7,40})|unreleased)\)", re.MULTILINE)
# What a generated project is made of: a change here changes what users get.
RENDERED = ("copier.yml", "template", "migrations")


def version(tag: str) -> tuple[int, ...]:
    return tuple(int(part) for part in tag[1:].split("."))


def releases() -> list[tuple[str, str]]:
    """(tag, commit) of every release in CHANGELOG.md, oldest first; the commit is "" if unreleased."""
    return sorted(RELEASE.findall((ROOT / "CHANGELOG.md").read_text()), key=lambda r: version(r[0]))


def released() -> list[tuple[str, str]]:
    return [(tag, commit) for tag, commit in releases() if commit]


def unreleased_changes() -> list[str]:
    """The entries of CHANGELOG.md's ``(unreleased)`` section: its lines that start a list item."""
    changelog = (ROOT / "CHANGELOG.md").read_text()
    tags = [tag for tag, commit in releases() if not commit]
    if not tags:
        return []
    section = changelog.split(f"## {tags[0]} (unreleased)", 1)[1].split("\n## ", 1)[0]
    changes = section.split("Upgrade notes:", 1)[0]
    return [line for line in changes.splitlines() if line.startswith("- ")]


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def changed_since(commit: str) -> list[str]:
    """The files of ``RENDERED`` that the working tree has changed, added or removed since ``commit``."""
    changed = _git("diff", "--name-only", "-z", commit, "--", *RENDERED).split("\0")
    added = _git("ls-files", "-z", "--others", "--exclude-standard", "--", *RENDERED).split("\0")
    return sorted({*changed, *added} - {""})


def unreleased_problem() -> str | None:
    """Why users do not get what the template holds, or None when they do."""
    tag, commit = released()[-1]
    try:
        changed = changed_since(commit)
    except RuntimeError as error:
        return f"cannot compare the template with {tag} (commit {commit}): {error}"
    if not changed:
        return None
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    entries = unreleased_changes()
    pending = (
        f"CHANGELOG.md lists {len(entries)} unreleased changes"
        if entries
        else "CHANGELOG.md has no unreleased changes for them"
    )
    return (
        f"{len(changed)} files of copier.yml, template/ and migrations/ changed since the newest release, "
        f"{tag} (commit {commit}): {shown}. {pending}. `copier copy` still gives users {tag}: "
        "release them (docs/releasing.md)"
    )


def main() -> None:
    problem = unreleased_problem()
    if problem is None:
        tag, commit = released()[-1]
        print(f"release-check: the template is {tag} (commit {commit}), the newest release")
    elif "--warn" in sys.argv[1:]:
        print(f"warning: {problem}", file=sys.stderr)
    else:
        sys.exit(f"release-check: {problem}")


if __name__ == "__main__":
    main()
