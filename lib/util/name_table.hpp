#pragma once
// The names of a closed enum (error codes, phases, unit states) as one table of value-name
// pairs, looked up both ways. Does not block.

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>

namespace modeld::util {

/// The values of enum E and their names, one pair each.
template <class E, std::size_t N>
using NameTable = std::array<std::pair<E, std::string_view>, N>;

/// The name of `value` in `table`; nullopt when the table lacks it.
template <class E, std::size_t N>
constexpr std::optional<std::string_view> name_in(const NameTable<E, N>& table, E value) noexcept {
  for (const auto& [v, name] : table)
    if (v == value) return name;
  return std::nullopt;
}

/// The value named `name` in `table`; nullopt when no entry has that name.
template <class E, std::size_t N>
constexpr std::optional<E> value_in(const NameTable<E, N>& table, std::string_view name) noexcept {
  for (const auto& [v, n] : table)
    if (n == name) return v;
  return std::nullopt;
}

}  // namespace modeld::util
