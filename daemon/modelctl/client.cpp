// Blocking HTTP over modeld's Unix socket with Boost.Beast. Beast's synchronous calls have
// no deadlines of their own, so the socket is wrapped in a stream that polls with a timeout
// before every read and write.

#include "modelctl/client.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <sys/un.h>

#include <array>
#include <limits>
#include <optional>

namespace modelctl {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using local = asio::local::stream_protocol;
using modeld::Errc;
using modeld::make_error;

// A SyncStream over a connected socket whose every read and write waits at most `timeout`.
class TimedSocket {
 public:
  TimedSocket(local::socket& s, std::chrono::milliseconds timeout) : s_(s), timeout_(timeout) {}

  template <class Buffers>
  std::size_t read_some(const Buffers& b, boost::system::error_code& ec) {
    if (!wait(POLLIN, ec)) return 0;
    return s_.read_some(b, ec);
  }
  template <class Buffers>
  std::size_t read_some(const Buffers& b) {
    boost::system::error_code ec;
    auto n = read_some(b, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }
  template <class Buffers>
  std::size_t write_some(const Buffers& b, boost::system::error_code& ec) {
    if (!wait(POLLOUT, ec)) return 0;
    return s_.write_some(b, ec);
  }
  template <class Buffers>
  std::size_t write_some(const Buffers& b) {
    boost::system::error_code ec;
    auto n = write_some(b, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

 private:
  bool wait(short events, boost::system::error_code& ec) {
    pollfd p{s_.native_handle(), events, 0};
    int rc;
    do rc = ::poll(&p, 1, static_cast<int>(timeout_.count()));
    while (rc < 0 && errno == EINTR);
    if (rc < 0) {
      ec.assign(errno, boost::system::system_category());
      return false;
    }
    if (rc == 0) {
      ec = beast::error::timeout;
      return false;
    }
    return true;
  }

  local::socket& s_;
  std::chrono::milliseconds timeout_;
};

modeld::Error unreachable(const boost::system::error_code& ec, std::chrono::milliseconds timeout) {
  if (ec == beast::error::timeout)
    return make_error(Errc::network_error,
                      fmt::format("no answer within {} s",
                                  std::chrono::duration_cast<std::chrono::seconds>(timeout).count()));
  if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == http::error::partial_message)
    return make_error(Errc::network_error, "connection closed");
  return make_error(Errc::network_error, ec.message());
}

modeld::Result<void> connect(local::socket& s, const std::string& path) {
  boost::system::error_code ec;
  if (path.size() >= sizeof(sockaddr_un::sun_path))
    return make_error(Errc::network_error, "socket path too long");
  s.connect(local::endpoint(path), ec);
  if (ec) return make_error(Errc::network_error, ec.message());
  return {};
}

http::request<http::string_body> make_request(const std::string& method, const std::string& target,
                                              const std::string& body) {
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, "localhost");
  req.set(http::field::user_agent, "modelctl/" MODELD_VERSION);
  req.keep_alive(false);
  if (!body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  return req;
}

}  // namespace

Daemon::Daemon(std::string socket_path, std::chrono::milliseconds timeout)
    : path_(std::move(socket_path)), timeout_(timeout) {}

modeld::Result<Reply> Daemon::call(const std::string& method, const std::string& target,
                                   const std::string& body) {
  asio::io_context io;
  local::socket socket(io);
  if (auto r = connect(socket, path_); !r) return r.error();
  TimedSocket stream(socket, timeout_);
  boost::system::error_code ec;
  auto req = make_request(method, target, body);
  http::write(stream, req, ec);
  if (ec) return unreachable(ec, timeout_);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64u << 20);
  http::read(stream, buffer, parser, ec);
  if (ec) return unreachable(ec, timeout_);
  return Reply{parser.get().result_int(), std::move(parser.get().body())};
}

int report_unreachable(const Daemon& daemon, const modeld::Error& error) {
  fmt::print(stderr, "modelctl: cannot reach modeld at {}: {}\n", daemon.socket_path(), error.message);
  return exit_unreachable;
}

int report_unreadable(const modeld::Error& error) {
  fmt::print(stderr, "modelctl: modeld answered with a body modelctl cannot read: {}\n", error.message);
  return exit_failed;
}

modeld::Result<std::optional<modeld::wire::Event>> read_event(const Event& e) {
  using Read = std::optional<modeld::wire::Event>;
  auto data = nlohmann::json::parse(e.data, nullptr, false);
  auto kind = modeld::wire::event_kind_from_string(e.kind);
  if (!data.is_object() || !kind) return Read();
  auto event = modeld::wire::event_from_json(*kind, data);
  if (!event) return event.error();
  return Read(std::move(*event));
}

struct EventStream::Impl {
  asio::io_context io;
  local::socket socket{io};
  std::optional<TimedSocket> stream;
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  std::string pending;  // received text not yet split into events
};

EventStream::EventStream(Daemon& daemon) : daemon_(daemon) {}
EventStream::~EventStream() = default;

modeld::Result<void> EventStream::open() {
  impl_ = std::make_unique<Impl>();
  if (auto r = connect(impl_->socket, daemon_.path_); !r) return r.error();
  impl_->stream.emplace(impl_->socket, daemon_.timeout_);
  boost::system::error_code ec;
  auto req = make_request("GET", "/v1/events", {});
  req.set(http::field::accept, "text/event-stream");
  http::write(*impl_->stream, req, ec);
  if (ec) return unreachable(ec, daemon_.timeout_);
  // The stream has no end the client can know; only the deadline per read bounds it.
  impl_->parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  http::read_header(*impl_->stream, impl_->buffer, impl_->parser, ec);
  if (ec) return unreachable(ec, daemon_.timeout_);
  if (auto status = impl_->parser.get().result_int(); status != 200)
    return make_error(Errc::network_error, fmt::format("GET /v1/events answered {}", status));
  return {};
}

modeld::Result<void> EventStream::follow(const std::function<bool(const Event&)>& on_event) {
  auto& im = *impl_;
  std::array<char, 8192> block{};
  std::optional<modeld::Error> failed;
  for (;;) {
    // Hand out every complete event received so far ("\n\n" ends one), also when the
    // stream has just ended: the last events before a close still count.
    for (std::size_t end; (end = im.pending.find("\n\n")) != std::string::npos;) {
      std::string_view text(im.pending.data(), end + 1);
      Event e;
      bool has_data = false;
      while (!text.empty()) {
        auto nl = text.find('\n');
        auto line = text.substr(0, nl);
        text.remove_prefix(nl + 1);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty() || line.front() == ':') continue;
        auto colon = line.find(':');
        auto field = line.substr(0, colon);
        auto value = colon == std::string_view::npos ? std::string_view{} : line.substr(colon + 1);
        if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
        if (field == "event") {
          e.kind = value;
        } else if (field == "data") {
          if (has_data) e.data += '\n';
          e.data += value;
          has_data = true;
        }
      }
      im.pending.erase(0, end + 2);
      if (!has_data) continue;
      if (e.kind.empty()) e.kind = "message";
      if (!on_event(e)) return {};
    }
    if (failed) return *failed;
    if (im.parser.is_done()) return make_error(Errc::network_error, "connection closed");
    auto& body = im.parser.get().body();
    body.data = block.data();
    body.size = block.size();
    boost::system::error_code ec;
    // read_some, not read: read would wait until the block is full, holding events back.
    http::read_some(*im.stream, im.buffer, im.parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    im.pending.append(block.data(), block.size() - body.size);
    if (ec) failed = unreachable(ec, daemon_.timeout_);
  }
}

}  // namespace modelctl
