// The Catch2 v2 main for the unit test binary.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
