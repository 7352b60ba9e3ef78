"""What stands between a row and the endpoint (resources/openai_api/limits.py): the token estimate a request is
charged, the cap on requests in flight, a token budget smaller than one request, a setup error that stops every
waiting request, the endpoint-wide pause a Retry-After asks for, and a stop that sends nothing new.

Each test drives the real gate on an event loop and counts requests admitted, never how long anything took."""

from __future__ import annotations

import asyncio
import base64
import io

import pytest

from batch_assets.resources.provider_errors import ProviderSetupError
from batch_assets.resources.openai_api.limits import (IMAGE_TOKENS_MAX, PDF_TOKENS_PER_PAGE, RequestGate,
                                                      anthropic_image_tokens, estimate_chat_tokens,
                                                      estimate_text_tokens, openai_image_tokens)


async def _settle() -> None:
    """Let every task that can run, run (no time passes for the buckets beyond a few loop turns)."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_request_is_charged_its_whole_prompt_and_its_completion_budget():
    text = "x" * 400
    one = estimate_chat_tokens([{"role": "user", "content": text}], max_new_tokens=50)
    # system prompts and content parts count too: a multimodal row's text is not free
    parts = estimate_chat_tokens([{"role": "system", "content": text},
                                  {"role": "user", "content": [{"type": "text", "text": text},
                                                               {"type": "image_url", "image_url": {"url": "x"}}]}],
                                 max_new_tokens=50)
    assert one >= 400 // 4 + 50 and parts >= 800 // 4 + 50 and parts > one
    assert estimate_chat_tokens([{"role": "assistant", "content": None}], 10) >= 10  # a tool-call turn: no text
    assert estimate_text_tokens(["a" * 40, "b" * 40]) >= 20  # embeddings: no completion


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def _pdf(pages: int) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    for n in range(pages):
        pdf.add_page()
        pdf.cell(text=f"page {n + 1}")
    return bytes(pdf.output())


def _user(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "Describe it."}, *parts]}]


def test_an_image_is_charged_what_the_endpoint_documents_not_nothing_and_not_its_base64():
    """An image row against tokens_per_minute / batch_max_enqueued_tokens: OpenAI's documented examples (a 1024 x 1024
    image in high detail: 765 tokens for the tile models, 1,024 patches for the newer ones; 'low': 85), Anthropic's
    (width x height / 750; 1092 x 1092 about 1,590), a URL the endpoint fetches at the most either charges."""
    text_only = estimate_chat_tokens(_user(), max_new_tokens=10)
    png = _png(1024, 1024)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    high = estimate_chat_tokens(_user({"type": "image_url", "image_url": {"url": url}}), 10) - text_only
    low = estimate_chat_tokens(_user({"type": "image_url", "image_url": {"url": url, "detail": "low"}}), 10) - text_only
    fetched = estimate_chat_tokens(_user({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}), 10)
    assert high == max(765, 1024) and low == 85
    assert fetched - text_only == IMAGE_TOKENS_MAX >= 1_536
    assert high < len(url) // 4, "an image is not charged its base64 characters"
    assert openai_image_tokens(2048, 4096) >= 1_105  # the docs' second example (6 tiles), patches capped at 1,536
    assert openai_image_tokens(200, 200) == 85 + 170  # one tile
    # Anthropic's shape, as its provider estimates the translated body
    anthropic = estimate_chat_tokens(_user({"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": base64.b64encode(_png(1092, 1092)).decode()}}), 10)
    assert anthropic - text_only == anthropic_image_tokens(1092, 1092) and 1_580 <= anthropic - text_only <= 1_600
    assert anthropic_image_tokens(4000, 3000) == anthropic_image_tokens(1092, 1092), "scaled down first"
    assert anthropic_image_tokens(200, 200) == 54


def test_a_pdf_is_charged_by_its_pages():
    text_only = estimate_chat_tokens(_user(), max_new_tokens=10)
    data = base64.b64encode(_pdf(3)).decode()
    openai = estimate_chat_tokens(_user({"type": "file", "file": {
        "filename": "a.pdf", "file_data": "data:application/pdf;base64," + data}}), 10) - text_only
    anthropic = estimate_chat_tokens(_user({"type": "document", "source": {
        "type": "base64", "media_type": "application/pdf", "data": data}}), 10) - text_only
    assert openai == anthropic == 3 * PDF_TOKENS_PER_PAGE
    one_page = estimate_chat_tokens(_user({"type": "file", "file": {
        "filename": "b.pdf", "file_data": "data:application/pdf;base64," + base64.b64encode(_pdf(1)).decode()}}), 10)
    assert one_page - text_only == PDF_TOKENS_PER_PAGE


def test_no_more_requests_in_flight_than_the_cap():
    async def main() -> tuple[int, int]:
        gate = RequestGate(max_concurrency=3, requests_per_minute=None, tokens_per_minute=None)
        release = asyncio.Event()
        peak = 0

        async def request() -> None:
            nonlocal peak
            async with gate.slot(1):
                peak = max(peak, gate.in_flight)
                await release.wait()

        tasks = [asyncio.create_task(request()) for _ in range(10)]
        await _settle()
        waiting_in_flight = gate.in_flight
        release.set()
        await asyncio.gather(*tasks)
        return waiting_in_flight, peak

    in_flight, peak = asyncio.run(main())
    assert in_flight == 3 and peak == 3


def test_a_request_larger_than_the_token_burst_is_sent_not_refused_or_held_forever():
    async def main() -> int:
        # 600 tokens a minute: a burst holds 60; a 10,000-token request takes a whole burst instead
        gate = RequestGate(max_concurrency=4, requests_per_minute=None, tokens_per_minute=600)
        sent = 0

        async def big() -> None:
            nonlocal sent
            async with gate.slot(10_000):
                sent += 1

        await asyncio.wait_for(big(), timeout=60)
        return sent

    assert asyncio.run(main()) == 1


def test_a_request_budget_admits_one_burst_and_holds_the_rest():
    async def main() -> int:
        gate = RequestGate(max_concurrency=100, requests_per_minute=60, tokens_per_minute=None)  # a burst of 6
        admitted = 0

        async def request() -> None:
            nonlocal admitted
            async with gate.slot(1):
                admitted += 1

        tasks = [asyncio.create_task(request()) for _ in range(20)]
        await _settle()
        seen = admitted
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return seen

    assert asyncio.run(main()) == 6


def test_a_setup_error_refuses_every_request_still_waiting_and_sends_none_of_them():
    async def main() -> tuple[int, list[BaseException]]:
        gate = RequestGate(max_concurrency=1, requests_per_minute=None, tokens_per_minute=None)
        release = asyncio.Event()
        sent = 0

        async def request(hold: bool) -> None:
            nonlocal sent
            async with gate.slot(1):
                sent += 1
                if hold:
                    await release.wait()

        first = asyncio.create_task(request(True))
        await _settle()
        waiting = [asyncio.create_task(request(False)) for _ in range(5)]
        await _settle()
        gate.break_with(ProviderSetupError("HTTP 401: the endpoint rejected the API key", "check `api_key`"))
        release.set()
        await first
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
        return sent, outcomes

    sent, outcomes = asyncio.run(main())
    assert sent == 1  # only the request already in flight
    assert all(isinstance(o, ProviderSetupError) and "rejected the API key" in str(o) for o in outcomes)


def test_a_retry_after_holds_every_request_of_the_endpoint_not_only_the_row_that_got_it():
    async def main() -> tuple[int, int]:
        gate = RequestGate(max_concurrency=10, requests_per_minute=None, tokens_per_minute=None)
        admitted = 0

        async def request() -> None:
            nonlocal admitted
            async with gate.slot(1):
                admitted += 1

        gate.pause_for(3600)  # a 429 said: come back in an hour
        held = [asyncio.create_task(request()) for _ in range(5)]
        await _settle()
        during = admitted
        for t in held:
            t.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        gate.pause_for(0)  # a shorter pause never shortens the one in force ...
        await _settle()
        still = asyncio.create_task(request())
        await _settle()
        after = admitted
        still.cancel()
        await asyncio.gather(still, return_exceptions=True)
        return during, after

    during, after = asyncio.run(main())
    assert (during, after) == (0, 0)


def test_a_pause_that_has_passed_lets_requests_go():
    async def main() -> int:
        gate = RequestGate(max_concurrency=10, requests_per_minute=None, tokens_per_minute=None)
        gate.pause_for(0.01)
        done = 0
        for _ in range(3):
            async with gate.slot(1):
                done += 1
        return done

    assert asyncio.run(asyncio.wait_for(main(), timeout=60)) == 3


def test_a_stop_lets_requests_in_flight_answer_and_sends_nothing_new():
    async def main() -> tuple[int, int, bool]:
        gate = RequestGate(max_concurrency=10, requests_per_minute=None, tokens_per_minute=None)
        release = asyncio.Event()
        answered = sent = 0

        async def request() -> None:
            nonlocal answered, sent
            async with gate.slot(1):
                sent += 1
                await release.wait()
                answered += 1

        in_flight = [asyncio.create_task(request()) for _ in range(2)]
        await _settle()
        gate.stop_sending()
        later = [asyncio.create_task(request()) for _ in range(3)]
        release.set()
        await asyncio.gather(*in_flight)
        await _settle()
        held = not any(t.done() for t in later)  # held until the stop's grace cancels them
        for t in later:
            t.cancel()
        await asyncio.gather(*later, return_exceptions=True)
        return sent, answered, held and gate.stopped_at is not None

    assert asyncio.run(main()) == (2, 2, True)


@pytest.mark.parametrize("per_minute", [1, 0.5])
def test_a_budget_below_one_burst_still_admits_a_request(per_minute):
    """A tiny budget (a free-tier key: 1 request a minute or less) sends its first request, then waits."""
    async def main() -> int:
        gate = RequestGate(max_concurrency=1, requests_per_minute=per_minute, tokens_per_minute=None)
        async with gate.slot(1):
            return 1

    assert asyncio.run(asyncio.wait_for(main(), timeout=60)) == 1
