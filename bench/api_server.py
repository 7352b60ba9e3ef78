"""A minimal OpenAI-compatible chat-completions server that answers every request after a fixed delay.

It measures the client, not a model: with latency L and C requests in flight, the ideal client does C / L
requests per second. GET /stats reports requests served, the most in flight at once, and the first-request to
last-response window; POST /reset clears them.

    python bench/api_server.py --port 8765 --latency 0.25
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiohttp import web

STATE = {"served": 0, "in_flight": 0, "max_in_flight": 0, "first": None, "last": None}


def reset() -> None:
    STATE.update(served=0, in_flight=0, max_in_flight=0, first=None, last=None)


def make_app(latency: float) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        now = time.monotonic()
        if STATE["first"] is None:
            STATE["first"] = now
        STATE["in_flight"] += 1
        STATE["max_in_flight"] = max(STATE["max_in_flight"], STATE["in_flight"])
        try:
            body = await request.json()
            await asyncio.sleep(latency)
        finally:
            STATE["in_flight"] -= 1
        STATE["served"] += 1
        STATE["last"] = time.monotonic()
        return web.json_response({
            "id": f"cmpl-{STATE['served']}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "bench"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Technology"}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22},
        })

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    async def stats(_: web.Request) -> web.Response:
        window = (STATE["last"] - STATE["first"]) if STATE["first"] is not None and STATE["last"] else 0.0
        return web.json_response({"served": STATE["served"], "max_in_flight": STATE["max_in_flight"],
                                  "window_s": window, "latency_s": latency})

    async def do_reset(_: web.Request) -> web.Response:
        reset()
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=16 * 2**20)
    app.add_routes([web.post("/v1/chat/completions", chat), web.get("/v1/models", models),
                    web.get("/stats", stats), web.post("/reset", do_reset)])
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--latency", type=float, default=0.25)
    args = ap.parse_args()
    # A large backlog: clients with no bound on concurrency (Daft) open hundreds of connections at once.
    web.run_app(make_app(args.latency), host="127.0.0.1", port=args.port, backlog=4096, print=None,
                access_log=None)


if __name__ == "__main__":
    print(json.dumps({"starting": True}), flush=True)
    main()
