"""``hordelite worker`` (the CLI, a subprocess) between a real horde and a
real llama.cpp server running a tiny generated model (tests/llamacpp/tiny_model.py).

The worker reaches llama-server through a relay that records every request
(tests/llamacpp/_relay.py), so the tests assert on the routes it really
called; llama-server's ``/metrics`` shows what it really generated.
One horde, relay and worker serve every test of the module, on each loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from hordelite.contract.chat_reply import FAULT_REASONS
from hordelite.testing import TestHorde, open_horde
from hordelite.worker import PROBE_MESSAGES
from tests.integration._chat_helpers import chat_status_path, text_status_path
from tests.integration._env import TLS
from tests.integration._helpers import eventually
from tests.llamacpp._relay import Relay, open_relay
from tests.llamacpp.conftest import LlamaServer
from tests.llamacpp.tiny_model import CONTEXT

pytestmark = [pytest.mark.anyio, pytest.mark.llamacpp]

NAME = "llama-worker"
MAX_LENGTH = 64  # the worker's --max-length: a quarter of the context
COMPLETIONS = "/v1/chat/completions"
# How the worker tokenizes a rendered prompt: with the BOS token, markers as tokens.
SPECIAL = {"add_special": True, "parse_special": True}


@pytest.fixture(scope="module", params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


@dataclasses.dataclass
class Env:
    llama: LlamaServer
    horde: TestHorde
    client: httpx.AsyncClient
    relay: Relay
    requester: str
    worker_log: Path

    def log(self) -> str:
        return text(self.worker_log)

    async def until(self, check: Callable[[], bool], seconds: float = 20) -> None:
        """Return once ``check()`` holds (polled, with a deadline)."""
        await eventually(check, within=seconds)

    async def status_when_ended(self, path: str) -> dict[str, Any]:
        with anyio.fail_after(30):
            while True:
                status: dict[str, Any] = (await self.client.get(path)).json()
                if status["done"] or status["faulted"]:
                    return status
                await anyio.sleep(0.02)

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """Queue a native chat request; its status once it ended."""
        r = await self.client.post(
            "/api/v2/generate/chat/async", headers={"apikey": self.requester}, json=body
        )
        assert r.status_code == 202, r.text
        return await self.status_when_ended(chat_status_path(r.json()["id"]))

    async def text(self, body: dict[str, Any]) -> dict[str, Any]:
        """Queue a native text request; its status once it ended."""
        r = await self.client.post(
            "/api/v2/generate/text/async", headers={"apikey": self.requester}, json=body
        )
        assert r.status_code == 202, r.text
        return await self.status_when_ended(text_status_path(r.json()["id"]))

    def sent(self, content: str) -> list[dict[str, Any]]:
        """The chat completion bodies the worker sent whose last message is ``content``."""
        return [
            b
            for b in self.relay.bodies(COMPLETIONS)
            if isinstance(b, dict) and b["messages"][-1].get("content") == content
        ]


def text(path: Path) -> str:
    return path.read_text(errors="replace")


async def declared_model(llama: LlamaServer) -> tuple[str, str]:
    """(llama-server's model id, the id the worker should declare)."""
    backend_id = (await llama.get("/v1/models"))["data"][0]["id"]
    return backend_id, Path(backend_id).name.removesuffix(".gguf")


def isolated_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDELITE_")}
    # Several progress posts even for a reply the tiny model generates in a blink.
    env["HORDELITE_WORKER_PROGRESS_INTERVAL"] = "0.02"
    return env


@contextlib.asynccontextmanager
async def running_worker(
    horde: TestHorde,
    relay: Relay,
    client: httpx.AsyncClient,
    log: Path,
    cwd: Path,
    *flags: str,
    name: str = NAME,
) -> AsyncIterator[None]:
    """``hordelite worker`` in front of the relay, online; SIGINT at exit."""
    owner = await horde.create_key(f"owner-{name}")
    command = [sys.executable, "-m", "hordelite", "worker", "--horde", horde.url]
    command += [f"--key={owner}", "--name", name, "--backend", relay.url]
    command += ["--max-length", str(MAX_LENGTH), *flags]
    with log.open("wb") as out:
        process = await anyio.open_process(
            command, cwd=cwd, env=isolated_environment(), stdout=out, stderr=out
        )
    try:
        with anyio.fail_after(30):
            while (await client.get(f"/api/v2/workers/name/{name}")).status_code != 200:
                assert process.returncode is None, text(log)
                await anyio.sleep(0.05)
        yield
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            with anyio.move_on_after(15, shield=True):
                await process.wait()
            if process.returncode is None:
                process.kill()
        await process.aclose()
    assert process.returncode == 0, text(log)


@pytest.fixture(scope="module")
async def env(
    anyio_backend: str, llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Env]:
    """A horde, the relay and the worker, on the loop of the tests that use it."""
    folder = tmp_path_factory.mktemp("worker")
    log = folder / "worker.log"
    async with (
        open_horde() as horde,
        open_relay(llama_server.port) as relay,
        httpx.AsyncClient(base_url=horde.url, verify=TLS, timeout=30) as client,
        running_worker(horde, relay, client, log, folder),
    ):
        requester = await horde.create_key("alice", kudos=100_000)
        yield Env(llama_server, horde, client, relay, requester, log)


async def exact_count(llama: LlamaServer, messages: list[dict[str, Any]]) -> tuple[str, int]:
    """The prompt llama-server renders for ``messages`` and its token count (BOS included)."""
    prompt = (await llama.post("/apply-template", {"messages": messages}))["prompt"]
    tokens = await llama.post("/tokenize", {"content": prompt, **SPECIAL})
    return prompt, len(tokens["tokens"])


# The declaration ------------------------------------------------------------------


async def test_the_worker_declares_the_context_from_props_and_the_model_id_from_v1_models(
    env: Env,
) -> None:
    props = await env.llama.get("/props")
    n_ctx = props["default_generation_settings"]["n_ctx"]
    backend_id, model_id = await declared_model(env.llama)
    details = (await env.client.get(f"/api/v2/workers/name/{NAME}")).json()
    assert n_ctx == CONTEXT
    assert backend_id.endswith("tiny-llama.gguf")  # llama-server lists the -m path
    assert details["models"] == [model_id] == ["tiny-llama"]
    assert details["max_context_length"] == n_ctx
    assert details["max_length"] == MAX_LENGTH
    assert details["chat"]["model_id"] == model_id
    assert details["chat"]["limits"] == {"max_context_length": n_ctx, "max_length": MAX_LENGTH}
    assert details["chat"]["features"] == ["prompt_overflow_refused"]
    log = env.log()
    assert (
        f"backend llamacpp: model {backend_id!r} (declared as {model_id!r}), "
        f"context {n_ctx} (/props n_ctx)" in log
    )


async def test_prompt_overflow_refused_is_backed_by_llama_servers_own_tokenize(env: Env) -> None:
    probe = list(PROBE_MESSAGES)
    prompt, counted = await exact_count(env.llama, probe)
    # What generation really takes in for the probe: its usage.prompt_tokens.
    answer = await env.llama.post(COMPLETIONS, {"messages": probe, "max_tokens": 1})
    usage = answer["usage"]
    assert counted == usage["prompt_tokens"]
    # The worker rendered the probe with /apply-template and counted that
    # prompt with /tokenize, BOS included, as generation does.
    assert {"messages": probe} in env.relay.bodies("/apply-template")
    tokenized = env.relay.bodies("/tokenize")
    assert {"content": prompt, **SPECIAL} in tokenized
    assert (
        "prompt_overflow_refused declared: backed by llama.cpp /apply-template + /tokenize, "
        f"which counts {counted} tokens for the probe conversation against the backend's "
        f"{usage['prompt_tokens']}" in env.log()
    )


# Jobs -----------------------------------------------------------------------------


async def test_a_chat_request_ends_done_with_the_models_text_and_the_counts_llama_server_reported(
    env: Env,
) -> None:
    _, model_id = await declared_model(env.llama)
    content = "Name one colour."
    status = await env.chat(
        {
            "model": model_id,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 24,
            "temperature": 0,
        }
    )
    assert status["done"], status
    [generation] = status["generations"]
    [sent] = env.sent(content)
    assert "stream" not in sent
    # The same body, sent to llama-server directly: greedy decoding gives the same reply.
    again = await env.llama.post(COMPLETIONS, sent)
    assert generation["message"]["content"] == again["choices"][0]["message"]["content"]
    assert generation["message"]["content"].isascii()
    assert generation["finish_reason"] == "length"  # the tiny model never stops by itself
    assert generation["completion_tokens"] == again["usage"]["completion_tokens"] == 24
    assert generation["prompt_tokens"] == again["usage"]["prompt_tokens"]
    assert generation["prompt_tokens"] == (await exact_count(env.llama, sent["messages"]))[1]
    assert generation["worker_name"] == NAME


async def test_a_streamed_request_gets_the_workers_progress_posts_before_its_end(env: Env) -> None:
    _, model_id = await declared_model(env.llama)
    content = "Count to three."
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": MAX_LENGTH,
        "stream": True,
    }
    chunks: list[tuple[float, dict[str, Any]]] = []
    headers = {"Authorization": f"Bearer {env.requester}"}
    async with env.client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                chunks.append((anyio.current_time(), json.loads(line[len("data:") :])))
    request_id = chunks[0][1]["id"].removeprefix("chatcmpl-")
    status = (await env.client.get(chat_status_path(request_id))).json()
    assert status["done"], status
    final = status["generations"][0]["message"]["content"]
    # The worker streamed from llama-server and posted what it had as it came.
    [sent] = env.sent(content)
    assert sent["stream"] is True
    posts = await env.horde.horde.signals.read_progress(request_id, 0)
    assert len(posts) >= 2
    assert [p["seq"] for p in posts] == list(range(1, len(posts) + 1))
    assert final.startswith("".join(p["content"] for p in posts))
    # The front relayed them: text arrived in several chunks, the first well
    # before the stream ended.
    texts = [(t, c["choices"][0]["delta"].get("content")) for t, c in chunks if c["choices"]]
    with_text = [(t, text) for t, text in texts if text]
    assert len(with_text) >= 2
    assert "".join(text for _, text in with_text) == final
    assert with_text[0][0] < chunks[-1][0]
    assert status["generations"][0]["completion_tokens"] == MAX_LENGTH


async def test_a_conversation_over_the_context_is_faulted_prompt_overflow_and_never_generated(
    env: Env,
) -> None:
    _, model_id = await declared_model(env.llama)
    content = "x" * 200  # one token a character: about 215 tokens with the template
    messages = [{"role": "user", "content": content}]
    prompt, counted = await exact_count(env.llama, messages)
    # It fits llama-server's context alone, not with the reply's budget.
    assert counted < CONTEXT < counted + MAX_LENGTH
    before = await env.llama.metrics()
    status = await env.chat({"model": model_id, "messages": messages, "max_tokens": MAX_LENGTH})
    assert status["faulted"], status
    assert status["fault"] == {"rc": "ChatWorkerFault", "message": FAULT_REASONS["prompt_overflow"]}
    await env.until(lambda: "outcome=faulted (prompt_overflow)" in env.log())
    # Counted with the real tokenizer, never sent for generation.
    assert {"content": prompt, **SPECIAL} in env.relay.bodies("/tokenize")
    assert env.sent(content) == []
    after = await env.llama.metrics()
    for counter in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"):
        assert after[counter] == before[counter], counter
    # Sent anyway, llama-server would have generated into it until its context ran out.
    cut = await env.llama.post(
        COMPLETIONS, {"messages": messages, "max_tokens": MAX_LENGTH, "temperature": 0}
    )
    assert cut["usage"]["prompt_tokens"] == counted
    assert cut["usage"]["completion_tokens"] < MAX_LENGTH


async def test_a_conversation_the_template_refuses_is_faulted_template_error_and_the_worker_serves_on(
    env: Env,
) -> None:
    _, model_id = await declared_model(env.llama)
    messages = [
        {"role": "user", "content": "First question."},
        {"role": "user", "content": "Second question, with no answer between."},
    ]
    before = await env.llama.metrics()
    status = await env.chat({"model": model_id, "messages": messages, "max_tokens": 8})
    assert status["faulted"], status
    assert status["fault"] == {"rc": "ChatWorkerFault", "message": FAULT_REASONS["template_error"]}
    # Short enough for the measured bound, it went to the chat route uncounted
    # (one call a job); llama-server refused it there, and the worker asked
    # /apply-template why (a 400: the template cannot render it).
    assert env.sent(messages[-1]["content"]) != []
    assert {"messages": messages} in env.relay.bodies("/apply-template")
    # Refused before any generation: llama-server's token counters did not move.
    after = await env.llama.metrics()
    for counter in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"):
        assert after[counter] == before[counter], counter
    # A refusal, not a backend down: the worker pops on and serves the next request.
    after = await env.chat(
        {"model": model_id, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4}
    )
    assert after["done"], after
    assert "no pops until it answers again" not in env.log()


async def test_a_native_text_request_is_completed_by_the_model_through_v1_completions(
    env: Env,
) -> None:
    _, model_id = await declared_model(env.llama)
    prompt = "Once upon a time"
    status = await env.text(
        {
            "prompt": prompt,
            "models": [model_id],
            "params": {"max_length": 16, "max_context_length": CONTEXT, "temperature": 0},
        }
    )
    assert status["done"], status
    [generation] = status["generations"]
    [sent] = [b for b in env.relay.bodies("/v1/completions") if b["prompt"] == prompt]
    again = await env.llama.post("/v1/completions", sent)
    assert generation["text"] == again["choices"][0]["text"]
    assert len(generation["text"]) >= 1
    assert again["usage"]["completion_tokens"] == 16


async def test_a_native_text_prompt_over_the_context_is_trimmed_from_its_start_and_completed(
    env: Env,
) -> None:
    """KoboldAI's way: the END of a text prompt that does not fit is kept,
    counted by llama-server's /tokenize and sent as token ids, BOS first."""
    _, model_id = await declared_model(env.llama)
    prompt = " ".join(f"w{i:03d}" for i in range(120))  # 599 characters: one token each
    max_length = 16
    tokens = (await env.llama.post("/tokenize", {"content": prompt, **SPECIAL}))["tokens"]
    assert len(tokens) > 2 * CONTEXT
    status = await env.text(
        {
            "prompt": prompt,
            "models": [model_id],
            "params": {"max_length": max_length, "max_context_length": CONTEXT},
        }
    )
    assert status["done"], (status, env.log()[-2000:])
    assert len(status["generations"][0]["text"]) >= 1
    assert {"content": prompt, **SPECIAL} in env.relay.bodies("/tokenize")
    [sent] = [
        b
        for b in env.relay.bodies("/v1/completions")
        if isinstance(b["prompt"], list) and b["prompt"][-1] == tokens[-1]
    ]
    kept = CONTEXT - max_length - 1
    assert sent["prompt"] == [tokens[0], *tokens[-kept:]]  # the BOS, then the end
    assert sent["max_tokens"] == max_length
    end = (await env.llama.post("/detokenize", {"tokens": sent["prompt"][1:]}))["content"]
    assert prompt.endswith(end)
    assert end.endswith("w119")
    # What llama-server itself takes in for it: the BOS and the kept tokens, fitting.
    again = await env.llama.post("/v1/completions", sent)
    assert again["usage"]["prompt_tokens"] == 1 + kept
    assert again["usage"]["prompt_tokens"] + max_length <= CONTEXT
    await env.until(lambda: f"{len(tokens)} tokens to {1 + kept}" in env.log())


async def test_a_prompt_llama_server_refuses_as_over_its_context_is_faulted_prompt_overflow(
    env: Env, tmp_path: Path
) -> None:
    """A worker told a larger context than llama-server's (``--context``, which
    it warns about) passes its fit check on a conversation llama-server then
    refuses with 400 ``exceed_context_size_error``: refused, not trimmed, so
    the job is faulted with the reason prompt_overflow."""
    log = tmp_path / "worker.log"
    name = "overstated"
    flags = ("--context", str(2 * CONTEXT), "--model-id", "tiny-llama-overstated")
    async with running_worker(env.horde, env.relay, env.client, log, tmp_path, *flags, name=name):
        messages = [{"role": "user", "content": "y" * 300}]  # over 300 tokens
        status = await env.chat(
            {"model": "tiny-llama-overstated", "messages": messages, "max_tokens": MAX_LENGTH}
        )
        assert status["faulted"], status
        assert status["fault"] == {
            "rc": "ChatWorkerFault",
            "message": FAULT_REASONS["prompt_overflow"],
        }
    worker_log = text(log)
    assert "more than the 256 tokens the backend reports" in worker_log
    assert "exceeds the available context size" in worker_log  # llama-server's refusal
    assert env.sent(messages[0]["content"])  # sent: the fit check passed
