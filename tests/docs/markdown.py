"""The documentation's Python examples and links, read from its Markdown."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[2]
# A block preceded by this line is run against a real stack by the tests.
RUN_MARK = "<!-- docs-test: run -->"
_FENCE = re.compile(r"^```python\s*$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Example:
    path: Path
    line: int  # 1-based, the opening fence's
    code: str
    runnable: bool

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def markdown_files() -> list[Path]:
    """The README and every page of the site."""
    pages = sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)
    return [ROOT / "README.md", *pages]


def examples(path: Path) -> list[Example]:
    lines = path.read_text().splitlines()
    found: list[Example] = []
    i = 0
    while i < len(lines):
        if _FENCE.match(lines[i]):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            runnable = i > 0 and lines[i - 1].strip() == RUN_MARK
            found.append(Example(path, i + 1, "\n".join(lines[i + 1 : end]) + "\n", runnable))
            i = end
        i += 1
    return found


def all_examples() -> list[Example]:
    return [e for path in markdown_files() for e in examples(path)]


def relative_links(path: Path) -> list[str]:
    """Links to files of the repository (not URLs, not anchors on the same page)."""
    links = _LINK.findall(path.read_text())
    return [link for link in links if "://" not in link and not link.startswith("#")]
