#include "backends/events/msgpack.h"

#include <bit>
#include <cstring>
#include <limits>

namespace kvroute::events {

namespace {

std::uint64_t load_be(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::kNil: return "nil";
    case MsgType::kBool: return "bool";
    case MsgType::kInt: return "int";
    case MsgType::kFloat: return "float";
    case MsgType::kStr: return "str";
    case MsgType::kBin: return "bin";
    case MsgType::kArray: return "array";
    case MsgType::kMap: return "map";
    case MsgType::kExt: return "ext";
    case MsgType::kEnd: return "end of data";
    case MsgType::kInvalid: return "invalid";
  }
  return "?";
}

// Tag ranges from the msgpack spec ("Formats" overview table).
MsgType MsgpackReader::peek() const {
  if (!ok()) return MsgType::kInvalid;
  if (p_ == end_) return MsgType::kEnd;
  const std::uint8_t b = *p_;
  if (b <= 0x7f || b >= 0xe0) return MsgType::kInt;
  if (b <= 0x8f) return MsgType::kMap;
  if (b <= 0x9f) return MsgType::kArray;
  if (b <= 0xbf) return MsgType::kStr;
  switch (b) {
    case 0xc0: return MsgType::kNil;
    case 0xc2: case 0xc3: return MsgType::kBool;
    case 0xc4: case 0xc5: case 0xc6: return MsgType::kBin;
    case 0xc7: case 0xc8: case 0xc9: return MsgType::kExt;
    case 0xca: case 0xcb: return MsgType::kFloat;
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: return MsgType::kInt;
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: return MsgType::kExt;
    case 0xd9: case 0xda: case 0xdb: return MsgType::kStr;
    case 0xdc: case 0xdd: return MsgType::kArray;
    case 0xde: case 0xdf: return MsgType::kMap;
    default: return MsgType::kInvalid;  // 0xc1 is "never used"
  }
}

bool MsgpackReader::fail(std::string_view what) {
  if (ok()) {
    error_.assign("msgpack: ");
    error_.append(what);
    error_.append(" at byte ");
    error_.append(std::to_string(offset()));
  }
  p_ = end_;  // nothing more is read after a failure
  return false;
}

bool MsgpackReader::need(std::size_t n, const char* what) {
  if (!ok()) return false;
  if (remaining() < n) {
    std::string m = "truncated ";
    m += what;
    m += " (needs ";
    m += std::to_string(n);
    m += " bytes, ";
    m += std::to_string(remaining());
    m += " left)";
    return fail(m);
  }
  return true;
}

bool MsgpackReader::type_error(const char* expected) {
  if (!ok()) return false;
  std::string m = "expected ";
  m += expected;
  m += ", found ";
  m += msg_type_name(peek());
  return fail(m);
}

bool MsgpackReader::read_nil() {
  if (!need(1, "nil")) return false;
  if (*p_ != 0xc0) return type_error("nil");
  ++p_;
  return true;
}

bool MsgpackReader::try_nil() {
  if (ok() && p_ != end_ && *p_ == 0xc0) {
    ++p_;
    return true;
  }
  return false;
}

bool MsgpackReader::read_bool(bool& out) {
  if (!need(1, "bool")) return false;
  if (*p_ != 0xc2 && *p_ != 0xc3) return type_error("bool");
  out = *p_++ == 0xc3;
  return true;
}

// Reads any integer; for negative values `v` holds the two's-complement bit pattern.
bool MsgpackReader::read_int_raw(bool& negative, std::uint64_t& v) {
  if (!need(1, "int")) return false;
  const std::uint8_t b = *p_;
  if (b <= 0x7f) {
    negative = false;
    v = b;
    ++p_;
    return true;
  }
  if (b >= 0xe0) {
    negative = true;
    v = static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int8_t>(b)));
    ++p_;
    return true;
  }
  int width = 0;
  bool is_signed = false;
  switch (b) {
    case 0xcc: width = 1; break;
    case 0xcd: width = 2; break;
    case 0xce: width = 4; break;
    case 0xcf: width = 8; break;
    case 0xd0: width = 1; is_signed = true; break;
    case 0xd1: width = 2; is_signed = true; break;
    case 0xd2: width = 4; is_signed = true; break;
    case 0xd3: width = 8; is_signed = true; break;
    default: return type_error("int");
  }
  if (!need(1 + static_cast<std::size_t>(width), "int")) return false;
  std::uint64_t raw = load_be(p_ + 1, width);
  p_ += 1 + width;
  if (is_signed) {
    // Sign-extend from `width` bytes.
    const int shift = 64 - 8 * width;
    const std::int64_t s = static_cast<std::int64_t>(raw << shift) >> shift;
    negative = s < 0;
    v = static_cast<std::uint64_t>(s);
  } else {
    negative = false;
    v = raw;
  }
  return true;
}

bool MsgpackReader::read_int(std::int64_t& out) {
  bool neg = false;
  std::uint64_t v = 0;
  if (!read_int_raw(neg, v)) return false;
  if (!neg && v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return fail("integer out of int64 range");
  }
  out = static_cast<std::int64_t>(v);
  return true;
}

bool MsgpackReader::read_uint(std::uint64_t& out) {
  bool neg = false;
  std::uint64_t v = 0;
  if (!read_int_raw(neg, v)) return false;
  if (neg) return fail("negative integer where an unsigned one is expected");
  out = v;
  return true;
}

bool MsgpackReader::read_u32_values(std::span<std::uint32_t> out) {
  for (std::uint32_t& v : out) {
    if (!ok()) return false;
    // Fast path: the tag and its payload are in bounds; otherwise the general reader reports the error.
    const std::size_t left = remaining();
    const std::uint8_t b = left ? *p_ : 0xc1;
    if (b <= 0x7f) {
      v = b;
      ++p_;
    } else if (b == 0xcc && left >= 2) {
      v = p_[1];
      p_ += 2;
    } else if (b == 0xcd && left >= 3) {
      v = static_cast<std::uint32_t>(load_be(p_ + 1, 2));
      p_ += 3;
    } else if (b == 0xce && left >= 5) {
      v = static_cast<std::uint32_t>(load_be(p_ + 1, 4));
      p_ += 5;
    } else {
      std::uint64_t u = 0;
      if (!read_uint(u)) return false;
      if (u > 0xffffffffull) return fail("integer out of uint32 range");
      v = static_cast<std::uint32_t>(u);
    }
  }
  return ok();
}

bool MsgpackReader::read_int_bits(std::uint64_t& out) {
  bool neg = false;
  return read_int_raw(neg, out);
}

bool MsgpackReader::read_number(double& out) {
  if (!need(1, "number")) return false;
  const std::uint8_t b = *p_;
  if (b == 0xca) {
    if (!need(5, "float32")) return false;
    const auto bits = static_cast<std::uint32_t>(load_be(p_ + 1, 4));
    out = static_cast<double>(std::bit_cast<float>(bits));
    p_ += 5;
    return true;
  }
  if (b == 0xcb) {
    if (!need(9, "float64")) return false;
    out = std::bit_cast<double>(load_be(p_ + 1, 8));
    p_ += 9;
    return true;
  }
  if (peek() != MsgType::kInt) return type_error("number");
  bool neg = false;
  std::uint64_t v = 0;
  if (!read_int_raw(neg, v)) return false;
  out = neg ? static_cast<double>(static_cast<std::int64_t>(v)) : static_cast<double>(v);
  return true;
}

bool MsgpackReader::read_str(std::string_view& out) {
  if (!need(1, "str")) return false;
  const std::uint8_t b = *p_;
  std::size_t len = 0;
  int hdr = 1;
  if (b >= 0xa0 && b <= 0xbf) {
    len = b & 0x1f;
  } else if (b == 0xd9 || b == 0xda || b == 0xdb) {
    const int w = b == 0xd9 ? 1 : b == 0xda ? 2 : 4;
    if (!need(1 + static_cast<std::size_t>(w), "str header")) return false;
    len = load_be(p_ + 1, w);
    hdr = 1 + w;
  } else {
    return type_error("str");
  }
  if (!need(hdr + len, "str")) return false;
  out = std::string_view(reinterpret_cast<const char*>(p_ + hdr), len);
  p_ += hdr + len;
  return true;
}

bool MsgpackReader::read_bin(std::span<const std::uint8_t>& out) {
  if (!need(1, "bin")) return false;
  const std::uint8_t b = *p_;
  if (b != 0xc4 && b != 0xc5 && b != 0xc6) return type_error("bin");
  const int w = b == 0xc4 ? 1 : b == 0xc5 ? 2 : 4;
  if (!need(1 + static_cast<std::size_t>(w), "bin header")) return false;
  const std::size_t len = load_be(p_ + 1, w);
  if (!need(1 + w + len, "bin")) return false;
  out = std::span<const std::uint8_t>(p_ + 1 + w, len);
  p_ += 1 + w + len;
  return true;
}

bool MsgpackReader::read_bytes(std::span<const std::uint8_t>& out) {
  if (peek() == MsgType::kStr) {
    std::string_view s;
    if (!read_str(s)) return false;
    out = std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
    return true;
  }
  return read_bin(out);
}

bool MsgpackReader::read_array_header(std::uint32_t& count) {
  if (!need(1, "array")) return false;
  const std::uint8_t b = *p_;
  if (b >= 0x90 && b <= 0x9f) {
    count = b & 0x0f;
    ++p_;
  } else if (b == 0xdc || b == 0xdd) {
    const int w = b == 0xdc ? 2 : 4;
    if (!need(1 + static_cast<std::size_t>(w), "array header")) return false;
    count = static_cast<std::uint32_t>(load_be(p_ + 1, w));
    p_ += 1 + w;
  } else {
    return type_error("array");
  }
  // Every element takes at least one byte.
  if (count > remaining()) return fail("array count " + std::to_string(count) + " exceeds the bytes left");
  return true;
}

bool MsgpackReader::read_map_header(std::uint32_t& count) {
  if (!need(1, "map")) return false;
  const std::uint8_t b = *p_;
  if (b >= 0x80 && b <= 0x8f) {
    count = b & 0x0f;
    ++p_;
  } else if (b == 0xde || b == 0xdf) {
    const int w = b == 0xde ? 2 : 4;
    if (!need(1 + static_cast<std::size_t>(w), "map header")) return false;
    count = static_cast<std::uint32_t>(load_be(p_ + 1, w));
    p_ += 1 + w;
  } else {
    return type_error("map");
  }
  // Every key and every value takes at least one byte.
  if (static_cast<std::uint64_t>(count) * 2 > remaining()) {
    return fail("map count " + std::to_string(count) + " exceeds the bytes left");
  }
  return true;
}

bool MsgpackReader::skip() { return skip_depth(0); }

bool MsgpackReader::skip_depth(int depth) {
  if (!need(1, "value")) return false;
  const std::uint8_t b = *p_;
  switch (peek()) {
    case MsgType::kNil:
    case MsgType::kBool:
      ++p_;
      return true;
    case MsgType::kInt: {
      std::uint64_t v;
      return read_int_bits(v);
    }
    case MsgType::kFloat: {
      double d;
      return read_number(d);
    }
    case MsgType::kStr: {
      std::string_view s;
      return read_str(s);
    }
    case MsgType::kBin: {
      std::span<const std::uint8_t> s;
      return read_bin(s);
    }
    case MsgType::kArray:
    case MsgType::kMap: {
      if (depth >= max_depth_) return fail("nesting deeper than " + std::to_string(max_depth_));
      std::uint32_t n = 0;
      std::uint64_t items = 0;
      if (peek() == MsgType::kArray) {
        if (!read_array_header(n)) return false;
        items = n;
      } else {
        if (!read_map_header(n)) return false;
        items = std::uint64_t{n} * 2;
      }
      for (std::uint64_t i = 0; i < items; ++i) {
        if (!skip_depth(depth + 1)) return false;
      }
      return true;
    }
    case MsgType::kExt: {
      // fixext 1/2/4/8/16: tag, type, data. ext 8/16/32: tag, length, type, data.
      std::size_t hdr = 0, len = 0;
      if (b >= 0xd4 && b <= 0xd8) {
        hdr = 2;
        len = std::size_t{1} << (b - 0xd4);
      } else {
        const int w = b == 0xc7 ? 1 : b == 0xc8 ? 2 : 4;
        if (!need(1 + static_cast<std::size_t>(w), "ext header")) return false;
        len = load_be(p_ + 1, w);
        hdr = 2 + static_cast<std::size_t>(w);
      }
      if (!need(hdr + len, "ext")) return false;
      p_ += hdr + len;
      return true;
    }
    case MsgType::kEnd:
    case MsgType::kInvalid:
      break;
  }
  return fail("invalid type byte 0xc1");
}

// ---------------------------------------------------------------------------------------------------------

void MsgpackWriter::put_be(std::uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) buf_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

MsgpackWriter& MsgpackWriter::nil() {
  put(0xc0);
  return *this;
}

MsgpackWriter& MsgpackWriter::boolean(bool v) {
  put(v ? 0xc3 : 0xc2);
  return *this;
}

MsgpackWriter& MsgpackWriter::u64(std::uint64_t v) {
  if (v <= 0x7f) {
    put(static_cast<std::uint8_t>(v));
  } else if (v <= 0xff) {
    put(0xcc);
    put_be(v, 1);
  } else if (v <= 0xffff) {
    put(0xcd);
    put_be(v, 2);
  } else if (v <= 0xffffffffull) {
    put(0xce);
    put_be(v, 4);
  } else {
    put(0xcf);
    put_be(v, 8);
  }
  return *this;
}

MsgpackWriter& MsgpackWriter::i64(std::int64_t v) {
  if (v >= 0) return u64(static_cast<std::uint64_t>(v));
  const auto bits = static_cast<std::uint64_t>(v);
  if (v >= -32) {
    put(static_cast<std::uint8_t>(bits));
  } else if (v >= -128) {
    put(0xd0);
    put_be(bits, 1);
  } else if (v >= -32768) {
    put(0xd1);
    put_be(bits, 2);
  } else if (v >= -2147483648ll) {
    put(0xd2);
    put_be(bits, 4);
  } else {
    put(0xd3);
    put_be(bits, 8);
  }
  return *this;
}

MsgpackWriter& MsgpackWriter::f32(float v) {
  put(0xca);
  put_be(std::bit_cast<std::uint32_t>(v), 4);
  return *this;
}

MsgpackWriter& MsgpackWriter::f64(double v) {
  put(0xcb);
  put_be(std::bit_cast<std::uint64_t>(v), 8);
  return *this;
}

MsgpackWriter& MsgpackWriter::str(std::string_view v) {
  const std::size_t n = v.size();
  if (n <= 31) {
    put(static_cast<std::uint8_t>(0xa0 | n));
  } else if (n <= 0xff) {
    put(0xd9);
    put_be(n, 1);
  } else if (n <= 0xffff) {
    put(0xda);
    put_be(n, 2);
  } else {
    put(0xdb);
    put_be(n, 4);
  }
  buf_.insert(buf_.end(), v.begin(), v.end());
  return *this;
}

MsgpackWriter& MsgpackWriter::bin(std::span<const std::uint8_t> v) {
  const std::size_t n = v.size();
  if (n <= 0xff) {
    put(0xc4);
    put_be(n, 1);
  } else if (n <= 0xffff) {
    put(0xc5);
    put_be(n, 2);
  } else {
    put(0xc6);
    put_be(n, 4);
  }
  buf_.insert(buf_.end(), v.begin(), v.end());
  return *this;
}

MsgpackWriter& MsgpackWriter::array(std::uint32_t n) {
  if (n <= 15) {
    put(static_cast<std::uint8_t>(0x90 | n));
  } else if (n <= 0xffff) {
    put(0xdc);
    put_be(n, 2);
  } else {
    put(0xdd);
    put_be(n, 4);
  }
  return *this;
}

MsgpackWriter& MsgpackWriter::map(std::uint32_t n) {
  if (n <= 15) {
    put(static_cast<std::uint8_t>(0x80 | n));
  } else if (n <= 0xffff) {
    put(0xde);
    put_be(n, 2);
  } else {
    put(0xdf);
    put_be(n, 4);
  }
  return *this;
}

MsgpackWriter& MsgpackWriter::ext(std::int8_t type, std::span<const std::uint8_t> data) {
  const std::size_t n = data.size();
  switch (n) {
    case 1: put(0xd4); break;
    case 2: put(0xd5); break;
    case 4: put(0xd6); break;
    case 8: put(0xd7); break;
    case 16: put(0xd8); break;
    default:
      if (n <= 0xff) {
        put(0xc7);
        put_be(n, 1);
      } else if (n <= 0xffff) {
        put(0xc8);
        put_be(n, 2);
      } else {
        put(0xc9);
        put_be(n, 4);
      }
  }
  put(static_cast<std::uint8_t>(type));
  buf_.insert(buf_.end(), data.begin(), data.end());
  return *this;
}

MsgpackWriter& MsgpackWriter::raw(std::span<const std::uint8_t> data) {
  buf_.insert(buf_.end(), data.begin(), data.end());
  return *this;
}

}  // namespace kvroute::events
