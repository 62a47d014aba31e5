// CachePools: the reference the fleet's cache efficiency is measured against (docs/operations.md, "Cache
// efficiency"), one shared cache per pool of workers that can hold the same blocks.
//
// A request's blocks only ever live on workers that serve its model, so its reference is one LRU as large as
// those workers' combined KV capacity, not the whole fleet's: behind a router of two models, model A's prompts
// never compete with model B's for memory, and one cache of both fleets' capacity would credit each with
// room it does not have (a false "fragmented" reading on every multi-model router). Workers that serve a
// common model id form one pool, transitively: the pools are the connected components of the graph linking
// each worker to the ids of its /v1/models. A base model and its LoRA adapters are listed by the same
// engine, which holds all of them in its one KV pool, so they land in one pool. A worker whose models are not
// known yet is taken to serve any model, as the router routes it, which joins every worker into one pool:
// the whole fleet, as for a router of one model.
//
// Each pool has its own hashing::SharedCache sized to its healthy, uncordoned workers' capacity. A pool is
// named after its oldest worker (the smallest registry serial) and keeps its cache under that name when
// workers join or leave it, so a scale-up resizes the cache instead of emptying it. A worker added to a
// multi-model fleet joins every pool into one until its models are read; the pools merged away meanwhile are
// set aside and get their caches back when they split off again.
//
//   CachePools pools;
//   if (auto a = pools.access(*workers, picked, capacity, chain.hashes)) ...   // a->blocks: the pool's hit
//   pools.count(a->pool, reported_cached_tokens, shared_cached_tokens);        // when the worker reports usage
//
// Thread safety: all methods may be called concurrently. access() reads every worker's models version (one
// atomic load each) and regroups under the lock only when one of them, or the worker list, changed.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backends/worker_registry.h"
#include "hashing/shared_cache.h"

namespace kvroute::router {

// The pool of every worker, given each worker's model ids (empty: not known, so it serves any model): the
// index of the first worker of its pool. Workers sharing an id are in one pool, transitively.
std::vector<std::size_t> group_by_models(const std::vector<std::vector<std::string>>& models);

class CachePools {
 public:
  struct Access {
    std::uint64_t pool = 0;    // the pool's name (its oldest worker's serial), for count()
    std::uint64_t blocks = 0;  // leading blocks of the chain one cache of the pool's capacity held
    bool resized = false;      // the pool's capacity changed with this access (refresh the gauges)
  };
  // What the pool of workers[picked] would have served from one shared cache, after which the chain is
  // recorded there. nullopt while some healthy, uncordoned worker of that pool has an unknown capacity
  // (`capacity`, indexed by worker id, is 0), so the comparison is never against a cache smaller than the pool's.
  std::optional<Access> access(const backends::WorkerList& workers, std::size_t picked,
                               const std::vector<std::uint64_t>& capacity, std::span<const hashing::BlockHash> chain);
  // Adds a request's cached tokens, as its worker reported them and as its pool's shared cache would have
  // served them, to the pool's totals. A pool that no longer exists is skipped.
  void count(std::uint64_t pool, std::uint64_t workers_hit, std::uint64_t shared_hit);

  struct Info {
    std::vector<std::string> workers;  // display names
    std::vector<std::string> models;   // the model ids its workers serve (empty: not known)
    std::uint64_t capacity_blocks = 0;
    double sample_rate = 1;
    std::size_t entries = 0;
    std::uint64_t hit_tokens_workers = 0, hit_tokens_shared = 0;
  };
  // Every pool, oldest first (admin API).
  std::vector<Info> pools() const;
  // The sum of the pools' capacities and the lowest sampling rate among them (the gauges).
  std::uint64_t capacity_blocks() const;
  double sample_rate() const;

 private:
  struct Pool {
    hashing::SharedCache cache;
    std::vector<std::string> workers, models;
    std::atomic<std::uint64_t> hit_workers{0}, hit_shared{0};
  };
  // Regroups the workers when the list or a worker's models changed since the last call. Holds mu_.
  void regroup(const backends::WorkerList& workers);

  mutable std::mutex mu_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> seen_;  // (serial, models version) of every worker
  std::vector<std::uint64_t> pool_of_;                          // the pool name of each worker, in list order
  std::map<std::uint64_t, std::shared_ptr<Pool>> pools_;        // by name
  std::map<std::uint64_t, std::shared_ptr<Pool>> parked_;       // merged into another pool for now, by name
};

}  // namespace kvroute::router
