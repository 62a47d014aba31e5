#include "router/request.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <optional>

#include <boost/json.hpp>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "hashing/chat_canonical.h"
#include "router/cache_salt.h"

namespace kvroute::router {

namespace json = boost::json;

namespace {

constexpr std::size_t kAffinityChars = 100;  // KubeAI PrefixHash hashes the first 100 characters

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

Error field_error(const std::string& field, const std::string& what, const char* code = "invalid_type") {
  return make_error("'" + field + "' " + what, 400, "invalid_request_error", code);
}

// Text of the first user message, for the affinity key.
std::string first_user_text(const json::array& messages) {
  for (const auto& m : messages) {
    const auto* obj = m.if_object();
    if (!obj) continue;
    const auto* role = obj->if_contains("role");
    if (!role || !role->is_string() || role->get_string() != "user") continue;
    const auto* content = obj->if_contains("content");
    if (!content) return {};
    if (content->is_string()) return std::string(content->get_string());
    if (content->is_array()) {
      std::string out;
      for (const auto& p : content->get_array()) {
        if (const auto* po = p.if_object()) {
          if (const auto* t = po->if_contains("text"); t && t->is_string()) out += t->get_string();
        }
        if (out.size() >= kAffinityChars) break;
      }
      return out;
    }
    return {};
  }
  return {};
}

Result<bool> read_token_ids(const json::array& arr, std::vector<std::uint32_t>& out, const char* field) {
  out.reserve(arr.size());
  for (const auto& v : arr) {
    if (v.is_int64() && v.get_int64() >= 0 && v.get_int64() <= 0xffffffffll) {
      out.push_back(static_cast<std::uint32_t>(v.get_int64()));
    } else if (v.is_uint64() && v.get_uint64() <= 0xffffffffull) {
      out.push_back(static_cast<std::uint32_t>(v.get_uint64()));
    } else {
      return field_error(field, "token ids must be integers from 0 to 4294967295");
    }
  }
  return true;
}

// Responses API function tools ({"type":"function","name",...}) in the chat shape ({"type":"function",
// "function":{...}}) that /tokenize renders; built-in tools (web search, ...) have no chat counterpart.
json::array chat_tools(const json::array& tools) {
  json::array out;
  for (const auto& t : tools) {
    const auto* o = t.if_object();
    const auto* type = o ? o->if_contains("type") : nullptr;
    if (!type || !type->is_string() || type->get_string() != "function") continue;
    if (o->contains("function")) {
      out.push_back(t);
      continue;
    }
    json::object fn;
    for (const auto& kv : *o) {
      if (kv.key() != "type" && kv.key() != "strict") fn[kv.key()] = kv.value();
    }
    out.push_back(json::object{{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// The body sent to the worker: the client's, asking for usage (`ask_usage`) and carrying `salt` as its
// cache_salt (none when empty), whatever cache_salt the client sent.
std::string upstream_body(std::string_view body, json::value& doc, bool ask_usage, const std::string& salt) {
  json::object& obj = doc.as_object();
  const bool edit_usage = ask_usage && obj.contains("stream_options");
  if (!edit_usage && !obj.contains("cache_salt")) {
    // The common case (the OpenAI clients stream without stream_options, and send no cache_salt): splice the
    // members in after the opening brace instead of serializing the whole document again, which doubled the
    // parse of an 8K-token request (15.3 µs against 8.4; kvroute-routing-bench BM_ParseStreamRewrite). The
    // object has at least `model`, so the comma is always followed by a member. The salt is hex: no escapes.
    constexpr std::string_view kAskUsage = R"("stream_options":{"include_usage":true},)";
    const std::size_t brace = body.find('{') + 1;
    std::string out;
    out.reserve(body.size() + kAskUsage.size() + salt.size() + 16);
    out.append(body.substr(0, brace));
    if (ask_usage) out.append(kAskUsage);
    if (!salt.empty()) out.append(R"("cache_salt":")").append(salt).append("\",");
    return out.append(body.substr(brace));
  }
  if (edit_usage) {
    json::value& so = obj["stream_options"];
    if (!so.is_object()) so = json::object();
    so.as_object()["include_usage"] = true;
  }
  if (salt.empty()) {
    obj.erase("cache_salt");
  } else {
    obj["cache_salt"] = salt;
  }
  return json::serialize(doc);
}

}  // namespace

std::string error_json(const Error& e) {
  json::object err;
  err["message"] = e.message;
  err["type"] = e.type;
  if (e.code.empty()) err["code"] = nullptr; else err["code"] = e.code;
  json::object root;
  root["error"] = std::move(err);
  return json::serialize(root);
}

Result<RoutableRequest> parse_request(Endpoint endpoint, std::string_view body, const RequestHeaders& headers,
                                      const ParseOptions& options, const SaltOptions& salt) {
  // The document lives only during this call: its nodes come from a per-thread arena, the heap only past it
  // (an 8K-token chat request parses in 8.5 µs instead of 9.6; docs/overhead.md).
  thread_local std::array<unsigned char, 32 * 1024> arena;
  json::monotonic_resource resource(arena.data(), arena.size());
  boost::system::error_code ec;
  json::value doc = json::parse(body, ec, json::storage_ptr(&resource));
  if (ec) return make_error("request body is not valid JSON: " + ec.message(), 400, "invalid_request_error", "invalid_json");
  const json::object* obj = doc.if_object();
  if (!obj) return make_error("request body must be a JSON object", 400, "invalid_request_error", "invalid_json");

  RoutableRequest r;
  r.endpoint = endpoint;
  const auto* model = obj->if_contains("model");
  if (!model) return field_error("model", "is required", "missing_field");
  if (!model->is_string()) return field_error("model", "must be a string");
  r.model = model->get_string();

  if (const auto* s = obj->if_contains("stream"); s && !s->is_null()) {
    if (!s->is_bool()) return field_error("stream", "must be a boolean");
    r.stream = s->get_bool();
  }
  if (const auto* so = obj->if_contains("stream_options"); so && !so->is_null()) {
    if (!so->is_object()) return field_error("stream_options", "must be an object");
    if (const auto* iu = so->get_object().if_contains("include_usage"); iu && !iu->is_null()) {
      if (!iu->is_bool()) return field_error("stream_options.include_usage", "must be a boolean");
      r.include_usage = iu->get_bool();
    }
  }
  for (const char* f : {"max_tokens", "max_completion_tokens", "max_output_tokens"}) {
    if (const auto* mt = obj->if_contains(f); mt && !mt->is_null()) {
      if (mt->is_int64() && mt->get_int64() >= 0 && mt->get_int64() <= 0xffffffffll) {
        r.max_tokens = static_cast<std::uint32_t>(mt->get_int64());
      } else {
        return field_error(f, "must be a non-negative integer");
      }
    }
  }

  r.sheddable = equals_ignoring_case(headers.priority, "sheddable");
  if (const auto* tier = obj->if_contains("service_tier"); tier && !tier->is_null()) {
    if (!tier->is_string()) return field_error("service_tier", "must be a string");
    r.sheddable = r.sheddable || tier->get_string() == "flex";
  }
  r.session_key = std::string(headers.session);
  if (const auto* user = obj->if_contains("user"); user && !user->is_null()) {
    if (!user->is_string()) return field_error("user", "must be a string");
    if (r.session_key.empty()) r.session_key = user->get_string();
  }
  const json::value* client_salt = obj->if_contains("cache_salt");
  if (client_salt && !client_salt->is_null() && !client_salt->is_string()) {
    return field_error("cache_salt", "must be a string");
  }
  std::string_view admitted;
  if (client_salt && client_salt->is_string() && salt.allow_client_cache_salt) {
    admitted = client_salt->get_string();
  }
  r.namespace_salt = worker_cache_salt(salt.secret, headers.tenant, admitted);
  const std::uint64_t root = hashing::namespace_root(r.model, r.namespace_salt);

  if (endpoint == Endpoint::kChatCompletions || endpoint == Endpoint::kResponses) {
    const json::value* messages = obj->if_contains("messages");
    const json::value* tools = obj->if_contains("tools");
    json::value converted, converted_tools;
    if (endpoint == Endpoint::kResponses) {
      if (const auto* prev = obj->if_contains("previous_response_id"); prev && !prev->is_null()) {
        if (!prev->is_string()) return field_error("previous_response_id", "must be a string");
        r.previous_response_id = prev->get_string();
      }
      if (const auto* bg = obj->if_contains("background"); bg && !bg->is_null()) {
        if (!bg->is_bool()) return field_error("background", "must be a boolean");
        r.background = bg->get_bool();
      }
      auto items = hashing::responses_messages(*obj);
      if (!items) return items.error();
      converted = std::move(*items);
      messages = &converted;
      if (tools && tools->is_array()) {
        converted_tools = chat_tools(tools->get_array());
        tools = &converted_tools;
      }
    }
    if (!messages) return field_error("messages", "is required", "missing_field");
    if (!messages->is_array()) return field_error("messages", "must be an array");
    if (messages->get_array().empty()) return field_error("messages", "must not be empty", "invalid_value");
    auto text = hashing::canonical_chat(*messages, tools);
    if (!text) return text.error();
    r.chain = hashing::hash_text(root, *text, options.block_bytes);
    r.affinity_key = r.model + '\0' + first_user_text(messages->get_array()).substr(0, kAffinityChars);
    if (options.tokenize) {
      json::object t;
      t["model"] = r.model;
      t["messages"] = *messages;
      if (tools && !tools->is_null()) t["tools"] = *tools;
      t["add_generation_prompt"] = true;
      r.tokenize_body = json::serialize(t);
    }
  } else {
    const auto* prompt = obj->if_contains("prompt");
    if (!prompt) return field_error("prompt", "is required", "missing_field");
    const json::value* p = prompt;
    // A batch of prompts routes on its first one: one upstream request serves the whole batch.
    if (p->is_array() && !p->get_array().empty() &&
        (p->get_array()[0].is_string() || p->get_array()[0].is_array())) {
      p = &p->get_array()[0];
    }
    if (p->is_string()) {
      const std::string_view text = p->get_string();
      r.chain = hashing::hash_text(root, text, options.block_bytes);
      r.affinity_key = r.model + '\0' + std::string(text.substr(0, kAffinityChars));
      if (options.tokenize) {
        json::object t;
        t["model"] = r.model;
        t["prompt"] = text;
        r.tokenize_body = json::serialize(t);
      }
    } else if (p->is_array()) {
      std::vector<std::uint32_t> tokens;
      auto ok = read_token_ids(p->get_array(), tokens, "prompt");
      if (!ok) return ok.error();
      r.chain = hashing::hash_tokens(root, tokens, options.block_tokens);
      std::string key = r.model + '\0';
      for (std::size_t i = 0; i < tokens.size() && i < 25; ++i) key += std::to_string(tokens[i]) + ",";
      r.affinity_key = std::move(key);
    } else {
      return field_error("prompt", "must be a string, an array of token ids, or an array of those");
    }
  }
  r.prompt_tokens = r.chain.estimated_tokens();
  if (!r.tokenize_body.empty()) r.tokenize_key = XXH3_64bits(r.tokenize_body.data(), r.tokenize_body.size());
  // The Responses API always ends a stream with its usage (in response.completed).
  // Usage feeds the router's truth metrics and learning; the client still gets the stream it asked for.
  r.strip_usage = r.stream && !r.include_usage && endpoint != Endpoint::kResponses;
  if (r.strip_usage || client_salt || !r.namespace_salt.empty()) {
    r.upstream_body = upstream_body(body, doc, r.strip_usage, r.namespace_salt);
  }
  return r;
}

namespace {

// A cursor over JSON text that steps over values without decoding them.
class Skimmer {
  // The characters that open or close something a skip must match: strings and containers.
  static constexpr std::array<bool, 256> kStructural = [] {
    std::array<bool, 256> t{};
    for (const unsigned char c : {'"', '{', '[', '}', ']'}) t[c] = true;
    return t;
  }();

 public:
  explicit Skimmer(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  void skip_space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  // After optional whitespace, consumes `c` if it comes next.
  bool take(char c) {
    skip_space();
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }

  bool at_end() {
    skip_space();
    return p_ == end_;
  }

  // A string literal at the cursor: its text between the quotes, escapes left as written.
  std::optional<std::string_view> string_literal() {
    if (p_ == end_ || *p_ != '"') return std::nullopt;
    const char* const start = ++p_;
    for (;;) {
      const auto* quote = static_cast<const char*>(std::memchr(p_, '"', static_cast<std::size_t>(end_ - p_)));
      if (quote == nullptr) return std::nullopt;
      p_ = quote + 1;
      const char* b = quote;
      while (b > start && b[-1] == '\\') --b;
      if ((quote - b) % 2 == 0) return std::string_view(start, static_cast<std::size_t>(quote - start));
    }
  }

  // One value of any kind. Containers are matched bracket for bracket, strings skipped whole; what lies
  // between (numbers, literals, separators) is passed over unchecked.
  bool skip_value() {
    skip_space();
    if (p_ == end_) return false;
    if (*p_ == '"') return string_literal().has_value();
    if (*p_ == '{' || *p_ == '[') {
      std::size_t depth = 0;
      while (p_ < end_) {
        while (p_ < end_ && !kStructural[static_cast<unsigned char>(*p_)]) ++p_;  // numbers, literals, ",:"
        if (p_ == end_) break;
        const char c = *p_;
        if (c == '"') {
          if (!string_literal()) return false;
          continue;
        }
        ++p_;
        if (c == '{' || c == '[') {
          ++depth;
        } else if ((c == '}' || c == ']') && --depth == 0) {
          return true;
        }
      }
      return false;
    }
    const char* const start = p_;
    while (p_ < end_ && *p_ != ',' && *p_ != '}' && *p_ != ']' && *p_ != ' ' && *p_ != '\n' && *p_ != '\r' &&
           *p_ != '\t')
      ++p_;
    return p_ > start;
  }

 private:
  const char* p_;
  const char* end_;
};

// The decoded text of a string literal's contents (escapes resolved); nullopt when they are invalid.
std::optional<std::string> decode_literal(std::string_view raw) {
  if (raw.find('\\') == std::string_view::npos) return std::string(raw);
  std::string quoted;
  quoted.reserve(raw.size() + 2);
  quoted.append(1, '"').append(raw).append(1, '"');
  boost::system::error_code ec;
  const json::value v = json::parse(quoted, ec);
  if (ec || !v.is_string()) return std::nullopt;
  return std::string(v.as_string());
}

// A key of the object being skimmed is `name` (written plainly or with escapes).
bool key_is(std::string_view raw, std::string_view name) {
  return raw == name || (raw.find('\\') != std::string_view::npos && decode_literal(raw) == name);
}

// From the '{' of an object, steps to the value of its first member named `key`; false when the object has
// none, is malformed, or ends before it.
bool find_member(Skimmer& s, std::string_view key) {
  if (!s.take('{')) return false;
  if (s.take('}')) return false;
  do {
    s.skip_space();
    const auto k = s.string_literal();
    if (!k || !s.take(':')) return false;
    if (key_is(*k, key)) {
      s.skip_space();
      return true;
    }
    if (!s.skip_value()) return false;
  } while (s.take(','));
  return false;
}

std::optional<std::string> string_value(Skimmer& s) {
  const auto raw = s.string_literal();
  if (!raw) return std::nullopt;
  return decode_literal(*raw);
}

}  // namespace

std::optional<std::string> response_id(std::string_view head, bool event_stream) {
  if (!event_stream) {
    Skimmer s(head);
    if (!find_member(s, "id")) return std::nullopt;
    return string_value(s);
  }
  // The first event's data line, once it is complete: response.created, {"type":..,"response":{"id":..}}.
  std::size_t at = 0;
  for (;;) {
    const std::size_t data = head.find("data:", at);
    if (data == std::string_view::npos) return std::nullopt;
    if (data == 0 || head[data - 1] == '\n') {
      const std::size_t end = head.find('\n', data);
      if (end == std::string_view::npos) return std::nullopt;
      Skimmer s(head.substr(data + 5, end - data - 5));
      if (!find_member(s, "response") || !find_member(s, "id")) return std::nullopt;
      return string_value(s);
    }
    at = data + 5;
  }
}

bool responses_output_began(std::string_view events) {
  for (std::size_t at = 0; at < events.size();) {
    const std::size_t end = events.find('\n', at);
    if (end == std::string_view::npos) return false;  // a line cut by the end of this piece: not read
    std::string_view line = events.substr(at, end - at);
    at = end + 1;
    if (!line.starts_with("event:")) continue;
    line.remove_prefix(6);
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line != "response.created" && line != "response.in_progress" && line != "response.queued") return true;
  }
  return false;
}

std::string top_level_model(std::string_view body) {
  Skimmer s(body);
  if (!s.take('{')) return {};
  if (s.take('}')) return {};
  std::string model;
  do {
    s.skip_space();
    const auto key = s.string_literal();
    if (!key || !s.take(':')) return {};
    const bool is_model = key_is(*key, "model");
    if (!is_model) {
      if (!s.skip_value()) return {};
      continue;
    }
    s.skip_space();
    if (const auto value = s.string_literal()) {
      auto decoded = decode_literal(*value);
      if (!decoded) return {};
      model = std::move(*decoded);
    } else {
      if (!s.skip_value()) return {};
      model.clear();
    }
  } while (s.take(','));
  return s.take('}') && s.at_end() ? model : std::string();
}

void use_token_ids(RoutableRequest& request, const std::vector<std::uint32_t>& tokens, std::uint32_t block_tokens) {
  request.chain = hashing::hash_tokens(request.chain.root, tokens, block_tokens);
  request.prompt_tokens = tokens.size();
}

}  // namespace kvroute::router
