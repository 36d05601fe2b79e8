"""The page's files, shipped in the package and read once: no build step, and only
these names are ever served."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".LICENSE": "text/plain; charset=utf-8",
}


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    media_type: str


def load_static() -> dict[str, StaticFile]:
    """Relative path -> file, for every file under ``static/`` with a known type."""
    root = resources.files("producer.dashboard") / "static"
    found: dict[str, StaticFile] = {}
    pending = [("", root)]
    while pending:
        prefix, folder = pending.pop()
        for entry in folder.iterdir():
            if entry.is_dir():
                pending.append((f"{prefix}{entry.name}/", entry))
                continue
            media = next((t for ext, t in MEDIA_TYPES.items() if entry.name.endswith(ext)), None)
            if media is not None:
                found[prefix + entry.name] = StaticFile(entry.read_bytes(), media)
    return found
