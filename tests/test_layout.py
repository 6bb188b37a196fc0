"""docs/layout.md draws the package of a generated project as it is: every module, nothing else."""

import re

from conftest import ROOT

LAYOUT = ROOT / "docs" / "layout.md"
# A line of the drawn tree: the branch characters, then a file or folder name, then what it holds.
ENTRY = re.compile(r"^(?P<indent>(?:│   |    )*)[├└]── (?P<name>\S+)")


def drawn_package() -> set[str]:
    """The files drawn under ``src/my_project/``, as paths inside the package."""
    paths, folders, root = set(), [], None
    for line in LAYOUT.read_text().splitlines():
        if not (entry := ENTRY.match(line)):
            continue
        depth = len(entry["indent"]) // 4
        if entry["name"] == "src/my_project/":
            root = depth
        elif root is not None:
            if depth <= root:
                break
            del folders[depth - root - 1 :]
            if entry["name"].endswith("/"):
                folders.append(entry["name"].rstrip("/"))
            else:
                paths.add("/".join([*folders, entry["name"]]))
    return paths


def test_the_drawn_package_is_the_generated_one(generated):
    drawn = drawn_package()
    modules = set()
    for key in ("loggers=wandb+csv", "task=regression,loggers=wandb+csv"):
        package = next((generated(key) / "src").iterdir())
        modules |= {str(path.relative_to(package)) for path in package.rglob("*.py")}
    assert drawn, "docs/layout.md draws no src/my_project/"
    assert sorted(modules - drawn) == [], "modules that docs/layout.md does not draw"
    assert sorted(drawn - modules) == [], "files docs/layout.md draws that a project does not have"
