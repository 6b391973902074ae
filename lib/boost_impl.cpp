// The one translation unit that compiles the implementation of Boost.Asio, its SSL layer and
// Boost.Beast (separate compilation); every other file sees only their declarations.
#include <boost/asio/impl/src.hpp>
#include <boost/asio/ssl/impl/src.hpp>
#include <boost/beast/src.hpp>
