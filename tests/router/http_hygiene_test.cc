// router/http_hygiene: the request heads of issue 24's smuggling report, parsed by Beast's own parser (the
// one the server uses), then judged by check_request_head; dot segments; hop-by-hop stripping.
#include "router/http_hygiene.h"

#include <memory>
#include <string>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <gtest/gtest.h>

namespace kvroute::router {
namespace {

namespace http = boost::beast::http;
using Parser = http::request_parser<http::string_body>;

struct Head {
  std::unique_ptr<Parser> parser;
  boost::beast::error_code ec;
  std::size_t consumed = 0;  // bytes of the input the parser took (the head, and the body when eager)
};

// Feeds `raw` to a fresh parser as the server does (header limit 64 KiB), stopping once the head is parsed.
Head parse_head(std::string_view raw) {
  Head h;
  h.parser = std::make_unique<Parser>();
  h.parser->header_limit(64 * 1024);
  while (h.consumed < raw.size() && !h.parser->is_header_done()) {
    const std::size_t n =
        h.parser->put(boost::asio::buffer(raw.data() + h.consumed, raw.size() - h.consumed), h.ec);
    h.consumed += n;
    if (h.ec == http::error::need_more) {
      h.ec = {};
      break;
    }
    if (h.ec || n == 0) break;
  }
  return h;
}

// Whether a raw request is refused, by Beast's parser (the server answers a parse error with 400 and closes)
// or by check_request_head.
bool refused(std::string_view raw) {
  Head h = parse_head(raw);
  return h.ec || !h.parser->is_header_done() || check_request_head(h.parser->get().base()).has_value();
}

// The verdict on a raw request: nullopt when accepted. Beast must have accepted the head itself.
std::optional<Error> judge(std::string_view raw, const HygieneLimits& limits = {}) {
  Head h = parse_head(raw);
  EXPECT_FALSE(h.ec) << h.ec.message();
  EXPECT_TRUE(h.parser->is_header_done());
  return check_request_head(h.parser->get().base(), limits);
}

constexpr std::string_view kSmuggled =
    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 76\r\n\r\n"
    R"({"model": "qwen3-8b", "messages": [{"role": "user", "content": "SMUGGLED"}]})";

TEST(HttpHygiene, ChunkedTwiceIsRejectedBeforeTheSmuggledRequestIsRead) {
  const std::string raw =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked, chunked\r\n\r\n" + std::string(kSmuggled);
  Head h = parse_head(raw);
  ASSERT_FALSE(h.ec) << h.ec.message();
  // What Beast 1.81 makes of it: not chunked, and no Content-Length, so a request without a body; the bytes
  // after the head would be parsed as the next request on the connection.
  EXPECT_FALSE(h.parser->chunked());
  EXPECT_FALSE(h.parser->content_length());
  const auto bad = check_request_head(h.parser->get().base());
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->message.find("more than once"), std::string::npos) << bad->message;
  // The verdict comes with the head alone: the smuggled request has not been consumed, and the caller closes.
  EXPECT_LT(h.consumed, raw.size() - kSmuggled.size() + 1);
}

TEST(HttpHygiene, FinalCodingNotChunkedIsRejected) {
  for (const char* te : {"gzip", "chunked, gzip", "identity"}) {
    const std::string raw = std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ") + te +
                            "\r\n\r\n" + std::string(kSmuggled);
    const auto bad = judge(raw);
    ASSERT_TRUE(bad) << te;
    EXPECT_EQ(bad->status, 400) << te;
    EXPECT_NE(bad->message.find("final transfer coding"), std::string::npos) << bad->message;
  }
}

TEST(HttpHygiene, UnknownInnerCodingIs501) {
  const auto bad = judge("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 501);
}

TEST(HttpHygiene, TransferEncodingSplitOverTwoLinesIsOneList) {
  // "chunked" then "gzip" on a second line: the final coding is gzip (Beast 1.81 refuses this one itself).
  EXPECT_TRUE(refused(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n"));
  // "chunked" on two lines: applied twice.
  EXPECT_TRUE(refused(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"));
  // The rule itself, on a head built by hand.
  http::request_header<> head;
  head.version(11);
  head.set(http::field::host, "x");
  head.insert(http::field::transfer_encoding, "chunked");
  head.insert(http::field::transfer_encoding, "gzip");
  const auto bad = check_request_head(head);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
}

TEST(HttpHygiene, TransferEncodingBesideContentLengthIsRejected) {
  // Beast 1.81 frames this one by its Content-Length and keeps the connection open.
  const std::string raw =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello";
  Head h = parse_head(raw);
  ASSERT_FALSE(h.ec) << h.ec.message();
  EXPECT_FALSE(h.parser->chunked());
  EXPECT_TRUE(h.parser->content_length().has_value());
  const auto bad = check_request_head(h.parser->get().base());
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->message.find("both Transfer-Encoding and Content-Length"), std::string::npos) << bad->message;

  // chunked beside Content-Length: Beast 1.81 refuses it itself; the rule refuses it too.
  EXPECT_TRUE(refused("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"));
  http::request_header<> head;
  head.version(11);
  head.set(http::field::host, "x");
  head.set(http::field::transfer_encoding, "chunked");
  head.set(http::field::content_length, "5");
  EXPECT_TRUE(check_request_head(head));
}

TEST(HttpHygiene, ChunkedInHttp10IsRejected) {
  const std::string raw =
      "POST /v1/completions HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n0\r\n\r\n";
  Head h = parse_head(raw);
  ASSERT_FALSE(h.ec) << h.ec.message();
  EXPECT_TRUE(h.parser->chunked());        // Beast reads it as chunked...
  EXPECT_TRUE(h.parser->keep_alive());     // ...and would keep the connection
  const auto bad = check_request_head(h.parser->get().base());
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->message.find("HTTP/1.0"), std::string::npos) << bad->message;
}

TEST(HttpHygiene, PlainRequestsPass) {
  EXPECT_FALSE(judge("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"));
  EXPECT_FALSE(judge("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  EXPECT_FALSE(judge("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked \r\n\r\n"));
  EXPECT_FALSE(judge("GET /health HTTP/1.1\r\nHost: kvroute:8080\r\n\r\n"));
  EXPECT_FALSE(judge("GET /health HTTP/1.0\r\n\r\n"));  // HTTP/1.0 needs no Host
}

TEST(HttpHygiene, MissingOrDuplicateHostIsRejected) {
  auto bad = judge("GET /v1/models HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->message.find("Host"), std::string::npos);
  bad = judge("GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_TRUE(judge("GET /v1/models HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n"));
  EXPECT_TRUE(judge("GET /v1/models HTTP/1.1\r\nHost: a, b\r\n\r\n"));
  EXPECT_TRUE(judge("GET /v1/models HTTP/1.1\r\nHost: user@evil\r\n\r\n"));
}

TEST(HttpHygiene, ConflictingContentLengthsAreRejected) {
  // Beast 1.81 refuses two Content-Length lines itself; the rule covers heads from any parser.
  EXPECT_TRUE(refused("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"));
  for (const char* values : {"5, 6", "5x", "-1", "99999999999999999999"}) {
    http::request_header<> head;
    head.version(11);
    head.set(http::field::host, "x");
    head.set(http::field::content_length, values);
    const auto bad = check_request_head(head);
    ASSERT_TRUE(bad) << values;
    EXPECT_EQ(bad->status, 400);
  }
  http::request_header<> same;
  same.version(11);
  same.set(http::field::host, "x");
  same.set(http::field::content_length, "5, 5");
  EXPECT_FALSE(check_request_head(same));
}

TEST(HttpHygiene, TooManyHeaderFieldsIs431) {
  std::string raw = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 6000; ++i) raw += "X:\r\n";
  raw += "\r\n";
  const auto bad = judge(raw);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 431);
  EXPECT_NE(bad->message.find("6001 header fields"), std::string::npos) << bad->message;

  std::string ok = "GET / HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 99; ++i) ok += "X-" + std::to_string(i) + ": v\r\n";
  EXPECT_FALSE(judge(ok + "\r\n"));                                       // exactly 100 fields
  EXPECT_TRUE(judge(ok + "\r\n", HygieneLimits{.max_header_fields = 99}));
}

TEST(HttpHygiene, DotSegmentsAreNormalized) {
  EXPECT_EQ(*normalize_target("/v1/../admin/workers"), "/admin/workers");
  EXPECT_EQ(*normalize_target("/v1/./chat/completions"), "/v1/chat/completions");
  EXPECT_EQ(*normalize_target("/v1/%2e%2E/admin"), "/admin");
  EXPECT_EQ(*normalize_target("/v1/chat/.."), "/v1/");
  EXPECT_EQ(*normalize_target("/v1/models?x=/../y"), "/v1/models?x=/../y");  // the query is not a path
  EXPECT_EQ(*normalize_target("/v1/chat/completions"), "/v1/chat/completions");
  EXPECT_EQ(*normalize_target("/"), "/");
  EXPECT_EQ(*normalize_target("/a/.../b"), "/a/.../b");  // three dots are a name
  EXPECT_EQ(*normalize_target("/a//b"), "/a//b");
}

TEST(HttpHygiene, PathsThatLeaveTheRootOrAreNotOriginFormAreRejected) {
  for (const char* t : {"/..", "/../admin", "/v1/../../admin", "/%2e%2e/x", "v1/models", "", "*",
                        "http://evil/v1/models"}) {
    const auto r = normalize_target(t);
    ASSERT_FALSE(r) << t;
    EXPECT_EQ(r.error().status, 400);
  }
}

TEST(HttpHygiene, HopByHopAndConnectionNamedFieldsAreStripped) {
  Head h = parse_head(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, X-Secret-Hop\r\n"
      "Connection: x-other\r\nX-Secret-Hop: 1\r\nX-Other: 2\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n"
      "Upgrade: h2c\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic Zm9v\r\nTrailer: X\r\n"
      "Transfer-Encoding: chunked\r\nAuthorization: Bearer k\r\nX-Tenant-Id: a\r\n\r\n");
  ASSERT_FALSE(h.ec);
  http::fields& f = h.parser->get().base();
  {
    const HopByHopFilter hop(f);
    EXPECT_TRUE(hop("x-secret-hop"));
    EXPECT_TRUE(hop("X-OTHER"));
    EXPECT_TRUE(hop("keep-alive"));  // a token of Connection, and hop-by-hop anyway
    EXPECT_FALSE(hop("authorization"));
    EXPECT_FALSE(hop("x-tenant-id"));
  }
  strip_hop_by_hop(f);
  std::vector<std::string> left;
  for (const auto& field : f) left.emplace_back(field.name_string());
  EXPECT_EQ(left, (std::vector<std::string>{"Host", "Authorization", "X-Tenant-Id"}));
}

}  // namespace
}  // namespace kvroute::router
