"""What the parsing child processes (kb.ingestion.pdf_text, html_text and docx_text) share: how
one is run, the limits it sets on itself before parsing, and the shape of a failure it reports.
Neither this module nor they need Django."""

import argparse
import json
import resource
import sys
from collections.abc import Callable, Iterable
from typing import Any

FAILURE_OUT_OF_MEMORY = "out_of_memory"


def failure(kind: str, detail: str = "") -> dict[str, Any]:
    """A child's answer when it could not read its input: ``kind`` is one of its FAILURE_* names."""
    return {"failure": kind, "detail": detail}


def limit_resources(memory_bytes: int, cpu_seconds: int) -> None:
    """Past the address-space limit allocations fail (MemoryError); past the CPU limit the kernel
    ends the process with SIGXCPU. Only soft limits are set: lowering them is always allowed."""
    for kind, value in ((resource.RLIMIT_AS, memory_bytes), (resource.RLIMIT_CPU, cpu_seconds)):
        _, hard = resource.getrlimit(kind)
        resource.setrlimit(kind, (value if hard == resource.RLIM_INFINITY else min(value, hard), hard))


def serve(extract: Callable[..., dict[str, Any]], description: str, *, options: Iterable[str]) -> None:
    """A child's main: ``extract(stdin's bytes, **options)`` as one JSON object on stdout, within
    ``--memory-bytes`` and ``--cpu-seconds``. Each option is an integer given as ``--name-like-this``."""
    parser = argparse.ArgumentParser(description=description)
    for name in (*options, "memory_bytes", "cpu_seconds"):
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, required=True)
    arguments = vars(parser.parse_args())
    data = sys.stdin.buffer.read()
    limit_resources(arguments.pop("memory_bytes"), arguments.pop("cpu_seconds"))
    try:  # the answer's JSON can be what no longer fits
        answer = json.dumps(extract(data, **arguments))  # ASCII escapes carry any lone surrogate
    except MemoryError:
        answer = json.dumps(failure(FAILURE_OUT_OF_MEMORY))
    sys.stdout.write(answer)
