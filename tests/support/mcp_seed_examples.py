"""Client code of the seeds, copied verbatim; tests change only the address."""

SEED_ADDRESS = "http://localhost:8001/sse"

# ../shared/seeds/000_3601c8dbb470ba5c.txt, "Python Client Example".
SCIRAG_CLIENT_EXAMPLE = """
import asyncio
from mcp import ClientSession
from mcp.client.sse import sse_client

async def main():
    async with sse_client("http://localhost:8001/sse") as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()

            # List available collections
            collections = await session.call_tool("list_collections", {})
            print(f"Available collections: {collections}")

            # Search for documents
            results = await session.call_tool(
                "retrieve_document_chunks",
                {
                    "query": "How does enzyme activity change with pH?",
                    "top_k": 5,
                    "collection": "research-papers"
                }
            )

            for chunk in results:
                print(f"[{chunk['score']:.2f}] {chunk['source_filename']}: {chunk['text'][:100]}...")

asyncio.run(main())
"""

# The same, with the one change the MCP Python SDK requires (v1 and v2 alike): call_tool returns a
# CallToolResult, whose list result is in structured_content["result"] (and, one JSON text per chunk,
# in content). Iterating the CallToolResult itself yields its pydantic fields as (name, value) tuples.
SCIRAG_CLIENT_EXAMPLE_FOR_THE_SDK = SCIRAG_CLIENT_EXAMPLE.replace(
    "for chunk in results:", 'for chunk in results.structured_content["result"]:'
)

# ../shared/seeds/000_3601c8dbb470ba5c.txt, store_document_chunks "Example Call".
SCIRAG_STORE_EXAMPLE_CHUNKS = [
    {
        "text": "First paragraph of the document...",
        "source_filename": "paper.pdf",
        "chunk_index": 0,
        "metadata": {"page_count": 5, "author": "Smith et al."},
    },
    {
        "text": "Second paragraph continues...",
        "source_filename": "paper.pdf",
        "chunk_index": 1,
        "metadata": {"page_count": 5, "author": "Smith et al."},
    },
]
