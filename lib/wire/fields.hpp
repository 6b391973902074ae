#pragma once
// How the wire stage writes and reads a flat answer from one list of its fields: each struct has
// a `fields(s, f)` (found by argument-dependent lookup) that calls f(key, member) once per field
// in the contract's words, and write()/read() walk that list. So a field is named once, for both
// directions. Strings, numbers and booleans are JSON values, optionals null when empty, vectors
// arrays, and a struct with fields() an object. Internal to lib/wire (the .cpp files use it).

#include <nlohmann/json.hpp>

#include <concepts>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace modeld::wire::detail {

/// S is T or const T: one fields() list serves writing (const) and reading.
template <class S, class T>
concept either = std::same_as<std::remove_const_t<S>, T>;

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

/// Whether T is written as a plain JSON value (string, number or boolean).
template <class T>
constexpr bool is_plain = std::is_arithmetic_v<T> || std::is_same_v<T, std::string>;

/// The JSON of `v` as its fields() list says; pure.
template <class T>
nlohmann::json write(const T& v) {
  if constexpr (is_optional<T>::value) {
    return v ? write(*v) : nlohmann::json(nullptr);
  } else if constexpr (is_vector<T>::value) {
    auto out = nlohmann::json::array();
    for (const auto& e : v) out.push_back(write(e));
    return out;
  } else if constexpr (is_plain<T>) {
    return nlohmann::json(v);
  } else {
    auto out = nlohmann::json::object();
    fields(v, [&](const char* key, const auto& member) { out[key] = write(member); });
    return out;
  }
}

/// Reads `j` into `v` as its fields() list says: a missing field keeps its default, null empties
/// an optional; throws nlohmann::json::exception on a mistyped value.
template <class T>
void read(const nlohmann::json& j, T& v) {
  if constexpr (is_optional<T>::value) {
    if (j.is_null()) {
      v.reset();
    } else {
      typename T::value_type x{};
      read(j, x);
      v = std::move(x);
    }
  } else if constexpr (is_vector<T>::value) {
    v.clear();
    for (const auto& e : j) read(e, v.emplace_back());
  } else if constexpr (is_plain<T>) {
    v = j.get<T>();
  } else {
    if (!j.is_object()) throw nlohmann::json::type_error::create(302, "expected an object, not " + std::string(j.type_name()), &j);
    fields(v, [&](const char* key, auto& member) {
      if (auto it = j.find(key); it != j.end()) read(*it, member);
    });
  }
}

}  // namespace modeld::wire::detail
