// Canonical routing text of an OpenAI request (docs/hashing.md, "Chat canonicalization").
//
// Each chat message becomes  STX role [RS name] US content [RS tool_calls] [RS tool_call_id] ETX  where
// STX=0x02, US=0x1f, RS=0x1e, ETX=0x03; text parts of a content array are concatenated, every other part and
// every tool call is written as canonical JSON (object keys sorted, no spaces). Tool definitions, when the
// request has any, come first as one pseudo-message with role "tools". Because a message's bytes do not
// depend on what follows it, the text of turn n is a byte prefix of the text of turn n+1.
//
//   auto text = canonical_chat(body.at("messages"), body.if_contains("tools"));
//   if (!text) return text.error();
#pragma once

#include <string>

#include <boost/json/fwd.hpp>

#include "util/result.h"

namespace kvroute::hashing {

// Messages array (and optional tools array) to canonical routing text; an error names what is malformed.
Result<std::string> canonical_chat(const boost::json::value& messages, const boost::json::value* tools);

// Deterministic JSON: object keys sorted bytewise, no insignificant white space.
void canonical_json(const boost::json::value& v, std::string& out);

}  // namespace kvroute::hashing
