#include "net/resource_errors.h"

#include <cerrno>

#include <boost/asio/error.hpp>

namespace kvroute::net {

bool local_resource_error(const boost::system::error_code& ec) {
  namespace error = boost::asio::error;
  return ec == error::no_descriptors || ec.value() == ENFILE || ec == error::no_buffer_space || ec == error::no_memory;
}

}  // namespace kvroute::net
