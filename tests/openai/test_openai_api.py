"""The OpenAI-compatible API through the real ``openai`` client (sync, async, streaming, images,
embeddings, error types) against warmgate, with fake OpenAI-compatible servers behind it."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.fake_openai import FakeOpenAI
from tests.helpers import metric_value
from tests.openai_stack import CLOUD_KEY, cloud_key, seen_anywhere, stack

__all__ = ["cloud_key"]
pytestmark = pytest.mark.usefixtures("cloud_key")

HELLO = [{"role": "user", "content": "hello there"}]


async def test_models_are_listed_and_retrieved() -> None:
    async with stack() as st:
        client = st.client()
        names = [m.id async for m in client.models.list()]
        assert names[:2] == ["qwen3-8b", "frontier"]
        model = await client.models.retrieve("qwen3-8b")
        assert model.id == "qwen3-8b" and model.object == "model"
        with pytest.raises(openai.NotFoundError) as info:
            await client.models.retrieve("gpt-nope")
        assert info.value.code == "model_not_found"
        await client.close()


async def test_local_chat_async_and_sync() -> None:
    async with stack() as st:
        client = st.client()
        raw = await client.chat.completions.with_raw_response.create(
            model="qwen3-8b", messages=HELLO
        )
        completion = raw.parse()
        assert completion.choices[0].message.content == "Hello from the fake server ."
        assert completion.object == "chat.completion" and completion.usage is not None
        assert raw.headers["x-warmgate-decision"] == "vllm-local; reason=ready"
        assert raw.headers["x-request-id"].startswith("req_")
        await client.close()

        def sync_call() -> str | None:
            with st.sync_client() as sync:
                return (
                    sync.chat.completions.create(model="qwen3-8b", messages=HELLO)
                    .choices[0]
                    .message.content
                )

        assert await asyncio.to_thread(sync_call) == "Hello from the fake server ."
        assert st.local.count("/v1/chat/completions") == 2 and st.cloud.requests == []
        sent = st.local.requests[0]
        assert (
            "Authorization" not in sent.headers
        )  # the client's key is warmgate's, not the target's
        # warmgate's own id goes to the target as the UUID it is made of (llama-cpp-python's
        # server takes nothing else); a client's own id goes as it is (below)
        ours = raw.headers["x-request-id"]
        assert sent.headers["X-Request-Id"] == str(uuid.UUID(hex=ours.removeprefix("req_")))
        assert sent.json()["model"] == "qwen3-8b"


async def test_a_clients_own_request_id_reaches_the_local_server_as_it_is() -> None:
    async with stack() as st:
        client = st.client()
        # Even one in warmgate's own form: only the ids warmgate makes go as a UUID.
        for own in ("trace-42", f"req_{uuid.uuid4().hex}", "req_not-hex"):
            raw = await client.chat.completions.with_raw_response.create(
                model="qwen3-8b", messages=HELLO, extra_headers={"X-Request-ID": own}
            )
            assert raw.headers["x-request-id"] == own
            assert st.local.requests[-1].headers["X-Request-Id"] == own
        await client.close()


async def test_local_model_name_is_rewritten_for_the_target() -> None:
    async with stack() as st:
        client = st.client()
        await client.chat.completions.create(model="local-only", messages=HELLO)
        assert st.local.requests[-1].json()["model"] == "served-name"
        await client.close()


async def test_local_stream_is_passed_through_as_it_comes() -> None:
    local = FakeOpenAI(name="local", chunk_delay=0.15)
    async with stack(local=local) as st:
        client = st.client()
        started = time.monotonic()
        stream = await client.chat.completions.create(model="qwen3-8b", messages=HELLO, stream=True)
        arrivals, text = [], ""
        async for chunk in stream:
            arrivals.append(time.monotonic() - started)
            text += chunk.choices[0].delta.content or ""
        assert text == "Hello from the fake server ."
        # unbuffered: the first chunk came long before the last (6 words x 0.15 s)
        assert arrivals[0] < 0.5 < arrivals[-1]
        await client.close()
        async with aiohttp.ClientSession() as http:
            body = {"model": "qwen3-8b", "messages": HELLO, "stream": True}
            async with http.post(st.wg.url + "/v1/chat/completions", json=body) as resp:
                raw = await resp.read()
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                assert resp.headers["X-Warmgate-Decision"] == "vllm-local; reason=ready"
        assert raw.endswith(b"data: [DONE]\n\n") and raw.count(b"chat.completion.chunk") == 8


async def test_cloud_chat_and_stream_settle_the_budget() -> None:
    async with stack(daily_cloud_budget_usd=1.0) as st:
        client = st.client()
        raw = await client.chat.completions.with_raw_response.create(
            model="frontier", messages=HELLO, max_tokens=50
        )
        assert raw.headers["x-warmgate-decision"] == "managed/frontier-large; reason=cloud_only"
        assert raw.parse().choices[0].message.content == "Hello from the fake server ."
        assert st.cloud.requests[0].json()["model"] == "frontier-large"
        spent = st.api.budget.spent
        assert spent == pytest.approx((3 * 3.0 + 6 * 15.0) / 1e6)  # settled from the usage

        stream = await client.chat.completions.create(model="frontier", messages=HELLO, stream=True)
        chunks = [chunk async for chunk in stream]
        assert all(chunk.choices for chunk in chunks)  # the usage-only chunk was not asked for
        assert "".join(c.choices[0].delta.content or "" for c in chunks).endswith("server .")
        assert st.cloud.requests[1].json()["stream_options"] == {"include_usage": True}
        assert st.api.budget.spent == pytest.approx(2 * spent)  # settled from that chunk

        stream = await client.chat.completions.create(
            model="frontier",
            messages=HELLO,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 6
        await client.close()
        assert await metric_value(
            st.wg.admin, "warmgate_cloud_spend_usd_total", cloud="managed"
        ) == pytest.approx(3 * spent)
        by_model = await metric_value(
            st.wg.admin,
            "warmgate_cloud_spend_by_model_usd_total",
            cloud="managed",
            model="frontier",
        )
        assert by_model == pytest.approx(3 * spent), "the same spend, by the model asked for"
        left = await metric_value(st.wg.admin, "warmgate_cloud_budget_remaining_usd")
        assert left == pytest.approx(1.0 - 3 * spent)
        assert await st.decisions(model="frontier", reason="cloud_only") == 3


async def test_embeddings_local_and_cloud_in_both_encodings() -> None:
    async with stack() as st:
        client = st.client()
        local = await client.embeddings.create(model="embed", input=["ab", "abcd"])
        assert [d.embedding[:2] for d in local.data] == [[2.0, 0.0], [4.0, 1.0]]
        floats = await client.embeddings.create(
            model="embed-cloud", input="abc", encoding_format="float"
        )
        assert floats.data[0].embedding == [3.0, 0.0, 0.5]
        assert floats.usage.prompt_tokens == 1
        await client.close()
    async with aiohttp.ClientSession() as http, stack() as st:
        body = {"model": "embed-cloud", "input": "abc"}  # no encoding_format: floats, like OpenAI
        async with http.post(st.wg.url + "/v1/embeddings", json=body) as resp:
            answer = await resp.json()
        assert answer["data"][0]["embedding"] == [3.0, 0.0, 0.5]


async def test_cloud_images_b64_and_url() -> None:
    async with stack() as st:
        client = st.client()
        images = await client.images.generate(model="image-cloud", prompt="a gate", n=2)
        assert len(images.data) == 2
        assert base64.b64decode(images.data[0].b64_json or "").startswith(b"\x89PNG")
        urls = await client.images.generate(
            model="image-cloud", prompt="a gate", response_format="url"
        )
        assert urls.data[0].url == "https://cloud.example/image.png"
        assert st.api.budget.spent == pytest.approx(0.12)
        await client.close()


async def test_errors_have_openai_shape_status_and_request_id(tmp_path: Path) -> None:
    async with stack(tweak=lambda c: c["api"].update(max_body="1KiB")) as st:
        client = st.client()
        with pytest.raises(openai.NotFoundError) as nf:
            await client.chat.completions.create(model="gpt-nope", messages=HELLO)
        assert nf.value.code == "model_not_found" and nf.value.param == "model"
        assert nf.value.response.headers["x-request-id"]
        assert nf.value.response.headers["x-should-retry"] == "false"
        assert nf.value.response.headers["x-warmgate-decision"] == "none; reason=model_not_found"
        assert "retry-after" not in nf.value.response.headers
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model="qwen3-8b", messages="hi")  # type: ignore[arg-type]
        assert bad.value.param == "messages"
        with pytest.raises(openai.BadRequestError, match="/v1/embeddings"):
            await client.chat.completions.create(model="embed", messages=HELLO)
        with pytest.raises(openai.APIStatusError) as big:
            await client.chat.completions.create(
                model="qwen3-8b", messages=[{"role": "user", "content": "x" * 2000}]
            )
        assert big.value.status_code == 413
        await client.close()
        async with aiohttp.ClientSession() as http:
            headers = {"x-request-id": "trace-42", "Content-Type": "application/json"}
            async with http.post(
                st.wg.url + "/v1/chat/completions", data=b"{nope", headers=headers
            ) as resp:
                assert resp.status == 400 and resp.headers["x-request-id"] == "trace-42"
                error = (await resp.json())["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"


async def test_client_api_keys(tmp_path: Path) -> None:
    (tmp_path / "keys.txt").write_text("# name key\nalice sk-alice-1\nsk-anonymous-2\n")

    def tweak(config: dict[str, object]) -> None:
        config["api"] = {"api_keys_file": "keys.txt"}

    async with stack(tweak=tweak, base_dir=str(tmp_path)) as st:
        for key in ("wrong", ""):
            client = (
                st.client(key=key)
                if key
                else st.client(key="x", default_headers={"Authorization": ""})
            )
            with pytest.raises(openai.AuthenticationError) as info:
                await client.chat.completions.create(model="qwen3-8b", messages=HELLO)
            assert info.value.code == "invalid_api_key"
            with pytest.raises(openai.AuthenticationError):
                await client.models.list()
            await client.close()
        for key in ("sk-alice-1", "sk-anonymous-2"):
            client = st.client(key=key)
            await client.chat.completions.create(model="qwen3-8b", messages=HELLO)
            await client.close()
        assert st.local.count("/v1/chat/completions") == 2


async def test_the_cloud_key_never_leaves_the_cloud_backend(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    # a cloud that quotes the key it was given, the way some error messages do
    cloud = FakeOpenAI(api_key="sk-a-different-key", name="cloud")
    async with stack(cloud=cloud) as st:
        client = st.client()
        with pytest.raises(openai.APIStatusError) as info:
            await client.chat.completions.create(model="frontier", messages=HELLO)
        assert info.value.status_code == 502
        assert "credentials" in info.value.message
        assert CLOUD_KEY not in info.value.response.text
        await client.chat.completions.create(model="qwen3-8b", messages=HELLO)
        stream = await client.chat.completions.create(model="qwen3-8b", messages=HELLO, stream=True)
        async for _ in stream:
            pass
        await client.close()
        assert st.cloud.requests and seen_anywhere(st.cloud, CLOUD_KEY)  # it did go there
        assert not seen_anywhere(st.local, CLOUD_KEY)
    assert caplog.records and all(CLOUD_KEY not in r.getMessage() for r in caplog.records)


async def test_cloud_errors_map_to_openai_errors_without_retry_loops() -> None:
    async with stack() as st:
        client = st.client(max_retries=2)
        st.cloud.fail_next(400, message="max_tokens is too large")
        with pytest.raises(openai.BadRequestError, match="max_tokens is too large"):
            await client.chat.completions.create(model="frontier", messages=HELLO)
        st.cloud.fail_next(500, times=2)  # warmgate retries once, then gives up
        with pytest.raises(openai.InternalServerError) as info:
            await client.chat.completions.create(model="frontier", messages=HELLO)
        assert info.value.status_code == 502 and info.value.code == "cloud_error"
        assert info.value.response.headers["x-should-retry"] == "false"
        assert st.cloud.count("/v1/chat/completions") == 3  # the client did not retry
        assert st.api.budget.spent == 0.0 and st.api.budget.reserved == 0.0
        await client.close()


async def test_a_cloud_timeout_is_retried_then_answered() -> None:
    cloud = FakeOpenAI(api_key=CLOUD_KEY, name="cloud", delay=3.0)  # the cloud's timeout is 2 s
    async with stack(
        cloud=cloud, tweak=lambda c: c["clouds"]["managed"].update(timeout="0.3s", retries=0)
    ) as st:
        client = st.client()
        with pytest.raises(openai.InternalServerError, match="did not answer in time"):
            await client.chat.completions.create(model="frontier", messages=HELLO)
        await client.close()


async def test_a_cloud_stream_that_stalls_ends_with_an_error_event() -> None:
    cloud = FakeOpenAI(api_key=CLOUD_KEY, name="cloud", chunk_delay=1.0)
    async with stack(
        cloud=cloud, tweak=lambda c: c["clouds"]["managed"].update(timeout="0.4s", retries=0)
    ) as st:
        client = st.client()
        stream = await client.chat.completions.create(model="frontier", messages=HELLO, stream=True)
        with pytest.raises(openai.APIError, match="stopped sending in time"):
            async for _ in stream:
                pass
        await client.close()
        # the usage never came: the whole reservation stays spent
        assert st.api.budget.spent > 0 and st.api.budget.reserved == 0.0
