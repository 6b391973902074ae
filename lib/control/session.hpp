#pragma once
// The request loop of one HTTP/1.1 connection, which the control socket's server and the TCP
// /metrics listener share: what differs between them (limits, deadlines, what is answered, how
// a connection is counted) is in the callables they pass. Internal to lib/control (it pulls in
// Asio and Beast; keep it out of public headers).

#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <cstddef>

namespace modeld::control::detail {

/// Serves one connection's requests in turn: one read buffer of at most `buffer_bytes` (room for
/// a request and the start of a pipelined next one) and a fresh parser per request, given to
/// `read(buffer, parser)`, whose request then goes to `answer(request)`; both return
/// awaitable<bool>, false ending the connection, and the loop also ends once `stopped()` is true.
/// `leave()` runs however the loop ends (finished, thrown, or its coroutine destroyed): where the
/// owner stops counting the connection and closes it. The callables live in this coroutine's
/// frame, so what they capture outlives every read and answer.
template <class Stopped, class Read, class Answer, class Leave>
boost::asio::awaitable<void> serve_requests(std::size_t buffer_bytes, Stopped stopped, Read read, Answer answer,
                                            Leave leave) {
  namespace http = boost::beast::http;
  struct Guard {
    Leave& leave;
    ~Guard() { leave(); }
  } guard{leave};
  if (stopped()) co_return;
  boost::beast::flat_buffer buffer(buffer_bytes);
  while (!stopped()) {
    http::request_parser<http::string_body> parser;
    if (!co_await read(buffer, parser)) co_return;
    if (!co_await answer(parser.get())) co_return;
  }
}

}  // namespace modeld::control::detail
