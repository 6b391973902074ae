#pragma once
// How the wire stage writes and reads an object from one list of its fields: each struct has a
// `fields(s, f)` (found by argument-dependent lookup) that calls f(key, member, marks...) once per
// field in the contract's words, and write()/read() walk that list. So a field is named once, for
// both directions. Strings, numbers and booleans are JSON values, optionals null when empty,
// vectors arrays, a struct with fields() an object, and a nlohmann::json itself; via() and
// named() write a member as another type (an enum as its name). A field is optional when read unless marked `required`,
// and always written unless marked `when_set`. Used by lib/wire's .cpp files and by
// lib/deploy/record_file.cpp (the on-disk record); not part of the API's types.

#include "util/name_table.hpp"

#include <nlohmann/json.hpp>

#include <concepts>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace modeld::wire::detail {

/// S is T or const T: one fields() list serves writing (const) and reading.
template <class S, class T>
concept either = std::same_as<std::remove_const_t<S>, T>;

/// The type of the mark `required`.
struct required_t {};
/// Marks a field that read() requires: a missing one throws out_of_range 403 "key 'K' not found",
/// as nlohmann::json::at() does.
inline constexpr required_t required{};

/// The type of the mark `when_set`.
struct when_set_t {};
/// Marks a field that write() leaves out while it equals its type's default value.
inline constexpr when_set_t when_set{};

/// A value a field's reader refuses (e.g. an unknown name): a json exception whose what() is
/// just `message`, so callers catching nlohmann::json::exception report it as they do a
/// mistyped value.
class field_error : public nlohmann::json::exception {
 public:
  /// The refusal `message`, e.g. "unknown kind \"teleport\"".
  explicit field_error(const std::string& message) : exception(0, message.c_str()) {}
};

/// A member written and read as a W (see via()).
template <class W, class M, class Out, class In>
struct Via {
  using wire_type = W;
  M& member;  ///< const while writing
  Out out;    ///< out(member) -> the W to write
  In in;      ///< in(W, member) stores what was read; may throw field_error
};

/// The field `member` written as the W that `out(member)` makes of it, and read back as a W
/// that `in(w, member)` stores. `member` may be the whole struct when a JSON field is made of
/// several members.
template <class W, class M, class Out, class In>
Via<W, M, Out, In> via(M& member, Out out, In in) {
  return {member, std::move(out), std::move(in)};
}

/// The enum field `member` written as its name in `table` ("unknown" for a value it lacks);
/// reading a name that `table` lacks throws field_error "unknown WHAT \"NAME\"". `table` is
/// kept by reference (a namespace-scope table).
template <class E, std::size_t N>
auto named(E& member, const util::NameTable<std::remove_const_t<E>, N>& table, const char* what) {
  using V = std::remove_const_t<E>;
  return via<std::string>(
      member, [&table](V v) { return std::string(util::name_in(table, v).value_or("unknown")); },
      [&table, what](const std::string& name, V& v) {
        auto found = util::value_in(table, name);
        if (!found) throw field_error("unknown " + std::string(what) + " " + nlohmann::json(name).dump());
        v = *found;
      });
}

/// Whether T is a std::optional, a std::vector or a Via (what write() and read() tell apart).
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};
template <class T>
struct is_via : std::false_type {};
template <class W, class M, class Out, class In>
struct is_via<Via<W, M, Out, In>> : std::true_type {};

/// Whether the marks `How...` include the mark of type `Mark`.
template <class Mark, class... How>
constexpr bool marked = (std::is_same_v<Mark, How> || ...);

/// Whether T is written as a plain JSON value (string, number or boolean, or JSON kept as it is).
template <class T>
constexpr bool is_plain =
    std::is_arithmetic_v<T> || std::is_same_v<T, std::string> || std::is_same_v<T, nlohmann::json>;

/// The JSON of `v` as its fields() list says; pure.
template <class T>
nlohmann::json write(const T& v) {
  if constexpr (is_via<T>::value) {
    return write<typename T::wire_type>(v.out(v.member));
  } else if constexpr (is_optional<T>::value) {
    return v ? write(*v) : nlohmann::json(nullptr);
  } else if constexpr (is_vector<T>::value) {
    auto out = nlohmann::json::array();
    for (const auto& e : v) out.push_back(write(e));
    return out;
  } else if constexpr (is_plain<T>) {
    return nlohmann::json(v);
  } else {
    auto out = nlohmann::json::object();
    fields(v, [&](const char* key, const auto& member, auto... how) {
      if constexpr (marked<when_set_t, decltype(how)...>) {
        if (member == std::remove_cvref_t<decltype(member)>{}) return;
      }
      out[key] = write(member);
    });
    return out;
  }
}

/// Reads `j` into `v` as its fields() list says: a missing field keeps its default (or throws
/// when `required`), null empties an optional; throws nlohmann::json::exception on a mistyped
/// value or one a field refuses.
template <class T>
void read(const nlohmann::json& j, T& v) {
  if constexpr (is_via<T>::value) {
    typename T::wire_type w{};
    read(j, w);
    v.in(std::move(w), v.member);
  } else if constexpr (is_optional<T>::value) {
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
    fields(v, [&](const char* key, auto&& member, auto... how) {
      if (auto it = j.find(key); it != j.end())
        read(*it, member);
      else if constexpr (marked<required_t, decltype(how)...>)
        throw nlohmann::json::out_of_range::create(403, "key '" + std::string(key) + "' not found", &j);
    });
  }
}

}  // namespace modeld::wire::detail
