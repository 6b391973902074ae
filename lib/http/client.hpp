#pragma once
// An HTTP/1.1 client over Boost.Beast for the Hub, its CDN and local inference servers:
// http and https (certificate and hostname verification against the system store plus an
// optional CA file, SNI), redirects with the token policy of hub-protocol.md ("Authorization"),
// a deadline on every socket operation, and bodies either collected or streamed to a sink.

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

  /// Parses "scheme://host[:port]/target"; returns bad_request naming the text on bad syntax
  /// or an unsupported scheme.
  static Result<Url> parse(std::string_view text);

  /// "scheme://host:port", the origin that the token policy compares.
  std::string origin() const;

  /// The URL as text (the default port left out).
  std::string str() const;

  /// Resolves a Location header against this URL: absolute URLs as they are, "//host/path" with
  /// this scheme, "/path" on this origin, "path" and "?query" relative to this URL (RFC 3986);
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
};

/// Receives a streamed body: called once with the final head (return an error to abort, e.g. a
/// wrong status), then with each block of body bytes in order.
struct BodySink {
  std::function<Result<void>(const ResponseHead&)> on_head;
  std::function<boost::asio::awaitable<Result<void>>(std::span<const char>)> on_data;
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
  /// here. Errors: network_error (connect, TLS, write or read failed, body cut short), timeout,
  /// hub_bad_response (too many redirects, body over the limit, a malformed answer), cancelled
  /// (the awaiting coroutine's cancellation slot fired). Messages name the URL without its query.
  boost::asio::awaitable<Result<Response>> request(Request request, std::size_t max_body = 64u << 20);

  /// Like request(), but hands the body to `sink` as it arrives, in blocks of at most 1 MiB (a
  /// block is handed over when the buffer is full or when no more bytes are waiting on the socket,
  /// so a slow event stream is not held back); the next read starts only after on_data returns.
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
