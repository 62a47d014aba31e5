// Authentication of kvroute's two listeners: the admin API's bearer token and the clients' API keys.
//
// The admin API can add a worker URL and so redirect client traffic (Authorization headers included): with a
// token configured (--admin-token, --admin-token-file, $KVROUTE_ADMIN_TOKEN) every admin request must carry
// it as `Authorization: Bearer TOKEN`. Client API keys (--api-keys-file) map each key to its tenant: the
// tenant of a request is then its key's, never a header the client chose (router/cache_salt.h).
//
// Comparisons do not leak the secret through timing: the token is compared with CRYPTO_memcmp over SHA-256
// digests (fixed length, so not even the length leaks), and keys are looked up by their SHA-256 digest, so
// the lookup's time depends on digests an attacker cannot steer, not on how many leading bytes matched.
//
//   AdminAuth admin(cfg.admin_token);
//   if (auto e = admin.check(req[http::field::authorization])) return answer(*e);   // 401
//   auto keys = ApiKeys::load_file(cfg.api_keys_file);   // "KEY TENANT" per line
//   auto tenant = keys->tenant_for(req[http::field::authorization]);          // or a 401 Error
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "util/result.h"

namespace kvroute::router {

// The credentials of an `Authorization: Bearer X` value (scheme case-insensitive), or nullopt.
std::optional<std::string_view> bearer_token(std::string_view authorization);

// Equality of two secrets in time independent of where they differ and of their lengths.
bool constant_time_equals(std::string_view a, std::string_view b);

class AdminAuth {
 public:
  explicit AdminAuth(std::string_view token);  // empty: every request passes
  bool enabled() const { return enabled_; }
  // nullopt: allowed. Else a 401 to answer with `WWW-Authenticate: Bearer`.
  std::optional<Error> check(std::string_view authorization) const;

 private:
  bool enabled_ = false;
  std::array<unsigned char, 32> digest_{};
};

class ApiKeys {
 public:
  // One key per line: KEY, white space, TENANT; blank lines and lines starting with '#' are skipped. Errors
  // name the line. A key listed twice is an error (which tenant would it be?).
  static Result<ApiKeys> parse(std::string_view text, const std::string& origin);
  static Result<ApiKeys> load_file(const std::string& path);

  std::size_t size() const { return tenants_.size(); }
  // The tenant of the request's key, or a 401 (no bearer token, or an unknown key).
  Result<std::string> tenant_for(std::string_view authorization) const;

 private:
  std::unordered_map<std::string, std::string> tenants_;  // SHA-256 digest of the key (32 bytes) -> tenant
};

// The 401 both checks answer with.
Error unauthorized(std::string message);

}  // namespace kvroute::router
