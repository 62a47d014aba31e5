// router/auth: the admin bearer token and the client API keys file.
#include "router/auth.h"

#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>

#include "router/config.h"

namespace kvroute::router {
namespace {

TEST(Auth, BearerTokenIsRead) {
  EXPECT_EQ(bearer_token("Bearer abc"), "abc");
  EXPECT_EQ(bearer_token("bearer   abc  "), "abc");
  EXPECT_FALSE(bearer_token("Basic abc"));
  EXPECT_FALSE(bearer_token("Bearer "));
  EXPECT_FALSE(bearer_token(""));
  EXPECT_FALSE(bearer_token("Bearerabc"));
}

TEST(Auth, ConstantTimeEquals) {
  EXPECT_TRUE(constant_time_equals("secret", "secret"));
  EXPECT_FALSE(constant_time_equals("secret", "secreT"));
  EXPECT_FALSE(constant_time_equals("secret", "secret2"));
  EXPECT_FALSE(constant_time_equals("", "x"));
}

TEST(Auth, AdminTokenIsRequiredWhenSet) {
  const AdminAuth open("");
  EXPECT_FALSE(open.enabled());
  EXPECT_FALSE(open.check(""));

  const AdminAuth admin("t0ken");
  EXPECT_TRUE(admin.enabled());
  EXPECT_FALSE(admin.check("Bearer t0ken"));
  for (const char* bad : {"", "Bearer", "Bearer t0ke", "Bearer t0ken2", "Basic t0ken", "t0ken"}) {
    const auto e = admin.check(bad);
    ASSERT_TRUE(e) << bad;
    EXPECT_EQ(e->status, 401);
  }
}

TEST(Auth, ApiKeysMapToTenants) {
  auto keys = ApiKeys::parse("# keys\nsk-a tenant-a\n\n  sk-b\ttenant-b  \r\n", "keys.txt");
  ASSERT_TRUE(keys) << keys.error().message;
  EXPECT_EQ(keys->size(), 2u);
  EXPECT_EQ(*keys->tenant_for("Bearer sk-a"), "tenant-a");
  EXPECT_EQ(*keys->tenant_for("Bearer sk-b"), "tenant-b");
  for (const char* bad : {"", "Bearer sk-c", "Bearer sk-", "sk-a", "Bearer tenant-a"}) {
    const auto t = keys->tenant_for(bad);
    ASSERT_FALSE(t) << bad;
    EXPECT_EQ(t.error().status, 401);
  }
}

TEST(Auth, ApiKeysFileErrorsNameTheLine) {
  auto r = ApiKeys::parse("sk-a tenant-a\nlonely\n", "keys.txt");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "keys.txt:2: expected 'KEY TENANT'");
  r = ApiKeys::parse("sk-a t1\nsk-a t2\n", "keys.txt");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "keys.txt:2: key listed twice");
  EXPECT_FALSE(ApiKeys::parse("# nothing\n", "keys.txt"));
  EXPECT_FALSE(ApiKeys::load_file("/nonexistent/keys"));
}

// The secrets' flags: a value, a file (a mounted Kubernetes Secret, final newline dropped) or the environment.
TEST(AuthConfig, SecretsComeFromFlagsFilesOrEnvironment) {
  const std::string file = ::testing::TempDir() + "/admin-token";
  std::ofstream(file) << "from-file\n";
  const char* argv[] = {"kvroute", "--admin-token-file", file.c_str(), "--tenant-salt-secret", "salt",
                        "--allow-client-cache-salt", "true", "--api-keys-file", "/etc/kvroute/keys"};
  auto cfg = load_config(9, argv);
  ASSERT_TRUE(cfg) << cfg.error().message;
  EXPECT_EQ(cfg->admin_token, "from-file");
  EXPECT_EQ(cfg->tenant_salt_secret, "salt");
  EXPECT_TRUE(cfg->allow_client_cache_salt);
  EXPECT_EQ(cfg->api_keys_file, "/etc/kvroute/keys");

  ::setenv("KVROUTE_ADMIN_TOKEN", "from-env", 1);
  const char* plain[] = {"kvroute"};
  cfg = load_config(1, plain);
  ::unsetenv("KVROUTE_ADMIN_TOKEN");
  ASSERT_TRUE(cfg);
  EXPECT_EQ(cfg->admin_token, "from-env");
  EXPECT_FALSE(cfg->allow_client_cache_salt);

  const char* missing[] = {"kvroute", "--admin-token-file", "/nonexistent/token"};
  cfg = load_config(3, missing);
  ASSERT_FALSE(cfg);
  EXPECT_NE(cfg.error().message.find("--admin-token-file"), std::string::npos) << cfg.error().message;
}

}  // namespace
}  // namespace kvroute::router
