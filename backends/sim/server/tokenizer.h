// SimTokenizer: the simulated worker's deterministic tokenizer, chat template and text generator.
//
// kvroute-sim has no real vocabulary; what matters to the router and the benchmark is that (1) the same text
// always gives the same token ids, (2) English-like text gives about 4 bytes per token, as real BPE
// tokenizers do, and (3) a chat conversation's prompt at turn n is a token prefix of its prompt at turn n+1,
// so prefix caching behaves as it does on vLLM.
//
// Tokenization recipe (version 1, stable; tests pin it):
//   - Text is cut into pieces: a run of letters/digits/'_'/non-ASCII bytes together with the one white space
//     byte right before it (" quick"; longer white space runs give the rest as a piece of its own), a run
//     of white space not followed by a word, or one punctuation byte.
//   - A piece of at most 6 bytes is one token; a longer piece is cut into 4-byte chunks (the last may be
//     shorter). On English prose this averages 4-5 bytes per token.
//   - Each piece maps to XXH3-64(piece, seed = 0x6b76726f75746531) mod (2^31 - kFirstTextToken)
//     + kFirstTextToken, i.e. an id in [1024, 2^31). Ids below 1024 are reserved for special tokens.
//
// Chat template: each message is rendered as  <|im_start|> role "\n" content <|im_end|> "\n"  with the
// content tokenized on its own (so a message's tokens never depend on what follows it), and the prompt ends
// with the generation prompt <|im_start|> "assistant" "\n". The next turn's assistant message starts with
// exactly those tokens, hence the prefix property.
//
//   std::vector<uint32_t> ids = kvroute::sim::tokenize("Hello, world!");   // 4 tokens
//   auto chat = kvroute::sim::render_chat(body.at("messages"));           // Result<std::vector<uint32_t>>
//   std::string out = kvroute::sim::generated_piece(seed, 3);             // the 4th output token's text
//   auto turn2 = kvroute::sim::continue_chat(prompt_and_output, *render_chat(next_messages));
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/fwd.hpp>

#include "util/result.h"

namespace kvroute::sim {

inline constexpr std::uint32_t kBosToken = 1;
inline constexpr std::uint32_t kImStartToken = 2;
inline constexpr std::uint32_t kImEndToken = 3;
inline constexpr std::uint32_t kNewlineToken = 4;
inline constexpr std::uint32_t kFirstTextToken = 1024;
// Exclusive upper bound of every token id (ids fit a signed 32-bit integer).
inline constexpr std::uint32_t kVocabEnd = 0x80000000u;

// Appends the tokens of `text` to `out`.
void tokenize_append(std::string_view text, std::vector<std::uint32_t>& out);
std::vector<std::uint32_t> tokenize(std::string_view text);

// Renders an OpenAI `messages` array through the chat template (with the generation prompt) and tokenizes
// it. Content may be a string, null, or an array of parts whose "text" parts are concatenated.
Result<std::vector<std::uint32_t>> render_chat(const boost::json::value& messages);

// A conversation continued (the Responses API's previous_response_id): `history` is an earlier prompt from
// render_chat() followed by the tokens of its generated output; the assistant message is closed
// (<|im_end|> "\n") and `next` (a render_chat() of the new messages) follows. Because generated text
// tokenizes back into the same pieces, the result equals render_chat() of the whole conversation with the
// output as an assistant message, and `history` is an exact prefix of it.
std::vector<std::uint32_t> continue_chat(std::span<const std::uint32_t> history, std::span<const std::uint32_t> next);

// A 64-bit fingerprint of a prompt, the seed of its generated text: same prompt, same output.
std::uint64_t prompt_fingerprint(std::span<const std::uint32_t> tokens, std::uint64_t seed);

// Text of output token `index` of a generation seeded by `fingerprint`: a short English-like word with a
// leading space (one token each, 3-7 bytes).
std::string_view generated_piece(std::uint64_t fingerprint, std::uint64_t index);

}  // namespace kvroute::sim
