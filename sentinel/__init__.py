"""sentinel: a watchdog sidecar for ML training jobs."""

from __future__ import annotations

__version__ = "0.1.0"


def install_hint(extra: str) -> str:
    """How to add an optional extra, as sentinel is installed today: from a clone or a built
    wheel (the package is not on PyPI yet; the manual (docs/), "Install")."""
    return (
        f"pip install '.[{extra}]' in sentinel's clone, or 'sentinel_watchdog-{__version__}"
        f"-py3-none-any.whl[{extra}]' from a built wheel"
    )
