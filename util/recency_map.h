// RecencyMap: a string-keyed map that holds at most `capacity` entries and forgets the least recently put one
// first. The router keeps session bindings and Responses API owners in it, so that clients minting new keys
// (a fresh session id or `user` per request) cost bounded memory, and time-based expiry pops stale entries
// off the old end instead of sweeping the whole map under its lock. It keeps the background responses whose
// load it holds too: their deadlines grow with the order they were put in, so the oldest expire first.
//
//   RecencyMap<int> m(2);
//   m.put("a", 1); m.put("b", 2);
//   m.put("a", 3);                        // "a" is now the most recent
//   m.put("c", 4);                        // evicts "b", returns 1
//   m.drop_oldest_while([](const int& v) { return v < 4; });  // drops "a"
//
// Not thread-safe: the owner serialises calls.
#pragma once

#include <cstddef>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace kvroute::util {

template <class V>
class RecencyMap {
 public:
  explicit RecencyMap(std::size_t capacity) : capacity_(capacity > 0 ? capacity : 1) {}
  RecencyMap(const RecencyMap&) = delete;
  RecencyMap& operator=(const RecencyMap&) = delete;

  // Inserts or replaces the value of `key`, which becomes the most recent entry. Returns how many entries were
  // evicted to stay within capacity (0 or 1), handing each evicted value to `dropped` (as an rvalue) first.
  template <class Dropped>
  std::size_t put(std::string_view key, V value, Dropped dropped) {
    if (auto it = index_.find(key); it != index_.end()) {
      it->second->second = std::move(value);
      order_.splice(order_.begin(), order_, it->second);
      return 0;
    }
    order_.emplace_front(std::string(key), std::move(value));
    index_.emplace(order_.front().first, order_.begin());  // the view points into the list node, which stays put
    std::size_t evicted = 0;
    while (order_.size() > capacity_) {
      dropped(std::move(order_.back().second));
      pop_oldest();
      ++evicted;
    }
    return evicted;
  }
  std::size_t put(std::string_view key, V value) {
    return put(key, std::move(value), [](V&&) {});
  }

  // The value of `key`, or null; does not change recency.
  const V* find(std::string_view key) const {
    const auto it = index_.find(key);
    return it == index_.end() ? nullptr : &it->second->second;
  }

  // Removes `key` and returns its value; nullopt when absent.
  std::optional<V> take(std::string_view key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    const auto node = it->second;
    index_.erase(it);  // before the node its key views
    std::optional<V> out(std::move(node->second));
    order_.erase(node);
    return out;
  }

  // Drops entries from the least recent end while `pred(value)` holds, handing each value to `dropped` (as an
  // rvalue) first; returns how many.
  template <class Pred, class Dropped>
  std::size_t drop_oldest_while(Pred pred, Dropped dropped) {
    std::size_t n = 0;
    while (!order_.empty() && pred(order_.back().second)) {
      dropped(std::move(order_.back().second));
      pop_oldest();
      ++n;
    }
    return n;
  }
  template <class Pred>
  std::size_t drop_oldest_while(Pred pred) {
    return drop_oldest_while(pred, [](V&&) {});
  }

  // Drops every entry whose value satisfies `pred`; returns how many.
  template <class Pred>
  std::size_t erase_if(Pred pred) {
    std::size_t n = 0;
    for (auto it = order_.begin(); it != order_.end();) {
      if (!pred(it->second)) {
        ++it;
        continue;
      }
      index_.erase(std::string_view(it->first));
      it = order_.erase(it);
      ++n;
    }
    return n;
  }

  std::size_t size() const { return order_.size(); }
  std::size_t capacity() const { return capacity_; }

 private:
  using Order = std::list<std::pair<std::string, V>>;

  void pop_oldest() {
    index_.erase(std::string_view(order_.back().first));
    order_.pop_back();
  }

  std::size_t capacity_;
  Order order_;  // most recent first
  std::unordered_map<std::string_view, typename Order::iterator> index_;
};

}  // namespace kvroute::util
