// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Named placement axes (`{ep: 3, tp: 1}`, `{expert: 37}`), the source placement policies
// `owner(AXIS)` and `replicate(AXIS)`, target matching, and a deterministic canonical source
// owner among the replicated participants of a logical key.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

/// An ordered set of (axis name, ordinal) pairs, sorted by name, names unique.
class NamedAxes {
public:
    using Entry = std::pair<std::string, std::int64_t>;

    NamedAxes() = default;

    /// Errors: InvalidArgument for an empty or malformed axis name, a duplicate axis, or a
    /// negative ordinal.
    static Result<NamedAxes> Make(std::vector<Entry> entries) {
        for (const auto& [name, ordinal] : entries) {
            if (!IsValidAxisName(name)) {
                return InvalidArgument("invalid placement axis name '" + name +
                                       "' (expected [A-Za-z_][A-Za-z0-9_]*)");
            }
            if (ordinal < 0) {
                return InvalidArgument("placement axis '" + name + "' has negative ordinal " +
                                       std::to_string(ordinal));
            }
        }
        std::sort(entries.begin(), entries.end());
        for (std::size_t i = 1; i < entries.size(); ++i) {
            if (entries[i].first == entries[i - 1].first) {
                return InvalidArgument("placement axis '" + entries[i].first + "' repeated");
            }
        }
        NamedAxes axes;
        axes.entries_ = std::move(entries);
        return axes;
    }

    static bool IsValidAxisName(std::string_view name) {
        if (name.empty() || name.size() > 64) return false;
        if (!(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_')) return false;
        return std::all_of(name.begin(), name.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
        });
    }

    std::optional<std::int64_t> Get(std::string_view axis) const {
        if (entries_.size() <= 8) {  // the usual handful of axes: a scan beats the search
            for (const Entry& e : entries_) {
                if (e.first.size() == axis.size() && std::string_view(e.first) == axis) {
                    return e.second;
                }
            }
            return std::nullopt;
        }
        auto it = std::lower_bound(entries_.begin(), entries_.end(), axis,
                                   [](const Entry& e, std::string_view a) { return e.first < a; });
        if (it == entries_.end() || it->first != axis) return std::nullopt;
        return it->second;
    }

    const std::vector<Entry>& entries() const { return entries_; }
    bool empty() const { return entries_.empty(); }

    std::string ToString() const {
        std::string s = "{";
        for (std::size_t i = 0; i < entries_.size(); ++i) {
            if (i) s += ", ";
            s += entries_[i].first + ": " + std::to_string(entries_[i].second);
        }
        return s + "}";
    }

    friend bool operator==(const NamedAxes&, const NamedAxes&) = default;
    friend auto operator<=>(const NamedAxes& a, const NamedAxes& b) {
        return a.entries_ <=> b.entries_;
    }

private:
    std::vector<Entry> entries_;
};

/// How a source object is matched to targets (docs/design.md §3).
class PlacementPolicy {
public:
    enum class Kind : std::uint8_t {
        kNone,       ///< Matches every target; the box decides.
        kOwner,      ///< Matches targets with the same ordinal on `axis` as the source.
        kReplicate,  ///< One object reused by every replica along `axis`; matches every target.
    };

    PlacementPolicy() = default;
    static PlacementPolicy None() { return {}; }
    static Result<PlacementPolicy> Owner(std::string axis) { return Make(Kind::kOwner, std::move(axis)); }
    static Result<PlacementPolicy> Replicate(std::string axis) {
        return Make(Kind::kReplicate, std::move(axis));
    }

    /// Parses "owner(AXIS)", "replicate(AXIS)", or "" / "none".
    /// Errors: InvalidArgument.
    static Result<PlacementPolicy> Parse(std::string_view text) {
        auto trim = [](std::string_view s) {
            while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
            while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
            return s;
        };
        text = trim(text);
        if (text.empty() || text == "none") return None();
        for (auto [prefix, kind] : {std::pair{std::string_view("owner("), Kind::kOwner},
                                    std::pair{std::string_view("replicate("), Kind::kReplicate}}) {
            if (text.starts_with(prefix) && text.ends_with(")")) {
                std::string_view axis = text.substr(prefix.size(), text.size() - prefix.size() - 1);
                return Make(kind, std::string(trim(axis)));
            }
        }
        return InvalidArgument("invalid placement policy '" + std::string(text) +
                               "' (expected owner(AXIS), replicate(AXIS) or none)");
    }

    Kind kind() const { return kind_; }
    const std::string& axis() const { return axis_; }

    std::string ToString() const {
        switch (kind_) {
            case Kind::kNone: return "none";
            case Kind::kOwner: return "owner(" + axis_ + ")";
            case Kind::kReplicate: return "replicate(" + axis_ + ")";
        }
        return "none";
    }

    /// Validates a source placement against this policy: `owner(AXIS)` needs the source to carry
    /// an ordinal on AXIS.
    /// Errors: InvalidArgument.
    Status ValidateSource(const NamedAxes& source_placement) const {
        if (kind_ == Kind::kOwner && !source_placement.Get(axis_)) {
            return InvalidArgument("policy " + ToString() + " needs source placement axis '" +
                                   axis_ + "', got " + source_placement.ToString());
        }
        return Status::Ok();
    }

    /// True when a target with `target_placement` may read a source placed at
    /// `source_placement` under this policy (the box decides the rest).
    bool Matches(const NamedAxes& source_placement, const NamedAxes& target_placement) const {
        if (kind_ != Kind::kOwner) return true;
        auto src = source_placement.Get(axis_);
        auto dst = target_placement.Get(axis_);
        return src && dst && *src == *dst;
    }

    friend bool operator==(const PlacementPolicy&, const PlacementPolicy&) = default;

private:
    static Result<PlacementPolicy> Make(Kind kind, std::string axis) {
        if (!NamedAxes::IsValidAxisName(axis)) {
            return InvalidArgument("invalid policy axis name '" + axis + "'");
        }
        PlacementPolicy p;
        p.kind_ = kind;
        p.axis_ = std::move(axis);
        return p;
    }

    Kind kind_ = Kind::kNone;
    std::string axis_;
};

/// 64-bit FNV-1a: a stable hash for owner selection (identical on every rank and build).
constexpr std::uint64_t StableHash(std::string_view s) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (char c : s) {
        h ^= static_cast<unsigned char>(c);
        h *= 0x100000001b3ull;
    }
    return h;
}

/// The canonical source owner of `tensor_id` among the training ranks that hold a replica of
/// it (their placements). Every rank computes the same answer from the same inputs, whatever
/// their order; the choice is spread across tensors by a stable hash so that one rank does not
/// encode every shared weight.
/// Errors: InvalidArgument for an empty or duplicated participant list.
inline Result<std::size_t> CanonicalOwner(std::string_view tensor_id,
                                          std::span<const NamedAxes> participants) {
    if (participants.empty()) return InvalidArgument("no participants for " + std::string(tensor_id));
    std::vector<std::size_t> order(participants.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return participants[a] < participants[b]; });
    for (std::size_t i = 1; i < order.size(); ++i) {
        if (participants[order[i]] == participants[order[i - 1]]) {
            return InvalidArgument("participant " + participants[order[i]].ToString() +
                                   " listed twice for " + std::string(tensor_id));
        }
    }
    return order[StableHash(tensor_id) % order.size()];
}

/// True when the rank at `self` is the canonical owner among `participants`.
inline Result<bool> IsCanonicalOwner(std::string_view tensor_id, const NamedAxes& self,
                                     std::span<const NamedAxes> participants) {
    MCS_ASSIGN_OR_RETURN(std::size_t owner, CanonicalOwner(tensor_id, participants));
    return participants[owner] == self;
}

}  // namespace mooncake::sparse
