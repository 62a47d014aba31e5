#include "router/relay_observer.h"

#include "router/log.h"
#include "router/request.h"

namespace kvroute::router {

namespace {
constexpr std::size_t kResponseIdHead = 64 * 1024;  // bytes of a Responses API body searched for its id
constexpr std::size_t kUsageTail = 16 * 1024;       // bytes of the response end kept to read `usage` from
}  // namespace

void take_complete_events(std::string& pending, std::string& out, bool last, std::optional<Usage>& usage) {
  std::size_t start = 0;
  while (true) {
    const std::size_t end = pending.find("\n\n", start);
    if (end == std::string::npos) break;
    const std::string_view event(pending.data() + start, end + 2 - start);
    const std::size_t data = event.find("data:");
    std::optional<Usage> only = data == std::string_view::npos ? std::nullopt : usage_only_chunk(event.substr(data + 5));
    if (only) usage = only;
    else out.append(event);
    start = end + 2;
  }
  pending.erase(0, start);
  if (last) {
    out.append(pending);
    pending.clear();
  }
}

void RelayObserver::begin(bool responses, bool strip_usage) {
  tail_.clear();
  stream_usage_.reset();
  responses_ = responses;
  strip_usage_ = strip_usage;
}

bool RelayObserver::on_head(unsigned status, bool event_stream, const backends::Worker& worker,
                            std::string_view request_id) {
  worker_ = &worker;
  request_id_ = request_id;
  status_ = status;
  if (decision_) decision_->status = status;
  time_events_ = event_stream && status >= 200 && status < 300;
  event_seen_ = false;
  strip_active_ = strip_usage_ && event_stream;
  // A new stored response: its id is read from the body's first bytes, to send its continuations here.
  id_head_.clear();
  capture_id_ = responses_ && status == 200;
  id_in_events_ = event_stream;
  await_output_ = capture_id_ && event_stream;
  sse_.clear();
  return strip_active_;
}

std::string_view RelayObserver::on_body(std::string_view piece, bool last) {
  if (!piece.empty()) {
    // A Responses API stream opens with events sent before the prompt is computed: its first token is the
    // first event after them.
    if (decision_ && (!await_output_ || responses_output_began(piece))) {
      await_output_ = false;
      router_.first_byte(*decision_);
    }
    keep_tail(piece);
    if (time_events_ && decision_) time_tokens(piece);
    if (capture_id_) capture_response_id(piece);
    if (status_reader_) status_reader_->feed(piece);
  }
  std::string_view out = piece;
  if (strip_active_) {
    sse_.append(piece);
    out_.clear();
    take_complete_events(sse_, out_, last, stream_usage_);
    out = out_;
  }
  // A background response's "queued" answer, complete: held before the client can act on its id. Any other
  // response, complete: its load on the worker ends before the client can send its next request.
  if (last && decision_) {
    if (decision_->background && status_ >= 200 && status_ < 300) {
      router_.hold_answered(*decision_);
    } else {
      router_.worker_done(*decision_);
    }
  }
  return out;
}

void RelayObserver::capture_response_id(std::string_view piece) {
  id_head_.append(piece);
  if (auto id = response_id(id_head_, id_in_events_)) {
    if (decision_ && decision_->background) decision_->response_id = *id;
    router_.remember_response(std::move(*id), worker_->id());
    capture_id_ = false;
  } else if (id_head_.size() > kResponseIdHead) {
    LOG_WARN("request " << request_id_ << ": no response id in the first " << kResponseIdHead << " bytes from worker "
                        << worker_->name() << "; a continuation of this response may not reach it");
    capture_id_ = false;
  }
}

// Inter-token latency: the time between data events after the first (vLLM sends a token per event). Events
// that arrive in one piece came together: the interval since the last one is shared among them, a mean. The
// closing "data: [DONE]" carries no token.
void RelayObserver::time_tokens(std::string_view piece) {
  std::size_t events = 0;
  for (std::size_t at = piece.find("data:"); at != std::string_view::npos; at = piece.find("data:", at + 5)) {
    if (at > 0 && piece[at - 1] != '\n') continue;  // "data:" inside a payload
    std::string_view rest = piece.substr(at + 5);
    if (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    if (!rest.starts_with("[DONE]")) ++events;
  }
  if (events == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (event_seen_) {
    router_.inter_token(*decision_, std::chrono::duration<double>(now - last_event_at_).count() /
                                        static_cast<double>(events));
  }
  event_seen_ = true;
  last_event_at_ = now;
}

void RelayObserver::keep_tail(std::string_view piece) {
  tail_.append(piece);
  if (tail_.size() > 2 * kUsageTail) tail_.erase(0, tail_.size() - kUsageTail);
}

void RelayObserver::watch_background(const std::string& id, std::string_view suffix, boost::beast::http::verb method) {
  using boost::beast::http::verb;
  if (!router_.holds_background(id)) return;
  if (suffix.empty() && method == verb::get) {
    background_watch_ = BackgroundWatch::kPoll;
    status_reader_ = std::make_unique<ResponseStatusReader>();
  } else if ((suffix.empty() && method == verb::delete_) || (suffix == "/cancel" && method == verb::post)) {
    background_watch_ = BackgroundWatch::kEnd;
  } else {
    return;
  }
  background_id_ = id;
}

void RelayObserver::settle_background(bool ok, unsigned status) {
  if (background_watch_ == BackgroundWatch::kNone) return;
  bool ended = false;
  if (background_watch_ == BackgroundWatch::kEnd) {
    ended = ok;
  } else if (status == 404) {
    ended = true;
  } else if (ok && status_reader_) {
    const auto final_status = status_reader_->finish();
    ended = final_status && final_response_status(*final_status);
  }
  if (ended) router_.background_ended(background_id_);
  end_background_watch();
}

void RelayObserver::end_background_watch() {
  background_watch_ = BackgroundWatch::kNone;
  background_id_.clear();
  status_reader_.reset();
}

}  // namespace kvroute::router
