#pragma once
// An HTTP/1.1 client over Boost.Beast for the Hub, its CDN and local inference servers:
// http and https (certificate and hostname verification against the system store plus an
// optional CA file, SNI), redirects with the token policy of hub-protocol.md ("Authorization"),
// a deadline on every socket operation, and bodies either collected or streamed to a sink.
// Proxies as curl reads them (http_proxy, HTTPS_PROXY, NO_PROXY): https goes through a CONNECT
// tunnel (TLS end to end with the origin), plain http is sent to the proxy in absolute form.

#include "util/error.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace modeld::http {

/// An absolute http(s) URL split into the parts a connection needs.
struct Url {
  std::string scheme;  ///< "http" or "https"
  std::string host;    ///< name or address, without brackets
  std::uint16_t port = 0;
  std::string target = "/";  ///< path and query, already percent-encoded

  /// Parses "scheme://host[:port]/target" with Boost.URL (bytes RFC 3986 leaves out, such as
  /// '|' or non-ASCII, percent-encoded first, as browsers do); returns bad_request naming the
  /// text without its query on bad syntax (a bad %-escape included), user information or an
  /// unsupported scheme.
  static Result<Url> parse(std::string_view text);

  /// "scheme://host:port", the origin that the token policy compares.
  std::string origin() const;

  /// The URL as text (the default port left out).
  std::string str() const;

  /// Resolves a Location header against this URL as RFC 3986 section 5 does (Boost.URL):
  /// absolute URLs as they are, "//host/path" with this scheme, "/path" on this origin, "path"
  /// and "?query" relative to this URL, dot segments removed, the fragment dropped;
  /// bad_request on bad syntax.
  Result<Url> resolve(std::string_view location) const;

  /// "scheme://host:port/path" without the query, for messages and logs: a CDN's signed URL
  /// carries its signature in the query, which must not be logged.
  std::string redacted() const;
};

/// A header list; names compare case-insensitively.
struct Headers {
  std::vector<std::pair<std::string, std::string>> items;

  /// The first value of header `name`, or nullopt.
  std::optional<std::string> get(std::string_view name) const;
  /// Appends a header.
  void add(std::string name, std::string value) { items.emplace_back(std::move(name), std::move(value)); }
};

/// A request; `url` must be absolute.
struct Request {
  std::string method = "GET";
  Url url;
  Headers headers;
  std::string body;
  std::string content_type;  ///< sent when `body` is not empty
  /// Overrides ClientOptions::read_timeout (and caps connect_timeout) for this request; zero:
  /// the client's settings.
  std::chrono::milliseconds timeout{0};
};

/// The status line and headers of a final (non-redirect) response.
struct ResponseHead {
  unsigned status = 0;
  Headers headers;
  std::optional<std::uint64_t> content_length;  ///< nullopt for chunked or close-delimited bodies
  Url url;  ///< the URL that answered, after redirects
  std::vector<Headers> redirects;  ///< headers of each 3xx answer followed, in order (the Hub puts
                                   ///< X-Linked-Etag, X-Linked-Size and X-Repo-Commit on its 302)
};

/// A response whose body was collected in memory.
struct Response {
  ResponseHead head;
  std::string body;
};

/// Which proxies a client uses, in curl's terms; all empty (the default) means direct connections.
struct ProxyConfig {
  std::string http_proxy;   ///< proxy for http URLs: "http://[user:pass@]host[:port]" or "host:port"
  std::string https_proxy;  ///< proxy for https URLs (reached with CONNECT), same syntax
  std::string no_proxy;     ///< comma-separated hosts, domain suffixes, IP addresses and CIDR
                            ///< blocks (each with an optional ":port") reached directly; "*": all

  /// Reads the environment as curl does: https_proxy (else HTTPS_PROXY), http_proxy only in
  /// lower case (HTTP_PROXY may be set by a CGI "Proxy:" header), no_proxy (else NO_PROXY);
  /// never fails, unset variables give empty fields.
  static ProxyConfig from_environment();

  /// True when no proxy is configured at all.
  bool empty() const { return http_proxy.empty() && https_proxy.empty(); }
};

/// A parsed proxy URL; only "http" proxies (plain TCP to the proxy) are supported.
struct ProxyEndpoint {
  std::string host;  ///< name or address, without brackets
  std::uint16_t port = 1080;  ///< curl's default when the URL names none
  std::string username;  ///< percent-decoded; empty: no Proxy-Authorization
  std::string password;  ///< percent-decoded

  /// Parses "http://[user:pass@]host[:port][/]" or "[user:pass@]host[:port]" (http assumed);
  /// config_invalid for bad syntax or an "https://"/"socks" proxy, with a message that names
  /// `setting` (e.g. "https_proxy") and never the credentials.
  static Result<ProxyEndpoint> parse(std::string_view text, std::string_view setting);

  /// "http://host:port", for messages and logs: the credentials are never shown.
  std::string redacted() const;

  /// The value of Proxy-Authorization ("Basic " + base64 of "user:pass"), or "" without a user.
  std::string authorization() const;
};

/// True when `no_proxy` (ProxyConfig::no_proxy syntax) says `url` is reached directly: an entry
/// matches the host itself, a subdomain of it (".example.com" and "example.com" both match
/// "a.example.com"), an IP address in its CIDR block, and with ":port" only that port.
bool bypasses_proxy(std::string_view no_proxy, const Url& url);

/// The proxy that `url` goes through under `config` (https_proxy for https, http_proxy for
/// http), or nullopt for a direct connection; config_invalid when the chosen proxy does not parse.
Result<std::optional<ProxyEndpoint>> select_proxy(const ProxyConfig& config, const Url& url);

/// The wait a Retry-After header value asks for, in whole seconds: delta-seconds ("120") or an
/// HTTP-date in any of the three forms of RFC 9110 section 5.6.7 compared with `now` (rounded
/// up; a date in the past gives 0 s); nullopt when the value is neither.
std::optional<std::chrono::seconds> parse_retry_after(std::string_view value,
                                                      std::chrono::system_clock::time_point now);

/// Settings of a client; one client serves one Hub (or local servers, with no token).
struct ClientOptions {
  std::string auth_origin;   ///< origin ("https://host:443") that may receive the token; empty: none
  std::string bearer_token;  ///< sent as "Authorization: Bearer ..." only to auth_origin
  std::filesystem::path ca_file;  ///< extra trusted CA bundle (PEM); empty: system store only
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);  ///< resolve, connect, TLS handshake
  std::chrono::milliseconds read_timeout = std::chrono::seconds(30);  ///< deadline of each read and of
                                                                       ///< writing the request
  unsigned max_redirects = 10;
  std::string user_agent = "modeld/" MODELD_VERSION;
  ProxyConfig proxy;  ///< proxies to use; empty: direct (the daemon sets ProxyConfig::from_environment())
};

/// Receives a streamed body: called once with the final head (return an error to abort, e.g. a
/// wrong status), then with each block of body bytes in order.
struct BodySink {
  std::function<Result<void>(const ResponseHead&)> on_head;
  std::function<boost::asio::awaitable<Result<void>>(std::span<const char>)> on_data;
  /// Optional, for Content-Length bodies: the memory the client reads the next body bytes into
  /// (called before each read, never empty); on_data then gets a prefix of that span, so the bytes
  /// are copied once, from the socket. The span must stay valid until that on_data returns.
  std::function<std::span<char>()> buffer;
};

/// The client; it is used from one executor (the daemon's io_context) and is cheap to share.
class Client {
 public:
  /// Creates a client; throws std::runtime_error when `options.ca_file` cannot be loaded.
  Client(boost::asio::any_io_executor executor, ClientOptions options);
  ~Client();

  /// Sends `request`, follows redirects (dropping the token whenever the target leaves
  /// auth_origin, and an "Authorization" of `request.headers` whenever it leaves the request's
  /// origin) and collects a body of at most `max_body` bytes; a non-2xx status is not an error
  /// here. Each hop (the first URL and every redirect target) picks its proxy with
  /// select_proxy(). Errors: network_error (connect, TLS, write or read failed, body cut short,
  /// a proxy that refused CONNECT), timeout, hub_bad_response (too many redirects, body over the
  /// limit, a malformed answer), config_invalid (the chosen proxy setting does not parse),
  /// cancelled (the awaiting coroutine's cancellation slot fired). Messages name the URL without
  /// its query, and a proxy as "http://host:port" without its credentials.
  boost::asio::awaitable<Result<Response>> request(Request request, std::size_t max_body = 64u << 20);

  /// Like request(), but hands the body to `sink` as it arrives: a Content-Length body read by
  /// read (into BodySink::buffer when set, else blocks of at most 1 MiB), any other body in
  /// blocks of at most 1 MiB handed over when full or when no more bytes are waiting on the
  /// socket (a slow event stream is not held back); the next read starts only after on_data returns.
  /// Returns the final head. A body shorter than Content-Length, or a chunked body without its
  /// last chunk, is network_error after the delivered bytes (the caller may resume with Range);
  /// an error from the sink is returned as it is.
  boost::asio::awaitable<Result<ResponseHead>> stream(Request request, BodySink sink);

  /// The options this client was made with.
  const ClientOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace modeld::http
