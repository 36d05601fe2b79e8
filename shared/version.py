"""tokenq's version, as installed (pyproject.toml is the one place it is written)."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("tokenq")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    VERSION = "0+unknown"
