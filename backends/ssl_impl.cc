// The single translation unit that compiles Boost.Asio's SSL support (BOOST_ASIO_SEPARATE_COMPILATION, like
// net/asio_impl.cc for the rest of Asio), kept apart so that only what speaks TLS (the Kubernetes API client of
// backends/discovery_k8s.h) links OpenSSL.
#include <boost/asio/ssl/impl/src.hpp>
