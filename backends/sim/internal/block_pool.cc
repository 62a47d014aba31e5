// BlockPool: see block_pool.h for the contract and the vLLM behaviour it follows.
#include "backends/sim/internal/block_pool.h"

#include <algorithm>

namespace kvroute::sim::internal {

BlockPool::BlockPool(std::uint64_t num_gpu_blocks, std::uint64_t num_cpu_blocks)
    : blocks_(num_gpu_blocks), cpu_capacity_(num_cpu_blocks) {
  gpu_map_.reserve(num_gpu_blocks);
  // All blocks start free, in index order (block 0 is allocated first).
  for (std::uint64_t i = 0; i < num_gpu_blocks; ++i) push_free_tail(static_cast<BlockId>(i));
}

void BlockPool::push_free_tail(BlockId b) {
  Block& blk = blocks_[b];
  blk.prev = free_tail_;
  blk.next = kNoBlock;
  if (free_tail_ != kNoBlock)
    blocks_[free_tail_].next = b;
  else
    free_head_ = b;
  free_tail_ = b;
  ++num_free_;
}

void BlockPool::unlink_free(BlockId b) {
  Block& blk = blocks_[b];
  if (blk.prev != kNoBlock)
    blocks_[blk.prev].next = blk.next;
  else
    free_head_ = blk.next;
  if (blk.next != kNoBlock)
    blocks_[blk.next].prev = blk.prev;
  else
    free_tail_ = blk.prev;
  blk.prev = blk.next = kNoBlock;
  --num_free_;
}

BlockId BlockPool::lookup_gpu(std::uint64_t hash) const {
  auto it = gpu_map_.find(hash);
  return it == gpu_map_.end() ? kNoBlock : it->second;
}

void BlockPool::touch_cpu(std::uint64_t hash) {
  auto it = cpu_map_.find(hash);
  if (it != cpu_map_.end()) cpu_lru_.splice(cpu_lru_.end(), cpu_lru_, it->second.lru);
}

void BlockPool::acquire(BlockId b) {
  Block& blk = blocks_[b];
  if (blk.ref == 0) unlink_free(b);
  ++blk.ref;
}

void BlockPool::evict_to_cpu(const Block& blk, EngineSink& sink, double t) {
  if (cpu_capacity_ == 0) return;
  if (auto it = cpu_map_.find(blk.hash); it != cpu_map_.end()) {
    cpu_lru_.splice(cpu_lru_.end(), cpu_lru_, it->second.lru);
    return;
  }
  if (cpu_map_.size() >= cpu_capacity_) {
    const std::uint64_t victim = cpu_lru_.front();
    cpu_lru_.pop_front();
    cpu_map_.erase(victim);
    ++cpu_evictions_;
    sink.on_blocks_removed(std::span<const std::uint64_t>(&victim, 1), Medium::kCpu, t);
  }
  cpu_lru_.push_back(blk.hash);
  CpuEntry e{blk.parent, blk.origin, blk.index, blk.has_parent, std::prev(cpu_lru_.end())};
  cpu_map_.emplace(blk.hash, e);
  std::optional<std::uint64_t> parent;
  if (blk.has_parent) parent = blk.parent;
  sink.on_blocks_stored(std::span<const std::uint64_t>(&blk.hash, 1), parent, blk.origin, blk.index, Medium::kCpu,
                        t);
}

void BlockPool::allocate(std::uint32_t n, std::vector<BlockId>& out, EngineSink& sink, double t) {
  for (std::uint32_t i = 0; i < n && free_head_ != kNoBlock; ++i) {
    const BlockId b = free_head_;
    unlink_free(b);
    Block& blk = blocks_[b];
    if (blk.has_hash) {
      gpu_map_.erase(blk.hash);
      ++gpu_evictions_;
      // The GPU removal is reported before the CPU copy so a consumer never sees a hash on two media
      // out of order; CPU events go one by one because a small tier may drop what it just took.
      sink.on_blocks_removed(std::span<const std::uint64_t>(&blk.hash, 1), Medium::kGpu, t);
      evict_to_cpu(blk, sink, t);
      blk.has_hash = false;
      blk.has_parent = false;
    }
    blk.ref = 1;
    out.push_back(b);
  }
}

void BlockPool::release(std::span<const BlockId> blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    Block& blk = blocks_[*it];
    if (blk.ref == 0) continue;  // defensive: never double-free into the queue
    if (--blk.ref == 0) push_free_tail(*it);
  }
}

bool BlockPool::register_hash(BlockId b, std::uint64_t hash, std::optional<std::uint64_t> parent,
                              std::uint64_t origin, std::uint32_t index) {
  Block& blk = blocks_[b];
  if (blk.has_hash) return blk.hash == hash;
  auto [it, inserted] = gpu_map_.try_emplace(hash, b);
  if (!inserted) return false;
  blk.hash = hash;
  blk.has_hash = true;
  blk.has_parent = parent.has_value();
  blk.parent = parent.value_or(0);
  blk.origin = origin;
  blk.index = index;
  return true;
}

bool BlockPool::clear(EngineSink& sink, double t) {
  if (num_free_ != blocks_.size()) return false;
  for (auto& blk : blocks_) {
    blk.has_hash = false;
    blk.has_parent = false;
  }
  gpu_map_.clear();
  cpu_map_.clear();
  cpu_lru_.clear();
  sink.on_all_cleared(t);
  return true;
}

std::vector<std::uint64_t> BlockPool::gpu_hashes() const {
  std::vector<std::uint64_t> out;
  out.reserve(gpu_map_.size());
  for (const auto& [h, b] : gpu_map_) out.push_back(h);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::uint64_t> BlockPool::cpu_hashes() const {
  std::vector<std::uint64_t> out(cpu_lru_.begin(), cpu_lru_.end());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<BlockId> BlockPool::free_queue() const {
  std::vector<BlockId> out;
  for (BlockId b = free_head_; b != kNoBlock; b = blocks_[b].next) out.push_back(b);
  return out;
}

}  // namespace kvroute::sim::internal
