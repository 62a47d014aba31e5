#include "backends/sim/server/openai_api.h"

#include <algorithm>
#include <optional>

#include <boost/json/parse.hpp>
#include <boost/json/string.hpp>
#include <boost/json/value.hpp>

#include "backends/sim/server/tokenizer.h"
#include "hashing/chat_canonical.h"

namespace kvroute::sim {

namespace json = boost::json;

namespace {

Result<json::object> parse_object(std::string_view body) {
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  if (ec) return make_error("request body is not valid JSON: " + ec.message());
  if (!v.is_object()) return make_error("request body must be a JSON object");
  return std::move(v.as_object());
}

// Reads an optional boolean field; absent or null leaves `out` unchanged.
std::optional<Error> read_bool(const json::object& o, std::string_view key, bool& out) {
  const auto* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_bool()) return make_error("'" + std::string(key) + "' must be a boolean");
  out = v->get_bool();
  return std::nullopt;
}

// Reads an optional token count in [1, 2^30]; absent or null leaves `out` unchanged.
std::optional<Error> read_token_count(const json::object& o, std::string_view key, std::uint32_t& out) {
  const auto* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (v->is_int64() && v->get_int64() >= 1 && v->get_int64() <= (1ll << 30)) {
    out = static_cast<std::uint32_t>(v->get_int64());
  } else if (v->is_uint64() && v->get_uint64() >= 1 && v->get_uint64() <= (1ull << 30)) {
    out = static_cast<std::uint32_t>(v->get_uint64());
  } else {
    return make_error("'" + std::string(key) + "' must be an integer >= 1");
  }
  return std::nullopt;
}

std::optional<Error> read_cache_salt(const json::object& o, std::string& out) {
  const auto* salt = o.if_contains("cache_salt");
  if (salt == nullptr || salt->is_null()) return std::nullopt;
  if (!salt->is_string()) return make_error("'cache_salt' must be a string");
  out = std::string(salt->get_string());
  return std::nullopt;
}

// The base model (or its alias), or a loaded LoRA adapter, whose name goes to `lora`.
std::optional<Error> check_model(const json::object& o, const ApiLimits& limits, std::string* lora = nullptr) {
  const auto* m = o.if_contains("model");
  if (m == nullptr || m->is_null()) return std::nullopt;  // vLLM serves its one model when none is named
  if (!m->is_string()) return make_error("'model' must be a string");
  const std::string_view name = m->get_string();
  if (name == limits.served_model_name || (!limits.alias.empty() && name == limits.alias)) return std::nullopt;
  if (limits.lora_adapters != nullptr &&
      std::find(limits.lora_adapters->begin(), limits.lora_adapters->end(), name) != limits.lora_adapters->end()) {
    if (lora != nullptr) *lora = std::string(name);
    return std::nullopt;
  }
  return make_error("The model `" + std::string(name) + "` does not exist.", 404, "NotFoundError",
                    "model_not_found");
}

Result<std::vector<std::uint32_t>> token_array(const json::array& a, std::string_view what) {
  std::vector<std::uint32_t> out;
  out.reserve(a.size());
  for (const auto& t : a) {
    std::int64_t id = -1;
    if (t.is_int64()) id = t.get_int64();
    else if (t.is_uint64() && t.get_uint64() < kVocabEnd) id = static_cast<std::int64_t>(t.get_uint64());
    else return make_error(std::string(what) + " must contain only integer token ids");
    if (id < 0 || id >= static_cast<std::int64_t>(kVocabEnd)) {
      return make_error("token id " + std::to_string(id) + " is out of vocabulary [0, 2^31)");
    }
    out.push_back(static_cast<std::uint32_t>(id));
  }
  return out;
}

// prompt: "text" | [ids] | ["text"] | [[ids]]; a batch of more than one prompt is not supported.
Result<std::vector<std::uint32_t>> completion_prompt(const json::object& o) {
  const auto* p = o.if_contains("prompt");
  if (p == nullptr || p->is_null()) return make_error("'prompt' is required");
  if (p->is_string()) return tokenize(p->get_string());
  const auto* a = p->if_array();
  if (a == nullptr) return make_error("'prompt' must be a string, an array of token ids, or a one-element array");
  if (a->empty()) return make_error("'prompt' must not be empty");
  const json::value& first = (*a)[0];
  if (first.is_number()) return token_array(*a, "'prompt'");
  if (a->size() != 1) return make_error("batched prompts (more than one prompt per request) are not supported");
  if (first.is_string()) return tokenize(first.get_string());
  if (const auto* inner = first.if_array()) return token_array(*inner, "'prompt'[0]");
  return make_error("'prompt' must be a string, an array of token ids, or a one-element array");
}

// A message item's content: a string, or an array of part objects whose input_text / output_text parts carry
// a string "text" (render_chat concatenates the "text" of every part; other part kinds add nothing).
std::optional<Error> check_item_content(const json::value* content, const std::string& where) {
  if (content != nullptr && content->is_string()) return std::nullopt;
  const auto* parts = content != nullptr ? content->if_array() : nullptr;
  if (parts == nullptr) return make_error(where + " must be a string or an array of content parts");
  for (const auto& part : *parts) {
    const auto* po = part.if_object();
    if (po == nullptr) return make_error(where + " parts must be objects");
    const auto* type = po->if_contains("type");
    if (type == nullptr || !type->is_string()) return make_error(where + " parts must have a string 'type'");
    const std::string_view t = type->get_string();
    const auto* text = po->if_contains("text");
    if ((t == "input_text" || t == "output_text") && (text == nullptr || !text->is_string())) {
      return make_error(where + " parts of type '" + std::string(t) + "' must have a string 'text'");
    }
  }
  return std::nullopt;
}

// The chat messages a Responses request stands for (hashing::responses_messages, the shape the router also
// derives and may send to /tokenize), after the checks vLLM makes of `instructions` and `input`, with its kind
// of messages: item roles are user, system, developer or assistant; a message's content is a string or parts;
// any other item has a string `type`.
Result<json::array> responses_messages(const json::object& o) {
  if (const auto* ins = o.if_contains("instructions"); ins != nullptr && !ins->is_null() && !ins->is_string()) {
    return make_error("'instructions' must be a string");
  }
  const auto* input = o.if_contains("input");
  if (input == nullptr || input->is_null()) return make_error("'input' is required");
  if (const auto* text = input->if_string()) {
    if (text->empty()) return make_error("'input' must not be empty");
    return hashing::responses_messages(o);
  }
  const auto* items = input->if_array();
  if (items == nullptr) return make_error("'input' must be a string or an array of input items");
  if (items->empty()) return make_error("'input' must not be empty");
  for (std::size_t i = 0; i < items->size(); ++i) {
    const std::string where = "input[" + std::to_string(i) + "]";
    const auto* item = (*items)[i].if_object();
    if (item == nullptr) return make_error(where + " must be an object");
    if (const auto* role = item->if_contains("role")) {
      const auto* r = role->if_string();
      if (r == nullptr || (*r != "user" && *r != "system" && *r != "developer" && *r != "assistant")) {
        return make_error(where + ".role must be one of 'user', 'system', 'developer', 'assistant'");
      }
      if (auto e = check_item_content(item->if_contains("content"), where + ".content")) return *e;
      continue;
    }
    const auto* type = item->if_contains("type");
    if (type == nullptr || !type->is_string()) return make_error(where + " must have a 'role' or a string 'type'");
  }
  return hashing::responses_messages(o);
}

}  // namespace

Result<ApiRequest> parse_api_request(ApiKind kind, std::string_view body, const ApiLimits& limits) {
  auto parsed = parse_object(body);
  if (!parsed) return parsed.error();
  const json::object& o = *parsed;
  ApiRequest req;
  if (auto e = check_model(o, limits, &req.lora)) return *e;
  req.kind = kind;
  if (kind == ApiKind::kChat) {
    const auto* msgs = o.if_contains("messages");
    if (msgs == nullptr) return make_error("'messages' is required");
    auto toks = render_chat(*msgs);
    if (!toks) return toks.error();
    req.prompt_tokens = std::move(*toks);
  } else {
    auto toks = completion_prompt(o);
    if (!toks) return toks.error();
    req.prompt_tokens = std::move(*toks);
  }
  if (req.prompt_tokens.empty()) return make_error("the prompt is empty (it has no tokens)");

  req.max_tokens = limits.default_max_tokens;
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (auto e = read_token_count(o, key, req.max_tokens)) return *e;
  }
  if (const auto* n = o.if_contains("n"); n != nullptr && !n->is_null()) {
    if (!(n->is_int64() && n->get_int64() == 1) && !(n->is_uint64() && n->get_uint64() == 1)) {
      return make_error("only n = 1 is supported");
    }
  }
  if (auto e = read_bool(o, "stream", req.stream)) return *e;
  bool ignore_eos = false;
  if (auto e = read_bool(o, "ignore_eos", ignore_eos)) return *e;  // accepted; the generator has no EOS
  if (const auto* so = o.if_contains("stream_options"); so != nullptr && !so->is_null()) {
    const auto* soo = so->if_object();
    if (soo == nullptr) return make_error("'stream_options' must be an object");
    if (auto e = read_bool(*soo, "include_usage", req.include_usage)) return *e;
  }
  if (auto e = read_cache_salt(o, req.cache_salt)) return *e;
  if (auto e = check_context_length(req, limits)) return *e;
  return req;
}

std::optional<Error> check_context_length(const ApiRequest& req, const ApiLimits& limits) {
  if (limits.max_model_len == 0 || req.prompt_tokens.size() + std::uint64_t{req.max_tokens} <= limits.max_model_len) {
    return std::nullopt;
  }
  return make_error("This model's maximum context length is " + std::to_string(limits.max_model_len) +
                    " tokens. However, you requested " + std::to_string(req.prompt_tokens.size() + req.max_tokens) +
                    " tokens (" + std::to_string(req.prompt_tokens.size()) + " in the prompt, " +
                    std::to_string(req.max_tokens) + " in the completion). Please reduce the length.");
}

Result<ResponsesRequest> parse_responses_request(std::string_view body, const ApiLimits& limits) {
  auto parsed = parse_object(body);
  if (!parsed) return parsed.error();
  const json::object& o = *parsed;
  std::string lora;
  if (auto e = check_model(o, limits, &lora)) return *e;

  auto messages = responses_messages(o);
  if (!messages) return messages.error();
  auto toks = render_chat(*messages);
  if (!toks) return toks.error();

  ResponsesRequest r;
  r.api.kind = ApiKind::kChat;
  r.api.lora = std::move(lora);
  r.api.prompt_tokens = std::move(*toks);
  r.api.max_tokens = limits.default_max_tokens;
  if (auto e = read_token_count(o, "max_output_tokens", r.api.max_tokens)) return *e;
  if (auto e = read_bool(o, "stream", r.api.stream)) return *e;
  if (auto e = read_bool(o, "store", r.store)) return *e;
  if (auto e = read_bool(o, "background", r.background)) return *e;
  if (r.background && !r.store) return make_error("background can only be used when `store` is true");
  if (r.background && r.api.stream) {
    // vLLM streams a background response and lets GET resume it; kvroute-sim does not model that.
    return make_error("kvroute-sim does not support stream=true with background=true; poll GET /v1/responses/{id}");
  }
  if (auto e = read_cache_salt(o, r.api.cache_salt)) return *e;
  if (const auto* prev = o.if_contains("previous_response_id"); prev != nullptr && !prev->is_null()) {
    if (!prev->is_string()) return make_error("'previous_response_id' must be a string");
    r.previous_response_id = std::string(prev->get_string());
  }
  return r;
}

Result<LoraRequest> parse_lora_request(std::string_view body) {
  auto parsed = parse_object(body);
  if (!parsed) return parsed.error();
  LoraRequest r;
  for (auto [key, out] : {std::pair{"lora_name", &r.name}, std::pair{"lora_path", &r.path}}) {
    const auto* v = parsed->if_contains(key);
    if (v == nullptr || v->is_null()) continue;
    if (!v->is_string()) return make_error("'" + std::string(key) + "' must be a string");
    *out = std::string(v->get_string());
  }
  return r;
}

Error response_not_found(std::string_view id) {
  return make_error("Response with id '" + std::string(id) + "' not found.", 404);
}

Result<std::vector<std::uint32_t>> parse_tokenize_request(std::string_view body, const ApiLimits& limits) {
  auto parsed = parse_object(body);
  if (!parsed) return parsed.error();
  const json::object& o = *parsed;
  if (auto e = check_model(o, limits)) return *e;
  if (const auto* msgs = o.if_contains("messages")) return render_chat(*msgs);
  const auto* p = o.if_contains("prompt");
  if (p == nullptr || !p->is_string()) return make_error("'prompt' (a string) or 'messages' is required");
  return tokenize(p->get_string());
}

std::string tokenize_response(const std::vector<std::uint32_t>& tokens, std::uint32_t max_model_len) {
  std::string out = "{\"count\":" + std::to_string(tokens.size()) +
                    ",\"max_model_len\":" + std::to_string(max_model_len) + ",\"tokens\":[";
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (i) out.push_back(',');
    out.append(std::to_string(tokens[i]));
  }
  out.append("],\"token_strs\":null}");
  return out;
}

std::string error_body(const Error& e) {
  std::string out = "{\"error\":{\"message\":";
  append_json_string(out, e.message);
  out.append(",\"type\":");
  append_json_string(out, e.type);
  out.append(",\"param\":null,\"code\":");
  if (e.code.empty()) out.append(std::to_string(e.status));
  else append_json_string(out, e.code);
  out.append("}}");
  return out;
}

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      default:
        if (c < 0x20) {
          out.append("\\u00");
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 15]);
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
}

void append_usage(std::string& out, const ApiUsage& u) {
  out.append("{\"prompt_tokens\":").append(std::to_string(u.prompt_tokens));
  out.append(",\"total_tokens\":").append(std::to_string(u.prompt_tokens + u.completion_tokens));
  out.append(",\"completion_tokens\":").append(std::to_string(u.completion_tokens));
  out.append(",\"prompt_tokens_details\":{\"cached_tokens\":").append(std::to_string(u.cached_tokens));
  out.append("}}");
}

ResponseFormatter::ResponseFormatter(ApiKind kind, std::string id, std::int64_t created, std::string_view model)
    : kind_(kind) {
  head_id_ = "{\"id\":";
  append_json_string(head_id_, id);
  head_id_.append(",\"object\":\"");
  head_rest_ = "\",\"created\":" + std::to_string(created) + ",\"model\":";
  append_json_string(head_rest_, model);
  head_rest_.append(",\"choices\":[");
}

void ResponseFormatter::append_head(std::string& out, std::string_view object) const {
  out.append(head_id_).append(object).append(head_rest_);
}

void ResponseFormatter::sse_role(std::string& out) const {
  if (kind_ != ApiKind::kChat) return;
  out.append("data: ");
  append_head(out, "chat.completion.chunk");
  out.append("{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
             "\"finish_reason\":null}]}\n\n");
}

void ResponseFormatter::sse_token(std::string& out, std::string_view text) const {
  out.append("data: ");
  if (kind_ == ApiKind::kChat) {
    append_head(out, "chat.completion.chunk");
    out.append("{\"index\":0,\"delta\":{\"content\":");
    append_json_string(out, text);
    out.append("},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
  } else {
    append_head(out, "text_completion");
    out.append("{\"index\":0,\"text\":");
    append_json_string(out, text);
    out.append(",\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}]}\n\n");
  }
}

void ResponseFormatter::sse_finish(std::string& out) const {
  out.append("data: ");
  if (kind_ == ApiKind::kChat) {
    append_head(out, "chat.completion.chunk");
    out.append("{\"index\":0,\"delta\":{\"content\":\"\"},\"logprobs\":null,\"finish_reason\":\"length\","
               "\"stop_reason\":null}]}\n\n");
  } else {
    append_head(out, "text_completion");
    out.append("{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}]}"
               "\n\n");
  }
}

void ResponseFormatter::sse_usage(std::string& out, const ApiUsage& u) const {
  out.append("data: ");
  append_head(out, kind_ == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  out.append("],\"usage\":");
  append_usage(out, u);
  out.append("}\n\n");
}

void ResponseFormatter::sse_done(std::string& out) { out.append("data: [DONE]\n\n"); }

std::string ResponseFormatter::full(std::string_view text, const ApiUsage& u) const {
  std::string out;
  out.reserve(head_id_.size() + head_rest_.size() + text.size() + 256);
  if (kind_ == ApiKind::kChat) {
    append_head(out, "chat.completion");
    out.append("{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
    append_json_string(out, text);
    out.append(",\"tool_calls\":[]},\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}]");
  } else {
    append_head(out, "text_completion");
    out.append("{\"index\":0,\"text\":");
    append_json_string(out, text);
    out.append(",\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}]");
  }
  out.append(",\"usage\":");
  append_usage(out, u);
  out.append("}");
  return out;
}

// ---- Responses API ----

namespace {

void append_responses_usage(std::string& out, const ApiUsage& u) {
  out.append("{\"input_tokens\":").append(std::to_string(u.prompt_tokens));
  out.append(",\"input_tokens_details\":{\"cached_tokens\":").append(std::to_string(u.cached_tokens));
  out.append("},\"output_tokens\":").append(std::to_string(u.completion_tokens));
  out.append(",\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":");
  out.append(std::to_string(u.prompt_tokens + u.completion_tokens)).append("}");
}

}  // namespace

ResponsesFormatter::ResponsesFormatter(std::string id, std::string_view message_id, std::int64_t created_at,
                                       std::string_view model)
    : id_(std::move(id)) {
  head_ = "{\"id\":";
  append_json_string(head_, id_);
  head_.append(",\"object\":\"response\",\"created_at\":").append(std::to_string(created_at));
  head_.append(",\"model\":");
  append_json_string(head_, model);
  head_.append(",\"status\":");
  item_head_ = "{\"type\":\"message\",\"id\":";
  append_json_string(item_head_, message_id);
  item_head_.append(",\"role\":\"assistant\",\"status\":\"completed\",\"content\":");
  delta_head_ = ",\"item_id\":";
  append_json_string(delta_head_, message_id);
  delta_head_.append(",\"output_index\":0,\"content_index\":0,\"delta\":");
}

std::string ResponsesFormatter::without_output(std::string_view status) const {
  std::string out = head_;
  append_json_string(out, status);
  return out.append(",\"output\":[],\"usage\":null}");
}

std::string ResponsesFormatter::completed(std::string_view text, const ApiUsage& u) const {
  std::string out;
  out.reserve(head_.size() + item_head_.size() + text.size() + 320);
  out.append(head_).append("\"completed\",\"output\":[").append(item_head_);
  out.append("[{\"type\":\"output_text\",\"text\":");
  append_json_string(out, text);
  out.append(",\"annotations\":[]}]}],\"usage\":");
  append_responses_usage(out, u);
  out.append("}");
  return out;
}

void ResponsesFormatter::append_event(std::string& out, std::string_view type) {
  out.append("event: ").append(type).append("\ndata: {\"type\":\"").append(type);
  out.append("\",\"sequence_number\":").append(std::to_string(seq_++));
}

void ResponsesFormatter::sse_created(std::string& out) {
  append_event(out, "response.created");
  out.append(",\"response\":").append(in_progress()).append("}\n\n");
  append_event(out, "response.in_progress");
  out.append(",\"response\":").append(in_progress()).append("}\n\n");
}

void ResponsesFormatter::sse_delta(std::string& out, std::string_view text) {
  if (!opened_) {
    // With the first token, as vLLM: the message item and its text part open.
    opened_ = true;
    append_event(out, "response.output_item.added");
    out.append(",\"output_index\":0,\"item\":").append(item_head_, 0, item_head_.size() - kCompletedTail.size());
    out.append("\"in_progress\",\"content\":[]}}\n\n");
    append_event(out, "response.content_part.added");
    out.append(delta_head_, 0, delta_head_.size() - kDeltaKey.size());
    out.append(",\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}\n\n");
  }
  append_event(out, "response.output_text.delta");
  out.append(delta_head_);
  append_json_string(out, text);
  out.append("}\n\n");
}

void ResponsesFormatter::sse_completed(std::string& out, std::string_view text, std::string_view completed_object) {
  if (opened_) {
    const std::string_view part_ids(delta_head_.data(), delta_head_.size() - kDeltaKey.size());
    append_event(out, "response.output_text.done");
    out.append(part_ids).append(",\"text\":");
    append_json_string(out, text);
    out.append("}\n\n");
    append_event(out, "response.content_part.done");
    out.append(part_ids).append(",\"part\":{\"type\":\"output_text\",\"text\":");
    append_json_string(out, text);
    out.append(",\"annotations\":[]}}\n\n");
    append_event(out, "response.output_item.done");
    out.append(",\"output_index\":0,\"item\":").append(item_head_).append("[{\"type\":\"output_text\",\"text\":");
    append_json_string(out, text);
    out.append(",\"annotations\":[]}]}}\n\n");
  }
  append_event(out, "response.completed");
  out.append(",\"response\":").append(completed_object).append("}\n\n");
}

}  // namespace kvroute::sim
