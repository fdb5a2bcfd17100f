"""Every ```python block of README.md and docs/ runs as written, in order, one namespace per file."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


@pytest.mark.parametrize("path", [p for p in DOCS if BLOCK.search(p.read_text())],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(path):
    namespace = {"__name__": f"doc:{path.name}"}
    for number, match in enumerate(BLOCK.finditer(path.read_text())):
        line = path.read_text()[:match.start()].count("\n") + 2
        exec(compile(match.group(1), f"{path.relative_to(ROOT)}:block{number}@line{line}", "exec"), namespace)


def test_links_stay_in_the_repository():
    """Relative links of the docs point to files of the repository, never outside it."""
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)", path.read_text()):
            if re.match(r"[a-z]+:", target):  # a URL
                continue
            resolved = (path.parent / target).resolve()
            assert resolved.is_relative_to(ROOT), f"{path.name} links outside the repository: {target}"
            assert resolved.exists(), f"{path.name} links to a missing file: {target}"
