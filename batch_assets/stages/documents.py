"""Documents in the prepare stage: each row's PDF, HTML, Markdown or text file, named by a column of paths or URLs
(`prepare.documents`), read through the storage layer and turned into a text column the template can name.

Which library, and why:
- PDF: pypdf (the `documents` extra, with `cryptography` for AES-encrypted files). Pure Python, no system
  package, BSD-licensed and actively kept; it reads the text layer page by page, tells an encrypted file from a
  damaged one, and opens a file that is only owner-protected (no password to read it, as most "secured" PDFs are). pdfminer.six lays text out a little better but is several times
  slower and no better at encryption; PDFium (pypdfium2) is faster but a native wheel per platform. A scanned PDF
  has no text layer: that row says so (OCR is out of scope), it is not sent empty.
- HTML: selectolax (lexbor), already core for `strip_html`: the same conversion (scripts and styles dropped, a line
  break per block element) as stages/transforms.py's html_to_text.
- Markdown and plain text: the file's text as it is. Models read Markdown natively; its headings, lists and tables
  carry structure that plain text would lose.

The bytes stay out of every Arrow batch: a file is opened by its path within its row's batch, read (bounded by
MAX_DOCUMENT_BYTES), and only its text goes into the `prepared` partition. A file that is missing, refused,
encrypted, damaged, not UTF-8 or holds no text is that row's error, naming the file and what to do; the row is never
sent and lands in the dead letters.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from batch_assets.resources.provider_errors import MissingExtraError
from batch_assets.stages.transforms import html_to_text
from batch_assets.storage import open_input, shown_path

MAX_DOCUMENT_BYTES = 100 * 2**20  # a larger "document" is almost certainly the wrong file
READ_THREADS = 4  # S3 reads wait on the network; parsing is done on the stage's own thread after that
PROBLEM = "document could not be read"  # how each reason starts (dead_letters.py classifies it as an input error)
MAX_FILE_PART_BYTES = 32 * 2**20  # OpenAI takes at most 32 MB of files in one request
FILE_PARTS = pa.list_(pa.struct([pa.field("filename", pa.string()), pa.field("data", pa.binary())]))
EXTENSIONS = {".pdf": "pdf", ".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown"}


class DocumentError(ValueError):
    """One file could not be turned into text; the message names the file and what to do."""


def extract_documents(spec: Any, batch: pa.RecordBatch, problems: pa.Array) -> tuple[pa.RecordBatch, pa.Array]:
    """The batch with one text column per `prepare.documents` entry, and each row's problem (the first one kept)."""
    documents = spec.prepare.documents
    if not documents:
        return batch, problems
    arrays, names = list(batch.columns), list(batch.schema.names)
    reasons = problems.to_pylist()
    for name, doc in documents.items():
        refs = batch.column(doc.column).to_pylist()
        with ThreadPoolExecutor(max_workers=max(1, min(READ_THREADS, len(refs)))) as pool:
            contents = list(pool.map(_read, refs))
        texts: list[str | None] = []
        for i, (ref, content) in enumerate(zip(refs, contents)):
            text = None
            if isinstance(content, bytes):
                try:
                    text = to_text(ref, content, doc.format)
                except DocumentError as exc:
                    content = str(exc)
            if isinstance(content, str) and reasons[i] is None:
                reasons[i] = f"{PROBLEM}: column {doc.column!r}: {content}"
            texts.append(text)
        arrays.append(pa.array(texts, pa.string()))
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names), pa.array(reasons, pa.string())


def prepare_file_parts(spec: Any, batch: pa.RecordBatch) -> tuple[pa.Array, list[str | None]]:
    """`prepare.file_columns`: each row's PDFs as (filename, bytes) for the request's file parts, read and checked
    here (a PDF, not encrypted, readable) so that the request loop only base64-wraps them; and each row's problem. A
    scanned PDF is fine here: a model that reads PDFs sees its pages."""
    n = batch.num_rows
    per_row: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    problems: list[str | None] = [None] * n
    for column in spec.prepare.file_columns:
        refs = batch.column(column).to_pylist()
        with ThreadPoolExecutor(max_workers=max(1, min(READ_THREADS, len(refs)))) as pool:
            contents = list(pool.map(lambda ref: _read(ref, MAX_FILE_PART_BYTES), refs))
        for i, (ref, content) in enumerate(zip(refs, contents)):
            if content is None:
                content = f"column {column!r} is empty: no file to send"
            elif isinstance(content, bytes):
                try:
                    check_pdf(shown_path(ref), content)
                except DocumentError as exc:
                    content = str(exc)
            if isinstance(content, str):
                problems[i] = problems[i] or f"{PROBLEM}: column {column!r}: {content}"
            else:
                per_row[i].append({"filename": ref.rsplit("/", 1)[-1], "data": content})
    return pa.array(per_row, FILE_PARTS), problems


def check_pdf(where: str, data: bytes) -> None:
    """A readable, unencrypted PDF, or DocumentError naming the file (the model could not open it either)."""
    if not data[:1024].lstrip().startswith(b"%PDF-"):
        raise DocumentError(f"{where} is not a PDF (only PDFs are sent as file parts; send other documents as "
                            "text with prepare.documents)")
    pdf_pages(where, data)


def _read(ref: Any, limit: int = MAX_DOCUMENT_BYTES) -> bytes | str | None:
    """The file's bytes, the problem (a str naming the file), or None for a row with no file (an empty input)."""
    if ref is None or (isinstance(ref, str) and not ref.strip()):
        return None
    if not isinstance(ref, str):
        return f"{ref!r} is not a path or URL (the column holds {type(ref).__name__} values)"
    try:
        with open_input(ref) as f:
            data = f.read(limit + 1)
    except FileNotFoundError as exc:
        return f"{exc}; check the path, or that the file was uploaded"
    except PermissionError as exc:
        return f"{exc}; check the credentials where the pipeline runs"
    except OSError as exc:
        return f"{shown_path(ref)} could not be read ({type(exc).__name__}: {exc})"
    if len(data) > limit:
        return f"{shown_path(ref)} is over {limit // 2**20} MiB: split it, or leave it out"
    return data


def kind_of(ref: str, data: bytes, declared: str) -> str:
    if declared != "auto":
        return declared
    if data[:1024].lstrip().startswith(b"%PDF-"):
        return "pdf"
    name = ref.rsplit("/", 1)[-1].lower()
    dot = name.rfind(".")
    return EXTENSIONS.get(name[dot:], "text") if dot >= 0 else "text"


def to_text(ref: str, data: bytes, declared: str = "auto") -> str:
    """A document's text; DocumentError naming the file when it has none or cannot be read."""
    kind = kind_of(ref, data, declared)
    where = shown_path(ref)
    if kind == "pdf":
        text = pdf_text(where, data)
        if not text.strip():
            raise DocumentError(f"{where}: the PDF has no text layer (a scanned document holds pictures of its "
                                "text); run OCR on it first, or send it as an image")
        return text
    try:
        decoded = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{where} is not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 4]!r}); "
                            "re-encode it as UTF-8") from None
    text = html_to_text(pa.array([decoded], pa.string()))[0].as_py() if kind == "html" else decoded
    if not (text or "").strip():
        raise DocumentError(f"{where} holds no text ({len(data)} bytes); remove it or fix the file")
    return text


def pdf_text(where: str, data: bytes) -> str:
    """The text of every page, pages apart by a blank line. Encrypted or damaged: DocumentError."""
    pages = pdf_pages(where, data)
    try:
        return "\n\n".join((page.extract_text() or "").strip() for page in pages).strip()
    except Exception as exc:  # pypdf raises many types on a damaged file; this one file is that row's error
        raise DocumentError(f"{where} is not a readable PDF ({type(exc).__name__}: {str(exc)[:200]}); re-export "
                            "it, or leave it out") from None


def pdf_pages(where: str, data: bytes) -> list[Any]:
    """The pages of an unencrypted (or only owner-protected) PDF. Encrypted or damaged: DocumentError."""
    try:
        from pypdf import PdfReader  # the `documents` extra: imported only by pipelines that read PDFs
    except ImportError as exc:
        raise MissingExtraError("pypdf", "documents", "reading PDF documents") from exc
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")  # owner-protected only: readable without a password
            except Exception as exc:
                if type(exc).__name__ == "DependencyError":  # AES needs `cryptography`, which the extra brings
                    raise MissingExtraError("cryptography", "documents", "reading AES-encrypted PDFs") from exc
                opened = 0
            if not opened:
                raise DocumentError(f"{where}: the PDF is encrypted (it needs a password to open); decrypt it "
                                    "first (e.g. qpdf --decrypt --password=... in.pdf out.pdf) or leave it out")
        pages = list(reader.pages)
        if not pages:
            raise DocumentError(f"{where} is a PDF with no pages; re-export it, or leave it out")
        return pages
    except (DocumentError, MissingExtraError):
        raise
    except Exception as exc:  # pypdf raises many types on a damaged file; this one file is that row's error
        raise DocumentError(f"{where} is not a readable PDF ({type(exc).__name__}: {str(exc)[:200]}); re-export "
                            "it, or leave it out") from None
