// ResponseStore: the Responses API responses one simulated worker keeps (store=true), as vLLM keeps them in
// its server's memory: a follow-up naming one (previous_response_id) or GET /v1/responses/{id} finds it only
// on the worker that made it. That is the behaviour a router must handle (send follow-ups to the same worker).
//
// Each entry holds the conversation's token ids (the prompt followed by the generated output), which a
// follow-up's prompt starts with, verbatim, so the engine's prefix cache hits it; and the response object,
// which GET returns. A background response (background=true) is stored as soon as it is queued and updated
// as it runs (queued, in_progress, completed), or marked cancelled by POST /v1/responses/{id}/cancel.
// Bounded: beyond the capacity (4096) the oldest entry is dropped. Ids are random
// ("resp_" + 32 hex digits from a std::random_device-seeded generator), so workers of different kvroute-sim
// processes never hand out the same id and a follow-up sent to the wrong worker is a clean 404.
//
// Threading: none of its own. A SimWorker and its sessions run on one io_context thread (see worker.h), which
// is the only thread that touches the store; so it takes no lock.
//
//   ResponseStore store;
//   const std::string id = store.new_id("resp_");
//   store.put(id, {conversation_tokens, response_json});
//   if (const StoredResponse* r = store.find(id)) ...   // valid until the next put()
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvroute::sim {

struct StoredResponse {
  std::vector<std::uint32_t> conversation;  // prompt tokens, then output tokens
  std::string object;                       // the response object (JSON) GET returns
  // A background response is stored when it is queued and updated as it runs. While it is queued or in
  // progress, `request` is its engine request and `cancelled` the object it becomes if it is cancelled.
  std::string status = "completed";         // queued, in_progress, completed, cancelled
  std::uint64_t request = 0;
  std::string cancelled;

  // A finished response (stored when it completes).
  static StoredResponse completed(std::vector<std::uint32_t> conversation, std::string object) {
    StoredResponse r;
    r.conversation = std::move(conversation);
    r.object = std::move(object);
    return r;
  }
};

class ResponseStore {
 public:
  static constexpr std::size_t kDefaultCapacity = 4096;
  explicit ResponseStore(std::size_t capacity = kDefaultCapacity);

  // Keeps `r` under `id`, dropping the oldest entries beyond the capacity. An id already present is replaced
  // (and keeps its age).
  void put(const std::string& id, StoredResponse r);
  // nullptr when unknown (never stored, stored with store=false, or dropped). Valid until the next put().
  const StoredResponse* find(std::string_view id) const;
  StoredResponse* find(std::string_view id);
  std::size_t size() const { return by_id_.size(); }

  // prefix + 32 lowercase hex digits (two 64-bit draws).
  std::string new_id(std::string_view prefix);

 private:
  std::size_t capacity_;
  std::unordered_map<std::string, StoredResponse> by_id_;
  std::deque<std::string> order_;  // ids, oldest first
  std::mt19937_64 rng_;
};

}  // namespace kvroute::sim
