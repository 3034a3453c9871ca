"""refusion's version: semantic versioning, one place (``pyproject.toml`` reads it; ``CHANGELOG.md`` says what
each version changed)."""

__version__ = "0.7.0"
