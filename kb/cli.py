"""``kb``: the management commands as one program, for an installed package (``pip install .``,
``pipx install .``, ``uvx --from . kb``), where there is no ``manage.py`` to call (USAGE)."""

import os
import sys

USAGE = """kb: the knowledge base's commands

  kb run                       the whole system on 127.0.0.1:8001 (KB_HOST, KB_PORT to change it)
  kb mcp-stdio [--profile P]   an MCP server on stdin/stdout, for desktop clients
  kb ingest|search|stats|collections|delete|reembed|sync|token ...
  kb manage COMMAND ...        any other Django command (migrate, createsuperuser, check ...)

Each is manage.py's command of that name: kb search "lift" is manage.py kb_search "lift".
kb COMMAND --help tells more. Data is kept in ~/.local/share/kb (KB_VAR_DIR to choose)."""

COMMANDS = {
    "run": "kb_run",
    "mcp-stdio": "mcp_stdio",
    "ingest": "kb_ingest",
    "search": "kb_search",
    "stats": "kb_stats",
    "collections": "kb_collections",
    "delete": "kb_delete",
    "reembed": "kb_reembed",
    "sync": "kb_sync",
    "token": "kb_token",
}


def main(argv: list[str] | None = None) -> None:
    try:
        _main(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:  # `kb help | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        sys.exit(1)


def _main(args: list[str]) -> None:
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    name, *rest = args
    if name == "manage":
        command = rest
    elif name in COMMANDS:
        command = [COMMANDS[name], *rest]
    else:
        sys.exit(f"kb: unknown command {name!r}; run `kb help`")
    run_management(["kb", *command])


def run_management(argv: list[str]) -> None:
    """Django's command line, with a configuration error said in one line, not a traceback."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(argv)
    except ImproperlyConfigured as error:
        sys.exit(f"Configuration error: {error}")


if __name__ == "__main__":  # `python -m kb.cli`, as well as the installed `kb`
    main()
