// ClientStream: the byte stream of one client connection, plain TCP or TLS (--tls-cert, --admin-tls-cert), as
// one type that Asio's and Beast's composed operations take (an AsyncReadStream and AsyncWriteStream).
//
// The plain path is the socket's own: async_read_some and async_write_some hand the caller's handler straight
// to the socket, so a plain connection pays one branch, no allocation and no type erasure. The TLS path lives in
// router/tls.cc, the only file of the router that includes OpenSSL's and Asio's SSL headers: the handler is
// type-erased there, the bytes to write are gathered into one record-sized piece (TLS encrypts one buffer per
// write anyway), and a read fills the first buffer given.
//
// Not thread-safe: used on the connection's thread. At most one read and one write at a time (TLS allows one
// of each under way together, as plain TCP does).
//
//   auto tls = TlsContext::load("cert.pem", "key.pem");            // once per listener
//   ClientStream stream(std::move(socket), *tls);                   // or without: plain TCP
//   stream.async_handshake([](error_code ec) { ... });             // TLS only
//   asio::async_write(stream, buffers, handler);
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "util/result.h"

namespace kvroute::router {

// One listener's server certificate and key (an ssl::context), shared by its connections. Defined in tls.cc.
class TlsContext {
 public:
  // PEM files: the certificate chain (leaf first) and its private key. Errors name the file and OpenSSL's reason.
  static Result<std::shared_ptr<TlsContext>> load(const std::string& cert_file, const std::string& key_file);
  ~TlsContext();
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit TlsContext(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class ClientStream {
 public:
  using executor_type = boost::asio::any_io_executor;
  using IoHandler = boost::asio::any_completion_handler<void(boost::system::error_code, std::size_t)>;
  using HandshakeHandler = boost::asio::any_completion_handler<void(boost::system::error_code)>;

  // `tls` null: plain TCP.
  ClientStream(boost::asio::ip::tcp::socket&& socket, const std::shared_ptr<TlsContext>& tls);
  ~ClientStream();
  ClientStream(const ClientStream&) = delete;
  ClientStream& operator=(const ClientStream&) = delete;

  executor_type get_executor() { return socket_.get_executor(); }
  // The TCP socket beneath (to wait for readability, to shut down and close).
  boost::asio::ip::tcp::socket& tcp() { return socket_; }
  bool tls() const { return tls_ != nullptr; }
  // The TLS server handshake; a plain stream completes at once.
  void async_handshake(HandshakeHandler handler);
  // Shuts the TCP connection down and closes it (a TLS connection without close_notify: every response is
  // framed by its length or its chunks, so the client never relies on it).
  void close();

  template <class ConstBufferSequence, class Token>
  auto async_write_some(const ConstBufferSequence& buffers, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [this](auto handler, const ConstBufferSequence& b) {
          if (!tls_) return socket_.async_write_some(b, std::move(handler));
          const std::size_t n = boost::asio::buffer_copy(boost::asio::buffer(staging(), kTlsStaging), b);
          tls_write(n, IoHandler(std::move(handler)));
        },
        token, buffers);
  }

  template <class MutableBufferSequence, class Token>
  auto async_read_some(const MutableBufferSequence& buffers, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [this](auto handler, const MutableBufferSequence& b) {
          if (!tls_) return socket_.async_read_some(b, std::move(handler));
          tls_read(boost::asio::mutable_buffer(*boost::asio::buffer_sequence_begin(b)), IoHandler(std::move(handler)));
        },
        token, buffers);
  }

 private:
  struct Tls;
  static constexpr std::size_t kTlsStaging = 16 * 1024;  // one TLS record's plaintext (RFC 8446 5.1)
  char* staging();
  void tls_write(std::size_t n, IoHandler handler);
  void tls_read(boost::asio::mutable_buffer buffer, IoHandler handler);

  boost::asio::ip::tcp::socket socket_;
  std::unique_ptr<Tls> tls_;  // after socket_: destroyed first, it refers to it
};

}  // namespace kvroute::router
