// The worker-side cache_salt of a tenant: what makes a vLLM worker keep one tenant's cached prefixes apart
// from another's, as the router's own index does (docs/hashing.md, "Tenants and cache_salt").
//
// vLLM mixes a request's `cache_salt` into the hash of its first KV block, so requests with different salts
// never share a cached block and one tenant cannot learn from its time to first token (or from
// usage.cached_tokens) what another has sent. kvroute sets that salt itself from the tenant, so a client can
// neither omit it nor choose another tenant's:
//
//   salt = "kvr1-" hex( HMAC-SHA256( secret, u32le(len tenant) tenant u32le(len client) client ) )[0..32)
//
// `client` is the client's own cache_salt when --allow-client-cache-salt is given, else empty. Fields are
// length-prefixed, so (tenant "a/s") and (tenant "a", client salt "s") give different salts. The secret
// (--tenant-salt-secret) keeps the salts unguessable to anyone who reaches a worker directly; replicas that
// share a fleet must share it, or a tenant's requests would miss the cache on another replica's namespace.
// With neither a tenant nor an admitted client salt there is no salt: the request stays in the shared
// namespace and any cache_salt the client sent is removed.
//
//   std::string s = worker_cache_salt("secret", "tenant-a", "");   // "kvr1-3f0c..." (37 characters)
#pragma once

#include <string>
#include <string_view>

namespace kvroute::router {

// HMAC-SHA256 (RFC 2104 over FIPS 180-4, OpenSSL's implementation) of `data` under `key`, as 64 hex digits.
std::string hmac_sha256_hex(std::string_view key, std::string_view data);

// The salt above; empty when both `tenant` and `client_salt` are empty.
std::string worker_cache_salt(std::string_view secret, std::string_view tenant, std::string_view client_salt);

}  // namespace kvroute::router
