"""What the parsing child processes (kb.ingestion.pdf_text, kb.ingestion.html_text) share: the
limits they set on themselves before parsing, and the shape of a failure they report. Neither this
module nor they need Django."""

import resource
from typing import Any


def failure(kind: str, detail: str = "") -> dict[str, Any]:
    """A child's answer when it could not read its input: ``kind`` is one of its FAILURE_* names."""
    return {"failure": kind, "detail": detail}


def limit_resources(memory_bytes: int, cpu_seconds: int) -> None:
    """Past the address-space limit allocations fail (MemoryError); past the CPU limit the kernel
    ends the process with SIGXCPU. Only soft limits are set: lowering them is always allowed."""
    for kind, value in ((resource.RLIMIT_AS, memory_bytes), (resource.RLIMIT_CPU, cpu_seconds)):
        _, hard = resource.getrlimit(kind)
        resource.setrlimit(kind, (value if hard == resource.RLIM_INFINITY else min(value, hard), hard))
