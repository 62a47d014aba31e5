// Result<T>: a value or an Error a user can act on. The data path reports errors as values, never by throwing
// (C++20 has no std::expected; this is the small subset kvroute needs).
//
//   Result<int> parse_port(std::string_view s);
//   auto r = parse_port("80x");
//   if (!r) log(r.error().message);   // "port: '80x' is not a number"
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace kvroute {

struct Error {
  std::string message;
  // HTTP status and OpenAI error fields, for errors that reach a client.
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;
};

template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

inline Error make_error(std::string message, int status = 400, std::string type = "invalid_request_error",
                        std::string code = "") {
  return Error{std::move(message), status, std::move(type), std::move(code)};
}

}  // namespace kvroute
