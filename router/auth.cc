#include "router/auth.h"

#include <fstream>
#include <sstream>

#include <openssl/crypto.h>
#include <openssl/evp.h>

namespace kvroute::router {

namespace {

std::array<unsigned char, 32> sha256(std::string_view data) {
  std::array<unsigned char, 32> out{};
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr);
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

}  // namespace

Error unauthorized(std::string message) {
  return make_error(std::move(message), 401, "invalid_request_error", "invalid_api_key");
}

std::optional<std::string_view> bearer_token(std::string_view authorization) {
  authorization = trim(authorization);
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size()) return std::nullopt;
  for (std::size_t i = 0; i < kScheme.size(); ++i) {
    const char c = authorization[i];
    if ((c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c) != kScheme[i]) return std::nullopt;
  }
  const std::string_view token = trim(authorization.substr(kScheme.size()));
  if (token.empty()) return std::nullopt;
  return token;
}

bool constant_time_equals(std::string_view a, std::string_view b) {
  const auto da = sha256(a);
  const auto db = sha256(b);
  return CRYPTO_memcmp(da.data(), db.data(), da.size()) == 0;
}

AdminAuth::AdminAuth(std::string_view token) : enabled_(!token.empty()), digest_(sha256(token)) {}

std::optional<Error> AdminAuth::check(std::string_view authorization) const {
  if (!enabled_) return std::nullopt;
  const auto token = bearer_token(authorization);
  if (!token) return unauthorized("the admin API needs 'Authorization: Bearer <admin token>'");
  const auto presented = sha256(*token);
  if (CRYPTO_memcmp(presented.data(), digest_.data(), digest_.size()) != 0) {
    return unauthorized("the admin token is not valid");
  }
  return std::nullopt;
}

Result<ApiKeys> ApiKeys::parse(std::string_view text, const std::string& origin) {
  ApiKeys keys;
  std::size_t line_no = 0;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    const std::size_t gap = line.find_first_of(" \t");
    const std::string where = origin + ":" + std::to_string(line_no);
    if (gap == std::string_view::npos) return make_error(where + ": expected 'KEY TENANT'");
    const std::string_view key = line.substr(0, gap);
    const std::string_view tenant = trim(line.substr(gap));
    if (tenant.find_first_of(" \t") != std::string_view::npos) return make_error(where + ": expected 'KEY TENANT'");
    const auto digest = sha256(key);
    const std::string id(reinterpret_cast<const char*>(digest.data()), digest.size());
    if (!keys.tenants_.emplace(id, std::string(tenant)).second) return make_error(where + ": key listed twice");
  }
  if (keys.tenants_.empty()) return make_error(origin + ": no API keys");
  return keys;
}

Result<ApiKeys> ApiKeys::load_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error("--api-keys-file: cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

Result<std::string> ApiKeys::tenant_for(std::string_view authorization) const {
  const auto key = bearer_token(authorization);
  if (!key) return unauthorized("an API key is required: 'Authorization: Bearer <key>'");
  const auto digest = sha256(*key);
  const auto it = tenants_.find(std::string(reinterpret_cast<const char*>(digest.data()), digest.size()));
  if (it == tenants_.end()) return unauthorized("the API key is not valid");
  return it->second;
}

}  // namespace kvroute::router
