// The shared state's hiredis plumbing, for its own files (backends/shared_state/*.cc): one synchronous
// connection (SharedState::Conn), owned replies, and replies read as strings.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <hiredis/hiredis.h>

#include "backends/shared_state/shared_state.h"

namespace kvroute::shared_state {

using ReplyPtr = std::unique_ptr<redisReply, void (*)(void*)>;

inline std::string_view str(const redisReply* r) {
  return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) ? std::string_view(r->str, r->len)
                                                                               : std::string_view();
}

struct SharedState::Conn {
  redisContext* c = nullptr;
  ~Conn() {
    if (c) redisFree(c);
  }
  std::string error() const { return c && c->err ? std::string(c->errstr) : std::string("no connection"); }
  // One command; null when the connection failed (the reply may still be a Redis error).
  ReplyPtr command(const std::vector<std::string>& args) {
    append(args);
    return reply();
  }
  void append(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data());
  }
  ReplyPtr reply() {
    void* r = nullptr;
    if (redisGetReply(c, &r) != REDIS_OK) return ReplyPtr(nullptr, freeReplyObject);
    return ReplyPtr(static_cast<redisReply*>(r), freeReplyObject);
  }
};

}  // namespace kvroute::shared_state
