// A small, strict MessagePack reader and writer (the wire format of vLLM's KV events).
//
// Wire format: the MessagePack specification, https://github.com/msgpack/msgpack/blob/master/spec.md.
// kvroute does not depend on a msgpack library: it needs a tiny, allocation-free subset that is strict about
// sizes and types, because every byte it reads comes from the network.
//
// Contract of MsgpackReader:
//  * it reads a borrowed byte span; strings and bins it returns point into that span (keep it alive);
//  * every read checks the bytes left and the type tag; the first failure is recorded (message + offset),
//    the reader becomes "failed" and every later read fails too, so a decoder can chain reads and test
//    ok() once (errors are values; nothing throws);
//  * a container header whose element count cannot fit in the bytes left is an error, so a 5-byte frame
//    cannot make a caller reserve 4 billion elements;
//  * skip() walks any value, nested at most `max_depth` containers deep.
//
//   MsgpackReader r(bytes);
//   std::uint32_t n = 0;
//   if (r.read_array_header(n) && n == 3) { double ts; r.read_number(ts); ... }
//   if (!r.ok()) return make_error(r.error());
//
// MsgpackWriter builds frames (tests, the simulated worker's publisher); it always picks the shortest
// encoding, as msgpack encoders do.
//
//   MsgpackWriter w;
//   w.array(3).f64(1.5).array(0).nil();
//   std::span<const std::uint8_t> frame = w.bytes();
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute::events {

enum class MsgType : std::uint8_t { kNil, kBool, kInt, kFloat, kStr, kBin, kArray, kMap, kExt, kEnd, kInvalid };

const char* msg_type_name(MsgType t);

class MsgpackReader {
 public:
  static constexpr int kDefaultMaxDepth = 32;

  explicit MsgpackReader(std::span<const std::uint8_t> bytes, int max_depth = kDefaultMaxDepth)
      : p_(bytes.data()), begin_(bytes.data()), end_(bytes.data() + bytes.size()), max_depth_(max_depth) {}

  // Type of the next value without consuming it (kEnd at the end, kInvalid for the unused tag 0xc1 or
  // after a failure).
  MsgType peek() const;
  bool ok() const { return error_.empty(); }
  bool at_end() const { return p_ == end_; }
  std::size_t offset() const { return static_cast<std::size_t>(p_ - begin_); }
  std::size_t remaining() const { return static_cast<std::size_t>(end_ - p_); }
  // "what went wrong at byte N"; empty while ok().
  const std::string& error() const { return error_; }

  // Each read returns false (and records an error) when the next value is not of that kind.
  bool read_nil();
  // Consumes a nil if one is next; returns whether it did. Never fails on another type.
  bool try_nil();
  bool read_bool(bool& out);
  // Any msgpack integer that fits in int64 / uint64.
  bool read_int(std::int64_t& out);
  bool read_uint(std::uint64_t& out);
  // Any integer as its 64-bit two's-complement pattern (block hashes may be signed or unsigned).
  bool read_int_bits(std::uint64_t& out);
  // out.size() consecutive unsigned integers that fit in uint32 (token ids): the decoder's hot loop, with a
  // fast path for the encodings msgpack writers pick for such values.
  bool read_u32_values(std::span<std::uint32_t> out);
  // float32, float64, or an integer converted to double.
  bool read_number(double& out);
  bool read_str(std::string_view& out);
  bool read_bin(std::span<const std::uint8_t>& out);
  // str or bin, as raw bytes.
  bool read_bytes(std::span<const std::uint8_t>& out);
  bool read_array_header(std::uint32_t& count);
  bool read_map_header(std::uint32_t& count);
  // Skips one complete value of any type (ext included).
  bool skip();

  // Records an error on behalf of a decoder (keeps the first one). Always returns false.
  bool fail(std::string_view what);

 private:
  bool need(std::size_t n, const char* what);
  bool read_int_raw(bool& negative, std::uint64_t& magnitude_or_bits);
  bool skip_depth(int depth);
  bool type_error(const char* expected);

  const std::uint8_t* p_;
  const std::uint8_t* begin_;
  const std::uint8_t* end_;
  int max_depth_;
  std::string error_;
};

class MsgpackWriter {
 public:
  MsgpackWriter& nil();
  MsgpackWriter& boolean(bool v);
  MsgpackWriter& i64(std::int64_t v);   // shortest signed or unsigned encoding of the value
  MsgpackWriter& u64(std::uint64_t v);  // shortest unsigned encoding
  MsgpackWriter& f32(float v);
  MsgpackWriter& f64(double v);
  MsgpackWriter& str(std::string_view v);
  MsgpackWriter& bin(std::span<const std::uint8_t> v);
  MsgpackWriter& array(std::uint32_t count);
  MsgpackWriter& map(std::uint32_t count);
  MsgpackWriter& ext(std::int8_t type, std::span<const std::uint8_t> data);
  // Appends bytes as they are (pre-encoded values, deliberately malformed frames in tests).
  MsgpackWriter& raw(std::span<const std::uint8_t> data);

  std::span<const std::uint8_t> bytes() const { return buf_; }
  std::vector<std::uint8_t> take() { return std::move(buf_); }
  void clear() { buf_.clear(); }
  std::size_t size() const { return buf_.size(); }

 private:
  void put(std::uint8_t b) { buf_.push_back(b); }
  void put_be(std::uint64_t v, int bytes);
  std::vector<std::uint8_t> buf_;
};

}  // namespace kvroute::events
