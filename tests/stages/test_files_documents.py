"""Documents into prompts (`prepare.documents`, batch_assets/stages/documents.py): PDFs made with fpdf2, HTML and
Markdown files, from a files source or a table's column of paths, on a local folder and on S3 (moto), become the
text of each row's prompt, and reach an OpenAI-compatible endpoint on loopback (the fault proxy answering by itself
and recording every body). An encrypted, damaged or text-less PDF and a missing object are row errors naming the
file, never sent."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from fpdf import FPDF
from pypdf import PdfReader, PdfWriter

from batch_assets.spec import SpecError, parse_spec
from batch_assets.stages.documents import to_text
from tests.conftest import run_pipeline, write_jsonl
from tests.resources.openai_api.fault_proxy import FaultProxy, Reply

CONTRACT = ["Master services agreement between Acme Corp and Globex.", "Payment is due within 45 days of invoice."]
HTML = ("<html><head><title>Policy</title><style>p {color: red}</style><script>var tracking = 1;</script></head>"
        "<body><h1>Refund policy</h1><p>Refunds are accepted within 30 days.</p><p>Keep the receipt &amp; the box."
        "</p></body></html>")
MARKDOWN = "# Release notes\n\n- Faster uploads\n- **Dark mode** for the dashboard\n"


def pdf_bytes(pages: list[str], *, text: bool = True) -> bytes:
    """A real PDF: one page per entry, its text laid out by fpdf2 (text=False: a drawing only, as a scan has)."""
    pdf = FPDF()
    for page in pages:
        pdf.add_page()
        if text:
            pdf.set_font("helvetica", size=12)
            pdf.multi_cell(0, 8, page)
        else:
            pdf.rect(20, 20, 120, 60, style="F")
    return bytes(pdf.output())


def encrypted(data: bytes, user_password: str, algorithm: str = "RC4-128") -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    writer.encrypt(user_password=user_password, owner_password="owner-secret", algorithm=algorithm)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def document_files() -> dict[str, bytes]:
    contract = pdf_bytes(CONTRACT)
    return {
        "contract.pdf": contract,
        "locked.pdf": encrypted(contract, "let-me-in"),  # needs a password: a row error
        "owner-only.pdf": encrypted(pdf_bytes(["Owner protected, readable by anyone."]), ""),  # no password to read
        "owner-aes.pdf": encrypted(pdf_bytes(["AES protected, readable by anyone."]), "", "AES-256"),  # the usual kind
        "damaged.pdf": contract[: len(contract) // 3],  # cut off mid-file, as an interrupted upload leaves it
        "scan.pdf": pdf_bytes(["(a picture of text)"], text=False),
        "policy.html": HTML.encode(),
        "notes.md": MARKDOWN.encode(),
        "empty.html": b"",  # a zero-byte file is a row too, with its error
    }


EXPECTED_ERRORS = {"locked.pdf": "the PDF is encrypted", "damaged.pdf": "damaged.pdf",
                   "scan.pdf": "the PDF has no text layer", "empty.html": "holds no text (0 bytes)"}


def completion(text: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"id": "chatcmpl-loopback", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "m"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}


def summaries_spec(source: dict[str, Any], url: str, column: str, **prepare: Any) -> dict[str, Any]:
    return {
        "name": "summaries",
        "source": source,
        "partitioning": {"kind": "hash", "count": 1},
        "prepare": {"documents": {"body": {"column": column}}, "template": "Summarize:\n\n{body}", **prepare},
        "task": {"kind": "generate", "params": {"max_new_tokens": 8}},
        "model": {"provider": "openai", "config": {"model": "gpt-4o-mini", "base_url": url,
                                                   "send_default_api_key": True}},
        "runtime": {"max_error_fraction": 0.6},
    }


def run_summaries(raw: dict[str, Any], store: Path, proxy: FaultProxy) -> tuple[list[str], dict[str, dict]]:
    assert run_pipeline(parse_spec(raw), store, ["shard-00-of-01"]).success
    prompts = [a.body["messages"][-1]["content"] for a in proxy.attempts]
    rows = {r["row_id"]: r for r in pq.read_table(store / "summaries" / "output" / "shard-00-of-01.parquet")
            .to_pylist()}
    return prompts, rows


def check_documents(prompts: list[str], rows: dict[str, dict], ids: dict[str, str], where: str) -> None:
    """Each readable document sent once with its text and nothing of its markup; each bad one a row error naming
    the file, never sent."""
    assert sorted(rows) == sorted(ids.values())  # every file once
    assert len(prompts) == 5  # contract, owner-only, owner-aes, policy, notes
    by_file = {name: next((p for p in prompts if marker in p), None) for name, marker in
               {"contract.pdf": "Acme Corp", "owner-only.pdf": "Owner protected", "owner-aes.pdf": "AES protected",
                "policy.html": "Refund policy", "notes.md": "Release notes"}.items()}
    assert all(by_file.values()), by_file
    contract = by_file["contract.pdf"]
    assert contract.startswith("Summarize:\n\n") and all(line.split()[0] in contract for line in CONTRACT)
    assert "45 days" in contract
    policy = by_file["policy.html"]
    assert "Refunds are accepted within 30 days." in policy and "Keep the receipt & the box." in policy
    assert "<" not in policy and "tracking" not in policy and "color" not in policy
    assert by_file["notes.md"].startswith("Summarize:\n\n" + MARKDOWN.strip())  # as it is: models read Markdown
    for name in ("contract.pdf", "owner-only.pdf", "owner-aes.pdf", "policy.html", "notes.md"):
        assert rows[ids[name]]["error"] is None and rows[ids[name]]["generated_text"] == "summary"
    for name, reason in EXPECTED_ERRORS.items():
        row = rows[ids[name]]
        assert row["generated_text"] is None
        assert row["error"].startswith("document could not be read: column ") and reason in row["error"], row
        assert f"{where}/{name}" in row["error"]  # names the file


def test_documents_from_a_local_folder_become_prompts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback")
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, data in document_files().items():
        (docs / name).write_bytes(data)
    with FaultProxy(lambda key, n: Reply(lambda body: completion("summary", body))) as proxy:
        raw = summaries_spec({"format": "files", "path": f"{docs}/*"}, proxy.url, "file_path")
        prompts, rows = run_summaries(raw, tmp_path / "store", proxy)
    check_documents(prompts, rows, {name: name for name in document_files()}, str(docs))
    dead = pq.read_table(tmp_path / "store" / "summaries" / "dead_letters" / "shard-00-of-01.parquet").to_pylist()
    assert sorted(r["row_id"] for r in dead) == sorted(EXPECTED_ERRORS)
    assert {r["error_class"] for r in dead} == {"input"}  # the file's fault, not the model's: not retried


def test_documents_on_s3_from_files_and_from_a_column_of_urls(s3_bucket: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback")
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    bucket = s3_bucket.removeprefix("s3://")
    for name, data in document_files().items():
        s3.put_object(Bucket=bucket, Key=f"contracts/{name}", Body=data)
    with FaultProxy(lambda key, n: Reply(lambda body: completion("summary", body))) as proxy:
        raw = summaries_spec({"format": "files", "path": f"{s3_bucket}/contracts/*"}, proxy.url, "file_path")
        prompts, rows = run_summaries(raw, tmp_path / "store", proxy)
    check_documents(prompts, rows, {name: name for name in document_files()}, f"{s3_bucket}/contracts")

    # a table whose column holds the URLs works the same; an object that is not there is that row's error
    listing = [{"doc_id": f"d{i}", "url": f"{s3_bucket}/contracts/{name}"} for i, name in enumerate(document_files())]
    listing.append({"doc_id": "gone", "url": f"{s3_bucket}/contracts/never-uploaded.pdf"})
    write_jsonl(tmp_path / "table" / "docs.jsonl", listing)
    with FaultProxy(lambda key, n: Reply(lambda body: completion("summary", body))) as proxy:
        raw = summaries_spec({"format": "jsonl", "path": f"{tmp_path}/table/*.jsonl", "columns": ["doc_id", "url"]},
                             proxy.url, "url", id_column="doc_id")
        prompts, rows = run_summaries(raw, tmp_path / "store-table", proxy)
    ids = {r["url"].rsplit("/", 1)[1]: r["doc_id"] for r in listing}
    gone = rows.pop("gone")
    ids.pop("never-uploaded.pdf")
    check_documents(prompts, rows, ids, f"{s3_bucket}/contracts")
    assert gone["generated_text"] is None
    assert f"{s3_bucket}/contracts/never-uploaded.pdf: no such file or object" in gone["error"]


def test_the_text_of_each_kind(tmp_path: Path) -> None:
    files = document_files()
    assert to_text("a.pdf", files["contract.pdf"]).splitlines()[0] == CONTRACT[0]
    assert to_text("mislabelled.txt", files["contract.pdf"]).startswith(CONTRACT[0])  # %PDF- wins over the name
    assert to_text("page.htm", HTML.encode()).startswith("Refund policy\n")  # body text: no <title>, no markup
    assert to_text("x.md", b"\xef\xbb\xbf# Title\n") == "# Title\n"  # a UTF-8 byte order mark is not text
    with pytest.raises(ValueError, match=r"latin\.txt is not UTF-8 text \(byte 3"):
        to_text(str(tmp_path / "latin.txt"), "caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match=r"empty\.md holds no text"):
        to_text(str(tmp_path / "empty.md"), b"  \n")


def test_the_documents_spec(tmp_path: Path) -> None:
    raw = summaries_spec({"format": "files", "path": f"{tmp_path}/*"}, "http://127.0.0.1:1/v1", "file_path")
    with pytest.raises(SpecError, match=r"prepare.documents.body: column 'path' is not in source.columns"):
        parse_spec({**raw, "prepare": {**raw["prepare"], "documents": {"body": {"column": "path"}}}})
    with pytest.raises(SpecError, match=r"prepare.documents: task 'embed_image' does not use it"):
        parse_spec({**raw, "prepare": {"image_columns": ["file_path"], "documents": {"body": {"column": "file_path"}}},
                    "task": {"kind": "embed_image"}, "model": {"provider": "image", "config": {}}})
    embed = parse_spec({**raw, "prepare": {"documents": {"body": {"column": "file_path"}}, "text_column": "body"},
                        "task": {"kind": "embed"}, "model": {"provider": "sentence_transformers", "config": {}}})
    assert embed.prepare.derived_columns() == ["body"]


def test_pdfs_sent_whole_as_file_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`prepare.file_columns`: each PDF reaches the endpoint whole, as a file part beside the prompt (a scan too: a
    model that reads PDFs sees its pages); a locked, damaged or non-PDF file is a row error naming it, never sent."""
    import base64

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback")
    docs = tmp_path / "docs"
    docs.mkdir()
    files = document_files()
    for name in ("contract.pdf", "scan.pdf", "locked.pdf", "damaged.pdf", "notes.md"):
        (docs / name).write_bytes(files[name])
    with FaultProxy(lambda key, n: Reply(lambda body: completion("summary", body))) as proxy:
        raw = summaries_spec({"format": "files", "path": f"{docs}/*"}, proxy.url, "file_path")
        raw["prepare"] = {"file_columns": ["file_path"], "template": "Summarize the attached document."}
        assert run_pipeline(parse_spec(raw), tmp_path / "store", ["shard-00-of-01"]).success
        bodies = [a.body for a in proxy.attempts]
    sent = {}
    for body in bodies:
        text, part = body["messages"][-1]["content"]
        assert text == {"type": "text", "text": "Summarize the attached document."} and part["type"] == "file"
        header, data = part["file"]["file_data"].split(",", 1)
        assert header == "data:application/pdf;base64"
        sent[part["file"]["filename"]] = base64.b64decode(data)
    assert sent == {"contract.pdf": files["contract.pdf"], "scan.pdf": files["scan.pdf"]}  # whole, byte for byte
    rows = {r["row_id"]: r for r in pq.read_table(tmp_path / "store" / "summaries" / "output" /
                                                  "shard-00-of-01.parquet").to_pylist()}
    assert sorted(rows) == sorted(["contract.pdf", "scan.pdf", "locked.pdf", "damaged.pdf", "notes.md"])
    assert rows["contract.pdf"]["generated_text"] == rows["scan.pdf"]["generated_text"] == "summary"
    for name, reason in {"locked.pdf": "the PDF is encrypted", "damaged.pdf": "damaged.pdf",
                         "notes.md": "is not a PDF"}.items():
        assert rows[name]["generated_text"] is None
        assert f"{docs}/{name}" in rows[name]["error"] and reason in rows[name]["error"], rows[name]["error"]
    with pytest.raises(SpecError, match=r"prepare.file_columns: provider 'transformers' does not take documents"):
        parse_spec({**raw, "model": {"provider": "transformers", "config": {}}})
