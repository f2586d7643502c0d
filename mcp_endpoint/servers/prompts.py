"""Prompts: answer only from retrieved documents (seed 002's grounded_qa_prompt), and cite them."""

from mcp.server.mcpserver import MCPServer

GROUNDED_QA = "You answer ONLY using the provided documents. \nIf information is missing, say you don't know."

CITATIONS = (
    "Answer from the knowledge base's search results and cite every statement you take from them. "
    "After the statement, cite its source in square brackets as [source_uri:lines], using the result's "
    "'source_uri' and its line range 'metadata.lines' (for example [file:///src/lib.rs:142-150]); add "
    "'p. N' when the result has a page. Cite each result you use, never one you did not retrieve. If the "
    "results do not contain the answer, say so instead of answering from memory."
)


def grounded_qa_prompt() -> str:
    """Instructions for answering only from the provided documents, saying when information is missing."""
    return GROUNDED_QA


def citation_prompt() -> str:
    """Instructions for citing search results by their source and line range."""
    return CITATIONS


def register(server: MCPServer, *, citations: bool) -> None:
    server.prompt()(grounded_qa_prompt)
    if citations:
        server.prompt()(citation_prompt)
