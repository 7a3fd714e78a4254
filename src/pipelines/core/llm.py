"""Optional LLM backends: one client for any OpenAI-compatible ``POST {base_url}/v1/chat/completions``.

Nothing in the project requires an endpoint. Answers are cached in an append-only JSONL file keyed by
sha256 of (model, request body), so a run can be repeated (or run on a machine without the endpoint) from
the cache; with no endpoint configured and no cached answer the client fails closed with an error that
names the parameter to set. Tests talk to :func:`stub_server` on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class LLMError(RuntimeError):
    """The endpoint is missing, unreachable or answered something that is not a chat completion."""


class ChatClient:
    """``chat(messages, **body)`` → the parsed JSON response (``choices[i].message.content`` ...).

    ``param_prefix`` (e.g. ``"hypospace.sampler.llm"``) names the parameters in error messages."""

    def __init__(
        self,
        base_url: str | None,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        cache_path: str | Path | None = None,
        param_prefix: str = "llm",
    ):
        self.base_url = (base_url or "").rstrip("/") or None
        self.model, self.api_key, self.timeout_s, self.param_prefix = model, api_key, timeout_s, param_prefix
        self.cache_path = Path(cache_path) if cache_path else None
        self.cache: dict[str, dict] = {}
        if self.cache_path is not None and self.cache_path.is_file():
            for n, line in enumerate(self.cache_path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self.cache[row["key"]] = row["response"]
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise LLMError(
                        f"{self.param_prefix}: cache file {self.cache_path} line {n} is corrupt "
                        f"({exc}); move it away to start a fresh cache"
                    ) from exc
        self.calls = 0  # requests actually sent
        self.cache_hits = 0

    def key(self, body: Mapping[str, Any]) -> str:
        blob = json.dumps({"model": self.model, **body}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def _post(self, body: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(
            f"{self.base_url}/v1/chat/completions", data=json.dumps(body).encode(), headers=headers
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                self.calls += 1
                out = json.loads(resp.read())
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise LLMError(f"{self.param_prefix}: request to {self.base_url} failed: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise LLMError(f"{self.param_prefix}: {self.base_url} did not answer JSON: {exc}") from exc
        if not isinstance(out, dict) or not isinstance(out.get("choices"), list) or not out["choices"]:
            raise LLMError(f"{self.param_prefix}: {self.base_url} answered without 'choices': {str(out)[:200]}")
        return out

    def chat(self, messages: list[dict[str, str]], **body: Any) -> dict:
        request = {"messages": messages, **body}
        k = self.key(request)
        if k in self.cache:
            self.cache_hits += 1
            return self.cache[k]
        if not self.base_url:
            where = f" and this request is not in the cache ({self.cache_path})" if self.cache_path else ""
            raise LLMError(
                f"{self.param_prefix}.base_url is not set{where}; configure an OpenAI-compatible "
                "endpoint or choose an offline backend"
            )
        out = self._post({"model": self.model, **request})
        self.cache[k] = out
        if self.cache_path is not None:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            with self.cache_path.open("a") as f:  # append-only: earlier answers are never rewritten
                f.write(json.dumps({"key": k, "model": self.model, "response": out}) + "\n")
        return out

    def texts(self, messages: list[dict[str, str]], **body: Any) -> list[str]:
        """The contents of all choices (``n`` samples when the body asks for them)."""
        return [(c.get("message") or {}).get("content") or "" for c in self.chat(messages, **body)["choices"]]


def completion(contents: list[str], logprobs: list[list[dict]] | None = None) -> dict:
    """A chat-completion response body with these choice contents (for stub servers and tests)."""
    choices = []
    for i, text in enumerate(contents):
        ch: dict[str, Any] = {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        if logprobs is not None:
            ch["logprobs"] = {"content": logprobs[i]}
        choices.append(ch)
    return {"id": "stub", "object": "chat.completion", "choices": choices}


@dataclass
class Stub:
    url: str  # base URL, e.g. http://127.0.0.1:PORT
    requests: list[dict] = field(default_factory=list)  # request bodies received, in order


@contextmanager
def stub_server(respond: Callable[[dict], dict]) -> Iterator[Stub]:
    """An OpenAI-compatible endpoint on 127.0.0.1 answering ``respond(request_body)`` (a response body,
    e.g. from :func:`completion`); yields a :class:`Stub` with its URL and the requests it received."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    stub = Stub(url="")
    received = stub.requests

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            received.append(body)
            if not self.path.endswith("/v1/chat/completions"):
                self.send_response(404)
                self.end_headers()
                return
            data = json.dumps(respond(body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    stub.url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        yield stub
    finally:
        srv.shutdown()
        srv.server_close()
