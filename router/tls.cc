// The TLS half of ClientStream (router/client_stream.h): the only file of the router that includes Asio's SSL
// support and OpenSSL, so that the plain path's files compile without them.
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <array>

#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>

#include "router/client_stream.h"

namespace kvroute::router {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

struct TlsContext::Impl {
  ssl::context context{ssl::context::tls_server};
};

TlsContext::TlsContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TlsContext::~TlsContext() = default;

Result<std::shared_ptr<TlsContext>> TlsContext::load(const std::string& cert_file, const std::string& key_file) {
  auto impl = std::make_unique<Impl>();
  boost::system::error_code ec;
  // TLS 1.2 and 1.3 only (RFC 8996 deprecates 1.0 and 1.1); no renegotiation a client could start.
  impl->context.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                                ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use,
                            ec);
  SSL_CTX_set_options(impl->context.native_handle(), SSL_OP_NO_RENEGOTIATION);
  if (!ec) impl->context.use_certificate_chain_file(cert_file, ec);
  if (ec) return make_error("TLS certificate '" + cert_file + "': " + ec.message());
  impl->context.use_private_key_file(key_file, ssl::context::pem, ec);
  if (ec) return make_error("TLS key '" + key_file + "': " + ec.message());
  if (SSL_CTX_check_private_key(impl->context.native_handle()) != 1) {
    return make_error("TLS key '" + key_file + "' does not match the certificate '" + cert_file + "'");
  }
  return std::shared_ptr<TlsContext>(new TlsContext(std::move(impl)));
}

struct ClientStream::Tls {
  Tls(tcp::socket& socket, ssl::context& context) : stream(socket, context) {}
  ssl::stream<tcp::socket&> stream;
  std::array<char, kTlsStaging> staging;
};

ClientStream::ClientStream(tcp::socket&& socket, const std::shared_ptr<TlsContext>& tls) : socket_(std::move(socket)) {
  if (tls) tls_ = std::make_unique<Tls>(socket_, tls->impl().context);
}

ClientStream::~ClientStream() = default;

char* ClientStream::staging() { return tls_->staging.data(); }

void ClientStream::async_handshake(HandshakeHandler handler) {
  if (!tls_) {
    return asio::post(socket_.get_executor(), [h = std::move(handler)]() mutable { std::move(h)(boost::system::error_code{}); });
  }
  tls_->stream.async_handshake(ssl::stream_base::server, std::move(handler));
}

void ClientStream::tls_write(std::size_t n, IoHandler handler) {
  tls_->stream.async_write_some(asio::buffer(tls_->staging.data(), n), std::move(handler));
}

void ClientStream::tls_read(asio::mutable_buffer buffer, IoHandler handler) {
  tls_->stream.async_read_some(buffer, std::move(handler));
}

void ClientStream::close() {
  boost::system::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  socket_.close(ec);
}

}  // namespace kvroute::router
