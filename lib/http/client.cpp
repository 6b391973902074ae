#include "http/client.hpp"
#include "util/text.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/cancellation_state.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/url.hpp>

#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdlib>
#include <stdexcept>

namespace modeld::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace ssl = boost::asio::ssl;
using asio::awaitable;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
constexpr std::size_t kBlockSize = 1u << 20;       // body blocks handed to a sink
constexpr std::size_t kReadBufferSize = 64u << 10; // Beast's largest read (read_size_or_throw)
constexpr std::uint32_t kHeaderLimit = 64u << 10;  // the Hub's 302s carry many headers

using util::iequals;

std::uint16_t default_port(std::string_view scheme) { return scheme == "https" ? 443 : 80; }

// Text shown in an error about a URL that did not parse: everything before the query, since
// a signed CDN URL carries its signature there.
std::string without_query(std::string_view text) {
  return std::string(text.substr(0, text.find_first_of("?#")));
}

std::string host_for_url(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

bool is_redirect(unsigned status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

bool is_ip_address(const std::string& host) {
  error_code ec;
  (void)asio::ip::make_address(host, ec);
  return !ec;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Url

namespace {

// `text` with the printable bytes RFC 3986 leaves out of URLs percent-encoded, as browsers do
// before they send them: '"', '<', '>', '\', '^', '`', '{', '|', '}', bytes from 0x80, and '[' and
// ']' after the host (a server decodes them to the same bytes). Spaces and control characters
// stay, for the parser to refuse.
std::string encode_lenient(std::string_view text) {
  std::size_t path_start = 0;  // the host's brackets ("[::1]") are left alone
  if (auto slashes = text.find("//"); slashes != std::string_view::npos && slashes == text.find_first_of("/?#"))
    path_start = std::min(text.find_first_of("/?#", slashes + 2), text.size());
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    bool bracket = (c == '[' || c == ']') && i >= path_start;
    if (c >= 0x80 || bracket || std::string_view("\"<>\\^`{|}").find(static_cast<char>(c)) != std::string_view::npos)
      out += fmt::format("%{:02X}", c);
    else
      out += static_cast<char>(c);
  }
  return out;
}

// The connection's parts of a URL Boost.URL parsed or resolved; `shown` is the text an error
// names (without its query).
Result<Url> from_parsed(const boost::urls::url_view_base& u, std::string_view shown) {
  auto bad = [&](std::string_view why) {
    return make_error(Errc::bad_request, fmt::format("bad URL '{}': {}", without_query(shown), why));
  };
  if (!u.has_scheme() || !u.has_authority()) return bad("it is not absolute (scheme://host/...)");
  Url url;
  url.scheme = util::ascii_lower(u.scheme());
  if (url.scheme != "http" && url.scheme != "https") return bad("the scheme is not http or https");
  if (u.has_userinfo()) return bad("user information in URLs is not supported");
  if (u.host_type() == boost::urls::host_type::ipvfuture) return bad("the host is not a name or address");
  url.host = util::ascii_lower(u.host_address());
  if (url.host.empty()) return bad("the host is empty");
  url.port = default_port(url.scheme);
  if (std::string_view port_text = u.port(); !port_text.empty()) {
    unsigned port = 0;
    auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || p != port_text.data() + port_text.size() || port == 0 || port > 65535)
      return bad("the port is not a number from 1 to 65535");
    url.port = static_cast<std::uint16_t>(port);
  }
  // After an authority the path is empty or begins with '/'; Boost.URL 1.81 accepts
  // "http://h:8x/" as port "8" and path "x/".
  std::string_view path = u.encoded_path();
  if (!path.empty() && path.front() != '/') return bad("junk after the host or port");
  url.target = path.empty() ? std::string("/") : std::string(path);
  if (u.has_query()) url.target += "?" + std::string(u.encoded_query());
  return url;
}

}  // namespace

Result<Url> Url::parse(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return make_error(Errc::bad_request, fmt::format("bad URL '{}': {}", without_query(text), why));
  };
  for (unsigned char c : text)
    if (c <= 0x20 || c == 0x7f) return bad("it contains a space or control character");
  if (text.find("://") == std::string_view::npos) return bad("it is not absolute (scheme://host/...)");
  std::string encoded = encode_lenient(text);
  auto parsed = boost::urls::parse_uri(encoded);
  if (!parsed) return bad("it is not a URL as RFC 3986 writes them");
  return from_parsed(*parsed, text);
}

std::string Url::origin() const { return fmt::format("{}://{}:{}", scheme, host_for_url(host), port); }

std::string Url::str() const {
  if (port == default_port(scheme)) return fmt::format("{}://{}{}", scheme, host_for_url(host), target);
  return fmt::format("{}://{}:{}{}", scheme, host_for_url(host), port, target);
}

std::string Url::redacted() const { return origin() + without_query(target); }

Result<Url> Url::resolve(std::string_view location) const {
  auto bad = [&] {
    return make_error(Errc::bad_request, fmt::format("bad redirect location '{}' from {}",
                                                     without_query(location), redacted()));
  };
  std::string base_text = str();
  std::string encoded = encode_lenient(location);
  auto ref = boost::urls::parse_uri_reference(encoded);
  auto base = boost::urls::parse_uri(base_text);
  if (!ref || !base) return bad();
  boost::urls::url resolved;
  if (!boost::urls::resolve(*base, *ref, resolved)) return bad();
  auto out = from_parsed(resolved, resolved.buffer());
  if (!out) return out;
  // Boost.URL 1.81 keeps the ".." segments that climb above the root ("/a/../../b" becomes
  // "/../b"); RFC 3986 section 5.2.4 drops them.
  std::string_view target = out->target;
  while (target.starts_with("/..") && (target.size() == 3 || target[3] == '/' || target[3] == '?'))
    target.remove_prefix(3);
  if (target.empty() || target.front() == '?') out->target = "/" + std::string(target);
  else out->target = std::string(target);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Headers

std::optional<std::string> Headers::get(std::string_view name) const {
  for (const auto& [k, v] : items)
    if (iequals(k, name)) return v;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Proxies

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// Splits "host[:port]" or "[v6][:port]"; an unbracketed text with several colons is an IPv6
// address without a port. Returns false on bad syntax.
bool split_host_port(std::string_view text, std::string& host, std::optional<std::uint16_t>& port) {
  std::string_view port_text;
  bool has_port = false;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos) return false;
    host = std::string(text.substr(1, close - 1));
    auto after = text.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return false;
      port_text = after.substr(1);
      has_port = true;
    }
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    auto colon = text.find(':');
    host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
    has_port = true;
  } else {
    host = std::string(text);
  }
  port.reset();
  if (has_port) {
    unsigned v = 0;
    auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), v);
    if (port_text.empty() || ec != std::errc() || p != port_text.data() + port_text.size() || v == 0 ||
        v > 65535)
      return false;
    port = static_cast<std::uint16_t>(v);
  }
  return true;
}

// True when the first `bits` bits of two addresses of one family are equal.
template <class Bytes>
bool same_prefix(const Bytes& a, const Bytes& b, unsigned bits) {
  for (std::size_t i = 0; i < a.size() && bits > 0; ++i) {
    unsigned n = std::min(bits, 8u);
    unsigned mask = (0xffu << (8 - n)) & 0xffu;
    if ((a[i] & mask) != (b[i] & mask)) return false;
    bits -= n;
  }
  return true;
}

// One NO_PROXY entry against a host (lower case, no trailing dot) and port.
bool no_proxy_entry_matches(std::string_view entry, const std::string& host, std::uint16_t port) {
  // "addr/bits" may come with brackets ("[::1]/128") or without ("::1/128").
  std::string_view bits_text;
  if (auto slash = entry.find('/'); slash != std::string_view::npos) {
    bits_text = entry.substr(slash + 1);
    entry = entry.substr(0, slash);
  }
  std::string name;
  std::optional<std::uint16_t> entry_port;
  if (!split_host_port(entry, name, entry_port)) return false;
  if (entry_port && *entry_port != port) return false;
  name = util::ascii_lower(name);
  while (!name.empty() && name.back() == '.') name.pop_back();

  error_code hec;
  auto host_addr = asio::ip::make_address(host, hec);
  if (!hec) {
    // An IP host matches only addresses and blocks, compared as numbers (so "::1" and
    // "0:0::1" are one address).
    error_code eec;
    auto net = asio::ip::make_address(name, eec);
    if (eec || net.is_v4() != host_addr.is_v4()) return false;
    unsigned max_bits = net.is_v4() ? 32 : 128;
    unsigned bits = max_bits;
    if (!bits_text.empty()) {
      auto [p, ec] = std::from_chars(bits_text.data(), bits_text.data() + bits_text.size(), bits);
      if (ec != std::errc() || p != bits_text.data() + bits_text.size() || bits > max_bits) return false;
    }
    if (net.is_v4()) return same_prefix(net.to_v4().to_bytes(), host_addr.to_v4().to_bytes(), bits);
    return same_prefix(net.to_v6().to_bytes(), host_addr.to_v6().to_bytes(), bits);
  }
  if (!bits_text.empty()) return false;  // a block never matches a name
  while (!name.empty() && name.front() == '.') name.erase(0, 1);
  if (name.empty()) return false;
  if (host == name) return true;
  return host.size() > name.size() && host.compare(host.size() - name.size(), name.size(), name) == 0 &&
         host[host.size() - name.size() - 1] == '.';
}

}  // namespace

ProxyConfig ProxyConfig::from_environment() {
  auto pick = [](const char* lower_name, const char* upper_name) {
    auto v = env(lower_name);
    return v.empty() ? env(upper_name) : v;
  };
  ProxyConfig c;
  c.http_proxy = env("http_proxy");  // never HTTP_PROXY: a CGI program gets it from a "Proxy:" header
  c.https_proxy = pick("https_proxy", "HTTPS_PROXY");
  c.no_proxy = pick("no_proxy", "NO_PROXY");
  return c;
}

Result<ProxyEndpoint> ProxyEndpoint::parse(std::string_view text, std::string_view setting) {
  text = util::trim(text);
  std::string scheme = "http";
  std::string_view rest = text;
  if (auto sep = text.find("://"); sep != std::string_view::npos) {
    scheme = util::ascii_lower(text.substr(0, sep));
    rest = text.substr(sep + 3);
  }
  // Whatever is shown of a bad setting leaves out everything up to the last '@': credentials
  // may contain any character, encoded or not.
  auto at = rest.rfind('@');
  std::string_view after_at = at == std::string_view::npos ? rest : rest.substr(at + 1);
  std::string shown = fmt::format("{}://{}", scheme, after_at);
  auto bad = [&](std::string_view why) {
    return make_error(Errc::config_invalid, fmt::format("{} '{}': {}", setting, shown, why));
  };
  if (scheme == "https")
    return bad("a proxy reached over TLS (https://) is not supported; use http:// (the tunnel to "
               "an https origin is encrypted end to end either way)");
  if (scheme != "http") return bad("only http:// proxies are supported");
  ProxyEndpoint p;
  std::string_view hostport = after_at.substr(0, after_at.find('/'));
  if (at != std::string_view::npos) {
    auto userinfo = rest.substr(0, at);
    auto colon = userinfo.find(':');
    auto user = util::percent_decode(userinfo.substr(0, colon));
    auto pass = util::percent_decode(colon == std::string_view::npos ? std::string_view{} : userinfo.substr(colon + 1));
    if (!user || !pass) return bad("bad percent-encoding in the user name or password");
    p.username = std::move(*user);
    p.password = std::move(*pass);
  }
  std::optional<std::uint16_t> port;
  if (!split_host_port(hostport, p.host, port)) return bad("the port is not a number from 1 to 65535");
  if (p.host.empty()) return bad("the host is empty");
  for (unsigned char c : p.host)
    if (c <= 0x20 || c == 0x7f || c == '?' || c == '#') return bad("the host contains a bad character");
  p.host = util::ascii_lower(p.host);
  if (port) p.port = *port;
  return p;
}

std::string ProxyEndpoint::redacted() const { return fmt::format("http://{}:{}", host_for_url(host), port); }

std::string ProxyEndpoint::authorization() const {
  if (username.empty()) return {};
  std::string plain = username + ":" + password;
  std::string out(4 * ((plain.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(plain.data()), static_cast<int>(plain.size()));
  out.resize(static_cast<std::size_t>(n));
  return "Basic " + out;
}

bool bypasses_proxy(std::string_view no_proxy, const Url& url) {
  std::string host = util::ascii_lower(url.host);
  while (!host.empty() && host.back() == '.') host.pop_back();
  std::size_t pos = 0;
  while (pos <= no_proxy.size()) {
    auto end = no_proxy.find_first_of(", \t", pos);
    auto entry = util::trim(no_proxy.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos));
    if (entry == "*") return true;
    if (!entry.empty() && no_proxy_entry_matches(entry, host, url.port)) return true;
    if (end == std::string_view::npos) break;
    pos = end + 1;
  }
  return false;
}

Result<std::optional<ProxyEndpoint>> select_proxy(const ProxyConfig& config, const Url& url) {
  bool https = url.scheme == "https";
  const std::string& text = https ? config.https_proxy : config.http_proxy;
  if (util::trim(text).empty() || bypasses_proxy(config.no_proxy, url)) return std::optional<ProxyEndpoint>();
  auto p = ProxyEndpoint::parse(text, https ? "https_proxy" : "http_proxy");
  if (!p) return p.error();
  return std::optional<ProxyEndpoint>(std::move(*p));
}

// ---------------------------------------------------------------------------------------------
// Retry-After

namespace {

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

unsigned days_in_month(std::int64_t y, unsigned m) {
  static constexpr unsigned kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  return m == 2 && leap ? 29 : kDays[m - 1];
}

// A cursor over an HTTP-date; every step returns false when the text does not fit.
struct DateText {
  std::string_view s;
  std::size_t i = 0;

  bool lit(std::string_view t) {
    if (!iequals(s.substr(i, t.size()), t)) return false;
    i += t.size();
    return true;
  }
  bool number(std::size_t digits, int& out) {
    if (i + digits > s.size()) return false;
    out = 0;
    for (std::size_t k = 0; k < digits; ++k) {
      char c = s[i + k];
      if (c < '0' || c > '9') return false;
      out = out * 10 + (c - '0');
    }
    i += digits;
    return true;
  }
  // One of `names`; returns its index.
  template <std::size_t N>
  bool one_of(const std::array<std::string_view, N>& names, unsigned& index) {
    for (unsigned k = 0; k < N; ++k)
      if (lit(names[k])) {
        index = k;
        return true;
      }
    return false;
  }
  bool time(int& h, int& m, int& sec) { return number(2, h) && lit(":") && number(2, m) && lit(":") && number(2, sec); }
  bool done() const { return i == s.size(); }
};

constexpr std::array<std::string_view, 12> kMonths = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                      "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
constexpr std::array<std::string_view, 7> kDayNames = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
// No full day name is a prefix of another, so the order of the list does not matter.
constexpr std::array<std::string_view, 7> kLongDayNames = {"Monday", "Tuesday", "Wednesday", "Thursday",
                                                           "Friday", "Saturday", "Sunday"};

struct CivilTime {
  std::int64_t year = 0;
  int month = 0, day = 0, hour = 0, minute = 0, second = 0;
};

// The three forms of RFC 9110 section 5.6.7; two-digit years of RFC 850 dates are read as the
// most recent year with those digits that is not more than 50 years after `now_year`.
std::optional<CivilTime> parse_http_date(std::string_view text, std::int64_t now_year) {
  CivilTime t;
  unsigned idx = 0;
  auto valid = [&]() -> std::optional<CivilTime> {
    if (t.month < 1 || t.month > 12 || t.day < 1 ||
        static_cast<unsigned>(t.day) > days_in_month(t.year, static_cast<unsigned>(t.month)) || t.hour > 23 ||
        t.minute > 59 || t.second > 60)
      return std::nullopt;
    return t;
  };
  {  // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT"
    DateText d{text};
    int year = 0;
    if (d.one_of(kDayNames, idx) && d.lit(", ") && d.number(2, t.day) && d.lit(" ") && d.one_of(kMonths, idx) &&
        (t.month = static_cast<int>(idx) + 1, d.lit(" ")) && d.number(4, year) && d.lit(" ") &&
        d.time(t.hour, t.minute, t.second) && d.lit(" GMT") && d.done()) {
      t.year = year;
      return valid();
    }
  }
  {  // RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT"
    DateText d{text};
    int yy = 0;
    if (d.one_of(kLongDayNames, idx) && d.lit(", ") && d.number(2, t.day) && d.lit("-") &&
        d.one_of(kMonths, idx) && (t.month = static_cast<int>(idx) + 1, d.lit("-")) && d.number(2, yy) &&
        d.lit(" ") && d.time(t.hour, t.minute, t.second) && d.lit(" GMT") && d.done()) {
      std::int64_t year = now_year - now_year % 100 + yy;
      if (year > now_year + 50) year -= 100;
      t.year = year;
      return valid();
    }
  }
  {  // asctime: "Sun Nov  6 08:49:37 1994"
    DateText d{text};
    int year = 0;
    if (d.one_of(kDayNames, idx) && d.lit(" ") && d.one_of(kMonths, idx) &&
        (t.month = static_cast<int>(idx) + 1, d.lit(" ")) && (d.lit(" ") ? d.number(1, t.day) : d.number(2, t.day)) &&
        d.lit(" ") && d.time(t.hour, t.minute, t.second) && d.lit(" ") && d.number(4, year) && d.done()) {
      t.year = year;
      return valid();
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::chrono::seconds> parse_retry_after(std::string_view value,
                                                      std::chrono::system_clock::time_point now) {
  value = util::trim(value);
  if (value.empty()) return std::nullopt;
  if (std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    std::int64_t seconds = 0;
    auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
    if (ec != std::errc() || p != value.data() + value.size()) return std::nullopt;  // out of range
    return std::chrono::seconds(seconds);
  }
  const std::int64_t now_s = std::chrono::floor<std::chrono::seconds>(now.time_since_epoch()).count();
  const std::int64_t now_days = now_s >= 0 ? now_s / 86400 : (now_s - 86399) / 86400;
  // The civil year of `now`, for the two-digit years of RFC 850 dates.
  std::int64_t now_year = 1970 + now_days / 365;
  while (days_from_civil(now_year, 1, 1) > now_days) --now_year;
  while (days_from_civil(now_year + 1, 1, 1) <= now_days) ++now_year;
  auto t = parse_http_date(value, now_year);
  if (!t) return std::nullopt;
  std::int64_t at = days_from_civil(t->year, static_cast<unsigned>(t->month), static_cast<unsigned>(t->day)) * 86400 +
                    t->hour * 3600 + t->minute * 60 + t->second;
  // Whole seconds, rounded up against a `now` with a fraction (at - floor(now) is that ceiling),
  // so that a caller never retries before the date; counted in seconds, not in the clock's
  // nanoseconds, which overflow for dates after 2262.
  return std::chrono::seconds(std::max<std::int64_t>(0, at - now_s));
}

// ---------------------------------------------------------------------------------------------
// Connections

namespace {

// One connection to one origin, plain or TLS. New connections are made per request for now; a
// pool keyed by Url::origin() can keep these between requests later (keep_alive() answers says
// whether one may be reused).
struct Connection {
  std::optional<beast::tcp_stream> tcp;
  std::optional<ssl::stream<beast::tcp_stream>> tls;
  std::optional<ProxyEndpoint> forward_proxy;  // plain http sent to this proxy in absolute form

  beast::tcp_stream& lowest() { return tls ? tls->next_layer() : *tcp; }
};

// What one socket operation's error means for the caller. Beast reports an expired deadline as
// beast::error::timeout; operation_aborted without an expired deadline is the caller's
// cancellation.
// `where` names the peer as it may be shown (a URL without its query, a proxy without its
// credentials).
Error socket_error(const error_code& ec, std::string_view doing, std::string_view where) {
  if (ec == beast::error::timeout)
    return make_error(Errc::timeout, fmt::format("{} {}: timed out", doing, where));
  if (ec == asio::error::operation_aborted)
    return make_error(Errc::cancelled, fmt::format("{} {}: cancelled", doing, where));
  return make_error(Errc::network_error, fmt::format("{} {}: {}", doing, where, ec.message()));
}

Error socket_error(const error_code& ec, std::string_view doing, const Url& url) {
  return socket_error(ec, doing, url.redacted());
}

struct HopContext {
  const Url& url;
  std::chrono::milliseconds read_timeout;
  BodySink& sink;
  std::vector<Headers>& redirects;
  unsigned redirects_left;
};

// The outcome of one request/response exchange: a redirect to follow, or the final head (whose
// body has then been delivered to the sink).
struct Hop {
  std::optional<ResponseHead> final_head;
  unsigned redirect_status = 0;
  std::string location;
};

ResponseHead make_head(const bhttp::response_parser<bhttp::buffer_body>& p, const Url& url) {
  ResponseHead head;
  const auto& msg = p.get();
  head.status = msg.result_int();
  for (const auto& f : msg) head.headers.add(std::string(f.name_string()), std::string(f.value()));
  if (p.content_length()) head.content_length = *p.content_length();
  head.url = url;
  return head;
}

// The error for a body that ended early or failed after `delivered` bytes.
Error body_error(const error_code& ec, const HopContext& ctx, const ResponseHead& head, std::uint64_t delivered) {
  if (ec == bhttp::error::partial_message || ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
      ec == asio::ssl::error::stream_truncated || ec == asio::error::connection_reset)
    return make_error(Errc::network_error,
                      fmt::format("reading the body of {}: cut short after {} bytes{} ({})", ctx.url.redacted(),
                                  delivered, head.content_length ? fmt::format(" of {}", *head.content_length) : "",
                                  ec.message()));
  return socket_error(ec, "reading the body of", ctx.url);
}

// Reads up to the final (non-1xx) response header into `parser_slot`; interim answers
// (100 Continue) are skipped.
template <class Stream>
awaitable<Result<void>> read_final_header(Stream& stream, beast::tcp_stream& lowest, beast::flat_buffer& buffer,
                                          std::optional<bhttp::response_parser<bhttp::buffer_body>>& parser_slot,
                                          bhttp::verb method, const HopContext& ctx) {
  for (;;) {
    parser_slot.emplace();
    parser_slot->header_limit(kHeaderLimit);
    parser_slot->body_limit(boost::none);  // limits belong to the sink (request() enforces max_body)
    if (method == bhttp::verb::head) parser_slot->skip(true);
    lowest.expires_after(ctx.read_timeout);
    auto [ec, n] = co_await bhttp::async_read_header(stream, buffer, *parser_slot, kTuple);
    (void)n;
    if (ec) co_return socket_error(ec, "reading the answer of", ctx.url);
    if (parser_slot->get().result_int() >= 200) co_return Result<void>{};
  }
}

// A Content-Length body (a download), read straight from the stream into the sink's memory
// (BodySink::buffer) or a block, bypassing the parser's copy: on a fast link the copies cost
// more CPU than hashing the bytes. Each read is handed over as it arrives.
template <class Stream>
awaitable<Result<void>> read_sized_body(Stream& stream, beast::tcp_stream& lowest, beast::flat_buffer& buffer,
                                        const HopContext& ctx, const ResponseHead& head) {
  std::vector<char> block;
  std::uint64_t delivered = 0;
  std::uint64_t remaining = *head.content_length;
  while (remaining > 0) {
    std::span<char> dst;
    if (ctx.sink.buffer) {
      dst = ctx.sink.buffer();
    } else {
      block.resize(kBlockSize);
      dst = std::span<char>(block.data(), block.size());
    }
    if (dst.empty()) co_return make_error(Errc::internal, "the body sink offered no buffer");
    dst = dst.first(static_cast<std::size_t>(std::min<std::uint64_t>(dst.size(), remaining)));
    std::size_t n = 0;
    error_code ec;
    if (buffer.size() > 0) {
      // Body bytes the header read already pulled in.
      n = asio::buffer_copy(asio::buffer(dst.data(), dst.size()), buffer.data());
      buffer.consume(n);
    } else {
      lowest.expires_after(ctx.read_timeout);
      auto [rec, rn] = co_await stream.async_read_some(asio::buffer(dst.data(), dst.size()), kTuple);
      ec = rec;
      n = rn;
    }
    if (n > 0) {
      remaining -= n;
      delivered += n;
      if (ctx.sink.on_data)
        if (auto r = co_await ctx.sink.on_data(std::span<const char>(dst.data(), n)); !r) co_return r.error();
    }
    if (ec) co_return body_error(ec, ctx, head, delivered);
  }
  co_return Result<void>{};
}

// A chunked or close-delimited body, read through the parser into blocks handed to the sink.
template <class Stream>
awaitable<Result<void>> read_streamed_body(Stream& stream, beast::tcp_stream& lowest, beast::flat_buffer& buffer,
                                           bhttp::response_parser<bhttp::buffer_body>& parser,
                                           const HopContext& ctx, const ResponseHead& head) {
  std::vector<char> block(kBlockSize);
  std::uint64_t delivered = 0;
  std::size_t filled = 0;
  auto deliver = [&]() -> awaitable<Result<void>> {
    if (filled == 0) co_return Result<void>{};
    auto data = std::span<const char>(block.data(), filled);
    delivered += filled;
    filled = 0;
    if (ctx.sink.on_data) co_return co_await ctx.sink.on_data(data);
    co_return Result<void>{};
  };
  while (!parser.is_done()) {
    parser.get().body().data = block.data() + filled;
    parser.get().body().size = block.size() - filled;
    lowest.expires_after(ctx.read_timeout);
    auto [ec, n] = co_await bhttp::async_read_some(stream, buffer, parser, kTuple);
    (void)n;
    if (ec == bhttp::error::need_buffer) ec = {};
    filled = block.size() - parser.get().body().size;
    if (ec) {
      // Hand over what arrived so the caller can resume from there, then report the cut.
      if (auto r = co_await deliver(); !r) co_return r.error();
      co_return body_error(ec, ctx, head, delivered);
    }
    // Hand a block over when it is full, when the body is complete, or when nothing more is
    // waiting on the socket (an event stream must not be held back until 1 MiB has arrived).
    // Bytes left in `buffer` do not count: with chunked encoding the CRLF closing each chunk
    // stays there until the next chunk arrives, so waiting for an empty buffer would hold
    // every token of a stream until its end. The sink accepts any split.
    error_code aec;
    bool idle = lowest.socket().available(aec) == 0;
    if (filled == block.size() || parser.is_done() || (filled > 0 && idle))
      if (auto r = co_await deliver(); !r) co_return r.error();
  }
  co_return co_await deliver();
}

template <class Stream>
awaitable<Result<Hop>> exchange(Stream& stream, beast::tcp_stream& lowest,
                                bhttp::request<bhttp::string_body>& req, HopContext ctx) {
  lowest.expires_after(ctx.read_timeout);
  auto [wec, wn] = co_await bhttp::async_write(stream, req, kTuple);
  (void)wn;
  if (wec) co_return socket_error(wec, "sending the request to", ctx.url);

  beast::flat_buffer buffer;
  // Beast reads at most max(512, free capacity) bytes per call, and a body that streams through
  // never grows the buffer: without this, a download runs on ~1 KiB reads (10x the CPU).
  buffer.reserve(kReadBufferSize);
  std::optional<bhttp::response_parser<bhttp::buffer_body>> parser_slot;
  if (auto r = co_await read_final_header(stream, lowest, buffer, parser_slot, req.method(), ctx); !r)
    co_return r.error();
  auto& parser = *parser_slot;

  unsigned status = parser.get().result_int();
  auto location = parser.get().find(bhttp::field::location);
  if (is_redirect(status) && location != parser.get().end()) {
    if (ctx.redirects_left == 0)
      co_return make_error(Errc::hub_bad_response,
                           fmt::format("too many redirects ({}) ending at {}", ctx.redirects.size(),
                                       ctx.url.redacted()));
    ctx.redirects.push_back(make_head(parser, ctx.url).headers);
    Hop hop;
    hop.redirect_status = status;
    hop.location = std::string(location->value());
    co_return hop;  // the redirect's body is dropped with the connection
  }

  ResponseHead head = make_head(parser, ctx.url);
  head.redirects = ctx.redirects;
  if (ctx.sink.on_head)
    if (auto r = ctx.sink.on_head(head); !r) co_return r.error();
  Result<void> body;
  if (head.content_length && req.method() != bhttp::verb::head)
    body = co_await read_sized_body(stream, lowest, buffer, ctx, head);
  else
    body = co_await read_streamed_body(stream, lowest, buffer, parser, ctx, head);
  if (!body) co_return body.error();
  Hop hop;
  hop.final_head = std::move(head);
  co_return hop;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Client

struct Client::Impl {
  asio::any_io_executor executor;
  ClientOptions options;
  ssl::context tls_context{ssl::context::tls_client};
  std::string auth_origin;  // normalized: "scheme://host:port"

  Impl(asio::any_io_executor ex, ClientOptions opts) : executor(std::move(ex)), options(std::move(opts)) {
    tls_context.set_default_verify_paths();
    if (!options.ca_file.empty()) {
      error_code ec;
      tls_context.load_verify_file(options.ca_file.string(), ec);
      if (ec)
        throw std::runtime_error(
            fmt::format("cannot load the CA file {}: {}", options.ca_file.string(), ec.message()));
    }
    tls_context.set_verify_mode(ssl::verify_peer);
    if (!options.auth_origin.empty()) {
      auto u = Url::parse(options.auth_origin);
      auth_origin = u ? u->origin() : options.auth_origin;
    }
  }

  static std::chrono::milliseconds effective(std::chrono::milliseconds configured, std::chrono::milliseconds per_request) {
    return per_request.count() > 0 ? std::min(configured, per_request) : configured;
  }

  // Resolves the host with a deadline. asio's resolver does not take per-operation cancellation,
  // so the caller's cancellation slot is pointed at resolver.cancel() while it runs.
  // `where` names the peer in messages.
  awaitable<Result<tcp::resolver::results_type>> resolve(const std::string& host, std::uint16_t port,
                                                         const std::string& where,
                                                         std::chrono::milliseconds deadline) {
    auto resolver = std::make_shared<tcp::resolver>(executor);
    auto timed_out = std::make_shared<bool>(false);
    asio::steady_timer timer(executor);
    timer.expires_after(deadline);
    timer.async_wait([resolver, timed_out](error_code ec) {
      if (!ec) {
        *timed_out = true;
        resolver->cancel();
      }
    });
    auto cs = co_await asio::this_coro::cancellation_state;
    auto slot = cs.slot();
    if (slot.is_connected()) slot.assign([resolver](asio::cancellation_type) { resolver->cancel(); });
    auto [ec, results] = co_await resolver->async_resolve(host, std::to_string(port), kTuple);
    if (slot.is_connected()) slot.clear();
    timer.cancel();
    if (ec == asio::error::operation_aborted && *timed_out)
      co_return make_error(Errc::timeout, fmt::format("resolving {}: timed out", where));
    if (ec) co_return socket_error(ec, "resolving", where);
    co_return results;
  }

  // Opens a tunnel to the URL's origin through an HTTP proxy, on a connected stream (RFC 9110
  // section 9.3.6). Bytes after the proxy's answer belong to the origin's TLS, which does not
  // start until our ClientHello, so a proxy that sends more is broken.
  awaitable<Result<void>> tunnel(beast::tcp_stream& stream, const ProxyEndpoint& proxy, const Url& url,
                                 std::chrono::milliseconds deadline) {
    const std::string authority = fmt::format("{}:{}", host_for_url(url.host), url.port);
    const std::string where = fmt::format("proxy {} (CONNECT to {})", proxy.redacted(), authority);
    bhttp::request<bhttp::empty_body> req{bhttp::verb::connect, authority, 11};
    req.set(bhttp::field::host, authority);
    req.set(bhttp::field::user_agent, options.user_agent);
    if (auto auth = proxy.authorization(); !auth.empty()) req.set(bhttp::field::proxy_authorization, auth);
    stream.expires_after(deadline);
    auto [wec, wn] = co_await bhttp::async_write(stream, req, kTuple);
    (void)wn;
    if (wec) co_return socket_error(wec, "sending CONNECT to", where);

    beast::flat_buffer buffer;
    std::optional<bhttp::response_parser<bhttp::empty_body>> parser;
    for (;;) {
      parser.emplace();
      parser->header_limit(kHeaderLimit);
      // A 2xx answer to CONNECT has no body whatever its headers say; a refusal's body is not
      // read because the connection is dropped.
      parser->skip(true);
      stream.expires_after(deadline);
      auto [ec, n] = co_await bhttp::async_read_header(stream, buffer, *parser, kTuple);
      (void)n;
      if (ec) co_return socket_error(ec, "reading the answer of", where);
      if (parser->get().result_int() >= 200) break;
    }
    const auto& answer = parser->get();
    unsigned status = answer.result_int();
    if (status < 200 || status > 299) {
      std::string reason(answer.reason());
      if (reason.empty()) reason = std::string(bhttp::obsolete_reason(answer.result()));
      co_return make_error(Errc::network_error, fmt::format("proxy {} refused CONNECT to {}: {} {}",
                                                            proxy.redacted(), authority, status, reason));
    }
    if (buffer.size() != 0)
      co_return make_error(Errc::network_error,
                           fmt::format("{}: the proxy sent data after its answer to CONNECT", where));
    co_return Result<void>{};
  }

  // Opens a connection to the URL's origin: directly, or through the proxy that select_proxy()
  // picks for this URL (each redirect target decides again, as NO_PROXY may differ). An https
  // origin behind a proxy is reached through a CONNECT tunnel and its certificate is checked
  // against the origin's name, not the proxy's; a plain http origin's requests go to the proxy.
  // Each step (resolve, connect, CONNECT exchange, TLS handshake) gets the connect deadline.
  awaitable<Result<std::unique_ptr<Connection>>> open(const Url& url, std::chrono::milliseconds timeout) {
    auto deadline = effective(options.connect_timeout, timeout);
    auto proxy = select_proxy(options.proxy, url);
    if (!proxy) co_return proxy.error();
    auto conn = std::make_unique<Connection>();
    if (url.scheme == "https") conn->tls.emplace(executor, tls_context);
    else conn->tcp.emplace(executor);
    auto& lowest = conn->lowest();
    if (*proxy) {
      const ProxyEndpoint& p = **proxy;
      const std::string where = fmt::format("proxy {} (for {})", p.redacted(), url.redacted());
      auto endpoints = co_await resolve(p.host, p.port, where, deadline);
      if (!endpoints) co_return endpoints.error();
      lowest.expires_after(deadline);
      auto [ec, ep] = co_await lowest.async_connect(*endpoints, kTuple);
      (void)ep;
      if (ec) co_return socket_error(ec, "connecting to", where);
      if (!conn->tls) {
        conn->forward_proxy = p;
        co_return conn;
      }
      if (auto t = co_await tunnel(lowest, p, url, deadline); !t) co_return t.error();
    } else {
      auto endpoints = co_await resolve(url.host, url.port, url.redacted(), deadline);
      if (!endpoints) co_return endpoints.error();
      lowest.expires_after(deadline);
      auto [ec, ep] = co_await lowest.async_connect(*endpoints, kTuple);
      (void)ep;
      if (ec) co_return socket_error(ec, "connecting to", url);
      if (!conn->tls) co_return conn;
    }

    SSL* handle = conn->tls->native_handle();
    if (!is_ip_address(url.host) && !SSL_set_tlsext_host_name(handle, url.host.c_str()))
      co_return make_error(Errc::network_error, fmt::format("TLS with {}: cannot set the server name", url.redacted()));
    // OpenSSL checks the name (or address) itself, so that a mismatch is reported as "hostname
    // mismatch" rather than the unspecified error a verify callback leaves behind. Through a
    // proxy this is still the origin's name: the proxy only relays the bytes.
    X509_VERIFY_PARAM* param = SSL_get0_param(handle);
    int named = is_ip_address(url.host) ? X509_VERIFY_PARAM_set1_ip_asc(param, url.host.c_str())
                                        : SSL_set1_host(handle, url.host.c_str());
    if (!named)
      co_return make_error(Errc::network_error, fmt::format("TLS with {}: cannot set the name to verify", url.redacted()));
    lowest.expires_after(deadline);
    auto [hec] = co_await conn->tls->async_handshake(ssl::stream_base::client, kTuple);
    if (hec) {
      long verify = SSL_get_verify_result(handle);
      if (hec != beast::error::timeout && hec != asio::error::operation_aborted && verify != X509_V_OK)
        co_return make_error(Errc::network_error,
                             fmt::format("TLS handshake with {}: certificate not trusted: {}", url.redacted(),
                                         X509_verify_cert_error_string(verify)));
      co_return socket_error(hec, "TLS handshake with", url);
    }
    co_return conn;
  }

  // `forward_proxy`: the proxy a plain http request is sent to, which needs the absolute form
  // of the target (RFC 9112 section 3.2.2) and gets its own credentials.
  bhttp::request<bhttp::string_body> build(const Request& r, const Url& url, const std::string& first_origin,
                                           const ProxyEndpoint* forward_proxy) {
    bhttp::request<bhttp::string_body> req;
    auto verb = bhttp::string_to_verb(r.method);
    if (verb == bhttp::verb::unknown) req.method_string(r.method);
    else req.method(verb);
    req.target(forward_proxy ? fmt::format("{}://{}:{}{}", url.scheme, host_for_url(url.host), url.port, url.target)
                             : url.target);
    req.version(11);
    req.set(bhttp::field::host,
            url.port == default_port(url.scheme) ? host_for_url(url.host)
                                                 : fmt::format("{}:{}", host_for_url(url.host), url.port));
    req.set(bhttp::field::user_agent, options.user_agent);
    req.set(bhttp::field::accept_encoding, "identity");
    bool same_origin = url.origin() == first_origin;
    bool has_auth = false;
    for (const auto& [k, v] : r.headers.items) {
      if (iequals(k, "host") || iequals(k, "proxy-authorization")) continue;
      if (iequals(k, "authorization")) {
        if (!same_origin) continue;  // a caller's credentials never follow a redirect elsewhere
        has_auth = true;
      }
      req.set(k, v);
    }
    if (!has_auth && !options.bearer_token.empty() && !auth_origin.empty() && url.origin() == auth_origin)
      req.set(bhttp::field::authorization, "Bearer " + options.bearer_token);
    if (forward_proxy)
      if (auto auth = forward_proxy->authorization(); !auth.empty()) req.set(bhttp::field::proxy_authorization, auth);
    if (!r.body.empty()) {
      req.body() = r.body;
      if (!r.content_type.empty()) req.set(bhttp::field::content_type, r.content_type);
    }
    req.keep_alive(false);  // one connection per request until a pool keeps them
    req.prepare_payload();
    return req;
  }

  awaitable<Result<ResponseHead>> execute(Request request, BodySink& sink) {
    const std::string what = request.method + " " + request.url.redacted();
    try {
      co_return co_await execute_unguarded(std::move(request), sink);
    } catch (const boost::system::system_error& e) {
      // After the caller's cancellation fires, awaiting anything in the coroutine throws
      // operation_aborted (asio's throw_if_cancelled); that is a cancellation, not a bug.
      if (e.code() == asio::error::operation_aborted)
        co_return make_error(Errc::cancelled, what + ": cancelled");
      throw;
    }
  }

  awaitable<Result<ResponseHead>> execute_unguarded(Request request, BodySink& sink) {
    const std::string first_origin = request.url.origin();
    Url url = request.url;
    std::vector<Headers> redirects;
    auto read_timeout = effective(options.read_timeout, request.timeout);
    for (;;) {
      auto conn = co_await open(url, request.timeout);
      if (!conn) co_return conn.error();
      auto req = build(request, url, first_origin, (*conn)->forward_proxy ? &*(*conn)->forward_proxy : nullptr);
      unsigned left = redirects.size() >= options.max_redirects
                          ? 0u
                          : options.max_redirects - static_cast<unsigned>(redirects.size());
      HopContext ctx{url, read_timeout, sink, redirects, left};
      // (No co_await inside ?: here: GCC 12 destroys the temporaries of such an expression twice.)
      Result<Hop> hop = make_error(Errc::internal, "no exchange");
      if ((*conn)->tls) hop = co_await exchange(*(*conn)->tls, (*conn)->lowest(), req, ctx);
      else hop = co_await exchange(*(*conn)->tcp, (*conn)->lowest(), req, ctx);
      if (!hop) co_return hop.error();
      if (hop->final_head) co_return std::move(*hop->final_head);
      auto next = url.resolve(hop->location);
      if (!next) co_return next.error();
      if (hop->redirect_status == 303 ||
          ((hop->redirect_status == 301 || hop->redirect_status == 302) && request.method == "POST")) {
        if (request.method != "HEAD") request.method = "GET";
        request.body.clear();
        request.content_type.clear();
      }
      url = std::move(*next);
    }
  }
};

Client::Client(asio::any_io_executor executor, ClientOptions options)
    : impl_(std::make_unique<Impl>(std::move(executor), std::move(options))) {}

Client::~Client() = default;

const ClientOptions& Client::options() const { return impl_->options; }

awaitable<Result<Response>> Client::request(Request request, std::size_t max_body) {
  Response response;
  const std::string where = request.url.redacted();
  BodySink sink;
  sink.on_head = [&](const ResponseHead& head) -> Result<void> {
    if (head.content_length && *head.content_length > max_body)
      return make_error(Errc::hub_bad_response,
                        fmt::format("{}: the body of {} bytes is over the limit of {} bytes", head.url.redacted(),
                                    *head.content_length, max_body));
    return {};
  };
  sink.on_data = [&](std::span<const char> data) -> awaitable<Result<void>> {
    if (response.body.size() + data.size() > max_body)
      co_return make_error(Errc::hub_bad_response,
                           fmt::format("{}: the body is over the limit of {} bytes", where, max_body));
    response.body.append(data.data(), data.size());
    co_return Result<void>{};
  };
  auto head = co_await impl_->execute(std::move(request), sink);
  if (!head) co_return head.error();
  response.head = std::move(*head);
  co_return response;
}

awaitable<Result<ResponseHead>> Client::stream(Request request, BodySink sink) {
  co_return co_await impl_->execute(std::move(request), sink);
}

}  // namespace modeld::http
