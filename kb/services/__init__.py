"""The write path of the knowledge base. Every front door (admin, API, MCP, commands, tasks)
calls these functions; they validate, run atomically and raise ``kb.errors.KBError``."""
