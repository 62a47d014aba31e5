// The official openai npm client, unchanged, against kvroute: chat and completions, streaming and not.
// usage: node openai_router.mjs http://127.0.0.1:8080/v1
import OpenAI from "openai";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "unused" });
const model = "qwen3-8b";
const system = { role: "system", content: "You are a careful assistant. ".repeat(40) };

const chat = await client.chat.completions.create({
  model, max_tokens: 8, messages: [system, { role: "user", content: "Say hello." }],
});
assert.ok(chat.choices[0].message.content.length > 0, "chat content");
assert.equal(chat.usage.completion_tokens, 8);

const again = await client.chat.completions.create({
  model, max_tokens: 8, messages: [system, { role: "user", content: "Say hello again." }],
});
assert.ok(again.usage.prompt_tokens_details.cached_tokens > 0, "shared system prompt is cached");

let text = "";
let usage = null;
const stream = await client.chat.completions.create({
  model, max_tokens: 12, stream: true, stream_options: { include_usage: true },
  messages: [system, { role: "user", content: "Stream something." }],
});
for await (const chunk of stream) {
  if (chunk.choices.length > 0) text += chunk.choices[0].delta.content ?? "";
  if (chunk.usage) usage = chunk.usage;
}
assert.ok(text.length > 0, "streamed text");
assert.equal(usage.completion_tokens, 12);

const completion = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 5 });
assert.ok(completion.choices[0].text.length > 0, "completion text");

let pieces = 0;
const cstream = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 5, stream: true });
for await (const chunk of cstream) pieces += chunk.choices.length;
assert.ok(pieces >= 5, "completion stream pieces");

const models = await client.models.list();
assert.ok(models.data.some((m) => m.id === model), "models list");
console.log("openai client through kvroute: ok");
