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

// The chat messages a Responses API request (POST /v1/responses) stands for, for routing (the router) and for
// rendering (kvroute-sim), which must agree: `instructions` as a system message, then `input` (a string: one
// user message; an array: its message items by role, their input_text / output_text parts as text parts, and
// any other item, such as a function call or its output, as a message whose role is the item's type and whose
// content is the item's canonical JSON). An error names the malformed field (400).
Result<boost::json::array> responses_messages(const boost::json::object& request);

// Deterministic JSON: object keys sorted bytewise, no insignificant white space.
void canonical_json(const boost::json::value& v, std::string& out);

}  // namespace kvroute::hashing
