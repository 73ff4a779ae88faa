"""Where the top-level ``static/`` and ``migrations/`` folders are, checkout or wheel.

In a source checkout (or an editable install) they sit next to the ``dashboard`` package; a
wheel carries them inside it as ``dashboard/_static`` and ``dashboard/_migrations``.
"""

from __future__ import annotations

from pathlib import Path


def resource_dir(name: str, marker: str) -> Path:
    """The folder ``name`` (checkout) or ``_name`` (wheel) that contains ``marker``."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / name, here / f"_{name}"):
        if (candidate / marker).exists():
            return candidate
    raise FileNotFoundError(f"pgdash's {name}/ folder is not next to {here}; reinstall pgdash")
