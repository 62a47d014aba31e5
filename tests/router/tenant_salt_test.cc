// router/cache_salt and parse_request's cache_salt rewrite: which salt each (tenant, client salt) gets, that
// the body sent on carries it, and that the router's namespace is the worker's.
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "hashing/block_chain.h"
#include "router/cache_salt.h"
#include "router/request.h"

namespace kvroute::router {
namespace {

namespace json = boost::json;

RequestHeaders tenant(std::string_view t) { return RequestHeaders{"", t, ""}; }

// RFC 4231 test case 2 ("Jefe"): the HMAC is the standard one.
TEST(CacheSalt, HmacSha256MatchesRfc4231) {
  EXPECT_EQ(hmac_sha256_hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(CacheSalt, TenantsGetDistinctSecretKeyedSalts) {
  const std::string a = worker_cache_salt("s3cret", "tenant-a", "");
  EXPECT_EQ(a.size(), 37u);
  EXPECT_TRUE(a.starts_with("kvr1-"));
  EXPECT_EQ(a, worker_cache_salt("s3cret", "tenant-a", ""));  // stable: replicas agree
  EXPECT_NE(a, worker_cache_salt("s3cret", "tenant-b", ""));
  EXPECT_NE(a, worker_cache_salt("other", "tenant-a", ""));   // the secret matters
  EXPECT_EQ(worker_cache_salt("s3cret", "", ""), "");         // no tenant, no salt: shared namespace
}

TEST(CacheSalt, LengthPrefixedFieldsNeverCollide) {
  // Issue 24: tenant "a/s" landed in the namespace of tenant "a" with cache_salt "s".
  EXPECT_NE(worker_cache_salt("k", "a/s", ""), worker_cache_salt("k", "a", "s"));
  EXPECT_NE(worker_cache_salt("k", "as", ""), worker_cache_salt("k", "a", "s"));
  EXPECT_NE(worker_cache_salt("k", "", "a"), worker_cache_salt("k", "a", ""));
}

std::string chat(const std::string& extra = "") {
  // Long enough for a few 64-byte blocks of routing text.
  return R"({"model":"m",)" + extra +
         R"("messages":[{"role":"user","content":"the same long prompt, word for word, for both tenants; )"
         R"(the same long prompt, word for word, for both tenants; the same long prompt, word for word"}]})";
}

json::object sent(const RoutableRequest& r, const std::string& body) {
  return json::parse(r.upstream_body.empty() ? body : r.upstream_body).as_object();
}

TEST(TenantRewrite, TheTenantsSaltIsInjectedAndIsTheNamespace) {
  SaltOptions opt;
  opt.secret = "k";
  const std::string body = chat();
  auto a = parse_request(Endpoint::kChatCompletions, body, tenant("a"), {}, opt);
  auto b = parse_request(Endpoint::kChatCompletions, body, tenant("b"), {}, opt);
  ASSERT_TRUE(a && b);
  const std::string salt_a = worker_cache_salt("k", "a", "");
  EXPECT_EQ(sent(*a, body).at("cache_salt").as_string(), salt_a);
  EXPECT_EQ(sent(*b, body).at("cache_salt").as_string(), worker_cache_salt("k", "b", ""));
  EXPECT_EQ(a->namespace_salt, salt_a);
  EXPECT_EQ(a->chain.root, hashing::namespace_root("m", salt_a));
  ASSERT_FALSE(a->chain.hashes.empty());
  EXPECT_NE(a->chain.hashes.front(), b->chain.hashes.front());
}

TEST(TenantRewrite, AClientSaltIsReplacedUnlessAllowed) {
  SaltOptions opt;
  opt.secret = "k";
  const std::string body = chat(R"("cache_salt":"victim-salt",)");
  auto r = parse_request(Endpoint::kChatCompletions, body, tenant("a"), {}, opt);
  ASSERT_TRUE(r);
  EXPECT_EQ(sent(*r, body).at("cache_salt").as_string(), worker_cache_salt("k", "a", ""));

  opt.allow_client_cache_salt = true;
  r = parse_request(Endpoint::kChatCompletions, body, tenant("a"), {}, opt);
  ASSERT_TRUE(r);
  EXPECT_EQ(sent(*r, body).at("cache_salt").as_string(), worker_cache_salt("k", "a", "victim-salt"));
  // Allowed but anonymous: the client's salt is still never sent as it is, so no client can name a tenant's.
  r = parse_request(Endpoint::kChatCompletions, body, {}, {}, opt);
  ASSERT_TRUE(r);
  EXPECT_EQ(sent(*r, body).at("cache_salt").as_string(), worker_cache_salt("k", "", "victim-salt"));
}

TEST(TenantRewrite, AnonymousRequestsStayInTheSharedNamespace) {
  const std::string plain = chat();
  auto r = parse_request(Endpoint::kChatCompletions, plain, {}, {});
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->upstream_body.empty());  // forwarded unchanged
  EXPECT_EQ(r->chain.root, hashing::namespace_root("m", ""));
  const std::string salted = chat(R"("cache_salt":"mine",)");
  r = parse_request(Endpoint::kChatCompletions, salted, {}, {});
  ASSERT_TRUE(r);
  EXPECT_FALSE(sent(*r, salted).contains("cache_salt"));  // not admitted: removed
  EXPECT_EQ(r->chain.root, hashing::namespace_root("m", ""));
}

TEST(TenantRewrite, SaltAndUsageRewritesCombine) {
  SaltOptions opt;
  const std::string body = R"({"model":"m","stream":true,"prompt":"hello"})";
  auto r = parse_request(Endpoint::kCompletions, body, tenant("t"), {}, opt);
  ASSERT_TRUE(r);
  const auto o = sent(*r, body);
  EXPECT_TRUE(o.at("stream_options").at("include_usage").as_bool());
  EXPECT_EQ(o.at("cache_salt").as_string(), worker_cache_salt("", "t", ""));
  EXPECT_EQ(o.at("prompt").as_string(), "hello");

  const std::string with_options = R"({"model":"m","stream":true,"stream_options":{},"cache_salt":"x","prompt":"p"})";
  r = parse_request(Endpoint::kCompletions, with_options, tenant("t"), {}, opt);
  ASSERT_TRUE(r);
  const auto o2 = sent(*r, with_options);
  EXPECT_TRUE(o2.at("stream_options").at("include_usage").as_bool());
  EXPECT_EQ(o2.at("cache_salt").as_string(), worker_cache_salt("", "t", ""));
}

TEST(TenantRewrite, ANonStringCacheSaltIsA400) {
  auto r = parse_request(Endpoint::kChatCompletions, chat(R"("cache_salt":5,)"), {}, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 400);
  EXPECT_NE(r.error().message.find("cache_salt"), std::string::npos);
}

}  // namespace
}  // namespace kvroute::router
