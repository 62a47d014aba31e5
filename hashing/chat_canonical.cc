#include "hashing/chat_canonical.h"

#include <algorithm>
#include <vector>

#include <boost/json.hpp>

namespace kvroute::hashing {

namespace {
constexpr char kStx = '\x02';
constexpr char kUs = '\x1f';
constexpr char kRs = '\x1e';
constexpr char kEtx = '\x03';

Result<bool> append_content(const boost::json::value& content, std::size_t index, std::string& out) {
  if (content.is_string()) {
    out.append(content.get_string());
    return true;
  }
  if (content.is_null()) return true;
  if (!content.is_array()) {
    return make_error("messages[" + std::to_string(index) + "].content must be a string or an array of parts",
                      400, "invalid_request_error", "invalid_type");
  }
  for (const auto& part : content.get_array()) {
    const auto* obj = part.if_object();
    if (obj == nullptr) {
      return make_error("messages[" + std::to_string(index) + "].content parts must be objects", 400,
                        "invalid_request_error", "invalid_type");
    }
    const auto* type = obj->if_contains("type");
    const auto* text = obj->if_contains("text");
    if (type != nullptr && type->is_string() && type->get_string() == "text" && text != nullptr &&
        text->is_string()) {
      out.append(text->get_string());
    } else {
      canonical_json(part, out);
    }
  }
  return true;
}

// A Responses API content part as a chat part: input_text and output_text are text; others stay as they are.
boost::json::value chat_part(const boost::json::value& part) {
  const auto* obj = part.if_object();
  if (!obj) return part;
  const auto* type = obj->if_contains("type");
  const auto* text = obj->if_contains("text");
  if (type && type->is_string() && (type->get_string() == "input_text" || type->get_string() == "output_text") &&
      text && text->is_string()) {
    return boost::json::object{{"type", "text"}, {"text", *text}};
  }
  return part;
}

// The bytes of the messages' roles and string contents, and four markers each: what canonical_chat writes for a
// plain chat, reserved at once. Appended as it grows, an 8K-token prompt's text was copied about twice over (a
// fifth of parsing a request: kvroute-routing-bench, BM_Parse).
std::size_t text_bytes(const boost::json::array& messages) {
  std::size_t n = 0;
  for (const auto& m : messages) {
    const auto* obj = m.if_object();
    if (obj == nullptr) continue;
    n += 4;
    if (const auto* role = obj->if_contains("role"); role != nullptr && role->is_string()) n += role->get_string().size();
    if (const auto* content = obj->if_contains("content"); content != nullptr && content->is_string())
      n += content->get_string().size();
  }
  return n;
}

}  // namespace

void canonical_json(const boost::json::value& v, std::string& out) {
  switch (v.kind()) {
    case boost::json::kind::object: {
      const auto& obj = v.get_object();
      std::vector<const boost::json::key_value_pair*> kvs;
      kvs.reserve(obj.size());
      for (const auto& kv : obj) kvs.push_back(&kv);
      std::sort(kvs.begin(), kvs.end(), [](auto* a, auto* b) { return a->key() < b->key(); });
      out.push_back('{');
      for (std::size_t i = 0; i < kvs.size(); ++i) {
        if (i) out.push_back(',');
        out.append(boost::json::serialize(boost::json::string(kvs[i]->key())));
        out.push_back(':');
        canonical_json(kvs[i]->value(), out);
      }
      out.push_back('}');
      return;
    }
    case boost::json::kind::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v.get_array()) {
        if (!first) out.push_back(',');
        first = false;
        canonical_json(e, out);
      }
      out.push_back(']');
      return;
    }
    default:
      out.append(boost::json::serialize(v));
  }
}

Result<std::string> canonical_chat(const boost::json::value& messages, const boost::json::value* tools) {
  if (!messages.is_array()) {
    return make_error("'messages' must be an array", 400, "invalid_request_error", "invalid_type");
  }
  std::string out;
  out.reserve(text_bytes(messages.get_array()));
  if (tools != nullptr && !tools->is_null()) {
    if (!tools->is_array()) return make_error("'tools' must be an array", 400, "invalid_request_error", "invalid_type");
    if (!tools->get_array().empty()) {
      out.push_back(kStx);
      out.append("tools");
      out.push_back(kUs);
      canonical_json(*tools, out);
      out.push_back(kEtx);
    }
  }
  std::size_t index = 0;
  for (const auto& m : messages.get_array()) {
    const auto* obj = m.if_object();
    if (obj == nullptr) {
      return make_error("messages[" + std::to_string(index) + "] must be an object", 400, "invalid_request_error",
                        "invalid_type");
    }
    const auto* role = obj->if_contains("role");
    if (role == nullptr || !role->is_string()) {
      return make_error("messages[" + std::to_string(index) + "].role must be a string", 400,
                        "invalid_request_error", role == nullptr ? "missing_field" : "invalid_type");
    }
    out.push_back(kStx);
    out.append(role->get_string());
    if (const auto* name = obj->if_contains("name"); name != nullptr && name->is_string()) {
      out.push_back(kRs);
      out.append(name->get_string());
    }
    out.push_back(kUs);
    if (const auto* content = obj->if_contains("content")) {
      auto r = append_content(*content, index, out);
      if (!r) return r.error();
    }
    if (const auto* calls = obj->if_contains("tool_calls"); calls != nullptr && !calls->is_null()) {
      out.push_back(kRs);
      canonical_json(*calls, out);
    }
    if (const auto* id = obj->if_contains("tool_call_id"); id != nullptr && id->is_string()) {
      out.push_back(kRs);
      out.append(id->get_string());
    }
    out.push_back(kEtx);
    ++index;
  }
  return out;
}

Result<boost::json::array> responses_messages(const boost::json::object& obj) {
  boost::json::array messages;
  if (const auto* instructions = obj.if_contains("instructions"); instructions && !instructions->is_null()) {
    if (!instructions->is_string()) {
      return make_error("'instructions' must be a string", 400, "invalid_request_error", "invalid_type");
    }
    messages.push_back(boost::json::object{{"role", "system"}, {"content", *instructions}});
  }
  const auto* input = obj.if_contains("input");
  if (!input || input->is_null()) {
    return make_error("'input' is required", 400, "invalid_request_error", "missing_field");
  }
  if (input->is_string()) {
    messages.push_back(boost::json::object{{"role", "user"}, {"content", *input}});
    return messages;
  }
  if (!input->is_array()) {
    return make_error("'input' must be a string or an array of items", 400, "invalid_request_error", "invalid_type");
  }
  if (input->get_array().empty()) {
    return make_error("'input' must not be empty", 400, "invalid_request_error", "invalid_value");
  }
  for (const auto& item : input->get_array()) {
    const auto* o = item.if_object();
    if (!o) return make_error("'input' items must be objects", 400, "invalid_request_error", "invalid_type");
    const auto* role = o->if_contains("role");
    if (role && role->is_string()) {
      boost::json::object m{{"role", *role}};
      if (const auto* content = o->if_contains("content"); content && content->is_array()) {
        boost::json::array parts;
        for (const auto& p : content->get_array()) parts.push_back(chat_part(p));
        m["content"] = std::move(parts);
      } else if (content) {
        m["content"] = *content;
      }
      messages.push_back(std::move(m));
      continue;
    }
    const auto* type = o->if_contains("type");
    std::string text;
    canonical_json(item, text);
    messages.push_back(
        boost::json::object{{"role", type && type->is_string() ? type->get_string() : "item"}, {"content", text}});
  }
  return messages;
}

}  // namespace kvroute::hashing
