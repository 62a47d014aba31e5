// The flags of TLS, admission control and the header-read timeout, and TlsContext's refusals of bad files.
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "router/client_stream.h"
#include "router/config.h"
#include "tests/router/load_args.h"

namespace kvroute::router {
namespace {

TEST(AccessConfig, DefaultsMatchTheDocumentation) {
  auto c = load_args({});
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->header_timeout_s, 10);
  EXPECT_EQ(c->max_concurrent_requests, 0u);  // no cap
  EXPECT_EQ(c->max_queued_requests, 1024u);
  EXPECT_DOUBLE_EQ(c->queue_timeout_s, 30);
  EXPECT_TRUE(c->tls_cert.empty());
  EXPECT_TRUE(c->admin_tls);
}

TEST(AccessConfig, Flags) {
  auto c = load_args({"--header-read-timeout", "2.5", "--max-concurrent-requests=64", "--max-queued-requests", "0",
                  "--queue-timeout", "0.5", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--admin-tls", "false"});
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_DOUBLE_EQ(c->header_timeout_s, 2.5);
  EXPECT_EQ(c->max_concurrent_requests, 64u);
  EXPECT_EQ(c->max_queued_requests, 0u);
  EXPECT_DOUBLE_EQ(c->queue_timeout_s, 0.5);
  EXPECT_EQ(c->tls_cert, "c.pem");
  EXPECT_EQ(c->tls_key, "k.pem");
  EXPECT_FALSE(c->admin_tls);
  EXPECT_FALSE(load_args({"--header-read-timeout", "0"}));
  EXPECT_FALSE(load_args({"--max-concurrent-requests", "-1"}));
  EXPECT_FALSE(load_args({"--queue-timeout", "never"}));
}

TEST(TlsContext, RefusesMissingFilesAndAKeyOfAnotherCertificate) {
  const std::string dir = ::testing::TempDir();
  const auto make = [&](const std::string& name) {
    const std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
                            "-subj /CN=localhost -keyout " + dir + "/" + name + "-key.pem -out " + dir + "/" + name +
                            "-cert.pem >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
  };
  if (!make("one") || !make("two")) GTEST_SKIP() << "no openssl CLI";
  auto ok = TlsContext::load(dir + "/one-cert.pem", dir + "/one-key.pem");
  EXPECT_TRUE(ok) << ok.error().message;
  auto missing = TlsContext::load(dir + "/none.pem", dir + "/one-key.pem");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("none.pem"), std::string::npos) << missing.error().message;
  auto no_key = TlsContext::load(dir + "/one-cert.pem", dir + "/none-key.pem");
  ASSERT_FALSE(no_key);
  EXPECT_NE(no_key.error().message.find("none-key.pem"), std::string::npos) << no_key.error().message;
  auto mismatch = TlsContext::load(dir + "/one-cert.pem", dir + "/two-key.pem");
  ASSERT_FALSE(mismatch);
  EXPECT_NE(mismatch.error().message.find("mismatch"), std::string::npos) << mismatch.error().message;
}

}  // namespace
}  // namespace kvroute::router
