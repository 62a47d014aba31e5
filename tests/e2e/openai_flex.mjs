// The official openai npm client, unchanged, asking for OpenAI's "flex" service tier through kvroute while
// the fleet is saturated: without retries it sees the 429 as a RateLimitError carrying Retry-After; with its
// default retries (which honor Retry-After) the same request succeeds once a worker has room again.
// usage: node openai_flex.mjs http://127.0.0.1:8080/v1
import OpenAI from "openai";
import assert from "node:assert/strict";

const request = {
  model: "qwen3-8b", max_tokens: 2, service_tier: "flex", messages: [{ role: "user", content: "hi" }],
};

const once = new OpenAI({ baseURL: process.argv[2], apiKey: "unused", maxRetries: 0 });
try {
  await once.chat.completions.create(request);
  assert.fail("a flex request on a saturated fleet was served");
} catch (e) {
  assert.ok(e instanceof OpenAI.RateLimitError, `expected a RateLimitError, got ${e}`);
  assert.equal(e.status, 429);
  assert.equal(e.code, "fleet_saturated");
  assert.equal(e.headers["retry-after"], "1");
}

const patient = new OpenAI({ baseURL: process.argv[2], apiKey: "unused", maxRetries: 20 });
const started = Date.now();
const served = await patient.chat.completions.create(request);
assert.equal(served.usage.completion_tokens, 2);
console.log(`flex request served after ${((Date.now() - started) / 1000).toFixed(1)} s of retries`);
