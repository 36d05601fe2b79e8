"""The documentation's Python examples are valid Python, and those marked to run do
run, unmodified but for the addresses, against a real redis-server, worker and gateway;
the README's links lead to files that exist (the site's own are checked by
`mkdocs build --strict`)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from producer.embedded import EmbeddedRedis
from tests.docs.markdown import ROOT, Example, all_examples, examples, relative_links
from tests.integration.openai_stack import openai_stack

EXAMPLES = all_examples()
RUNNABLE = [e for e in EXAMPLES if e.runnable]
# The addresses the examples are written for: Redis's default and `tokenq up`'s gateway.
REDIS_IN_DOCS = "redis://127.0.0.1:6379/0"
GATEWAY_IN_DOCS = "http://127.0.0.1:8000/v1"


def test_the_docs_have_runnable_examples_in_the_readme_and_the_site() -> None:
    places = {e.path.name for e in RUNNABLE}
    assert "README.md" in places
    assert "getting-started.md" in places


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_every_python_example_compiles(example: Example) -> None:
    compile(example.code, example.name, "exec")


def test_the_readmes_links_lead_to_files_that_exist() -> None:
    readme = ROOT / "README.md"
    missing = [link for link in relative_links(readme) if not (ROOT / link.split("#")[0]).exists()]
    assert not missing


@pytest.fixture(scope="module")
def stack(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A worker on the default model and a gateway; yields the gateway's /v1 URL."""
    with openai_stack(redis_server.url, tmp_path_factory.mktemp("docs")) as client:
        yield str(client.base_url).rstrip("/")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("example", RUNNABLE, ids=[e.name for e in RUNNABLE])
def test_marked_examples_run_against_a_real_stack(
    example: Example, stack: str, redis_server: EmbeddedRedis
) -> None:
    assert REDIS_IN_DOCS in example.code or GATEWAY_IN_DOCS in example.code
    code = example.code.replace(REDIS_IN_DOCS, redis_server.url).replace(GATEWAY_IN_DOCS, stack)
    printed = io.StringIO()
    namespace: dict[str, Any] = {"__name__": "__docs_example__"}
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, example.name, "exec"), namespace)
    finally:
        close = getattr(namespace.get("client"), "close", None)
        if close is not None:  # the example's client: its reader and connections
            close()
    if "print(" in example.code:
        assert printed.getvalue().strip(), "the example printed nothing"


def test_markdown_helpers_find_a_marked_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- docs-test: run -->\n```python\nx = 1\n```\n\n```python\ny\n```\n")
    found = examples(page)
    expected = [(4, "x = 1\n", True), (8, "y\n", False)]
    assert [(e.line, e.code, e.runnable) for e in found] == expected
