# Every dependency is a Debian 12 package; scripts/install-deps.sh installs them.
# Boost.URL is a compiled library (libboost-url1.81-dev ships libboost_url): parsing, reference
# resolution and percent-decoding of URLs.
find_package(Boost 1.81 REQUIRED COMPONENTS url)
find_package(OpenSSL 3 REQUIRED)
find_package(nlohmann_json 3.11 REQUIRED)
find_package(fmt 9 REQUIRED)
find_package(spdlog 1.10 REQUIRED)
find_package(tomlplusplus 3 REQUIRED)
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)

# One interface target carrying the flags every part of modeld is compiled with.
add_library(modeld_deps INTERFACE)
target_compile_definitions(modeld_deps INTERFACE
  BOOST_ASIO_SEPARATE_COMPILATION
  BOOST_BEAST_SEPARATE_COMPILATION
  BOOST_ASIO_NO_DEPRECATED
  MODELD_VERSION="${PROJECT_VERSION}")
target_link_libraries(modeld_deps INTERFACE
  Boost::headers Boost::url OpenSSL::SSL OpenSSL::Crypto nlohmann_json::nlohmann_json
  fmt::fmt spdlog::spdlog tomlplusplus::tomlplusplus PkgConfig::SYSTEMD Threads::Threads)
