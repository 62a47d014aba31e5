#include "router/usage.h"

#include <cstdint>
#include <string>

#include <boost/json/basic_parser_impl.hpp>

namespace kvroute::router {
namespace {

namespace json = boost::json;

// Keeps prompt_tokens and completion_tokens of the usage object (depth 1) and cached_tokens of its
// prompt_tokens_details (depth 2); every other event is accepted and ignored.
class UsageHandler {
 public:
  static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);

  Usage usage;

  bool on_document_begin(json::error_code&) { return true; }
  bool on_document_end(json::error_code&) { return true; }
  bool on_object_begin(json::error_code&) {
    ++depth_;
    if (depth_ == 2) key2_.clear();
    return true;
  }
  bool on_object_end(std::size_t, json::error_code&) {
    --depth_;
    return true;
  }
  bool on_array_begin(json::error_code&) {
    ++depth_;
    ++arrays_;
    return true;
  }
  bool on_array_end(std::size_t, json::error_code&) {
    --depth_;
    --arrays_;
    return true;
  }
  bool on_key_part(json::string_view part, std::size_t, json::error_code&) {
    partial_.append(part.data(), part.size());
    return true;
  }
  bool on_key(json::string_view part, std::size_t, json::error_code&) {
    std::string& key = depth_ == 1 ? key1_ : key2_;
    key.assign(partial_);
    key.append(part.data(), part.size());
    partial_.clear();
    return true;
  }
  bool on_string_part(json::string_view, std::size_t, json::error_code&) { return true; }
  bool on_string(json::string_view, std::size_t, json::error_code&) { return true; }
  bool on_number_part(json::string_view, json::error_code&) { return true; }
  bool on_int64(std::int64_t v, json::string_view, json::error_code&) {
    if (v > 0) count(static_cast<std::uint64_t>(v));
    return true;
  }
  bool on_uint64(std::uint64_t v, json::string_view, json::error_code&) {
    count(v);
    return true;
  }
  bool on_double(double, json::string_view, json::error_code&) { return true; }
  bool on_bool(bool, json::error_code&) { return true; }
  bool on_null(json::error_code&) { return true; }
  bool on_comment_part(json::string_view, json::error_code&) { return true; }
  bool on_comment(json::string_view, json::error_code&) { return true; }

 private:
  void count(std::uint64_t v) {
    if (arrays_ > 0) return;
    if (depth_ == 1) {
      if (key1_ == "prompt_tokens") usage.prompt_tokens = v;
      else if (key1_ == "completion_tokens") usage.completion_tokens = v;
    } else if (depth_ == 2 && key1_ == "prompt_tokens_details" && key2_ == "cached_tokens") {
      usage.cached_tokens = v;
    }
  }

  int depth_ = 0;   // objects and arrays open
  int arrays_ = 0;  // arrays open: numbers in them are not counts
  std::string key1_, key2_, partial_;
};

}  // namespace

std::optional<Usage> find_usage(std::string_view tail) {
  for (std::size_t pos = tail.rfind("\"usage\""); pos != std::string_view::npos;
       pos = pos == 0 ? std::string_view::npos : tail.rfind("\"usage\"", pos - 1)) {
    std::size_t i = pos + 7;
    while (i < tail.size() && (tail[i] == ' ' || tail[i] == ':' || tail[i] == '\n' || tail[i] == '\r' || tail[i] == '\t')) ++i;
    if (i >= tail.size() || tail[i] != '{') continue;  // "usage": null in intermediate chunks
    json::basic_parser<UsageHandler> parser(json::parse_options{});
    json::error_code ec;
    parser.write_some(true, tail.data() + i, tail.size() - i, ec);
    if (ec || !parser.done()) continue;
    return parser.handler().usage;
  }
  return std::nullopt;
}

}  // namespace kvroute::router
