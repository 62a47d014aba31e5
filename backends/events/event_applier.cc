#include "backends/events/event_applier.h"

#include <bit>
#include <utility>

#include "hashing/block_chain.h"

namespace kvroute::events {

namespace {
constexpr std::uint8_t kGpuBit = 1;
constexpr std::uint8_t kCpuBit = 2;
// LoRA namespaces remembered; beyond this the root is recomputed per event (cheap, one short hash).
constexpr std::size_t kMaxLoraRoots = 4096;
}  // namespace

KvEventApplier::KvEventApplier(hashing::PrefixIndex& index, ApplierOptions options)
    : index_(index), opt_(std::move(options)) {
  if (opt_.ranks == 0) opt_.ranks = 1;
  if (opt_.router_block_tokens == 0) opt_.router_block_tokens = hashing::kDefaultBlockTokens;
  model_root_ = hashing::namespace_root(opt_.model, opt_.salt);
  ranks_.resize(opt_.ranks);
}

std::uint64_t KvEventApplier::root_for(const std::string& lora_name) {
  if (lora_name.empty()) return model_root_;
  if (auto it = lora_roots_.find(lora_name); it != lora_roots_.end()) return it->second;
  const std::uint64_t root = hashing::namespace_root(lora_name, opt_.salt);
  if (lora_roots_.size() < kMaxLoraRoots) lora_roots_.emplace(lora_name, root);
  return root;
}

void KvEventApplier::apply(const KvEventBatch& batch, std::uint32_t r) {
  if (r >= ranks_.size()) r = 0;
  ++stats_.batches;
  for (const KvEvent& e : batch.events) {
    switch (e.type) {
      case KvEventType::kBlockStored:
        apply_stored(batch, e, ranks_[r], r);
        break;
      case KvEventType::kBlockRemoved:
        apply_removed(batch, e, ranks_[r]);
        break;
      case KvEventType::kAllBlocksCleared:
        drop_rank(r);  // a clear the engine asked for, not a reset the router forced
        ++stats_.clears;
        ++stats_.events;
        break;
    }
    // Lost removals would otherwise grow the map without bound; the engine can never hold more blocks
    // than it has, so this many mapped hashes means the stream and the map disagree.
    if (ranks_[r].blocks.size() > opt_.max_mapped_blocks) {
      drop_rank(r);
      ++stats_.resets;
      ++stats_.overflow_resets;
    }
  }
}

void KvEventApplier::add_ref(std::uint64_t own, std::uint8_t bit) {
  OwnRefs& refs = *own_.try_emplace(own).first;
  if (bit == kGpuBit) {
    ++refs.gpu;
  } else {
    ++refs.cpu;
  }
  (refs.gpu > 0 ? to_gpu_ : to_cpu_).push_back(own);
}

void KvEventApplier::drop_ref(std::uint64_t own, std::uint8_t bit) {
  OwnRefs* found = own_.find(own);
  if (found == nullptr) return;
  OwnRefs& refs = *found;
  if (bit == kGpuBit) {
    if (refs.gpu == 0) return;
    --refs.gpu;
    if (refs.gpu > 0) return;  // another GPU copy still holds it
    if (refs.cpu > 0) {
      to_cpu_.push_back(own);
      return;
    }
  } else {
    if (refs.cpu == 0) return;
    --refs.cpu;
    if (refs.cpu > 0 || refs.gpu > 0) return;
  }
  own_.erase(own);
  to_remove_.push_back(own);
}

void KvEventApplier::flush() {
  // Order matters only for an own hash that is re-tiered and then removed within one reset; see drop_ref.
  if (!to_gpu_.empty()) index_.store(opt_.worker, to_gpu_, hashing::Tier::kGpu);
  if (!to_cpu_.empty()) index_.store(opt_.worker, to_cpu_, hashing::Tier::kCpu);
  if (!to_remove_.empty()) index_.remove(opt_.worker, to_remove_);
  to_gpu_.clear();
  to_cpu_.clear();
  to_remove_.clear();
}

void KvEventApplier::apply_stored(const KvEventBatch& batch, const KvEvent& e, Rank& rank, std::uint32_t r) {
  const std::uint32_t R = opt_.router_block_tokens;
  if (e.medium == Medium::kOther || e.group_idx != opt_.group_idx || e.block_size % R != 0) {
    ++stats_.unsupported_events;
    return;
  }
  std::uint64_t parent = 0;
  if (!e.has_parent && !e.cache_salt.empty()) {
    // A salted prompt (a tenant's, router/cache_salt.h): the same namespace the router hashed it under.
    parent = hashing::namespace_root(e.lora_name.empty() ? opt_.model : e.lora_name, e.cache_salt);
  } else if (!e.has_parent) {
    parent = root_for(e.lora_name);
  } else {
    const EngineBlock* pb = rank.blocks.find(e.parent_block_hash);
    if (pb == nullptr) {
      ++stats_.orphan_events;
      return;
    }
    parent = pb->own;
  }
  const std::uint8_t bit = e.medium == Medium::kCpu ? kCpuBit : kGpuBit;
  const std::uint32_t per_engine = e.block_size / R;
  const auto hashes = batch.hashes_of(e);
  const auto tokens = batch.tokens_of(e);

  for (std::size_t b = 0; b < hashes.size(); ++b) {
    // Own hashes of this engine block: per_engine router blocks, each chained on the previous.
    sub_.clear();
    const std::uint32_t* tok = tokens.data() + b * e.block_size;
    for (std::uint32_t s = 0; s < per_engine; ++s) {
      if constexpr (std::endian::native == std::endian::little) {
        parent = hashing::hash_block(parent, tok + std::size_t{s} * R, std::size_t{R} * 4);
      } else {
        std::vector<unsigned char> buf(std::size_t{R} * 4);
        for (std::uint32_t i = 0; i < R; ++i) {
          const std::uint32_t t = tok[std::size_t{s} * R + i];
          for (int k = 0; k < 4; ++k) buf[i * 4 + k] = static_cast<unsigned char>(t >> (8 * k));
        }
        parent = hashing::hash_block(parent, buf.data(), buf.size());
      }
      sub_.push_back(parent);
    }

    auto [slot, inserted] = rank.blocks.try_emplace(hashes[b]);
    EngineBlock& eb = *slot;  // stable below: only own_ and rank.split change until the next block
    if (!inserted && eb.own != parent) {
      // The engine reused a hash for different tokens (or a hash collision in a bytes reduction): the old
      // mapping is wrong now, so release it entirely before taking the new one.
      std::vector<std::uint64_t> old;
      if (auto sp = rank.split.find(hashes[b]); sp != rank.split.end()) {
        old = std::move(sp->second);
        rank.split.erase(sp);
      }
      old.push_back(eb.own);
      for (std::uint8_t m : {kGpuBit, kCpuBit}) {
        if (eb.media & m) {
          for (std::uint64_t o : old) drop_ref(o, m);
        }
      }
      eb.media = 0;
    }
    eb.own = parent;
    if (per_engine > 1 && (inserted || eb.media == 0)) {
      rank.split[hashes[b]].assign(sub_.begin(), sub_.end() - 1);
    }
    if (eb.media & bit) {
      // Already held on this medium: a re-store only refreshes recency.
      for (std::uint64_t o : sub_) (own_.try_emplace(o).first->gpu > 0 ? to_gpu_ : to_cpu_).push_back(o);
    } else {
      eb.media |= bit;
      for (std::uint64_t o : sub_) add_ref(o, bit);
    }
  }
  stats_.blocks_stored += hashes.size();
  ++stats_.events;
  (void)r;
  flush();
}

void KvEventApplier::apply_removed(const KvEventBatch& batch, const KvEvent& e, Rank& rank) {
  if (e.medium == Medium::kOther || e.group_idx != opt_.group_idx) {
    ++stats_.unsupported_events;
    return;
  }
  const std::uint8_t bit = e.medium == Medium::kCpu ? kCpuBit : kGpuBit;
  for (std::uint64_t h : batch.hashes_of(e)) {
    EngineBlock* found = rank.blocks.find(h);
    if (found == nullptr || !(found->media & bit)) {
      ++stats_.unknown_removals;
      continue;
    }
    EngineBlock& eb = *found;
    eb.media &= static_cast<std::uint8_t>(~bit);
    auto sp = rank.split.empty() ? rank.split.end() : rank.split.find(h);
    if (sp != rank.split.end()) {
      for (std::uint64_t o : sp->second) drop_ref(o, bit);
    }
    drop_ref(eb.own, bit);
    if (eb.media == 0) {
      if (sp != rank.split.end()) rank.split.erase(sp);
      rank.blocks.erase(h);
    }
    ++stats_.blocks_removed;
  }
  ++stats_.events;
  flush();
}

ApplierStats KvEventApplier::stats() const {
  ApplierStats s = stats_;
  s.mapped_blocks = 0;
  for (const Rank& rank : ranks_) s.mapped_blocks += rank.blocks.size();
  return s;
}

void KvEventApplier::reset_rank(std::uint32_t r) {
  ++stats_.resets;
  drop_rank(r);
}

void KvEventApplier::reset() {
  ++stats_.resets;
  drop_all();
}

void KvEventApplier::drop_rank(std::uint32_t r) {
  if (r >= ranks_.size()) r = 0;
  if (ranks_.size() == 1) {
    drop_all();
    return;
  }
  Rank& rank = ranks_[r];
  rank.blocks.for_each([&](std::uint64_t h, const EngineBlock& eb) {
    auto sp = rank.split.empty() ? rank.split.end() : rank.split.find(h);
    for (std::uint8_t m : {kGpuBit, kCpuBit}) {
      if (!(eb.media & m)) continue;
      if (sp != rank.split.end()) {
        for (std::uint64_t o : sp->second) drop_ref(o, m);
      }
      drop_ref(eb.own, m);
    }
  });
  rank.blocks.clear();
  rank.split.clear();
  flush();
}

void KvEventApplier::drop_all() {
  for (Rank& rank : ranks_) {
    rank.blocks.clear();
    rank.split.clear();
  }
  own_.clear();
  index_.clear_worker(opt_.worker);
}

}  // namespace kvroute::events
