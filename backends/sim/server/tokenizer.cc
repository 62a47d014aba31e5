#include "backends/sim/server/tokenizer.h"

#include <array>

#include <boost/json/value.hpp>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvroute::sim {
namespace {

constexpr std::uint64_t kPieceSeed = 0x6b76726f75746531ull;  // "kvroute1"
constexpr std::size_t kMaxWholePiece = 6;
constexpr std::size_t kChunk = 4;

bool is_word_byte(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80;
}
bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::uint32_t piece_id(std::string_view piece) {
  const std::uint64_t h = XXH3_64bits_withSeed(piece.data(), piece.size(), kPieceSeed);
  return static_cast<std::uint32_t>(h % (kVocabEnd - kFirstTextToken)) + kFirstTextToken;
}

void emit(std::string_view piece, std::vector<std::uint32_t>& out) {
  if (piece.size() <= kMaxWholePiece) {
    out.push_back(piece_id(piece));
    return;
  }
  for (std::size_t i = 0; i < piece.size(); i += kChunk) out.push_back(piece_id(piece.substr(i, kChunk)));
}

// Short words, so that one generated token is 3-7 bytes like a real one. The list is part of the output
// format only (not of any hash), but keep it stable so recorded outputs stay comparable.
constexpr std::array<std::string_view, 64> kWords = {
    " the",   " cache", " of",    " and",   " a",     " to",    " block", " in",    " is",    " token",
    " that",  " for",   " it",    " as",    " with",  " on",    " hit",   " be",    " at",    " by",
    " this",  " from",  " or",    " an",    " which", " are",   " was",   " we",    " can",   " all",
    " model", " but",   " not",   " one",   " time",  " has",   " more",  " GPU",   " will",  " each",
    " so",    " when",  " route", " than",  " its",   " new",   " into",  " fast",  " two",   " way",
    " may",   " only",  " then",  " out",   " any",   " up",    " work",  " same",  " load",  " over",
    ".",      ",",      " path",  " data"};

}  // namespace

void tokenize_append(std::string_view text, std::vector<std::uint32_t>& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const std::size_t start = i;
    if (is_space(s[i])) {
      while (i < n && is_space(s[i])) ++i;
      // White space belongs to the word that follows it (" quick"), as in GPT-style pre-tokenizers; only
      // the last white space byte is taken so that indentation stays its own token.
      if (i < n && is_word_byte(s[i])) {
        if (i - start > 1) emit(text.substr(start, i - 1 - start), out);
        const std::size_t word = i - 1;
        while (i < n && is_word_byte(s[i])) ++i;
        emit(text.substr(word, i - word), out);
      } else {
        emit(text.substr(start, i - start), out);
      }
    } else if (is_word_byte(s[i])) {
      while (i < n && is_word_byte(s[i])) ++i;
      emit(text.substr(start, i - start), out);
    } else {
      ++i;
      emit(text.substr(start, 1), out);
    }
  }
}

std::vector<std::uint32_t> tokenize(std::string_view text) {
  std::vector<std::uint32_t> out;
  out.reserve(text.size() / 4 + 1);
  tokenize_append(text, out);
  return out;
}

Result<std::vector<std::uint32_t>> render_chat(const boost::json::value& messages) {
  const auto* arr = messages.if_array();
  if (arr == nullptr) return make_error("'messages' must be an array of message objects");
  if (arr->empty()) return make_error("'messages' must not be empty");
  std::vector<std::uint32_t> out;
  std::string text;
  for (std::size_t m = 0; m < arr->size(); ++m) {
    const auto* msg = (*arr)[m].if_object();
    if (msg == nullptr) return make_error("messages[" + std::to_string(m) + "] must be an object");
    const auto* role = msg->if_contains("role");
    if (role == nullptr || !role->is_string())
      return make_error("messages[" + std::to_string(m) + "].role must be a string");
    text.clear();
    if (const auto* content = msg->if_contains("content"); content != nullptr && !content->is_null()) {
      if (content->is_string()) {
        text.assign(content->get_string());
      } else if (const auto* parts = content->if_array()) {
        for (const auto& p : *parts) {
          const auto* po = p.if_object();
          if (po == nullptr) return make_error("messages[" + std::to_string(m) + "].content parts must be objects");
          if (const auto* t = po->if_contains("text"); t != nullptr && t->is_string()) text.append(t->get_string());
        }
      } else {
        return make_error("messages[" + std::to_string(m) + "].content must be a string, an array or null");
      }
    }
    out.push_back(kImStartToken);
    tokenize_append(role->get_string(), out);
    out.push_back(kNewlineToken);
    tokenize_append(text, out);
    out.push_back(kImEndToken);
    out.push_back(kNewlineToken);
  }
  out.push_back(kImStartToken);
  tokenize_append("assistant", out);
  out.push_back(kNewlineToken);
  return out;
}

std::vector<std::uint32_t> continue_chat(std::span<const std::uint32_t> history, std::span<const std::uint32_t> next) {
  std::vector<std::uint32_t> out;
  out.reserve(history.size() + 2 + next.size());
  out.assign(history.begin(), history.end());
  out.push_back(kImEndToken);
  out.push_back(kNewlineToken);
  out.insert(out.end(), next.begin(), next.end());
  return out;
}

std::uint64_t prompt_fingerprint(std::span<const std::uint32_t> tokens, std::uint64_t seed) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), seed);
}

std::string_view generated_piece(std::uint64_t fingerprint, std::uint64_t index) {
  // splitmix64 of (fingerprint, index): cheap, and every output position is independent.
  std::uint64_t z = fingerprint + (index + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return kWords[z % kWords.size()];
}

}  // namespace kvroute::sim
