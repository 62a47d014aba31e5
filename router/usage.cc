#include "router/usage.h"

#include <cstdint>
#include <cstring>
#include <string>

#include <boost/json/basic_parser_impl.hpp>

namespace kvroute::router {
namespace {

namespace json = boost::json;

// A key of the first levels, kept without allocating; a longer key than any the handler looks for is only
// marked as such.
class Key {
 public:
  void clear() { size_ = 0; }
  void append(json::string_view part) {
    if (size_ + part.size() > sizeof(buf_)) {
      size_ = sizeof(buf_) + 1;  // matches nothing
      return;
    }
    std::memcpy(buf_ + size_, part.data(), part.size());
    size_ += part.size();
  }
  bool operator==(std::string_view s) const { return size_ == s.size() && std::memcmp(buf_, s.data(), s.size()) == 0; }

 private:
  char buf_[32];
  std::size_t size_ = 0;
};

// What every handler of json::basic_parser here shares: no size limits of its own (the bodies are bounded
// where they are read), events a handler has no use for accepted, and the depth and the current key of each of
// the first levels (keys_[d]: the key at depth d, 1-based; objects and arrays both count as a level). A handler
// declares the events it reads, which hide these.
class KeyedHandler {
 public:
  static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);

  bool on_document_begin(json::error_code&) { return true; }
  bool on_document_end(json::error_code&) { return true; }
  bool on_object_begin(json::error_code&) { return open(); }
  bool on_object_end(std::size_t, json::error_code&) { return close(); }
  bool on_array_begin(json::error_code&) { return open(); }
  bool on_array_end(std::size_t, json::error_code&) { return close(); }
  bool on_key_part(json::string_view part, std::size_t, json::error_code&) {
    if (depth_ < kKeys) {
      if (!key_open_) keys_[depth_].clear();
      keys_[depth_].append(part);
    }
    key_open_ = true;
    return true;
  }
  bool on_key(json::string_view part, std::size_t n, json::error_code& ec) {
    on_key_part(part, n, ec);
    key_open_ = false;
    return true;
  }
  bool on_string_part(json::string_view, std::size_t, json::error_code&) { return true; }
  bool on_string(json::string_view, std::size_t, json::error_code&) { return true; }
  bool on_number_part(json::string_view, json::error_code&) { return true; }
  bool on_int64(std::int64_t, json::string_view, json::error_code&) { return true; }
  bool on_uint64(std::uint64_t, json::string_view, json::error_code&) { return true; }
  bool on_double(double, json::string_view, json::error_code&) { return true; }
  bool on_bool(bool, json::error_code&) { return true; }
  bool on_null(json::error_code&) { return true; }
  bool on_comment_part(json::string_view, json::error_code&) { return true; }
  bool on_comment(json::string_view, json::error_code&) { return true; }

 protected:
  static constexpr int kKeys = 4;

  bool open() {
    ++depth_;
    if (depth_ < kKeys) keys_[depth_].clear();
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }

  int depth_ = 0;  // objects and arrays open
  bool key_open_ = false;
  Key keys_[kKeys];
};

// Reads a usage object: prompt_tokens and completion_tokens at its top level, cached_tokens of its
// prompt_tokens_details (or the Responses API's input_tokens, output_tokens, input_tokens_details). Every
// other event is accepted and ignored.
//   Usage mode: the document is the usage object itself.
//   Chunk mode: the document is a stream chunk; its usage is the member "usage", and the handler also notes
//   whether the chunk's "choices" is an empty array and its "usage" an object.
class UsageHandler : public KeyedHandler {
 public:
  enum class Mode { kUsage, kChunk };
  explicit UsageHandler(Mode mode) : base_(mode == Mode::kChunk ? 1 : 0) {}

  Usage usage;
  bool empty_choices = false;  // chunk mode: "choices": []
  bool usage_object = false;   // chunk mode: "usage": {...}

  bool on_object_begin(json::error_code&) {
    element();
    open();
    if (base_ == 1 && depth_ == 2 && keys_[1] == "usage") usage_object = true;
    return true;
  }
  bool on_array_begin(json::error_code&) {
    element();
    open();
    ++arrays_;
    if (base_ == 1 && depth_ == 2 && keys_[1] == "choices") empty_choices = true;
    return true;
  }
  bool on_array_end(std::size_t, json::error_code&) {
    --arrays_;
    return close();
  }
  bool on_string(json::string_view, std::size_t, json::error_code&) { return element(); }
  bool on_int64(std::int64_t v, json::string_view, json::error_code&) {
    element();
    if (v > 0) count(static_cast<std::uint64_t>(v));
    return true;
  }
  bool on_uint64(std::uint64_t v, json::string_view, json::error_code&) {
    element();
    count(v);
    return true;
  }
  bool on_double(double, json::string_view, json::error_code&) { return element(); }
  bool on_bool(bool, json::error_code&) { return element(); }
  bool on_null(json::error_code&) { return element(); }

 private:
  // A value begins at the current depth: an element of the chunk's choices makes them non-empty.
  bool element() {
    if (base_ == 1 && depth_ == 2 && arrays_ == 1 && keys_[1] == "choices") empty_choices = false;
    return true;
  }
  void count(std::uint64_t v) {
    if (arrays_ > 0) return;
    if (base_ == 1 && !(depth_ >= 2 && keys_[1] == "usage")) return;
    const int d = depth_ - base_;
    // The Responses API names the same counts input_tokens, output_tokens and input_tokens_details.
    if (d == 1) {
      if (keys_[depth_] == "prompt_tokens" || keys_[depth_] == "input_tokens") usage.prompt_tokens = v;
      else if (keys_[depth_] == "completion_tokens" || keys_[depth_] == "output_tokens") usage.completion_tokens = v;
    } else if (d == 2 && (keys_[depth_ - 1] == "prompt_tokens_details" || keys_[depth_ - 1] == "input_tokens_details") &&
               keys_[depth_] == "cached_tokens") {
      usage.cached_tokens = v;
    }
  }

  const int base_;  // depth of the usage object's members, minus one
  int arrays_ = 0;  // arrays open: numbers in them are not counts
};

// Reads the string value of the key "status" of the top-level object; every other event is accepted and
// ignored. Values over 64 bytes are not a status and are dropped.
class StatusHandler : public KeyedHandler {
 public:
  std::string status;
  bool found = false;

  bool on_string_part(json::string_view part, std::size_t, json::error_code&) {
    if (at_status() && value_.size() + part.size() <= 64) value_.append(part);
    return true;
  }
  bool on_string(json::string_view part, std::size_t n, json::error_code& ec) {
    on_string_part(part, n, ec);
    if (at_status() && value_.size() <= 64) {
      status = value_;
      found = true;
    }
    value_.clear();
    return true;
  }

 private:
  // A value of the response's own "status" (its members are at depth 1).
  bool at_status() const { return depth_ == 1 && keys_[1] == "status"; }

  std::string value_;
};

// Where the object that is the value of the key ending at `key_end` begins: the first '{' after only whitespace
// and ':'; npos for another value ("usage": null in intermediate chunks).
std::size_t object_after(std::string_view text, std::size_t key_end) {
  std::size_t i = key_end;
  while (i < text.size() && (text[i] == ' ' || text[i] == ':' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t')) ++i;
  return i < text.size() && text[i] == '{' ? i : std::string_view::npos;
}

// Whether a "usage" key with an object value occurs in `text`. Inside a JSON string the quotes would be
// escaped, so only keys (and a string value "usage") match. The search runs memchr on the key's 'u', a letter
// stream chunks have few of: on chunks of a few hundred bytes that costs a tenth of a generic substring search,
// which builds a shift table on every call.
bool has_usage_object(std::string_view text) {
  for (std::size_t from = 1; from < text.size();) {
    const void* u = std::memchr(text.data() + from, 'u', text.size() - from);
    if (u == nullptr) return false;
    const auto at = static_cast<std::size_t>(static_cast<const char*>(u) - text.data());
    from = at + 1;
    if (text[at - 1] == '"' && text.compare(at, 6, "usage\"") == 0 && object_after(text, at + 6) != std::string_view::npos) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::optional<Usage> find_usage(std::string_view tail) {
  for (std::size_t pos = tail.rfind("\"usage\""); pos != std::string_view::npos;
       pos = pos == 0 ? std::string_view::npos : tail.rfind("\"usage\"", pos - 1)) {
    const std::size_t i = object_after(tail, pos + 7);
    if (i == std::string_view::npos) continue;
    json::basic_parser<UsageHandler> parser(json::parse_options{}, UsageHandler::Mode::kUsage);
    json::error_code ec;
    parser.write_some(true, tail.data() + i, tail.size() - i, ec);
    if (ec || !parser.done()) continue;
    return parser.handler().usage;
  }
  return std::nullopt;
}

std::optional<Usage> usage_only_chunk(std::string_view chunk) {
  // Most chunks carry tokens and no usage object: a substring search turns them away before any parsing.
  if (!has_usage_object(chunk)) return std::nullopt;
  json::basic_parser<UsageHandler> parser(json::parse_options{}, UsageHandler::Mode::kChunk);
  json::error_code ec;
  parser.write_some(false, chunk.data(), chunk.size(), ec);
  if (ec || !parser.done()) return std::nullopt;
  const UsageHandler& h = parser.handler();
  if (!h.empty_choices || !h.usage_object) return std::nullopt;
  return h.usage;
}

struct ResponseStatusReader::Parser {
  json::basic_parser<StatusHandler> parser{json::parse_options{}};
  bool failed = false;
};

ResponseStatusReader::ResponseStatusReader() : parser_(std::make_unique<Parser>()) {}
ResponseStatusReader::~ResponseStatusReader() = default;

void ResponseStatusReader::feed(std::string_view piece) {
  if (parser_->failed || piece.empty()) return;
  json::error_code ec;
  parser_->parser.write_some(true, piece.data(), piece.size(), ec);
  if (ec) parser_->failed = true;
}

std::optional<std::string> ResponseStatusReader::finish() {
  if (parser_->failed) return std::nullopt;
  json::error_code ec;
  parser_->parser.write_some(false, nullptr, 0, ec);
  if (ec || !parser_->parser.done() || !parser_->parser.handler().found) return std::nullopt;
  return parser_->parser.handler().status;
}

bool final_response_status(std::string_view status) {
  return status == "completed" || status == "failed" || status == "cancelled" || status == "incomplete";
}

}  // namespace kvroute::router
