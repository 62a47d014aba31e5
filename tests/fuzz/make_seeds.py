#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/TARGET/NAME): a few well-formed inputs of
each parser, so that fuzzing starts from the real formats, and so that corpus_test.cc replays them in CI.
Inputs that once crashed a target are added by hand beside these (named crash-*), never regenerated.

    python3 tests/fuzz/make_seeds.py
"""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


# --- a minimal msgpack encoder (the subset vLLM's msgspec writes) -------------------------------------------
def mp(v):
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 128:
            return bytes([v])
        if -32 <= v < 0:
            return struct.pack("b", v)
        if 0 <= v < 2**64 and v >= 2**63:
            return b"\xcf" + struct.pack(">Q", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        b = v.encode()
        return (bytes([0xA0 | len(b)]) if len(b) < 32 else b"\xd9" + bytes([len(b)])) + b
    if isinstance(v, bytes):
        return b"\xc4" + bytes([len(v)]) + v
    if isinstance(v, (list, tuple)):
        head = bytes([0x90 | len(v)]) if len(v) < 16 else b"\xdc" + struct.pack(">H", len(v))
        return head + b"".join(mp(x) for x in v)
    if isinstance(v, dict):
        head = bytes([0x80 | len(v)]) if len(v) < 16 else b"\xde" + struct.pack(">H", len(v))
        return head + b"".join(mp(k) + mp(x) for k, x in v.items())
    raise TypeError(v)


TOKENS = list(range(100, 132))


def stored_positional(extra=None, lora=None, parent=None, hashes=(1, 2)):
    e = ["BlockStored", list(hashes), parent, TOKENS[: 16 * len(hashes)], 16, None, "GPU", lora]
    if extra is not None:
        e.append(extra)
    return e


def stored_map(**kw):
    e = {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": TOKENS,
         "block_size": 16, "medium": "GPU"}
    e.update(kw)
    return e


def vllm_seeds():
    removed = ["BlockRemoved", [1], "GPU"]
    write("vllm_events", "shape1_positional", mp([1.5, [stored_positional(), removed, ["AllBlocksCleared"]], 0]))
    write("vllm_events", "shape1_trimmed", mp([1.5, [["BlockStored", [7], None, TOKENS[:16], 16]], None]))
    write("vllm_events", "shape2_map_events",
          mp([1.5, [stored_map(), {"type": "BlockRemoved", "block_hashes": [2], "medium": "CPU"}], 0]))
    write("vllm_events", "shape3_map_batch",
          mp({"ts": 1.5, "events": [stored_map(lora_name="sql"), {"type": "AllBlocksCleared"}],
              "data_parallel_rank": 1}))
    write("vllm_events", "salted_extra_keys",
          mp([1.5, [stored_positional(extra=[["kvr1-0123456789abcdef0123456789abcdef"], None])], 0]))
    write("vllm_events", "lora_salt_mm_extra_keys",
          mp({"ts": 2.0, "events": [stored_map(lora_name="sql", extra_keys=[["sql", ["img", 0], "s"], ["sql"]],
                                               group_idx=0)]}))
    write("vllm_events", "bytes_hashes",
          mp([1.5, [["BlockStored", [b"\x01" * 32], None, TOKENS[:16], 16, None, None, None],
                    ["BlockStored", [b"\x02" * 32], b"\x01" * 32, TOKENS[16:32], 16]], 0]))


# --- a minimal protobuf encoder for kvroute.v1.EventBatch (proto/kv_events.proto) --------------------------
def varint(n):
    out = b""
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, wire, payload):
    key = varint((num << 3) | wire)
    if wire == 0:
        return key + varint(payload)
    if wire == 1:
        return key + struct.pack("<d", payload)
    return key + varint(len(payload)) + payload


def packed(num, values):
    return field(num, 2, b"".join(varint(v) for v in values))


def native_seeds():
    stored = packed(1, [11, 12]) + packed(3, TOKENS) + field(4, 0, 16) + field(6, 2, b"sql")
    salted = packed(1, [21]) + packed(3, TOKENS[:16]) + field(4, 0, 16) + field(8, 2, b"kvr1-abc")
    child = packed(1, [13]) + field(2, 0, 12) + packed(3, TOKENS[:16]) + field(4, 0, 16) + field(5, 0, 1)
    removed = packed(1, [11]) + field(2, 0, 1)
    load = field(1, 0, 3) + field(2, 0, 1) + field(3, 1, 0.25) + field(4, 0, 1000) + field(5, 0, 16)
    ev = lambda kind, body: field(2, 2, field(kind, 2, body))
    write("native_events", "stored_removed",
          field(1, 1, 1.5) + ev(1, stored) + ev(1, child) + ev(2, removed) + field(3, 0, 0) + field(4, 0, 7))
    write("native_events", "salted", field(1, 1, 2.0) + ev(1, salted) + ev(3, b""))
    write("native_events", "load_report", field(1, 1, 3.0) + ev(4, load) + field(4, 0, 8))


def request_seeds():
    # First byte: endpoint (% 3: chat, completions, responses) and option bits (see targets.cc).
    chat = {"model": "qwen3-8b", "stream": True,
            "messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "hello " * 20},
                                                      {"type": "image_url", "image_url": {"url": "x"}}]},
                         {"role": "assistant", "content": None,
                          "tool_calls": [{"id": "c1", "type": "function",
                                          "function": {"name": "f", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "42"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "cache_salt": "s", "user": "u"}
    write("request", "chat", b"\x18" + json.dumps(chat).encode())
    write("request", "completions_tokens", b"\x01" + json.dumps({"model": "m", "prompt": list(range(40)),
                                                                  "max_tokens": 4}).encode())
    write("request", "completions_batch", b"\x05" + json.dumps({"model": "m", "prompt": ["a" * 70, "b"],
                                                                 "stream": True, "stream_options": {}}).encode())
    write("request", "responses",
          b"\x02" + json.dumps({"model": "m", "instructions": "sys", "previous_response_id": "resp_1",
                                "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                                "tools": [{"type": "function", "name": "f"}], "background": False}).encode())
    write("request", "sse_response_created",
          b"\x20event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\\u0031\"}}\n\n")


def usage_seeds():
    write("usage", "json_body", '\x10{"id":"x","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,'
                                '"prompt_tokens_details":{"cached_tokens":8}}}')
    write("usage", "stream_tail", 'data: {"choices":[{"delta":{}}],"usage":null}\n\ndata: {"choices":[],'
                                  '"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}\n\ndata: [DONE]\n\n')
    write("usage", "responses_status", '\x07{"id":"resp_1","object":"response","output":[{"content":[{"text":"'
                                       '\\"status\\": no"}]}],"status":"completed","usage":{"input_tokens":5}}')


def metrics_seeds():
    write("metrics", "vllm", "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n"
                             'vllm:num_requests_running{model_name="m"} 3\nvllm:num_requests_waiting{model_name="m"} 1\n'
                             'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
                             'vllm:prefix_cache_queries_total{model_name="m"} 1e3\n'
                             'vllm:prefix_cache_hits_total{model_name="m"} 512\n'
                             'vllm:cache_config_info{block_size="16",num_gpu_blocks="2048",x="a\\"b\\\\c\\n"} 1\n')
    write("metrics", "sglang", "sglang:num_running_reqs 2\nsglang:num_queue_reqs 0\nsglang:token_usage 0.5\n"
                               "sglang:cache_hit_rate NaN\nsglang:gen_throughput +Inf 1700000000000\n")
    write("metrics", "histogram", "# TYPE vllm:time_to_first_token_seconds histogram\n"
                                  'vllm:time_to_first_token_seconds_bucket{le="0.1"} 4\n'
                                  'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 5\n'
                                  "vllm:time_to_first_token_seconds_sum 0.9\nbroken line {\n")


def config_seeds():
    write("config", "full", "listen: 0.0.0.0:8080\nadmin_listen: 127.0.0.1:9090\npolicy: kv_cost\n"
                            "workers:\n  - http://10.0.0.1:8000\n  - {url: http://10.0.0.2:8000, kv_events: tcp://10.0.0.2:5557,"
                            " model: m, dp_size: 2}\ndiscover:\n  - vllm.default.svc:8000,kv_events_port=5557\n"
                            "block_tokens: 16\nsession_ttl: 300\ntenant_header: x-tenant\n")
    write("config", "security", "tenant_salt_secret: s3cret\nallow_client_cache_salt: true\nadmin_token: t\n"
                                "max_body_bytes: 1048576\n")
    write("config", "errors", "policy: nope\nworkers: 5\nblock_tokens: -1\n[unbalanced\n")


def hygiene_seeds():
    smuggle = ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked, chunked\r\n\r\n"
               "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: 76\r\n\r\n"
               '{"model": "qwen3-8b", "messages": [{"role": "user", "content": "SMUGGLED"}]}')
    write("hygiene", "smuggle_chunked_twice", smuggle)
    write("hygiene", "te_gzip_with_cl", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n"
                                        "Content-Length: 5\r\n\r\nhello")
    write("hygiene", "http10_chunked", "POST / HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
                                       "0\r\n\r\n")
    write("hygiene", "connection_named", "GET /v1/../admin/workers HTTP/1.1\r\nHost: x\r\nConnection: close, X-A\r\n"
                                         "X-A: 1\r\nKeep-Alive: 5\r\n\r\n")
    write("hygiene", "plain", "GET /v1/models?x=%2e%2E HTTP/1.1\r\nHost: kvroute:8080\r\nAuthorization: Bearer k\r\n\r\n")


if __name__ == "__main__":
    vllm_seeds()
    native_seeds()
    request_seeds()
    usage_seeds()
    metrics_seeds()
    config_seeds()
    hygiene_seeds()
