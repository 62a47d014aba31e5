// The official `openai` npm client against kvroute-sim: non-streaming and streaming chat and completions,
// usage.prompt_tokens_details.cached_tokens (present always, growing when a prefix is re-sent).
//
// Usage: KVROUTE_BIN_DIR=<build>/bin node openai_sim.mjs      (or KVROUTE_SIM_URL=http://host:port/v1 to use
// a running worker). Exits 0 when every check passes; prints the failed check and exits 1 otherwise.
import { spawn } from "node:child_process";
import net from "node:net";
import assert from "node:assert/strict";
import OpenAI from "openai";

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

async function waitHealthy(base, child) {
  const deadline = Date.now() + 15000;
  while (Date.now() < deadline) {
    if (child && child.exitCode !== null) throw new Error(`kvroute-sim exited with ${child.exitCode}`);
    try {
      const r = await fetch(`${base}/health`);
      if (r.status === 200) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("kvroute-sim did not become healthy");
}

async function main() {
  let child = null;
  let baseURL = process.env.KVROUTE_SIM_URL;
  if (!baseURL) {
    const binDir = process.env.KVROUTE_BIN_DIR;
    if (!binDir) throw new Error("set KVROUTE_BIN_DIR (directory of kvroute-sim) or KVROUTE_SIM_URL");
    const port = await freePort();
    child = spawn(`${binDir}/kvroute-sim`,
                  ["--host", "127.0.0.1", "--port", String(port), "--speed", "200", "--served-model-name", "sim"],
                  { stdio: ["ignore", "inherit", "inherit"] });
    baseURL = `http://127.0.0.1:${port}/v1`;
    await waitHealthy(`http://127.0.0.1:${port}`, child);
  }
  const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 30000 });
  try {
    const models = await client.models.list();
    const model = models.data[0].id;
    assert.ok(model, "a model id");

    // Non-streaming chat; the same prefix again reports cached tokens.
    const longText = "The router sends each request to the worker that already holds its prefix. ".repeat(30);
    const messages = [{ role: "user", content: longText }];
    const c1 = await client.chat.completions.create({ model, messages, max_tokens: 8 });
    assert.equal(c1.object, "chat.completion");
    assert.equal(c1.choices[0].message.role, "assistant");
    assert.ok(c1.choices[0].message.content.length > 0);
    assert.equal(c1.usage.completion_tokens, 8);
    assert.equal(typeof c1.usage.prompt_tokens_details.cached_tokens, "number");
    assert.equal(c1.usage.prompt_tokens_details.cached_tokens, 0, "fresh prefix: nothing cached");
    const c2 = await client.chat.completions.create({ model, messages, max_tokens: 8 });
    assert.ok(c2.usage.prompt_tokens_details.cached_tokens >= c1.usage.prompt_tokens - 32,
              `cached_tokens ${c2.usage.prompt_tokens_details.cached_tokens} of ${c1.usage.prompt_tokens}`);
    assert.equal(c2.choices[0].message.content, c1.choices[0].message.content, "deterministic output");

    // Streaming chat with include_usage.
    const stream = await client.chat.completions.create({
      model, messages: [{ role: "user", content: "Stream, please." }], max_tokens: 5, stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let usage = null;
    let finish = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices) {
        text += choice.delta?.content ?? "";
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    assert.ok(text.length > 0);
    assert.equal(finish, "length");
    assert.ok(usage, "usage chunk");
    assert.equal(usage.completion_tokens, 5);
    assert.equal(typeof usage.prompt_tokens_details.cached_tokens, "number");

    // Completions, non-streaming and streaming; same prompt, same text.
    const prompt = "Once upon a time, a cache";
    const p1 = await client.completions.create({ model, prompt, max_tokens: 6 });
    assert.equal(p1.object, "text_completion");
    assert.equal(p1.usage.completion_tokens, 6);
    assert.equal(typeof p1.usage.prompt_tokens_details.cached_tokens, "number");
    const ps = await client.completions.create({ model, prompt, max_tokens: 6, stream: true,
                                                 stream_options: { include_usage: true } });
    let streamed = "";
    let streamUsage = null;
    for await (const chunk of ps) {
      if (chunk.usage) streamUsage = chunk.usage;
      for (const choice of chunk.choices) streamed += choice.text ?? "";
    }
    assert.equal(streamed, p1.choices[0].text);
    assert.equal(streamUsage.prompt_tokens, p1.usage.prompt_tokens);

    // Bad input surfaces as the client's API error with a 4xx status.
    await assert.rejects(client.completions.create({ model: "no-such-model", prompt: "x" }),
                         (e) => e.status === 404);
    await assert.rejects(client.completions.create({ model, prompt: "x", max_tokens: -5 }),
                         (e) => e.status === 400);
    console.log("openai_sim: all checks passed");
  } finally {
    if (child) child.kill("SIGTERM");
  }
}

main().catch((e) => {
  console.error("openai_sim: FAILED:", e);
  process.exit(1);
});
