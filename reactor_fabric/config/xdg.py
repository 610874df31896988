"""Where the user's own files go: the XDG base directories, under ``reactor-fabric``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

APP_DIR = "reactor-fabric"


def xdg_dir(environ: Mapping[str, str], variable: str, fallback: str) -> Path:
    """``${variable:-$HOME/fallback}/reactor-fabric`` (e.g. ``XDG_CONFIG_HOME``, ``.config``)."""
    home = Path(environ.get("HOME") or Path.home())
    return Path(environ.get(variable) or home / fallback) / APP_DIR
