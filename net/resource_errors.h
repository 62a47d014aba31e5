// Errors of this process rather than of its peer: out of file descriptors or memory. They say nothing about
// the other end (a worker's health), and retrying at once fails again at once (an accept loop must pause).
#pragma once

#include <boost/system/error_code.hpp>

namespace kvroute::net {

bool local_resource_error(const boost::system::error_code& ec);

}  // namespace kvroute::net
