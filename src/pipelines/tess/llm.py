"""Optional LLM extractor (paper §4.1: structured prompts to a frozen LLM) over any OpenAI-compatible
``POST {base_url}/v1/chat/completions``. Off by default; nothing in the project requires an endpoint.

Primary: temperature 0 with ``logprobs`` / ``top_logprobs`` on a one-token answer (the label's number, so
the label distribution is read exactly). Fallback when the server gives no logprobs: ``samples`` answers at
``temperature``, vote frequencies + ε (the paper repo's scheme), ``<think>…</think>`` stripped.
Responses are cached by ``core.llm.ChatClient`` in ``<cache_dir>/responses.jsonl`` (append-only); with no
endpoint configured the backend runs from the cache or fails closed with a clear error."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.core.api import ChatClient
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
    return (
        f"You label time-series news with one temporal primitive: {primitive} "
        f"({DEFINITIONS[primitive]}).\nOptions:\n{options}\nHistory: {history_summary}\nText: {text}\n"
        "Answer with exactly one line 'Label: N' where N is the option number."
    )


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
    """Label distributions for prompts, over core's OpenAI-compatible client (which caches responses)."""

    def __init__(
        self,
        base_url: str | None,
        model: str,
        api_key: str | None,
        timeout_s: float,
        samples: int,
        temperature: float,
        cache_dir: str | Path,
    ):
        self.samples, self.temperature = samples, temperature
        self.chat = ChatClient(
            base_url, model, api_key, timeout_s, Path(cache_dir) / "responses.jsonl", param_prefix="tess.extractor.llm"
        )

    def probs(self, prompt: str, n_labels: int) -> np.ndarray:
        msgs = [{"role": "user", "content": prompt}]
        out = self.chat.chat(msgs, temperature=0, max_tokens=8, logprobs=True, top_logprobs=10)
        p = parse_logprobs(out["choices"][0], n_labels)
        if p is None:
            p = parse_votes(
                self.chat.texts(msgs, temperature=self.temperature, n=self.samples, max_tokens=512), n_labels
            )
        return p


def history_summary(x: np.ndarray) -> str:
    return f"last value {x[-1]:.2f}, mean {x.mean():.2f}, std {x.std():.2f}, min {x.min():.2f}, max {x.max():.2f}"


def extract_llm(texts: pd.DataFrame, texts_seen: pd.DataFrame, windows: pd.DataFrame, p: Params) -> pd.DataFrame:
    """LLM extractions for every text of both renderings (the node exists only when ``extractor.backend`` is
    'llm'; called with another backend it returns an empty table)."""
    if p.extractor.backend != "llm":
        return empty_extractions()
    c = p.extractor.llm
    client = LLMClient(
        c.base_url, c.model, os.environ.get(c.api_key_env), c.timeout_s, c.samples, c.temperature, c.cache_dir
    )
    hist = {int(w): history_summary(np.asarray(x)) for w, x in zip(windows["window_id"], windows["x"])}
    parts = []
    for table, rendering in ((texts, "open"), (texts_seen, "seen")):
        if len(table) == 0:
            continue
        probs = {prim: [] for prim in PRIMITIVES}
        for wid, text in zip(table["window_id"], table["text"]):
            for prim in PRIMITIVES:
                probs[prim].append(client.probs(build_prompt(prim, text, hist[int(wid)]), len(LABELS[prim])))
        parts.append(
            extraction_rows(
                table["window_id"], table["level"], {k: np.array(v) for k, v in probs.items()}, "llm", rendering
            )
        )
    return pd.concat(parts, ignore_index=True)
