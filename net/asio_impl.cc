// The single translation unit that compiles Boost.Asio and Boost.Beast (see BOOST_*_SEPARATE_COMPILATION in
// the top-level CMakeLists.txt). Every other file includes only the headers it needs and links kvroute_net.
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>
