// The official openai npm client, unchanged, against kvroute over TLS with a client API key: the certificate
// is trusted through NODE_EXTRA_CA_CERTS, as a deployment with a private CA would do. A wrong key is refused.
// usage: NODE_EXTRA_CA_CERTS=cert.pem node openai_tls.mjs https://127.0.0.1:8443/v1 KEY
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL, apiKey] = process.argv.slice(2);
const model = "qwen3-8b";
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

const chat = await client.chat.completions.create({
  model, max_tokens: 6, messages: [{ role: "user", content: "Say hello over TLS." }],
});
assert.ok(chat.choices[0].message.content.length > 0, "chat content");
assert.equal(chat.usage.completion_tokens, 6);

let text = "";
let usage = null;
const stream = await client.chat.completions.create({
  model, max_tokens: 8, stream: true, stream_options: { include_usage: true },
  messages: [{ role: "user", content: "Stream over TLS." }],
});
for await (const chunk of stream) {
  if (chunk.choices.length > 0) text += chunk.choices[0].delta.content ?? "";
  if (chunk.usage) usage = chunk.usage;
}
assert.ok(text.length > 0, "streamed text");
assert.equal(usage.completion_tokens, 8);

const models = await client.models.list();
assert.ok(models.data.some((m) => m.id === model), "models listed");

const wrong = new OpenAI({ baseURL, apiKey: "not-a-key", maxRetries: 0 });
await assert.rejects(
  wrong.chat.completions.create({ model, max_tokens: 1, messages: [{ role: "user", content: "hi" }] }),
  (e) => e.status === 401 && e.code === "invalid_api_key",
);
console.log("openai client over TLS: ok");
