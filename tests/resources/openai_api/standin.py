"""A strict loopback stand-in of OpenAI's Files and Batch APIs (`/v1/files`, `/v1/batches`), for the batch path.

Nothing of OpenAI's batch service can run here, so this process plays it, as strictly as the documented API where
the product could get it wrong:
- every object it returns is built as the SDK's own types (`openai.types.Batch`, `FileObject`, `FileDeleted`,
  `ChatCompletion`) and validated against them before it is sent; a request's parameters are checked against the
  SDK's `BatchCreateParams` (unknown keys, a `completion_window` other than `24h`, metadata over 16 pairs / 64-char
  keys / 512-char values are refused with a 400, as OpenAI does);
- an input file is validated as OpenAI validates it (status `validating`, then `failed` with `errors.data` naming
  the line): JSONL, `custom_id` unique, `method` POST, `url` equal to the batch's endpoint, one model per file, at
  most 50,000 requests and 200 MB (both lowerable for tests: `--max-requests`, `--max-bytes`); optionally a
  per-model queue of enqueued tokens (`--enqueued-token-limit`): a batch that would take it past the limit fails
  validation with `token_limit_exceeded`, as OpenAI's does;
- every status: validating -> in_progress -> finalizing -> completed; failed; expired at 24 h with the partial
  results (finished requests in the output file, the rest as `batch_expired` lines in the error file); cancelling ->
  cancelled with partial results (`batch_cancelled`); `request_counts` and `usage` as they advance;
- the output file is written in an order of its own (shuffled), never the input's: a client must match by
  `custom_id`; requests that fail go to the error file with their HTTP status and error body;
- time is a clock the test advances (`POST /_standin/advance {"seconds": s}`): nothing moves on its own, so a test
  can hold a batch at any status while it kills the client (or `{"speed": r}`: r stand-in seconds per real second,
  for a whole run in one process); state lives on disk (`--state DIR`), so a restarted
  stand-in keeps its files, batches and clock.

The "model" answers a chat request deterministically from its body: a JSON schema (OpenAI's `json_schema` or
llama.cpp's `json_object` form) gets an instance of the schema (a `label` enum: the first label named in the
prompt), otherwise `echo: <last user message>`. Markers in a prompt inject faults per request: `[[400]]` (refused,
deterministic), `[[500]]` (server error, transient), `[[500-once]]` (a server error the first time this stand-in
sees that prompt, an answer after), `[[slow]]` (never finishes: it expires or is cancelled).

    python -m tests.resources.openai_api.standin --port 8790 --state /tmp/standin [--api-key KEY]

Control and inspection (not OpenAI's): POST /_standin/advance, GET /_standin/stats (batches created, files
uploaded, per-status counts, every call by route), POST /_standin/faults {"lose_create_response": n} (the next n
batch creations succeed but answer 500, as a response lost on the way would).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

VALIDATE_S = 60.0  # stand-in seconds from creation to in_progress
PER_REQUEST_S = 1.0  # each request finishes this long after the previous one
FINALIZE_S = 60.0
CANCEL_S = 30.0  # cancelling -> cancelled
WINDOW_S = 24 * 3600
MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1000 * 1000
ENDPOINTS = ("/v1/responses", "/v1/chat/completions", "/v1/embeddings", "/v1/completions", "/v1/moderations")
FILE_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
NEVER = float("inf")
EMBED_DIM = 8


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
           code: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}},
                             status=status)


def schema_instance(schema: Any, prompt: str, root: Any = None) -> Any:
    """A value valid against `schema` (the subset structured outputs use); enum values: the first one the prompt
    names, else the first."""
    root = root if root is not None else schema
    if not isinstance(schema, dict):
        return None
    if "$ref" in schema:
        node: Any = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        return schema_instance(node, prompt, root)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return schema_instance(schema[key][0], prompt, root)
    if "enum" in schema:
        named = [v for v in schema["enum"] if isinstance(v, str) and v.lower() in prompt.lower()]
        return named[0] if named else schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = schema.get("required", list(props))
        return {name: schema_instance(props[name], prompt, root) for name in required if name in props}
    if kind == "array":
        return [schema_instance(schema.get("items", {}), prompt, root)] * int(schema.get("minItems", 0))
    if kind == "integer":
        return int(schema.get("minimum", 0))
    if kind == "number":
        return float(schema.get("minimum", 0))
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return "x" * int(schema.get("minLength", 1))


def _tokens(body: dict[str, Any]) -> int:
    """A request's enqueued tokens as the stand-in counts them: prompt characters / 4 plus the completion budget."""
    budget = body.get("max_tokens") or body.get("max_completion_tokens") or 0
    return len(_prompt(body)) // 4 + int(budget)


def embedding(text: str, dimensions: int = EMBED_DIM) -> list[float]:
    """The stand-in's embedding of a text: deterministic, so a batch's vector can be compared with the online one."""
    digest = hashlib.sha256(text.encode()).digest()
    return [round((digest[i % len(digest)] - 127.5) / 127.5, 6) for i in range(dimensions)]


def _prompt(body: dict[str, Any]) -> str:
    if isinstance(body.get("input"), str):  # an embeddings request
        return body["input"]
    texts = []
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [p.get("text", "") for p in content if isinstance(p, dict)]
    return "\n".join(texts)


class StandinState:
    """What both stand-ins (this one and anthropic_standin.py) keep: state on disk (a restart keeps it) and a clock
    the test moves. `fresh`: the provider-specific part of a new state."""

    def __init__(self, state_dir: Path, fresh: dict[str, Any]):
        self.dir = state_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        path = state_dir / "state.json"
        if path.exists():
            self.state = json.loads(path.read_text())
            self.state["stats"]["restarts"] += 1
        else:
            self.state = {"base": int(time.time()), "offset": 0.0, "speed": 0.0, "speed_since": 0.0, "seen": {},
                          "faults": {"lose_create_response": 0}, **fresh}
        self.save()

    def save(self) -> None:
        tmp = self.dir / f"state.json.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.dir / "state.json")

    def now(self) -> float:
        """The stand-in's clock: still unless a test advances it, or sets a speed (stand-in seconds per real second,
        for a whole pipeline run in-process)."""
        speed = self.state.get("speed", 0.0)
        moving = speed * (time.time() - self.state["speed_since"]) if speed else 0.0
        return self.state["base"] + self.state["offset"] + moving

    def set_speed(self, speed: float) -> None:
        self.state["offset"] = self.now() - self.state["base"]
        self.state["speed"], self.state["speed_since"] = speed, time.time()
        self.save()

    def advance(self, body: dict[str, Any]) -> float:
        """POST /_standin/advance {"seconds": s} and/or {"speed": r}."""
        self.state["offset"] += float(body.get("seconds", 0))
        if "speed" in body:
            self.set_speed(float(body["speed"]))
        self.save()
        return self.now()

    def seen_first(self, prompt: str) -> bool:
        """Whether this is the first time the stand-in sees `prompt` (the [[...-once]] markers)."""
        key = hashlib.sha256(prompt.encode()).hexdigest()
        first = key not in self.state["seen"]
        self.state["seen"][key] = self.state["seen"].get(key, 0) + 1
        return first


class Standin(StandinState):
    def __init__(self, state_dir: Path, api_key: str | None, max_requests: int, max_bytes: int,
                 enqueued_token_limit: int | None = None):
        self.files_dir = state_dir / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self.api_key, self.max_requests, self.max_bytes = api_key, max_requests, max_bytes
        self.enqueued_token_limit = enqueued_token_limit
        super().__init__(state_dir, {"files": {}, "batches": {}, "stats": {
            "batches_created": 0, "files_uploaded": 0, "restarts": 0, "calls": {}}})

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{uuid.uuid4().hex[:24]}"

    # -- files -----------------------------------------------------------------------------------------------------
    def add_file(self, content: bytes, filename: str, purpose: str) -> dict[str, Any]:
        import openai.types

        file_id = self.new_id("file-")
        (self.files_dir / file_id).write_bytes(content)
        created = int(self.now())
        obj = openai.types.FileObject(id=file_id, bytes=len(content), created_at=created, filename=filename,
                                      object="file", purpose=purpose, status="processed",
                                      expires_at=created + 30 * 86400 if purpose in ("batch", "batch_output")
                                      else None)
        self.state["files"][file_id] = obj.model_dump(mode="json")
        return self.state["files"][file_id]

    def content(self, file_id: str) -> bytes:
        return (self.files_dir / file_id).read_bytes()

    # -- batches ---------------------------------------------------------------------------------------------------
    def validate(self, batch: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]:
        """(requests, errors, model) of the batch's input file, as OpenAI's validation reads it."""
        raw = self.content(batch["input_file_id"])
        errors: list[dict[str, Any]] = []
        if len(raw) > self.max_bytes:
            errors.append({"code": "file_too_large", "line": None, "param": None,
                           "message": f"The input file is {len(raw)} bytes; at most {self.max_bytes} are allowed."})
            return [], errors, None
        requests, seen, models = [], set(), set()
        lines = raw.decode("utf-8", "replace").splitlines()
        if len([line for line in lines if line.strip()]) > self.max_requests:
            errors.append({"code": "too_many_requests", "line": None, "param": None, "message":
                           f"The input file has more than {self.max_requests} requests."})
            return [], errors, None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError:
                errors.append({"code": "invalid_json_line", "line": number, "param": None,
                               "message": "This line is not parseable as valid JSON."})
                continue
            problem = None
            if not isinstance(item, dict) or set(item) != {"custom_id", "method", "url", "body"}:
                problem = ("invalid_request", None, "Each line needs exactly custom_id, method, url and body.")
            elif not isinstance(item["custom_id"], str) or not item["custom_id"]:
                problem = ("invalid_custom_id", "custom_id", "custom_id must be a non-empty string.")
            elif item["custom_id"] in seen:
                problem = ("duplicate_custom_id", "custom_id",
                           f"The custom_id {item['custom_id']!r} is used more than once in this file.")
            elif item["method"] != "POST":
                problem = ("invalid_method", "method", "Only POST is supported.")
            elif item["url"] != batch["endpoint"]:
                problem = ("mismatched_url", "url", f"The url {item['url']!r} does not match the batch's endpoint "
                           f"{batch['endpoint']!r}.")
            elif not isinstance(item["body"], dict) or not isinstance(item["body"].get("model"), str):
                problem = ("missing_required_parameter", "body.model", "The body must name a model.")
            elif item["url"] == "/v1/embeddings" and not isinstance(item["body"].get("input"), (str, list)):
                problem = ("missing_required_parameter", "body.input", "An embeddings body needs `input`.")
            elif item["url"] == "/v1/chat/completions" and not isinstance(item["body"].get("messages"), list):
                problem = ("missing_required_parameter", "body.messages", "A chat body needs `messages`.")
            if problem is not None:
                errors.append({"code": problem[0], "line": number, "param": problem[1], "message": problem[2]})
                continue
            seen.add(item["custom_id"])
            models.add(item["body"]["model"])
            requests.append(item)
        enqueued = sum(_tokens(r["body"]) for r in requests)
        if self.enqueued_token_limit is not None and models and not errors:
            model = next(iter(models))
            others = sum(o.get("tokens", 0) for o in self.state["batches"].values()
                         if o is not batch and o.get("model") == model and self._enqueued(o))
            if others + enqueued > self.enqueued_token_limit:
                errors.append({"code": "token_limit_exceeded", "line": None, "param": None, "message":
                               f"Enqueued token limit reached for {model} in organization org-standin. Limit: "
                               f"{self.enqueued_token_limit} enqueued tokens. Please try again once some "
                               "in_progress batches have been completed."})
        batch["tokens"] = enqueued
        if len(models) > 1:
            errors.append({"code": "mismatched_model", "line": None, "param": "body.model", "message":
                           f"A batch input file may use one model; this one uses {sorted(models)}."})
        if not requests and not errors:
            errors.append({"code": "empty_file", "line": None, "param": None, "message": "The input file is empty."})
        return requests, errors, (models.pop() if len(models) == 1 else None)

    def _enqueued(self, b: dict[str, Any]) -> bool:
        """Whether a batch's tokens count in its model's queue now: validated, and not ended."""
        if not b.get("requests") or b.get("errors"):
            return False
        now = self.now()
        if b.get("cancelling_at") is not None:
            return now < b["cancelling_at"] + CANCEL_S
        finished = max(r["done_at"] for r in b["requests"])
        return now < min(finished + FINALIZE_S, b["created_at"] + WINDOW_S)

    def outcome(self, item: dict[str, Any], batch_id: str) -> dict[str, Any]:
        """What one request gets: ('ok', body) or ('error', status, body), or it never finishes."""
        import openai.types.chat

        body = item["body"]
        prompt = _prompt(body)
        if "[[slow]]" in prompt:
            return {"kind": "never"}
        if "[[400]]" in prompt:
            return {"kind": "error", "status": 400, "body": {"error": {
                "message": "The request was refused ([[400]] in the prompt).", "type": "invalid_request_error",
                "param": "messages", "code": None}}}
        first = self.seen_first(prompt)
        if "[[500]]" in prompt or ("[[500-once]]" in prompt and first):
            return {"kind": "error", "status": 500, "body": {"error": {
                "message": "The server had an error while processing your request.", "type": "server_error",
                "param": None, "code": None}}}
        if "input" in body:  # /v1/embeddings: one text per line
            import openai.types

            response = openai.types.CreateEmbeddingResponse.model_validate({
                "object": "list", "model": body["model"],
                "data": [{"object": "embedding", "index": 0,
                          "embedding": embedding(prompt, body.get("dimensions") or EMBED_DIM)}],
                "usage": {"prompt_tokens": len(prompt) // 4 + 1, "total_tokens": len(prompt) // 4 + 1}})
            return {"kind": "ok", "status": 200, "body": response.model_dump(mode="json")}
        fmt = body.get("response_format") or {}
        schema = (fmt.get("json_schema") or {}).get("schema") if fmt.get("type") == "json_schema" else \
            fmt.get("schema") if fmt.get("type") == "json_object" else None
        text = json.dumps(schema_instance(schema, prompt)) if schema is not None else f"echo: {prompt}"
        completion = openai.types.chat.ChatCompletion.model_validate({
            "id": f"chatcmpl-{uuid.uuid4().hex[:20]}", "object": "chat.completion", "created": int(self.now()),
            "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": text, "refusal": None}}],
            "usage": {"prompt_tokens": len(prompt) // 4 + 1, "completion_tokens": len(text) // 4 + 1,
                      "total_tokens": len(prompt) // 4 + len(text) // 4 + 2},
        })
        return {"kind": "ok", "status": 200, "body": completion.model_dump(mode="json", exclude_none=True)}

    def view(self, batch_id: str) -> dict[str, Any]:
        """The batch as of the stand-in's clock, as an `openai.types.Batch` (files written on reaching a terminal
        status)."""
        import openai.types

        b = self.state["batches"][batch_id]
        now = self.now()
        created, validated = b["created_at"], b["created_at"] + VALIDATE_S
        cancelled_early = b.get("cancelling_at") is not None and b["cancelling_at"] < validated
        if "requests" not in b and now >= validated and not cancelled_early:  # a batch cancelled while validating
            # is never validated: it ends with no results
            for other_id, other in list(self.state["batches"].items()):  # earlier batches first: the token queue
                if other.get("seq", 0) < b.get("seq", 0) and "requests" not in other:  # is theirs before this one's
                    self.view(other_id)
            requests, errors, model = self.validate(b)
            b["errors"], b["model"] = errors, model
            b["requests"] = [] if errors else [
                {"custom_id": r["custom_id"], "done_at": NEVER if o["kind"] == "never" else
                 validated + (i + 1) * PER_REQUEST_S, "outcome": o}
                for i, r in enumerate(requests) for o in [self.outcome(r, batch_id)]]
            self.save()
        out: dict[str, Any] = {
            "id": batch_id, "object": "batch", "endpoint": b["endpoint"], "input_file_id": b["input_file_id"],
            "completion_window": "24h", "created_at": int(created), "expires_at": int(created + WINDOW_S),
            "metadata": b.get("metadata"), "model": b.get("model"), "errors": None,
        }
        cancel_at = b.get("cancelling_at")
        if "requests" not in b:  # still validating (or cancelled while validating)
            if cancel_at is not None:
                return self._finish(b, out, "cancelling" if now < cancel_at + CANCEL_S else "cancelled",
                                    cancel_at, [])
            out["status"] = "validating"
            out["request_counts"] = {"total": 0, "completed": 0, "failed": 0}
            return openai.types.Batch.model_validate(out).model_dump(mode="json")
        if b["errors"]:
            out.update(status="failed", failed_at=int(validated), in_progress_at=None,
                       errors={"object": "list", "data": b["errors"]},
                       request_counts={"total": 0, "completed": 0, "failed": 0})
            return openai.types.Batch.model_validate(out).model_dump(mode="json")
        requests = b["requests"]
        out["in_progress_at"] = int(validated)
        finished_at = max((r["done_at"] for r in requests), default=validated)
        completed_at = finished_at + FINALIZE_S
        expires = created + WINDOW_S
        if cancel_at is not None:
            return self._finish(b, out, "cancelling" if now < cancel_at + CANCEL_S else "cancelled", cancel_at,
                                requests)
        if finished_at > expires and now >= expires:
            return self._finish(b, out, "expired", expires, requests)
        if now >= completed_at:
            out["finalizing_at"] = int(finished_at)
            return self._finish(b, out, "completed", completed_at, requests)
        if now >= finished_at:
            out["finalizing_at"] = int(finished_at)
            out["status"] = "finalizing"
        else:
            out["status"] = "in_progress"
        out["request_counts"] = self._counts(requests, min(now, finished_at))
        return openai.types.Batch.model_validate(out).model_dump(mode="json")

    def _counts(self, requests: list[dict[str, Any]], cutoff: float, end: bool = False) -> dict[str, int]:
        done = [r for r in requests if r["done_at"] <= cutoff]
        ok = sum(1 for r in done if r["outcome"]["kind"] == "ok")
        return {"total": len(requests), "completed": ok, "failed": (len(requests) - ok) if end else len(done) - ok}

    def _finish(self, b: dict[str, Any], out: dict[str, Any], status: str, at: float,
                requests: list[dict[str, Any]]) -> dict[str, Any]:
        """A batch at a status with results (completed, expired, cancelled; cancelling shows counts so far)."""
        import openai.types

        cutoff = at if status != "completed" else NEVER
        out["status"] = status
        if status in ("cancelling", "cancelled"):
            out["cancelling_at"] = int(b["cancelling_at"])
        if status == "cancelling":
            out["request_counts"] = self._counts(requests, b["cancelling_at"])
            return openai.types.Batch.model_validate(out).model_dump(mode="json")
        out[{"completed": "completed_at", "expired": "expired_at", "cancelled": "cancelled_at"}[status]] = \
            int(at + (CANCEL_S if status == "cancelled" else 0))
        out["request_counts"] = self._counts(requests, cutoff, end=True)
        if "files" not in b:  # written once, when the batch first reaches its end
            ok_lines, error_lines = [], []
            for r in requests:
                line: dict[str, Any] = {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": r["custom_id"]}
                if r["done_at"] <= cutoff:
                    o = r["outcome"]
                    line.update(response={"status_code": o["status"], "request_id": uuid.uuid4().hex,
                                          "body": o["body"]}, error=None)
                    (ok_lines if o["kind"] == "ok" else error_lines).append(line)
                else:
                    code = "batch_expired" if status == "expired" else "batch_cancelled"
                    message = ("This request could not be executed before the completion window expired."
                               if status == "expired" else "This request was not executed: the batch was cancelled.")
                    line.update(response=None, error={"code": code, "message": message})
                    error_lines.append(line)
            random.Random(b["id"]).shuffle(ok_lines)  # never the input's order
            files = {}
            for name, lines in (("output_file_id", ok_lines), ("error_file_id", error_lines)):
                if lines:
                    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
                    files[name] = self.add_file(data, f"{b['id']}_{name.split('_')[0]}.jsonl", "batch_output")["id"]
            b["files"] = files
            usage = [r["outcome"]["body"]["usage"] for r in requests
                     if r["done_at"] <= cutoff and r["outcome"]["kind"] == "ok"]
            b["usage"] = {"input_tokens": sum(u["prompt_tokens"] for u in usage),
                          "output_tokens": sum(u.get("completion_tokens", 0) for u in usage)}  # 0: embeddings
            self.save()
        out.update(b["files"])
        u = b["usage"]
        out["usage"] = {"input_tokens": u["input_tokens"], "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens": u["output_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": u["input_tokens"] + u["output_tokens"]}
        return openai.types.Batch.model_validate(out).model_dump(mode="json")


def _page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    ids = [i["id"] for i in items]
    start = ids.index(after) + 1 if after in ids else 0
    data = items[start:start + limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": start + limit < len(items)}


def make_app(s: Standin) -> web.Application:
    import openai.types
    from openai.types.batch_create_params import BatchCreateParams

    @web.middleware
    async def auth_and_count(request: web.Request, handler: Any) -> web.StreamResponse:
        route = f"{request.method} {request.match_info.route.resource.canonical if request.match_info.route.resource else request.path}"
        calls = s.state["stats"]["calls"]
        calls[route] = calls.get(route, 0) + 1
        if request.path.startswith("/v1/") and s.api_key is not None and \
                request.headers.get("Authorization") != f"Bearer {s.api_key}":
            return _error(401, "Incorrect API key provided.", code="invalid_api_key")
        return await handler(request)

    async def create_file(request: web.Request) -> web.Response:
        if not request.content_type.startswith("multipart/"):
            return _error(400, "Uploads must be multipart/form-data.")
        form = await request.post()
        upload, purpose = form.get("file"), form.get("purpose")
        if purpose not in FILE_PURPOSES:
            return _error(400, f"Invalid purpose {purpose!r}.", param="purpose")
        if not hasattr(upload, "file"):
            return _error(400, "A file is required.", param="file")
        if purpose == "batch" and not upload.filename.endswith(".jsonl"):
            return _error(400, "Batch input files must be .jsonl.", param="file")
        obj = s.add_file(upload.file.read(), upload.filename, purpose)
        s.state["stats"]["files_uploaded"] += 1
        s.save()
        return web.json_response(obj)

    async def list_files(request: web.Request) -> web.Response:
        purpose = request.query.get("purpose")
        items = sorted((f for f in s.state["files"].values() if purpose in (None, f["purpose"])),
                       key=lambda f: f["created_at"], reverse=request.query.get("order", "desc") == "desc")
        return web.json_response(_page(items, request.query.get("after"), int(request.query.get("limit", 10000))))

    def _file(request: web.Request) -> dict[str, Any] | None:
        return s.state["files"].get(request.match_info["file_id"])

    async def get_file(request: web.Request) -> web.Response:
        f = _file(request)
        return web.json_response(f) if f else _error(404, "No such File object.", param="id")

    async def file_content(request: web.Request) -> web.Response:
        f = _file(request)
        if f is None:
            return _error(404, "No such File object.", param="id")
        return web.Response(body=s.content(f["id"]), content_type="application/octet-stream")

    async def delete_file(request: web.Request) -> web.Response:
        f = _file(request)
        if f is None:
            return _error(404, "No such File object.", param="id")
        del s.state["files"][f["id"]]
        s.save()
        return web.json_response(openai.types.FileDeleted(id=f["id"], object="file", deleted=True)
                                 .model_dump(mode="json"))

    async def create_batch(request: web.Request) -> web.Response:
        try:
            params = await request.json()
        except ValueError:
            return _error(400, "The body is not JSON.")
        allowed = set(BatchCreateParams.__annotations__)
        unknown = sorted(set(params) - allowed)
        if unknown:
            return _error(400, f"Unrecognized request argument supplied: {', '.join(unknown)}", param=unknown[0])
        for name in ("input_file_id", "endpoint", "completion_window"):
            if name not in params:
                return _error(400, f"Missing required parameter: '{name}'.", param=name)
        if params["completion_window"] != "24h":
            return _error(400, "completion_window must be '24h'.", param="completion_window")
        if params["endpoint"] not in ENDPOINTS:
            return _error(400, f"Unsupported endpoint {params['endpoint']!r}.", param="endpoint")
        metadata = params.get("metadata") or {}
        if len(metadata) > 16 or any(len(k) > 64 or not isinstance(v, str) or len(v) > 512
                                     for k, v in metadata.items()):
            return _error(400, "metadata: at most 16 pairs, keys up to 64 and string values up to 512 characters.",
                          param="metadata")
        f = s.state["files"].get(params["input_file_id"])
        if f is None:
            return _error(404, f"No such File object: {params['input_file_id']}", param="input_file_id")
        if f["purpose"] != "batch":
            return _error(400, "The input file must be uploaded with purpose 'batch'.", param="input_file_id")
        batch_id = s.new_id("batch_")
        s.state["batches"][batch_id] = {"id": batch_id, "endpoint": params["endpoint"],
                                        "input_file_id": params["input_file_id"], "created_at": s.now(),
                                        "metadata": metadata or None, "seq": len(s.state["batches"])}
        s.state["stats"]["batches_created"] += 1
        s.save()
        view = s.view(batch_id)
        if s.state["faults"]["lose_create_response"] > 0:
            s.state["faults"]["lose_create_response"] -= 1
            s.save()
            return _error(500, "The server had an error while processing your request.", kind="server_error")
        return web.json_response(view)

    async def list_batches(request: web.Request) -> web.Response:
        limit = int(request.query.get("limit", 20))
        if not 1 <= limit <= 100:
            return _error(400, "limit must be between 1 and 100.", param="limit")
        items = [s.view(i) for i in sorted(s.state["batches"], key=lambda i: (s.state["batches"][i]["created_at"],
                                                                         s.state["batches"][i]["seq"]),
                                           reverse=True)]
        return web.json_response(_page(items, request.query.get("after"), limit))

    async def get_batch(request: web.Request) -> web.Response:
        batch_id = request.match_info["batch_id"]
        if batch_id not in s.state["batches"]:
            return _error(404, f"No batch found with id '{batch_id}'.", param="batch_id")
        return web.json_response(s.view(batch_id))

    async def cancel_batch(request: web.Request) -> web.Response:
        batch_id = request.match_info["batch_id"]
        if batch_id not in s.state["batches"]:
            return _error(404, f"No batch found with id '{batch_id}'.", param="batch_id")
        status = s.view(batch_id)["status"]
        if status in ("cancelling", "cancelled"):
            return web.json_response(s.view(batch_id))
        if status not in ("validating", "in_progress", "finalizing"):
            return _error(409, f"Cannot cancel a batch with status '{status}'.")
        s.state["batches"][batch_id]["cancelling_at"] = s.now()
        s.save()
        return web.json_response(s.view(batch_id))

    async def advance(request: web.Request) -> web.Response:
        return web.json_response({"now": s.advance(await request.json())})

    async def chat(request: web.Request) -> web.Response:
        """The online endpoint beside the batch one (OpenAI serves both): the same answers, at once."""
        body = await request.json()
        o = s.outcome({"body": {**body, "messages": [
            {**m, "content": str(m.get("content", "")).replace("[[slow]]", "")} for m in body.get("messages", [])]}},
            "online")
        s.save()
        return web.json_response(o["body"], status=o["status"])

    async def embeddings(request: web.Request) -> web.Response:
        """The online embeddings endpoint (a row sent online after its batch expired): one vector per input."""
        body = await request.json()
        texts = body["input"] if isinstance(body.get("input"), list) else [body.get("input")]
        outcomes = [s.outcome({"body": {**body, "input": str(t).replace("[[slow]]", "")}}, "online") for t in texts]
        s.save()
        failed = next((o for o in outcomes if o["kind"] == "error"), None)
        if failed is not None:
            return web.json_response(failed["body"], status=failed["status"])
        data = [{**o["body"]["data"][0], "index": i} for i, o in enumerate(outcomes)]
        tokens = sum(o["body"]["usage"]["prompt_tokens"] for o in outcomes)
        return web.json_response({**outcomes[0]["body"], "data": data,
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def faults(request: web.Request) -> web.Response:
        s.state["faults"].update(await request.json())
        s.save()
        return web.json_response(s.state["faults"])

    async def stats(_: web.Request) -> web.Response:
        statuses: dict[str, int] = {}
        for batch_id in s.state["batches"]:
            status = s.view(batch_id)["status"]
            statuses[status] = statuses.get(status, 0) + 1
        return web.json_response({**s.state["stats"], "statuses": statuses, "now": s.now(),
                                  "batches": [s.view(i) for i in s.state["batches"]]})

    app = web.Application(middlewares=[auth_and_count], client_max_size=2 * MAX_BYTES)
    app.add_routes([
        web.post("/v1/files", create_file), web.get("/v1/files", list_files),
        web.get("/v1/files/{file_id}", get_file), web.get("/v1/files/{file_id}/content", file_content),
        web.delete("/v1/files/{file_id}", delete_file),
        web.post("/v1/batches", create_batch), web.get("/v1/batches", list_batches),
        web.get("/v1/batches/{batch_id}", get_batch), web.post("/v1/batches/{batch_id}/cancel", cancel_batch),
        web.post("/v1/chat/completions", chat), web.post("/v1/embeddings", embeddings),
        web.post("/_standin/advance", advance), web.post("/_standin/faults", faults),
        web.get("/_standin/stats", stats),
    ])
    return app


def arguments(doc: str, max_requests: int, max_bytes: int) -> argparse.ArgumentParser:
    """The command line both stand-ins take (anthropic_standin.py adds nothing; this one its token limit)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--max-requests", type=int, default=max_requests)
    parser.add_argument("--max-bytes", type=int, default=max_bytes)
    return parser


def main() -> None:
    parser = arguments(__doc__, MAX_REQUESTS, MAX_BYTES)
    parser.add_argument("--enqueued-token-limit", type=int, default=None,
                        help="per model: a batch whose tokens would take its model's queue of validated, unended "
                        "batches past this fails validation with token_limit_exceeded")
    args = parser.parse_args()
    standin = Standin(args.state, args.api_key, args.max_requests, args.max_bytes, args.enqueued_token_limit)
    web.run_app(make_app(standin), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
