#include "router/cache_pools.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>

namespace kvroute::router {

std::vector<std::size_t> group_by_models(const std::vector<std::vector<std::string>>& models) {
  // Union-find over the workers; a worker joins the first worker seen with each of its ids, and a worker of
  // unknown models joins everyone.
  std::vector<std::size_t> parent(models.size());
  std::iota(parent.begin(), parent.end(), std::size_t{0});
  auto find = [&](std::size_t i) {
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
  };
  auto join = [&](std::size_t a, std::size_t b) {
    a = find(a);
    b = find(b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  };
  std::unordered_map<std::string_view, std::size_t> first_with;
  for (std::size_t i = 0; i < models.size(); ++i) {
    if (models[i].empty()) {
      for (std::size_t j = 0; j < models.size(); ++j) join(i, j);
      continue;
    }
    for (const auto& id : models[i]) {
      auto [it, fresh] = first_with.emplace(id, i);
      if (!fresh) join(i, it->second);
    }
  }
  std::vector<std::size_t> pool(models.size());
  for (std::size_t i = 0; i < models.size(); ++i) pool[i] = find(i);
  return pool;
}

void CachePools::regroup(const backends::WorkerList& workers) {
  bool same = seen_.size() == workers.size();
  for (std::size_t i = 0; same && i < workers.size(); ++i) {
    same = seen_[i] == std::pair{workers[i]->serial(), workers[i]->models_version()};
  }
  if (same) return;
  seen_.resize(workers.size());
  std::vector<std::vector<std::string>> models(workers.size());
  for (std::size_t i = 0; i < workers.size(); ++i) {
    // The version first: a change racing with this read is seen again at the next access.
    seen_[i] = {workers[i]->serial(), workers[i]->models_version()};
    models[i] = workers[i]->models();
  }
  const std::vector<std::size_t> first = group_by_models(models);
  // A pool is named after its oldest worker, so it keeps its cache while younger workers join or leave it.
  std::vector<std::uint64_t> name(workers.size(), UINT64_MAX);
  for (std::size_t i = 0; i < workers.size(); ++i) name[first[i]] = std::min(name[first[i]], workers[i]->serial());
  pool_of_.assign(workers.size(), 0);
  std::map<std::uint64_t, std::shared_ptr<Pool>> kept;
  for (std::size_t i = 0; i < workers.size(); ++i) {
    const std::uint64_t n = name[first[i]];
    pool_of_[i] = n;
    auto& pool = kept[n];
    if (!pool) {
      if (auto old = pools_.find(n); old != pools_.end()) {
        pool = old->second;
      } else if (auto set_aside = parked_.find(n); set_aside != parked_.end()) {
        pool = set_aside->second;
        parked_.erase(set_aside);
      } else {
        pool = std::make_shared<Pool>();
      }
      pool->workers.clear();
      pool->models.clear();
    }
    pool->workers.push_back(workers[i]->name());
    for (auto& m : models[i]) {
      if (std::find(pool->models.begin(), pool->models.end(), m) == pool->models.end()) {
        pool->models.push_back(std::move(m));
      }
    }
  }
  // A pool merged into another (a new worker of not yet known models joins every pool) is set aside, so it
  // gets its cache back when it splits off again, until its oldest worker leaves the fleet.
  for (auto& [n, pool] : pools_) {
    if (!kept.contains(n)) parked_[n] = std::move(pool);
  }
  std::erase_if(parked_, [&](const auto& entry) {
    return std::none_of(workers.begin(), workers.end(), [&](const auto& w) { return w->serial() == entry.first; });
  });
  pools_ = std::move(kept);
}

std::optional<CachePools::Access> CachePools::access(const backends::WorkerList& workers, std::size_t picked,
                                                     const std::vector<std::uint64_t>& capacity,
                                                     std::span<const hashing::BlockHash> chain) {
  std::shared_ptr<Pool> pool;
  Access a;
  std::uint64_t blocks = 0;
  {
    std::lock_guard lock(mu_);
    regroup(workers);
    a.pool = pool_of_[picked];
    bool known = true;
    for (std::size_t i = 0; i < workers.size(); ++i) {
      if (pool_of_[i] != a.pool || !workers[i]->routable()) continue;
      const hashing::WorkerId id = workers[i]->id();
      const std::uint64_t c = id < capacity.size() ? capacity[id] : 0;
      known = known && c > 0;
      blocks += c;
    }
    if (!known || blocks == 0) return std::nullopt;
    pool = pools_.at(a.pool);
    // Under the lock, so that the gauges' totals (capacity_blocks()) see every resize in order.
    a.resized = pool->cache.set_capacity(blocks);
  }
  a.blocks = pool->cache.access(chain);
  return a;
}

void CachePools::count(std::uint64_t pool, std::uint64_t workers_hit, std::uint64_t shared_hit) {
  std::shared_ptr<Pool> p;
  {
    std::lock_guard lock(mu_);
    auto it = pools_.find(pool);
    if (it == pools_.end()) return;
    p = it->second;
  }
  p->hit_workers.fetch_add(workers_hit, std::memory_order_relaxed);
  p->hit_shared.fetch_add(shared_hit, std::memory_order_relaxed);
}

std::vector<CachePools::Info> CachePools::pools() const {
  std::lock_guard lock(mu_);
  std::vector<Info> out;
  for (const auto& [name, p] : pools_) {
    Info i;
    i.workers = p->workers;
    i.models = p->models;
    i.capacity_blocks = p->cache.capacity();
    i.sample_rate = p->cache.sample_rate();
    i.entries = p->cache.entries();
    i.hit_tokens_workers = p->hit_workers.load(std::memory_order_relaxed);
    i.hit_tokens_shared = p->hit_shared.load(std::memory_order_relaxed);
    out.push_back(std::move(i));
  }
  return out;
}

std::uint64_t CachePools::capacity_blocks() const {
  std::lock_guard lock(mu_);
  std::uint64_t total = 0;
  for (const auto& [name, p] : pools_) total += p->cache.capacity();
  return total;
}

double CachePools::sample_rate() const {
  std::lock_guard lock(mu_);
  double lowest = 1;
  for (const auto& [name, p] : pools_) {
    if (p->cache.capacity() > 0) lowest = std::min(lowest, p->cache.sample_rate());
  }
  return lowest;
}

}  // namespace kvroute::router
