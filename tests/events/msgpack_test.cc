// Byte-exact tests of the msgpack reader and writer against the MessagePack spec's encodings.
#include "backends/events/msgpack.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/events/test_util.h"

namespace kvroute::events {
namespace {

using testing::hex;

TEST(MsgpackReader, ScalarsOfEveryWidth) {
  struct Case {
    const char* bytes;
    std::int64_t value;
  };
  const Case cases[] = {
      {"00", 0},          {"7f", 127},         {"ff", -1},          {"e0", -32},
      {"cc ff", 255},     {"cd 01 00", 256},   {"ce 00 01 00 00", 65536},
      {"cf 00 00 00 01 00 00 00 00", 4294967296ll},
      {"d0 80", -128},    {"d1 80 00", -32768}, {"d2 80 00 00 00", -2147483648ll},
      {"d3 80 00 00 00 00 00 00 00", std::numeric_limits<std::int64_t>::min()},
      {"d0 05", 5},  // non-minimal encodings are legal
  };
  for (const Case& c : cases) {
    auto b = hex(c.bytes);
    MsgpackReader r(b);
    std::int64_t v = 0;
    ASSERT_TRUE(r.read_int(v)) << c.bytes << ": " << r.error();
    EXPECT_EQ(v, c.value) << c.bytes;
    EXPECT_TRUE(r.at_end());
  }
}

TEST(MsgpackReader, Uint64AndBitPatterns) {
  auto max = hex("cf ff ff ff ff ff ff ff ff");
  {
    MsgpackReader r(max);
    std::uint64_t u = 0;
    ASSERT_TRUE(r.read_uint(u));
    EXPECT_EQ(u, std::numeric_limits<std::uint64_t>::max());
  }
  {
    MsgpackReader r(max);
    std::int64_t i = 0;
    EXPECT_FALSE(r.read_int(i));  // does not fit int64
    EXPECT_NE(r.error().find("int64"), std::string::npos);
  }
  {
    auto neg = hex("d3 ff ff ff ff ff ff ff fe");  // -2
    MsgpackReader r(neg);
    std::uint64_t bits = 0;
    ASSERT_TRUE(r.read_int_bits(bits));
    EXPECT_EQ(bits, 0xfffffffffffffffeull);
    MsgpackReader r2(neg);
    std::uint64_t u = 0;
    EXPECT_FALSE(r2.read_uint(u));
  }
}

TEST(MsgpackReader, FloatsStringsBinsNilBool) {
  auto b = hex("ca 3f c0 00 00  cb 3f f8 00 00 00 00 00 00  a3 'abc'  d9 03 'abc'  da 00 03 'abc'"
               "db 00 00 00 03 'abc'  c4 02 01 02  c5 00 01 ff  c0 c2 c3 2a");
  MsgpackReader r(b);
  double d = 0;
  ASSERT_TRUE(r.read_number(d));
  EXPECT_EQ(d, 1.5);
  ASSERT_TRUE(r.read_number(d));
  EXPECT_EQ(d, 1.5);
  for (int i = 0; i < 4; ++i) {
    std::string_view s;
    ASSERT_TRUE(r.read_str(s)) << r.error();
    EXPECT_EQ(s, "abc");
  }
  std::span<const std::uint8_t> bin;
  ASSERT_TRUE(r.read_bin(bin));
  ASSERT_EQ(bin.size(), 2u);
  EXPECT_EQ(bin[1], 2);
  ASSERT_TRUE(r.read_bin(bin));
  EXPECT_EQ(bin.size(), 1u);
  EXPECT_TRUE(r.read_nil());
  bool v = true;
  ASSERT_TRUE(r.read_bool(v));
  EXPECT_FALSE(v);
  ASSERT_TRUE(r.read_bool(v));
  EXPECT_TRUE(v);
  ASSERT_TRUE(r.read_number(d));  // an integer where a number is expected
  EXPECT_EQ(d, 42.0);
  EXPECT_TRUE(r.at_end());
}

TEST(MsgpackReader, ContainersAndSkip) {
  auto b = hex("93 01 02 03  dc 00 02 c0 c0  dd 00 00 00 01 c0  81 a1 'a' 01  de 00 01 a1 'b' 02"
               "df 00 00 00 00");
  MsgpackReader r(b);
  std::uint32_t n = 0;
  ASSERT_TRUE(r.read_array_header(n));
  EXPECT_EQ(n, 3u);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(r.skip());
  ASSERT_TRUE(r.read_array_header(n));
  EXPECT_EQ(n, 2u);
  ASSERT_TRUE(r.skip());
  ASSERT_TRUE(r.skip());
  ASSERT_TRUE(r.skip());  // the whole array32
  ASSERT_TRUE(r.read_map_header(n));
  EXPECT_EQ(n, 1u);
  ASSERT_TRUE(r.skip());
  ASSERT_TRUE(r.skip());
  ASSERT_TRUE(r.skip());  // map16
  ASSERT_TRUE(r.read_map_header(n));
  EXPECT_EQ(n, 0u);
  EXPECT_TRUE(r.at_end());
}

TEST(MsgpackReader, SkipsExtensionsOfEveryForm) {
  auto b = hex("d4 01 05  d5 01 05 06  d6 ff 00 00 00 00  d7 ff 00 00 00 00 00 00 00 00"
               "d8 02 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
               "c7 03 01 aa bb cc  c8 00 01 01 aa  c9 00 00 00 00 01  c0");
  MsgpackReader r(b);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(r.skip()) << i << " " << r.error();
  EXPECT_EQ(r.peek(), MsgType::kNil);
}

TEST(MsgpackReader, ErrorsAreValuesAndSticky) {
  const char* bad[] = {
      "cd 01",                 // truncated uint16
      "a5 'ab'",               // truncated fixstr
      "d9",                    // str8 without its length
      "dd ff ff ff ff 00",     // count larger than the bytes left
      "df 00 00 00 05 00",     // map count larger than the bytes left
      "c1",                    // never used
      "c6 ff ff ff ff 00",     // bin32 longer than the frame
      "c9 00 00 00 10 01 02",  // ext32 longer than the frame
      "",                      // nothing at all
  };
  for (const char* b : bad) {
    auto bytes = hex(b);
    MsgpackReader r(bytes);
    EXPECT_FALSE(r.skip()) << b;
    EXPECT_FALSE(r.ok()) << b;
    EXPECT_FALSE(r.error().empty());
    // Sticky: nothing reads after the first error.
    std::int64_t v;
    EXPECT_FALSE(r.read_int(v));
  }
  auto s = hex("a1 'x'");
  MsgpackReader r(s);
  std::int64_t v;
  EXPECT_FALSE(r.read_int(v));
  EXPECT_NE(r.error().find("expected int, found str"), std::string::npos) << r.error();
}

TEST(MsgpackReader, DepthIsBounded) {
  std::vector<std::uint8_t> deep(100, 0x91);  // [[[[...]]]]
  deep.push_back(0xc0);
  MsgpackReader r(deep, 32);
  EXPECT_FALSE(r.skip());
  EXPECT_NE(r.error().find("nesting"), std::string::npos);
  MsgpackReader ok(std::span<const std::uint8_t>(deep).subspan(90), 32);
  EXPECT_TRUE(ok.skip());
}

TEST(MsgpackWriter, ShortestEncodings) {
  MsgpackWriter w;
  w.i64(0).i64(127).i64(128).i64(-1).i64(-32).i64(-33).i64(-129).i64(256).i64(-40000).i64(70000);
  w.u64(0xffffffffffffffffull).i64(std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(std::vector<std::uint8_t>(w.bytes().begin(), w.bytes().end()),
            hex("00 7f cc 80 ff e0 d0 df d1 ff 7f cd 01 00 d2 ff ff 63 c0 ce 00 01 11 70"
                "cf ff ff ff ff ff ff ff ff d3 80 00 00 00 00 00 00 00"));
  w.clear();
  w.str("abc").str(std::string(32, 'x')).array(15).array(16).map(15).map(16).nil().boolean(true).f64(1.5).f32(1.5f);
  auto expect = hex("a3 'abc' d9 20");
  expect.insert(expect.end(), 32, 'x');
  auto tail = hex("9f dc 00 10 8f de 00 10 c0 c3 cb 3f f8 00 00 00 00 00 00 ca 3f c0 00 00");
  expect.insert(expect.end(), tail.begin(), tail.end());
  EXPECT_EQ(std::vector<std::uint8_t>(w.bytes().begin(), w.bytes().end()), expect);
  w.clear();
  const std::uint8_t data[3] = {1, 2, 3};
  w.bin(data).ext(5, std::span<const std::uint8_t>(data, 1)).ext(5, data);
  EXPECT_EQ(std::vector<std::uint8_t>(w.bytes().begin(), w.bytes().end()),
            hex("c4 03 01 02 03 d4 05 01 c7 03 05 01 02 03"));
}

TEST(MsgpackWriter, RoundTripsThroughTheReader) {
  MsgpackWriter w;
  w.map(2).str("k").array(3).i64(-5).u64(1ull << 40).f64(-0.25).str("n").nil();
  MsgpackReader r(w.bytes());
  std::uint32_t n;
  std::string_view s;
  std::int64_t i;
  std::uint64_t u;
  double d;
  ASSERT_TRUE(r.read_map_header(n) && n == 2);
  ASSERT_TRUE(r.read_str(s) && s == "k");
  ASSERT_TRUE(r.read_array_header(n) && n == 3);
  ASSERT_TRUE(r.read_int(i) && i == -5);
  ASSERT_TRUE(r.read_uint(u) && u == (1ull << 40));
  ASSERT_TRUE(r.read_number(d) && d == -0.25);
  ASSERT_TRUE(r.read_str(s) && s == "n");
  ASSERT_TRUE(r.read_nil());
  EXPECT_TRUE(r.at_end());
}

}  // namespace
}  // namespace kvroute::events

namespace kvroute::events {
namespace {

TEST(MsgpackReader, U32ValuesFastPathAndErrors) {
  auto b = hex("05 cc ff cd 01 00 ce 00 01 00 00 d0 07 cf 00 00 00 00 ff ff ff ff");
  std::uint32_t out[6] = {};
  MsgpackReader r(b);
  ASSERT_TRUE(r.read_u32_values(out)) << r.error();
  EXPECT_EQ(out[0], 5u);
  EXPECT_EQ(out[1], 255u);
  EXPECT_EQ(out[2], 256u);
  EXPECT_EQ(out[3], 65536u);
  EXPECT_EQ(out[4], 7u);  // signed encoding of a non-negative value
  EXPECT_EQ(out[5], 0xffffffffu);
  for (const char* bad : {"ce 00 01", "cf 00 00 00 01 00 00 00 00", "ff", "cd 01", "a1 'x'"}) {
    auto bytes = hex(bad);
    std::uint32_t v[1];
    MsgpackReader rb(bytes);
    EXPECT_FALSE(rb.read_u32_values(v)) << bad;
  }
}

}  // namespace
}  // namespace kvroute::events
