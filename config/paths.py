"""Where the embedded default keeps its data (Postgres, the broker's files, the secret key)."""

import os
from pathlib import Path


def default_var_dir(base_dir: Path) -> Path:
    """``var/`` in a checkout (``var/test`` under pytest, away from ``make run``); for an installed
    package (``pip install .``, pipx), a folder of the user's: a desktop MCP client may start
    ``kb mcp-stdio`` anywhere, even in ``/``."""
    if os.environ.get("PYTEST_VERSION"):
        return base_dir / "var" / "test"
    if (base_dir / "manage.py").exists():
        return base_dir / "var"
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "kb"
