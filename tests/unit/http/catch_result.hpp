#pragma once
// Lets Catch2 print a modeld::Result<T> in assertions: "ok", or the error's code and message.
// (boost::system::result's own operator<< needs operator<< for T and the error type.)

#include "util/error.hpp"

#include <catch2/catch.hpp>

#include <string>

namespace Catch {
template <class T>
struct StringMaker<boost::system::result<T, modeld::Error>> {
  static std::string convert(const boost::system::result<T, modeld::Error>& r) {
    if (r) return "ok";
    return "error " + std::string(modeld::to_string(r.error().code)) + ": " + r.error().message;
  }
};
}  // namespace Catch
