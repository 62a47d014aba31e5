// The official openai npm client, unchanged, against kvroute: chat, completions and responses, streaming and
// not.
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

// Responses API: each continuation must reach the worker that stores the response it continues.
let response = await client.responses.create({
  model, instructions: system.content, input: "Plan a short trip.", max_output_tokens: 6,
});
assert.ok(response.id.startsWith("resp_"), "response id");
assert.ok(response.output_text.length > 0, "response text");
for (let turn = 0; turn < 4; turn++) {
  response = await client.responses.create({
    model, input: `And then, step ${turn}?`, previous_response_id: response.id, max_output_tokens: 4,
  });
  assert.ok(response.usage.input_tokens_details.cached_tokens > 0, "continuation cached on its worker");
}
let streamed = "";
let completed = null;
const rstream = await client.responses.create({
  model, input: "One more step.", previous_response_id: response.id, max_output_tokens: 5, stream: true,
});
for await (const event of rstream) {
  if (event.type === "response.output_text.delta") streamed += event.delta;
  if (event.type === "response.completed") completed = event.response;
}
assert.ok(streamed.length > 0, "streamed response text");
assert.equal(completed.usage.output_tokens, 5);
const stored = await client.responses.retrieve(completed.id);
assert.equal(stored.id, completed.id, "stored response read back");
// The SDK's accumulating stream helper needs vLLM's whole event sequence (items and parts opened and done).
const helper = client.responses.stream({
  model, input: "Last step.", previous_response_id: completed.id, max_output_tokens: 3,
});
const final = await helper.finalResponse();
assert.equal(final.usage.output_tokens, 3);
assert.ok(final.output[0].content[0].text.length > 0, "accumulated response text");
// In the background: answered at once, polled until done, and cancelled, each on the worker running it.
let job = await client.responses.create({ model, input: "Think it over.", max_output_tokens: 20, background: true });
assert.equal(job.status, "queued");
for (let i = 0; i < 300 && job.status !== "completed"; i++) {
  await new Promise((resolve) => setTimeout(resolve, 10));
  job = await client.responses.retrieve(job.id);
}
assert.equal(job.status, "completed", "background response completed");
assert.equal(job.usage.output_tokens, 20);
const long = await client.responses.create({ model, input: "Go on forever.", max_output_tokens: 30000, background: true });
await client.responses.cancel(long.id);
assert.equal((await client.responses.retrieve(long.id)).status, "cancelled", "background response cancelled");

const models = await client.models.list();
assert.ok(models.data.some((m) => m.id === model), "models list");
console.log("openai client through kvroute: ok");
