#include "router/cache_salt.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "hashing/length_prefixed.h"

namespace kvroute::router {

std::string hmac_sha256_hex(std::string_view key, std::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // An empty key is a valid HMAC key; OpenSSL wants a non-null pointer for it.
  static const char kEmpty = 0;
  HMAC(EVP_sha256(), key.empty() ? &kEmpty : key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[mac[i] >> 4]);
    out.push_back(kHex[mac[i] & 15]);
  }
  return out;
}

std::string worker_cache_salt(std::string_view secret, std::string_view tenant, std::string_view client_salt) {
  if (tenant.empty() && client_salt.empty()) return {};
  std::string message;
  message.reserve(8 + tenant.size() + client_salt.size());
  hashing::append_length_prefixed(message, tenant);
  hashing::append_length_prefixed(message, client_salt);
  // 128 bits of the MAC: collisions need about 2^64 tenants.
  return "kvr1-" + hmac_sha256_hex(secret, message).substr(0, 32);
}

}  // namespace kvroute::router
