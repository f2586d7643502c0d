"""Real documents of every supported format, made on the fly (no binary files in the repository)."""

import io
from pathlib import Path


def make_pdf(pages: list[str], *, title: str = "", author: str = "", created: str = "D:20240102030405Z") -> bytes:
    """A minimal but valid PDF: one Helvetica text line per page line, with an info dictionary."""
    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    pages_id = len(objects) + 1 + 2 * len(pages) + 1  # placeholder index, fixed below
    page_ids = []
    for text in pages:
        lines = [line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for line in text.split("\n")]
        stream = (
            b"BT /F1 12 Tf 72 720 Td 14 TL " + b" ".join(f"({line}) '".encode("latin-1") for line in lines) + b" ET"
        )
        content = add(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
        page_ids.append(
            add(
                b"<< /Type /Page /Parent PAGES 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
                b"/Resources << /Font << /F1 %d 0 R >> >> >>" % (content, font)
            )
        )
    pages_id = add(
        b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % p for p in page_ids) + b"] /Count %d >>" % len(page_ids)
    )
    catalog = add(b"<< /Type /Catalog /Pages %d 0 R >>" % pages_id)
    info = add(
        b"<< /Title (%s) /Author (%s) /CreationDate (%s) >>" % (title.encode(), author.encode(), created.encode())
    )
    objects = [body.replace(b"PAGES", str(pages_id).encode()) for body in objects]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(
        b"trailer\n<< /Size %d /Root %d 0 R /Info %d 0 R >>\nstartxref\n%d\n%%%%EOF\n"
        % (len(objects) + 1, catalog, info, xref)
    )
    return out.getvalue()


def make_docx(*, title: str, heading: str, paragraphs: list[str], author: str = "") -> bytes:
    import docx

    document = docx.Document()
    document.core_properties.title = title
    document.core_properties.author = author
    document.add_heading(title, level=0)
    document.add_heading(heading, level=1)
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "Setting", "Value"
    table.cell(1, 0).text, table.cell(1, 1).text = "max_tokens", "512"
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


MARKDOWN = """# Deployment guide

How to deploy the service.

## Requirements

You need Postgres with pgvector and a Celery broker.

## Rolling upgrades

Upgrade one replica at a time; Streamable HTTP in stateless mode lets any replica answer.
"""

PYTHON = '''"""Retry helpers."""

import time


def retry(function, attempts=3):
    """Call function until it succeeds, sleeping between attempts."""
    for attempt in range(attempts):
        try:
            return function()
        except ConnectionError:
            time.sleep(2 ** attempt)
    raise RuntimeError("gave up")


class Backoff:
    def __init__(self, base):
        self.base = base

    def delay(self, attempt):
        return self.base * 2 ** attempt
'''

RUST = """use std::io;

/// Reads the configuration file.
pub fn read_config(path: &str) -> io::Result<String> {
    std::fs::read_to_string(path)
}

async fn handle_error(err: Error) -> Result<()> {
    match err {
        Error::Timeout => retry().await?,
        _ => return Err(err),
    }
    Ok(())
}
"""

HTML = """<!doctype html>
<html><head><title>Turbulence notes</title></head>
<body>
<nav><a href="/">Home</a> | <a href="/about">About</a> | <a href="/contact">Contact us</a></nav>
<article>
<h1>Turbulence notes</h1>
<p>Turbulent boundary layers transfer momentum far more effectively than laminar ones, which is why
skin friction rises sharply after transition. Engineers delay transition with smooth surfaces.</p>
<p>Vortex generators re-energise the boundary layer and postpone separation on wings at high angles of
attack, at the price of a little extra drag in cruise.</p>
</article>
<footer>Copyright 2024 Example Corp. All rights reserved. Privacy policy.</footer>
</body></html>
"""


def write_mixed_folder(root: Path) -> dict[str, str]:
    """A folder of Markdown, code, PDF, DOCX, HTML, JSON and YAML files; returns name -> content type."""
    (root / "src").mkdir(parents=True)
    files = {
        "guide.md": (MARKDOWN, "markdown"),
        "src/retry.py": (PYTHON, "python"),
        "src/config.rs": (RUST, "rust"),
        "notes.html": (HTML, "html"),
        "settings.json": ('{"max_tokens": 512, "overlap": 0}\n', "json"),
        "compose.yaml": ("services:\n  web:\n    image: kb\n", "yaml"),
    }
    for name, (text, _) in files.items():
        (root / name).write_text(text)
    (root / "paper.pdf").write_bytes(
        make_pdf(
            ["Lift and drag of slender wings.\nPage one text.", "Page two discusses shock waves."],
            title="Wings",
            author="Smith",
        )
    )
    (root / "report.docx").write_bytes(
        make_docx(
            title="Quarterly report",
            heading="Results",
            paragraphs=["Ingestion doubled.", "Search got faster."],
            author="Lee",
        )
    )
    types = {name: kind for name, (_, kind) in files.items()}
    types.update({"paper.pdf": "pdf", "report.docx": "docx"})
    return types
