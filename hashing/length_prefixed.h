// Length-prefixed fields: u32le(len field) followed by the field's bytes. A key made of such fields cannot be
// spelled as another sequence of fields, which a separator byte cannot promise (a field may contain it).
// Used by the namespace root (docs/hashing.md) and the tenant salt's HMAC message (router/cache_salt.h).
//
//   std::string key = "kvroute/v2";
//   append_length_prefixed(key, model);   // "qwen3-8b" -> 08 00 00 00 'qwen3-8b'
#pragma once

#include <string>
#include <string_view>

namespace kvroute::hashing {

void append_length_prefixed(std::string& out, std::string_view field);

}  // namespace kvroute::hashing
