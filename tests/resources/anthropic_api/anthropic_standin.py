"""A strict loopback stand-in of Anthropic's Messages API (`/v1/messages`) and Message Batches
(`/v1/messages/batches`), beside the OpenAI one (standin.py, whose schema-following "model" it shares).

Strict where the product could get it wrong:
- requests are checked against the SDK's own parameter types (`MessageCreateParamsNonStreaming`: unknown fields
  such as `temperature` are refused with a 400 invalid_request_error, `model` / `max_tokens` / `messages` required,
  no system message inside `messages`); a key is required (`Authorization: Bearer`, as the SDK 2.x sends it, or `x-api-key`; 401
  authentication_error otherwise), and
  the `anthropic-version` header;
- every object it returns is validated as the SDK's types (`Message`, `MessageBatch`,
  `MessageBatchIndividualResponse`) before it is sent;
- batches: `{custom_id, params}` requests, custom_id `^[a-zA-Z0-9_-]{1,64}$` and unique, at most 100,000 requests /
  256 MB (lowerable: --max-requests, --max-bytes); processing_status in_progress -> ended (canceling -> ended on a
  cancel; expired at 24 h with the finished requests' results kept); request_counts stay `processing` until the
  batch ends, as Anthropic's do; results only once ended, at `results_url`, in an order of their own (shuffled);
  every result type: succeeded, errored (markers below), canceled, expired;
- time is a clock the test advances (`POST /_standin/advance {"seconds": s}` or `{"speed": r}`), state lives on disk
  (`--state DIR`): a restarted stand-in keeps its batches and clock.

Markers in a prompt: `[[400]]` (invalid_request_error), `[[500]]` (api_error, each time), `[[529-once]]` (529
overloaded_error the first time the prompt is seen), `[[429-once]]` (429 rate_limit_error with `retry-after: 2` the
first time), `[[slow]]` (a batch request that never finishes: it is canceled or expires). Online, an errored marker is
the HTTP answer; in a batch it is an `errored` result with that error type.

Control: POST /_standin/advance, GET /_standin/stats, POST /_standin/faults {"lose_create_response": n}.
"""

from __future__ import annotations

import base64
import json
import random
import re
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.resources.openai_api.standin import StandinState, _prompt, arguments, schema_instance

PER_REQUEST_S = 1.0
CANCEL_S = 30.0
WINDOW_S = 24 * 3600
MAX_REQUESTS = 100_000
MAX_BYTES = 256 * 1000 * 1000
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
NEVER = float("inf")
ERRORS = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 413: "request_too_large",
          429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": ERRORS[status], "message": message}},
                             status=status, headers=headers)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def check_params(params: Any) -> str | None:
    """Why Anthropic would refuse these Messages parameters, or None."""
    from anthropic.types.message_create_params import MessageCreateParamsNonStreaming

    if not isinstance(params, dict):
        return "params: expected an object"
    unknown = sorted(set(params) - set(MessageCreateParamsNonStreaming.__annotations__))
    if unknown:
        return f"{unknown[0]}: Extra inputs are not permitted"
    for name in ("model", "max_tokens", "messages"):
        if name not in params:
            return f"{name}: Field required"
    if not isinstance(params["max_tokens"], int) or params["max_tokens"] < 1:
        return "max_tokens: must be a positive integer"
    for i, message in enumerate(params["messages"]):
        if message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant' (a system prompt is the top-level system)"
        content = message.get("content")
        for j, block in enumerate(content if isinstance(content, list) else []):
            problem = _block_problem(block)
            if problem:
                return f"messages.{i}.content.{j}.{problem}"
    fmt = (params.get("output_config") or {}).get("format")
    if fmt is not None and (fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict)):
        return "output_config.format: expected {type: json_schema, schema: {...}}"
    return None


IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def _block_problem(block: Any) -> str | None:
    """Why Anthropic would refuse one content block (text and images: what this product sends), or None."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        return None if isinstance(block.get("text"), str) and set(block) <= {"type", "text", "cache_control"} \
            else "text: expected {type: text, text: str}"
    if kind == "image":
        source = block.get("source") or {}
        if source.get("type") == "base64":
            if source.get("media_type") not in IMAGE_TYPES:
                return f"source.media_type: Input should be one of {', '.join(IMAGE_TYPES)}"
            try:
                base64.b64decode(source.get("data", ""), validate=True)
            except ValueError:
                return "source.data: invalid base64"
            return None
        return None if source.get("type") == "url" and isinstance(source.get("url"), str) else \
            "source: expected {type: base64, media_type, data} or {type: url, url}"
    return f"type: Input tag {kind!r} found using 'type' does not match any of the expected tags"


class AnthropicStandin(StandinState):
    def __init__(self, state_dir: Path, api_key: str | None, max_requests: int, max_bytes: int):
        self.api_key, self.max_requests, self.max_bytes = api_key, max_requests, max_bytes
        super().__init__(state_dir, {"batches": {}, "stats": {"batches_created": 0, "messages": 0, "restarts": 0,
                                                              "calls": {}}})

    def answer(self, params: dict[str, Any]) -> dict[str, Any]:
        """('ok', Message) or ('error', status) for one request; 'never' for [[slow]] in a batch."""
        import anthropic.types

        prompt = _prompt(params)
        if "[[400]]" in prompt:
            return {"kind": "error", "status": 400, "message": "The request was refused ([[400]] in the prompt)."}
        if "[[500]]" in prompt:
            return {"kind": "error", "status": 500, "message": "Internal server error."}
        if "[[529-once]]" in prompt and self.seen_first(prompt + "#529"):
            return {"kind": "error", "status": 529, "message": "Overloaded"}
        if "[[429-once]]" in prompt and self.seen_first(prompt + "#429"):
            return {"kind": "error", "status": 429, "message": "Number of requests has exceeded your rate limit."}
        fmt = (params.get("output_config") or {}).get("format")
        text = json.dumps(schema_instance(fmt["schema"], prompt)) if fmt else f"echo: {prompt}"
        message = anthropic.types.Message.model_validate({
            "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": params["model"],
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": len(prompt) // 4 + 1, "output_tokens": len(text) // 4 + 1}})
        return {"kind": "ok", "message": message.model_dump(mode="json", exclude_none=True)}

    def view(self, batch_id: str, host: str) -> dict[str, Any]:
        import anthropic.types.messages as types

        b = self.state["batches"][batch_id]
        now = self.now()
        cancel_at = b.get("cancel_at")
        ended_at = None
        if cancel_at is not None and now >= cancel_at + CANCEL_S:
            ended_at, cut, why = cancel_at + CANCEL_S, cancel_at, "canceled"
        elif now >= b["created_at"] + WINDOW_S:
            ended_at, cut, why = b["created_at"] + WINDOW_S, b["created_at"] + WINDOW_S, "expired"
        else:
            last = max(r["done_at"] for r in b["requests"])
            if now >= last and cancel_at is None:
                ended_at, cut, why = last, last, None
        counts = {"processing": len(b["requests"]), "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if ended_at is not None:  # counts move only once the whole batch has ended
            counts["processing"] = 0
            for r in b["requests"]:
                kind = ("succeeded" if r["outcome"]["kind"] == "ok" else "errored") if r["done_at"] <= cut else why
                counts[kind] += 1
        out = {"id": batch_id, "type": "message_batch", "created_at": _iso(b["created_at"]),
               "expires_at": _iso(b["created_at"] + WINDOW_S), "archived_at": None,
               "cancel_initiated_at": _iso(cancel_at) if cancel_at is not None else None,
               "ended_at": _iso(ended_at) if ended_at is not None else None,
               "processing_status": "ended" if ended_at is not None else "canceling" if cancel_at is not None
               else "in_progress",
               "request_counts": counts,
               "results_url": f"http://{host}/v1/messages/batches/{batch_id}/results" if ended_at is not None else None}
        out["_cut"], out["_why"] = (cut, why) if ended_at is not None else (None, None)
        view = {k: v for k, v in out.items() if not k.startswith("_")}
        types.MessageBatch.model_validate(view)
        return out

    def results(self, batch_id: str, host: str) -> bytes | None:
        import anthropic.types.messages as types

        view = self.view(batch_id, host)
        if view["processing_status"] != "ended":
            return None
        lines = []
        for r in self.state["batches"][batch_id]["requests"]:
            o = r["outcome"]
            if r["done_at"] > view["_cut"]:
                result: dict[str, Any] = {"type": view["_why"]}
            elif o["kind"] == "ok":
                result = {"type": "succeeded", "message": o["message"]}
            else:
                result = {"type": "errored", "error": {"type": "error", "error": {
                    "type": ERRORS[o["status"]], "message": o["message"]}}}
            item = {"custom_id": r["custom_id"], "result": result}
            types.MessageBatchIndividualResponse.model_validate(item)
            lines.append(json.dumps(item))
        random.Random(batch_id).shuffle(lines)  # never the input order: a client must match by custom_id
        return ("\n".join(lines) + "\n").encode()


def make_app(s: AnthropicStandin) -> web.Application:
    @web.middleware
    async def auth_and_count(request: web.Request, handler: Any) -> web.StreamResponse:
        route = f"{request.method} {request.match_info.route.resource.canonical if request.match_info.route.resource else request.path}"
        s.state["stats"]["calls"][route] = s.state["stats"]["calls"].get(route, 0) + 1
        if request.path.startswith("/v1/"):
            # the SDK 2.x sends the key as a bearer token; earlier ones (and curl examples) as x-api-key
            if s.api_key and s.api_key not in (request.headers.get("x-api-key"),
                                               request.headers.get("Authorization", "").removeprefix("Bearer ")):
                return _error(401, "invalid x-api-key")
            if not request.headers.get("anthropic-version"):
                return _error(400, "anthropic-version: header is required")
        return await handler(request)

    def host(request: web.Request) -> str:
        return request.host

    async def messages(request: web.Request) -> web.Response:
        params = await request.json()
        problem = check_params(params)
        if problem:
            return _error(400, problem)
        o = s.answer(params)
        s.state["stats"]["messages"] += 1
        # when each online request arrived (real time) and what it got: a test checks a retry waited for retry-after
        s.state["stats"].setdefault("message_log", []).append(
            {"prompt": _prompt(params)[-120:], "at": time.time(), "status": o.get("status", 200)})
        s.save()
        if o["kind"] == "error":
            headers = {"retry-after": "2"} if o["status"] == 429 else None
            return _error(o["status"], o["message"], headers)
        return web.json_response(o["message"])

    async def create_batch(request: web.Request) -> web.Response:
        raw = await request.read()
        if len(raw) > s.max_bytes:
            return _error(413, f"Request exceeds the maximum size of {s.max_bytes} bytes.")
        body = json.loads(raw)
        if set(body) != {"requests"} or not isinstance(body["requests"], list) or not body["requests"]:
            return _error(400, "requests: a non-empty list is required (and nothing else)")
        if len(body["requests"]) > s.max_requests:
            return _error(400, f"requests: at most {s.max_requests} requests per batch")
        seen: set[str] = set()
        requests = []
        created = s.now()
        for i, item in enumerate(body["requests"]):
            if not isinstance(item, dict) or set(item) != {"custom_id", "params"}:
                return _error(400, f"requests.{i}: exactly custom_id and params are required")
            cid = item["custom_id"]
            if not isinstance(cid, str) or not CUSTOM_ID.match(cid):
                return _error(400, f"requests.{i}.custom_id: must match ^[a-zA-Z0-9_-]{{1,64}}$")
            if cid in seen:
                return _error(400, f"requests.{i}.custom_id: {cid!r} is used more than once in this batch")
            seen.add(cid)
            problem = check_params(item["params"])
            if problem:
                return _error(400, f"requests.{i}.params.{problem}")
            slow = "[[slow]]" in _prompt(item["params"])
            requests.append({"custom_id": cid, "outcome": s.answer(item["params"]),
                             "done_at": NEVER if slow else created + (i + 1) * PER_REQUEST_S})
        batch_id = f"msgbatch_{uuid.uuid4().hex[:24]}"
        s.state["batches"][batch_id] = {"created_at": created, "requests": requests, "seq": len(s.state["batches"])}
        s.state["stats"]["batches_created"] += 1
        lose = s.state["faults"].get("lose_create_response", 0) > 0
        if lose:
            s.state["faults"]["lose_create_response"] -= 1
        s.save()
        if lose:
            return _error(500, "Internal server error.")  # created, but the answer never arrives intact
        return web.json_response(_public(s.view(batch_id, host(request))))

    async def list_batches(request: web.Request) -> web.Response:
        limit = int(request.query.get("limit", 20))
        ids = sorted(s.state["batches"], key=lambda i: -s.state["batches"][i]["seq"])  # newest first
        after = request.query.get("after_id")
        if after in ids:
            ids = ids[ids.index(after) + 1:]
        page = ids[:limit]
        data = [_public(s.view(i, host(request))) for i in page]
        return web.json_response({"data": data, "has_more": len(ids) > limit,
                                  "first_id": page[0] if page else None, "last_id": page[-1] if page else None})

    def _known(request: web.Request) -> str | None:
        batch_id = request.match_info["batch_id"]
        return batch_id if batch_id in s.state["batches"] else None

    async def get_batch(request: web.Request) -> web.Response:
        batch_id = _known(request)
        if batch_id is None:
            return _error(404, "message batch not found")
        return web.json_response(_public(s.view(batch_id, host(request))))

    async def cancel_batch(request: web.Request) -> web.Response:
        batch_id = _known(request)
        if batch_id is None:
            return _error(404, "message batch not found")
        if s.view(batch_id, host(request))["processing_status"] == "in_progress":
            s.state["batches"][batch_id]["cancel_at"] = s.now()
            s.save()
        return web.json_response(_public(s.view(batch_id, host(request))))

    async def batch_results(request: web.Request) -> web.Response:
        batch_id = _known(request)
        if batch_id is None:
            return _error(404, "message batch not found")
        body = s.results(batch_id, host(request))
        if body is None:
            return _error(400, "results are available once the batch has ended")
        return web.Response(body=body, content_type="application/binary")

    async def advance(request: web.Request) -> web.Response:
        return web.json_response({"now": s.advance(await request.json())})

    async def faults(request: web.Request) -> web.Response:
        s.state["faults"].update(await request.json())
        s.save()
        return web.json_response(s.state["faults"])

    async def stats(request: web.Request) -> web.Response:
        views = [_public(s.view(i, host(request))) for i in s.state["batches"]]
        statuses: dict[str, int] = {}
        for v in views:
            statuses[v["processing_status"]] = statuses.get(v["processing_status"], 0) + 1
        return web.json_response({**s.state["stats"], "statuses": statuses, "now": s.now(), "batches": views})

    app = web.Application(middlewares=[auth_and_count], client_max_size=2 * MAX_BYTES)
    app.add_routes([
        web.post("/v1/messages", messages),
        web.post("/v1/messages/batches", create_batch), web.get("/v1/messages/batches", list_batches),
        web.get("/v1/messages/batches/{batch_id}", get_batch),
        web.post("/v1/messages/batches/{batch_id}/cancel", cancel_batch),
        web.get("/v1/messages/batches/{batch_id}/results", batch_results),
        web.post("/_standin/advance", advance), web.post("/_standin/faults", faults),
        web.get("/_standin/stats", stats),
    ])
    return app


def _public(view: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in view.items() if not k.startswith("_")}


def main() -> None:
    args = arguments(__doc__, MAX_REQUESTS, MAX_BYTES).parse_args()
    standin = AnthropicStandin(args.state, args.api_key, args.max_requests, args.max_bytes)
    web.run_app(make_app(standin), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
