"""core.llm: the OpenAI-compatible client against a stub server on 127.0.0.1; cache and errors."""

import json

import pytest

from pipelines.core.llm import ChatClient, LLMError, completion, stub_server


def test_chat_roundtrip_cache_and_offline_replay(tmp_path):
    cache = tmp_path / "llm" / "cache.jsonl"
    with stub_server(lambda body: completion([f"echo {body['messages'][0]['content']}"] * body.get("n", 1))) as s:
        c = ChatClient(s.url, "m1", api_key="k", cache_path=cache, param_prefix="x.llm")
        assert c.texts([{"role": "user", "content": "hi"}], n=2, temperature=0.7) == ["echo hi", "echo hi"]
        assert c.texts([{"role": "user", "content": "hi"}], n=2, temperature=0.7) == ["echo hi", "echo hi"]
        assert c.calls == 1 and c.cache_hits == 1
        assert s.requests[0]["model"] == "m1" and s.requests[0]["n"] == 2
        c.texts([{"role": "user", "content": "hi"}], n=2, temperature=0.0)  # another body: another request
        assert c.calls == 2
    rows = [json.loads(line) for line in cache.read_text().splitlines()]
    assert len(rows) == 2 and all(r["model"] == "m1" for r in rows)
    # no endpoint: cached requests replay, new ones fail closed naming the parameter
    offline = ChatClient(None, "m1", cache_path=cache, param_prefix="x.llm")
    assert offline.texts([{"role": "user", "content": "hi"}], n=2, temperature=0.7) == ["echo hi", "echo hi"]
    with pytest.raises(LLMError, match=r"x\.llm\.base_url is not set"):
        offline.chat([{"role": "user", "content": "new"}])
    # another model never reads the first model's answers
    with pytest.raises(LLMError):
        ChatClient(None, "m2", cache_path=cache).chat([{"role": "user", "content": "hi"}], n=2, temperature=0.7)


def test_errors_name_the_endpoint_and_the_corrupt_cache(tmp_path):
    with pytest.raises(LLMError, match="request to http://127.0.0.1:9 failed"):
        ChatClient("http://127.0.0.1:9", "m", timeout_s=2).chat([{"role": "user", "content": "x"}])
    with stub_server(lambda body: {"error": "overloaded"}) as s:
        with pytest.raises(LLMError, match="without 'choices'"):
            ChatClient(s.url, "m").chat([{"role": "user", "content": "x"}])
    bad = tmp_path / "cache.jsonl"
    bad.write_text('{"key": "a", "response": {}}\nnot json\n')
    with pytest.raises(LLMError, match="line 2 is corrupt"):
        ChatClient(None, "m", cache_path=bad)
