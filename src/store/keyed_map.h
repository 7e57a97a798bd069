// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// A map of objects by key, sorted for listing by prefix and hashed for lookups by key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mooncake::sparse::internal {

/// The hash index of a KeyedMap: open addressing with linear probing, each slot holding the
/// key's hash, a view of the key (the tree node's, which never moves) and the tree's iterator.
/// A lookup reads one slot (two, three where keys collide) and the key's bytes only when the
/// hashes match; a node-based hash map (std::unordered_map) walked a bucket and one or two
/// nodes before that, each a cache miss in a store of hundreds of thousands of keys. At most
/// half full; an erase shifts the probe sequence back instead of leaving tombstones.
/// Hand-written: abseil's flat_hash_map would do (Debian has it), at the cost of a dependency
/// every build machine must carry for one index.
template <typename It, typename Hash = std::hash<std::string_view>>
class KeyIndex {
public:
    KeyIndex() = default;
    KeyIndex(const KeyIndex&) = default;
    KeyIndex& operator=(const KeyIndex&) = default;
    KeyIndex(KeyIndex&& other) noexcept
        : slots_(std::move(other.slots_)),
          mask_(std::exchange(other.mask_, 0)),
          size_(std::exchange(other.size_, 0)) {}
    KeyIndex& operator=(KeyIndex&& other) noexcept {
        KeyIndex(std::move(other)).swap(*this);
        return *this;
    }

    std::size_t size() const { return size_; }

    /// The slot of `key`, or nullptr.
    const It* find(std::string_view key) const {
        if (size_ == 0) return nullptr;
        const std::uint64_t h = Hash{}(key);
        for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (s.key == nullptr) return nullptr;
            if (s.hash == h && s.size == key.size() && std::memcmp(s.key, key.data(), key.size()) == 0) {
                return &s.it;
            }
        }
    }

    /// Adds `key` (absent; a view that stays valid while it is indexed). May throw bad_alloc,
    /// and then leaves the index as it was.
    void insert(std::string_view key, It it) {
        if (2 * (size_ + 1) > slots_.size()) Grow();
        Place({Hash{}(key), key.data() == nullptr ? "" : key.data(), key.size(), it});
        ++size_;
    }

    /// Removes `key` when present; whether it was.
    bool erase(std::string_view key) {
        if (size_ == 0) return false;
        const std::uint64_t h = Hash{}(key);
        std::size_t i = h & mask_;
        for (;; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (s.key == nullptr) return false;
            if (s.hash == h && s.size == key.size() && std::memcmp(s.key, key.data(), key.size()) == 0) {
                break;
            }
        }
        // Backward shift: each later slot of the probe run moves into the hole unless its home
        // lies after the hole (cyclically), so that every key stays reachable from its home.
        for (std::size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
            Slot& s = slots_[j];
            if (s.key == nullptr) break;
            const std::size_t home = s.hash & mask_;
            if (((j - home) & mask_) >= ((j - i) & mask_)) {
                slots_[i] = s;
                i = j;
            }
        }
        slots_[i] = Slot{};
        --size_;
        return true;
    }

    void swap(KeyIndex& other) noexcept {
        slots_.swap(other.slots_);
        std::swap(mask_, other.mask_);
        std::swap(size_, other.size_);
    }

private:
    struct Slot {
        std::uint64_t hash = 0;
        const char* key = nullptr;  ///< nullptr: empty
        std::size_t size = 0;
        It it{};
    };

    void Place(const Slot& slot) {
        for (std::size_t i = slot.hash & mask_;; i = (i + 1) & mask_) {
            if (slots_[i].key == nullptr) {
                slots_[i] = slot;
                return;
            }
        }
    }

    void Grow() {
        std::vector<Slot> old(slots_.empty() ? 16 : 2 * slots_.size());
        old.swap(slots_);  // may throw: nothing changed yet
        mask_ = slots_.size() - 1;
        for (const Slot& s : old) {
            if (s.key != nullptr) Place(s);
        }
    }

    std::vector<Slot> slots_;
    std::size_t mask_ = 0;
    std::size_t size_ = 0;
};

/// std::map by key (List walks a prefix in order) with a hash index beside it for find: a read
/// of a step looks up each of its sources by key, and in a store of tens of thousands of
/// objects the sorted tree's walk (a dozen and more nodes, each a cache miss and a comparison
/// of keys that share a long prefix) cost the read about a microsecond per source. The index
/// holds views of the tree's keys (which never move) and the tree's iterators.
template <typename V, typename Hash = std::hash<std::string_view>>
class KeyedMap {
public:
    using Tree = std::map<std::string, V, std::less<>>;
    using iterator = typename Tree::iterator;
    using const_iterator = typename Tree::const_iterator;

    KeyedMap() = default;
    KeyedMap(const KeyedMap&) = delete;  // the index would point into the other tree
    KeyedMap& operator=(const KeyedMap&) = delete;
    KeyedMap(KeyedMap&&) noexcept = default;  // nodes move with the tree: the index stays right
    KeyedMap& operator=(KeyedMap&&) noexcept = default;

    iterator find(std::string_view key) {
        const iterator* it = index_.find(key);
        return it == nullptr ? tree_.end() : *it;
    }
    const_iterator find(std::string_view key) const {
        const iterator* it = index_.find(key);
        return it == nullptr ? tree_.end() : const_iterator(*it);
    }
    iterator begin() { return tree_.begin(); }
    iterator end() { return tree_.end(); }
    const_iterator end() const { return tree_.end(); }
    const_iterator lower_bound(std::string_view key) const { return tree_.lower_bound(key); }
    std::size_t size() const { return tree_.size(); }

    /// Inserts (key, value) unless the key is there; the entry and whether it was inserted.
    std::pair<iterator, bool> emplace(std::string key, V value) {
        auto [it, inserted] = tree_.emplace(std::move(key), std::move(value));
        if (inserted) {
            try {
                index_.insert(std::string_view(it->first), it);
            } catch (...) {
                tree_.erase(it);
                throw;
            }
        }
        return {it, inserted};
    }

    /// Removes the entry of `key` with one lookup; its value, or nullopt when there is none.
    std::optional<V> extract(std::string_view key) {
        const iterator* hit = index_.find(key);
        if (hit == nullptr) return std::nullopt;
        const iterator it = *hit;
        std::optional<V> value(std::move(it->second));
        index_.erase(std::string_view(it->first));  // before the tree node whose key it views
        tree_.erase(it);
        return value;
    }

    void erase(iterator it) {
        index_.erase(std::string_view(it->first));
        tree_.erase(it);
    }

    void swap(KeyedMap& other) noexcept {
        tree_.swap(other.tree_);  // iterators and keys stay valid, now in the other map
        index_.swap(other.index_);
    }

private:
    Tree tree_;
    KeyIndex<iterator, Hash> index_;
};

}  // namespace mooncake::sparse::internal
