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

}  // namespace kvroute::hashing
