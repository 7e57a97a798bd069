// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// A map of objects by key, sorted for listing by prefix and hashed for lookups by key.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace mooncake::sparse::internal {

/// std::map by key (List walks a prefix in order) with a hash index beside it for find: a read
/// of a step looks up each of its sources by key, and in a store of tens of thousands of
/// objects the sorted tree's walk (a dozen and more nodes, each a cache miss and a comparison
/// of keys that share a long prefix) cost the read about a microsecond per source. The index
/// holds views of the tree's keys (which never move) and the tree's iterators.
template <typename V>
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
        auto it = index_.find(key);
        return it == index_.end() ? tree_.end() : it->second;
    }
    const_iterator find(std::string_view key) const {
        auto it = index_.find(key);
        return it == index_.end() ? tree_.end() : const_iterator(it->second);
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
                index_.emplace(std::string_view(it->first), it);
            } catch (...) {
                tree_.erase(it);
                throw;
            }
        }
        return {it, inserted};
    }

    /// Removes the entry of `key` with one lookup; its value, or nullopt when there is none.
    std::optional<V> extract(std::string_view key) {
        auto hit = index_.find(key);
        if (hit == index_.end()) return std::nullopt;
        const iterator it = hit->second;
        std::optional<V> value(std::move(it->second));
        index_.erase(hit);  // before the tree node that holds the key it views
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
    std::unordered_map<std::string_view, iterator> index_;
};

}  // namespace mooncake::sparse::internal
