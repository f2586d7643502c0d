"""What the MCP servers here are made of: a server class, tool annotations, and the adapter that
runs a tool's synchronous service calls in a worker thread and turns KBError into the profile's
error behaviour."""

import asyncio
import functools
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, ParamSpec, TypeVar

from django.db import DatabaseError, close_old_connections, connections
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, GetPromptResult, InputRequiredResult, TextContent, ToolAnnotations
from mcp_types import Tool as MCPTool
from pydantic import ValidationError

from kb.access import Access
from kb.errors import ErrorCode, KBError, database_error
from kb.models import TokenScope
from mcp_endpoint.caller import Caller, calling_as, current_access, current_caller_or_none

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
# What a tool answers when a call fails: given the error and the call's arguments.
ErrorHandler = Callable[[KBError, dict[str, Any]], Any]

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
# Writes that add or update but never remove; ingesting the same source again is a no-op.
ADDITIVE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
CREATING = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)
# Ingestion may fetch http(s) URLs: the tool reaches beyond the knowledge base.
FETCHING = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=True)
# A sync fetches, and removes the documents whose file or URL is gone.
SYNCING = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=True)


# Each tool thread keeps its own database connection (CONN_MAX_AGE): opening one costs ~13 ms
# against ~0.1 ms for a query, more than the whole transport. sync_to_async cannot keep it: it runs
# every call in a copy of the caller's context, where Django keeps connections, so each call would
# open (and leak until garbage collection) a connection of its own. These threads run calls in
# their own context instead and get the caller passed explicitly.
#
# Reads and writes have pools of their own: a write may wait on a slow URL fetch, a large parse or
# its embedding (KB_WRITE_WAIT_SECONDS), and however many of those clients start, searches and
# listings keep their threads.
POOL_SIZES = {"read": 8, "write": 8}
_pools: dict[str, ThreadPoolExecutor] = {}


def _tool_threads(pool: str) -> ThreadPoolExecutor:
    if pool not in _pools:
        _pools[pool] = ThreadPoolExecutor(max_workers=POOL_SIZES[pool], thread_name_prefix=f"mcp-{pool}")
    return _pools[pool]


def stop_tool_threads() -> None:
    """End the tool threads and close their database connections (server shutdown, end of tests)."""
    for name in list(_pools):
        _stop_pool(_pools.pop(name), POOL_SIZES[name])


def _stop_pool(pool: ThreadPoolExecutor, size: int) -> None:
    # Every thread takes exactly one of these (each waits for all), so every connection is closed.
    everyone = threading.Barrier(size)

    def close_connection() -> None:
        connections.close_all()
        everyone.wait(timeout=30)

    for _ in range(size):
        pool.submit(close_connection)
    pool.shutdown(wait=True)


def _call_as(caller: Caller | None, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    close_old_connections()
    try:
        with calling_as(caller):
            return fn(*args, **kwargs)
    except DatabaseError as exc:
        error = database_error(exc)
        if error.code == ErrorCode.DATABASE_ERROR:  # not a caller's NUL character, which is theirs to fix
            logger.exception("Database error in an MCP tool")
        raise error from exc


async def in_thread(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run synchronous read code in a tool thread, as the current caller. Calls of different
    sessions run in parallel, each thread with its own database connection."""
    return await _in_pool("read", fn, *args, **kwargs)


async def _in_pool(pool: str, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    call = functools.partial(_call_as, current_caller_or_none(), fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_tool_threads(pool), call)


def json_error(error: KBError, arguments: dict[str, Any] | None = None) -> CallToolResult:
    """rag-mcp's error body as the text of an error result, so the client sees the code. No
    structured content: TypeScript clients check it against the tool's output schema even when
    the result is an error (checked with the MCP Inspector)."""
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(error.as_dict()))], is_error=True)


def text_error(error: KBError, arguments: dict[str, Any] | None = None) -> CallToolResult:
    """For seeds whose SDK answers a failed tool with its message alone (TypeScript's McpServer, C#'s
    for an McpException): an error result whose text is the code and the message."""
    return CallToolResult(content=[TextContent(type="text", text=str(error))], is_error=True)


def raise_tool_error(error: KBError, arguments: dict[str, Any] | None = None) -> NoReturn:
    """For seeds whose tools raise: the client gets an error result with the message, after
    rag-mcp's code, as every door names one ("COLLECTION_NOT_FOUND: Collection not found: x")."""
    raise ToolError(str(error)) from error


def service_tool(
    scope: TokenScope,
    *,
    every_collection_to: str | None = None,
    collection: str | None = None,
    on_error: ErrorHandler = json_error,
) -> Callable[[Callable[P, R]], Callable[P, Awaitable[R]]]:
    """Make an MCP tool of a synchronous function that calls the services. The tool keeps the
    function's name, docstring and signature (its input and output schemas). ``scope`` is what
    the caller's token needs, ``every_collection_to`` (an action, e.g. "create collections")
    says the tool also needs a token not limited to some collections, and ``collection`` names
    the one collection a tool always works in (a token must be allowed it): checked before every
    call, and tools a token may not use are not listed to it."""
    need = ToolNeed(scope=scope, every_collection_to=every_collection_to, collection=collection)

    def decorate(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
        def as_permitted(*args: P.args, **kwargs: P.kwargs) -> R:
            need.require(current_access())
            return fn(*args, **kwargs)

        pool = "read" if scope == TokenScope.READ else "write"

        @functools.wraps(fn)
        async def tool(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return await _in_pool(pool, as_permitted, *args, **kwargs)
            except KBError as error:
                logger.info("MCP tool %s failed: %s", fn.__name__, error)
                return on_error(error, kwargs)

        tool.need = need  # type: ignore[attr-defined]
        return tool

    return decorate


@dataclass(frozen=True)
class ToolNeed:
    """What a caller's access must allow for a tool to be listed to it and called."""

    scope: TokenScope
    every_collection_to: str | None = None
    collection: str | None = None

    def met_by(self, access: Access) -> bool:
        return (
            access.allows(self.scope)
            and (self.every_collection_to is None or access.unrestricted)
            and (self.collection is None or access.can_see(self.collection))
        )

    def require(self, access: Access) -> None:
        access.require(self.scope)
        if self.every_collection_to is not None:
            access.require_unrestricted(self.every_collection_to)
        if self.collection is not None:
            access.check_collection(self.collection)


def tool_need(fn: Callable[..., Any]) -> ToolNeed:
    """What a tool needs; tools not made by service_tool (which call one) only read."""
    return getattr(fn, "need", ToolNeed(scope=TokenScope.READ))


def flat_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The same JSON schema without $ref indirections, titles, or anyOf for nullable types. Clients
    check every structured result against the output schema; the SDK's validation of a search
    result takes 2.4 ms against this form and 3.9 ms against pydantic's. (No output here is recursive.)"""
    definitions = schema.get("$defs", {})

    def flat(node: Any) -> Any:
        if isinstance(node, list):
            return [flat(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return flat(definitions[node["$ref"].rsplit("/", 1)[1]])
        node = {
            # Under "properties" the keys are field names (a field may be called "title").
            key: {name: flat(field) for name, field in value.items()} if key == "properties" else flat(value)
            for key, value in node.items()
            if key not in ("$defs", "title")
        }
        options = node.get("anyOf", [])
        if options and all(set(option) == {"type"} and isinstance(option["type"], str) for option in options):
            del node["anyOf"]
            node["type"] = [option["type"] for option in options]
        return node

    return flat(schema)


def validation_message(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in issue['loc']) or 'arguments'}: {issue['msg']}" for issue in error.errors()
    )


class KBServer(MCPServer):
    """An MCP server over the knowledge base.

    ``errors``: how arguments that fail the input schema are reported, as the profile's tools
    report every other error: ``"json"``, INVALID_ARGUMENT in rag-mcp's shape; ``"text"``, the
    code and what was wrong (the TypeScript and C# seeds); ``"fastmcp"``, the same after FastMCP's
    "Error executing tool X:" (the Python seeds). Never pydantic's dump.
    Tool descriptions may end with live text, e.g. the collections a search can cover, computed
    whenever the tools are listed.
    """

    def __init__(
        self,
        name: str,
        *,
        errors: Literal["json", "text", "fastmcp"] = "fastmcp",
        input_schema_in_meta: bool = False,
        strict_arguments: bool = False,
        closed_arguments: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        self.errors = errors
        # Synthesis (seed 003) attaches each tool's input JSON Schema as _meta.jsonSchema.
        self.input_schema_in_meta = input_schema_in_meta
        # Arguments are taken as their JSON Schema types say, never coerced ("5" is not 5, "false"
        # not false): seeds whose servers validate with JSON Schema or zod. Python seeds coerce.
        self.strict_arguments = strict_arguments or closed_arguments
        # The schemas say no other names (Synthesis's zod .strict()); as the seed's SDK checks the
        # arguments with its shape alone, other names are dropped before the tool sees them.
        self.closed_arguments = closed_arguments
        self._description_suffixes: dict[str, Callable[[], Awaitable[str]]] = {}
        self._needs: dict[str, ToolNeed] = {}

    def add_tools(
        self,
        tools: Sequence[tuple[Callable[..., Any], ToolAnnotations]],
        *,
        read_only: bool,
        structured_output: bool | None = None,
    ) -> None:
        """Register tools; in read-only mode those that write are not offered at all."""
        for fn, annotations in tools:
            if read_only and not annotations.read_only_hint:
                continue
            self.add_tool(fn, annotations=annotations, structured_output=structured_output)
            self._needs[fn.__name__] = tool_need(fn)
            if self.strict_arguments:
                self._tighten(fn.__name__)

    def _tighten(self, tool_name: str) -> None:
        tool = self._tool_manager.get_tool(tool_name)
        loose = tool.fn_metadata.arg_model
        config = {**loose.model_config, "strict": True}
        if self.closed_arguments:
            properties = {name: _untitled(value) for name, value in tool.parameters.get("properties", {}).items()}
            tool.parameters = {
                **{key: value for key, value in tool.parameters.items() if key != "title"},
                "properties": properties,
                "additionalProperties": False,
            }
        tool.fn_metadata.arg_model = type(loose.__name__, (loose,), {"model_config": config})

    def describe_live(self, tool_name: str, suffix: Callable[[], Awaitable[str]]) -> None:
        self._description_suffixes[tool_name] = suffix

    async def list_tools(self) -> list[MCPTool]:
        """The tools the caller's token may use (all of them when no caller is known: in memory)."""
        caller = current_caller_or_none()
        tools = await super().list_tools()
        permitted = [tool for tool in tools if caller is None or self._needs[tool.name].met_by(caller.access)]
        return [await self._listed(tool) for tool in permitted]

    async def _listed(self, tool: MCPTool) -> MCPTool:
        update: dict[str, Any] = {}
        if tool.output_schema is not None:
            update["output_schema"] = flat_schema(tool.output_schema)
        if suffix := self._description_suffixes.get(tool.name):
            update["description"] = f"{tool.description}\n\n{await suffix()}"
        if self.input_schema_in_meta:
            update["meta"] = {**(tool.meta or {}), "jsonSchema": tool.input_schema}
        return tool.model_copy(update=update)

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None, context: Context[Any, Any] | None = None
    ) -> GetPromptResult | InputRequiredResult:
        """An unknown prompt or argument is the caller's mistake: JSON-RPC's invalid params, with the
        names, where the SDK answers error code 0 ("Error rendering prompt")."""
        prompt = self._prompt_manager.get_prompt(name)
        if prompt is None:
            raise MCPError(INVALID_PARAMS, f"Unknown prompt: {name}")
        unknown = sorted(set(arguments or {}) - {argument.name for argument in prompt.arguments or []})
        if unknown:
            raise MCPError(INVALID_PARAMS, f"Prompt {name} takes no argument {', '.join(unknown)}")
        return await super().get_prompt(name, arguments, context)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        tool = self._tool_manager.get_tool(name)
        if tool is None:  # a protocol error, as MCP's spec has it
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {name}")
        if self.strict_arguments:
            arguments = whole_numbers(arguments, tool.parameters.get("properties", {}))
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            invalid_arguments = isinstance(exc.__cause__, ValidationError) and not isinstance(exc, UnexpectedToolError)
            if not invalid_arguments:
                raise
            error = KBError(ErrorCode.INVALID_ARGUMENT, validation_message(exc.__cause__))
            if self.errors == "json":
                return json_error(error)
            if self.errors == "text":
                return text_error(error)
            raise ToolError(f"Error executing tool {name}: {error}") from None


def _untitled(schema: Any) -> Any:
    """A property's JSON Schema without pydantic's generated titles (zod's schemas have none)."""
    if isinstance(schema, dict):
        return {key: _untitled(value) for key, value in schema.items() if key != "title"}
    if isinstance(schema, list):
        return [_untitled(item) for item in schema]
    return schema


def whole_numbers(arguments: dict[str, Any], properties: dict[str, Any]) -> dict[str, Any]:
    """Integral floats given for integer arguments as integers: JSON has one number type, and the
    zod and JSON Schema seeds take 2.0 where an integer is asked (pydantic's strict int does not)."""
    return {
        name: int(value)
        if isinstance(value, float) and value.is_integer() and _integer(properties.get(name))
        else value
        for name, value in (arguments or {}).items()
    }


def _integer(schema: Any) -> bool:
    """Whether a property's schema takes an integer (alone, or among anyOf's choices)."""
    if not isinstance(schema, dict):
        return False
    return schema.get("type") == "integer" or any(_integer(choice) for choice in schema.get("anyOf", []))
