// MsgpackWriter: the few msgpack encodings the simulated worker's KV-event publisher needs.
//
// Why here and not backends/events: the publisher must not wait on the events library; this writer covers
// exactly what vLLM's msgspec encoder emits for KV events (nil, bool, int64/uint64, float64, str, arrays,
// maps) and nothing else. Output matches msgspec: integers in their smallest msgpack form, floats as
// float64, strings as fixstr/str8/str16/str32.
//
//   MsgpackWriter w;
//   w.array(3); w.f64(ts); w.array(0); w.i64(0);
//   send(w.data());
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kvroute::sim::internal {

class MsgpackWriter {
 public:
  void nil() { out_.push_back(static_cast<char>(0xc0)); }
  void boolean(bool b) { out_.push_back(static_cast<char>(b ? 0xc3 : 0xc2)); }

  void i64(std::int64_t v) {
    if (v >= 0) return u64(static_cast<std::uint64_t>(v));
    if (v >= -32) return byte(static_cast<std::uint8_t>(v));
    if (v >= INT8_MIN) return tagged(0xd0, static_cast<std::uint8_t>(v), 1);
    if (v >= INT16_MIN) return tagged(0xd1, static_cast<std::uint16_t>(v), 2);
    if (v >= INT32_MIN) return tagged(0xd2, static_cast<std::uint32_t>(v), 4);
    tagged(0xd3, static_cast<std::uint64_t>(v), 8);
  }
  void u64(std::uint64_t v) {
    if (v < 128) return byte(static_cast<std::uint8_t>(v));
    if (v <= UINT8_MAX) return tagged(0xcc, v, 1);
    if (v <= UINT16_MAX) return tagged(0xcd, v, 2);
    if (v <= UINT32_MAX) return tagged(0xce, v, 4);
    tagged(0xcf, v, 8);
  }
  void f64(double d) {
    std::uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    tagged(0xcb, bits, 8);
  }
  void str(std::string_view s) {
    const std::size_t n = s.size();
    if (n < 32) byte(static_cast<std::uint8_t>(0xa0 | n));
    else if (n <= UINT8_MAX) tagged(0xd9, n, 1);
    else if (n <= UINT16_MAX) tagged(0xda, n, 2);
    else tagged(0xdb, n, 4);
    out_.append(s);
  }
  void array(std::size_t n) {
    if (n < 16) return byte(static_cast<std::uint8_t>(0x90 | n));
    if (n <= UINT16_MAX) return tagged(0xdc, n, 2);
    tagged(0xdd, n, 4);
  }
  void map(std::size_t n) {
    if (n < 16) return byte(static_cast<std::uint8_t>(0x80 | n));
    if (n <= UINT16_MAX) return tagged(0xde, n, 2);
    tagged(0xdf, n, 4);
  }

  // Appends bytes that already are msgpack (a pre-encoded element).
  void raw(std::string_view encoded) { out_.append(encoded); }

  const std::string& data() const { return out_; }
  std::string take() { return std::move(out_); }
  void clear() { out_.clear(); }

 private:
  void byte(std::uint8_t b) { out_.push_back(static_cast<char>(b)); }
  // Tag byte followed by the low `size` bytes of v, big-endian.
  void tagged(std::uint8_t tag, std::uint64_t v, int size) {
    byte(tag);
    for (int i = size - 1; i >= 0; --i) byte(static_cast<std::uint8_t>(v >> (8 * i)));
  }

  std::string out_;
};

}  // namespace kvroute::sim::internal
