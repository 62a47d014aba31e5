// SimSession: one HTTP/1.1 connection to a simulated worker (Beast, keep-alive).
//
// Owned by its pending operations (enable_shared_from_this) and, while a completion is in flight, by the
// worker's table of in-flight requests (it is the request's RequestObserver). Runs on the io_context thread
// only (see worker.h), so it needs no strand of its own.
//
// Bounds: a fresh parser per request with the body limit (413 beyond it), a header limit, an idle timeout
// before each read and a write timeout before each write, and a cap on SSE bytes queued for a slow client
// (the request is cancelled and the connection closed beyond it).
//
// Responses API: POST /v1/responses runs like a chat completion (same engine path, counters and cancellation)
// with its own formatter; its prompt starts with the conversation stored under previous_response_id in this
// worker's ResponseStore, and when it finishes (store=true) its conversation and object are stored there.
//
// Client disconnect: while a completion is in flight the session keeps one read pending on the socket; EOF
// or an error there cancels the request in the engine. Bytes that arrive instead (a pipelined request) are
// kept in the read buffer for the next parse.
//
//   std::make_shared<SimSession>(std::move(socket), worker)->run();
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/sim/server/openai_api.h"
#include "backends/sim/server/worker.h"

namespace kvroute::sim {

class SimSession : public RequestObserver, public std::enable_shared_from_this<SimSession> {
 public:
  SimSession(boost::asio::ip::tcp::socket socket, std::shared_ptr<SimWorker> worker);
  void run();

  // RequestObserver
  void on_first_token(std::uint32_t cached_tokens) override;
  void on_token(std::uint32_t index) override;
  void on_finish(const ApiUsage& usage) override;

 private:
  using Request = boost::beast::http::request<boost::beast::http::string_body>;
  using Response = boost::beast::http::response<boost::beast::http::string_body>;

  void do_read();
  void hang();
  void on_header(boost::beast::error_code ec, std::size_t bytes);
  void read_body();
  void on_read(boost::beast::error_code ec, std::size_t bytes);
  void handle(Request& req);
  // Submits to the engine and starts the exchange's state; false when refused (the error is sent).
  bool submit(ApiRequest request);
  void start_completion(ApiKind kind, Request& req);
  void start_response(Request& req);
  void start_background_response(ApiRequest api);
  ResponsesFormatter new_response_formatter();
  void get_response(std::string_view id);
  void cancel_response(std::string_view id);
  void update_lora(bool load, const std::string& body);
  void finish_response(const ApiUsage& usage);
  void send(Response res);
  void send_json(unsigned status, std::string body);
  void send_error(const Error& e);
  void on_write(bool keep_alive, boost::beast::error_code ec, std::size_t bytes);

  // Streaming: the header, then chunks from out_pending_, written one batch at a time. schedule_flush()
  // defers the write to after the current engine advance, so every token of one advance (often the whole
  // response at a high --speed) leaves in a single write.
  void schedule_flush();
  void flush();
  void on_stream_write(boost::beast::error_code ec, std::size_t bytes);
  // Disconnect detection while a completion is in flight.
  void watch();
  void on_watch(boost::beast::error_code ec, std::size_t bytes);
  void finish_exchange();
  void close();

  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
  std::string hang_buffer_;  // --fault hang: what the client sends meanwhile, dropped
  std::shared_ptr<SimWorker> worker_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  std::optional<Response> res_;

  // The completion in flight (valid while active_).
  bool active_ = false;
  bool keep_alive_ = true;
  bool stream_mode_ = false;
  bool include_usage_ = false;
  std::uint64_t request_id_ = 0;
  std::uint64_t fingerprint_ = 0;
  std::optional<ResponseFormatter> fmt_;
  std::string text_;            // non-streaming, and any Responses API request: the output so far
  // Responses API (valid while active_ and responses_api_).
  bool responses_api_ = false;
  bool store_ = true;
  std::optional<ResponsesFormatter> rfmt_;
  std::vector<std::uint32_t> conversation_;  // store_: the prompt tokens; the output's are added at the end
  std::uint32_t cached_tokens_ = 0;

  // Streaming output.
  bool header_pending_ = false; // the SSE response header still has to go out (with the first chunk)
  bool flush_posted_ = false;
  bool writing_ = false;
  bool stream_done_ = false;    // everything up to [DONE] is queued
  bool last_write_ = false;     // the write in flight ends the response
  std::string out_pending_;     // SSE bytes not yet handed to a write
  std::string out_writing_;     // SSE bytes of the write in flight

  bool watching_ = false;       // a disconnect-watch read is pending
  bool want_read_ = false;      // the exchange is over; read the next request when the watch ends
  bool closed_ = false;
};

}  // namespace kvroute::sim
