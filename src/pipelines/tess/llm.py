"""Optional LLM extractor (paper §4.1: structured prompts to a frozen LLM) over any OpenAI-compatible
``POST {base_url}/v1/chat/completions``. Off by default; nothing in the project requires an endpoint.

Primary: temperature 0 with ``logprobs`` / ``top_logprobs`` on a one-token answer (the label's number, so
the label distribution is read exactly). Fallback when the server gives no logprobs: ``samples`` answers at
``temperature``, vote frequencies + ε (the paper repo's scheme), ``<think>…</think>`` stripped.
Responses are cached in an append-only JSONL file keyed by sha256(model + prompt); with no endpoint
configured the backend runs from the cache or fails closed with a clear error."""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.tess.extract import empty_extractions, extraction_rows
from pipelines.tess.lexicon import LABELS, PRIMITIVES
from pipelines.tess.params import Params

EPS = 0.01
DEFINITIONS = {
    "shift": "change of the average level of the next values versus the recent history",
    "vol": "change of the step-to-step noise of the next values versus the recent history",
    "shape": "overall shape of the coming path",
    "lag": "when the described change happens inside the forecast window and whether it lasts",
}


def build_prompt(primitive: str, text: str, history_summary: str) -> str:
    options = "\n".join(f"{i + 1}. {lab}" for i, lab in enumerate(LABELS[primitive]))
    return (f"You label time-series news with one temporal primitive: {primitive} "
            f"({DEFINITIONS[primitive]}).\nOptions:\n{options}\nHistory: {history_summary}\nText: {text}\n"
            "Answer with exactly one line 'Label: N' where N is the option number.")


def parse_votes(contents: list[str], n_labels: int) -> np.ndarray:
    votes = np.full(n_labels, EPS)
    for c in contents:
        c = re.sub(r"<think>.*?</think>", "", c or "", flags=re.S)
        m = re.search(r"Label:\s*(\d+)", c)
        if m and 1 <= int(m.group(1)) <= n_labels:
            votes[int(m.group(1)) - 1] += 1
    return votes / votes.sum()


def parse_logprobs(choice: dict, n_labels: int) -> np.ndarray | None:
    """Distribution over option numbers from the top_logprobs of the first digit token after 'Label:'."""
    content = (choice.get("logprobs") or {}).get("content") or []
    for tok in content:
        if tok.get("token", "").strip().isdigit():
            p = np.full(n_labels, 0.0)
            for alt in tok.get("top_logprobs", []):
                t = alt.get("token", "").strip()
                if t.isdigit() and 1 <= int(t) <= n_labels:
                    p[int(t) - 1] += math.exp(alt["logprob"])
            if p.sum() > 0:
                p = p + EPS / n_labels
                return p / p.sum()
    return None


class LLMClient:
    def __init__(self, base_url: str | None, model: str, api_key: str | None, timeout_s: float, samples: int,
                 temperature: float, cache_dir: str | Path):
        self.base_url, self.model, self.api_key = (base_url or "").rstrip("/") or None, model, api_key
        self.timeout_s, self.samples, self.temperature = timeout_s, samples, temperature
        self.cache_path = Path(cache_dir) / "cache.jsonl"
        self.cache: dict[str, list[float]] = {}
        if self.cache_path.is_file():
            for line in self.cache_path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    self.cache[row["key"]] = row["probs"]
        self.calls = 0

    def key(self, prompt: str) -> str:
        return hashlib.sha256((self.model + "\n" + prompt).encode()).hexdigest()

    def _post(self, body: dict) -> dict:
        req = urllib.request.Request(f"{self.base_url}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                self.calls += 1
                return json.loads(resp.read())
        except (urllib.error.URLError, TimeoutError) as exc:
            raise ConnectionError(f"tess LLM extractor: request to {self.base_url} failed: {exc}") from exc

    def probs(self, prompt: str, n_labels: int) -> np.ndarray:
        k = self.key(prompt)
        if k in self.cache:
            return np.asarray(self.cache[k])
        if not self.base_url:
            raise ValueError("tess.extractor.llm.base_url is not set and this prompt is not in the cache "
                             f"({self.cache_path}); configure an OpenAI-compatible endpoint or use backend 'lexicon'")
        msgs = [{"role": "user", "content": prompt}]
        out = self._post({"model": self.model, "messages": msgs, "temperature": 0, "max_tokens": 8,
                          "logprobs": True, "top_logprobs": 10})
        p = parse_logprobs(out["choices"][0], n_labels)
        if p is None:
            out = self._post({"model": self.model, "messages": msgs, "temperature": self.temperature,
                              "n": self.samples, "max_tokens": 512})
            p = parse_votes([c["message"]["content"] for c in out["choices"]], n_labels)
        self.cache[k] = [float(v) for v in p]
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        with self.cache_path.open("a") as f:  # append-only: earlier answers are never rewritten
            f.write(json.dumps({"key": k, "model": self.model, "probs": self.cache[k]}) + "\n")
        return p


def history_summary(x: np.ndarray) -> str:
    return f"last value {x[-1]:.2f}, mean {x.mean():.2f}, std {x.std():.2f}, min {x.min():.2f}, max {x.max():.2f}"


def extract_llm(texts: pd.DataFrame, texts_seen: pd.DataFrame, windows: pd.DataFrame, p: Params) -> pd.DataFrame:
    """LLM extractions for every text of both renderings (the node exists only when ``extractor.backend`` is
    'llm'; called with another backend it returns an empty table)."""
    if p.extractor.backend != "llm":
        return empty_extractions()
    c = p.extractor.llm
    client = LLMClient(c.base_url, c.model, os.environ.get(c.api_key_env), c.timeout_s, c.samples, c.temperature,
                       c.cache_dir)
    hist = {int(w): history_summary(np.asarray(x)) for w, x in zip(windows["window_id"], windows["x"])}
    parts = []
    for table, rendering in ((texts, "open"), (texts_seen, "seen")):
        if len(table) == 0:
            continue
        probs = {prim: [] for prim in PRIMITIVES}
        for wid, text in zip(table["window_id"], table["text"]):
            for prim in PRIMITIVES:
                probs[prim].append(client.probs(build_prompt(prim, text, hist[int(wid)]), len(LABELS[prim])))
        parts.append(extraction_rows(table["window_id"], table["level"], {k: np.array(v) for k, v in probs.items()},
                                     "llm", rendering))
    return pd.concat(parts, ignore_index=True)
