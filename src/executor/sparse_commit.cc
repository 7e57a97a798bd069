// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The commit side of SparseStore (docs/design.md §2-3): validation and encoding of a source
// object, idempotent commit by logical key, generation fencing, single-owner admission, the
// manifest of a generation, and the key naming of every object of this layer.

// GCC 12 reports a false -Wrestrict inside std::string operator+ inlined from contracts.h
// (Generation::ToString, via SourceDescriptor::Make); GCC bug 105329. The
// diagnostic is located in <string>, so this must come before any include.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "codec/object_metadata.h"
#include "executor/node_cache.h"
#include "transport/parallel_for.h"
#include "executor/sparse_store.h"
#include "transport/host_copy.h"
#include "executor/tensor_store.h"  // kReservedKeyPrefix

namespace mooncake::sparse {

std::string GenerationTag(Generation g) {
    return std::to_string(g.base) + "-" + std::to_string(g.delta);
}

std::optional<Generation> ParseGenerationTag(std::string_view tag) {
    const std::size_t dash = tag.find('-');
    if (dash == std::string_view::npos) return std::nullopt;
    Generation g;
    const char* b = tag.data();
    const auto [be, berr] = std::from_chars(b, b + dash, g.base);
    const auto [de, derr] = std::from_chars(b + dash + 1, b + tag.size(), g.delta);
    if (berr != std::errc() || be != b + dash || derr != std::errc() || de != b + tag.size()) {
        return std::nullopt;
    }
    return g;
}

namespace {

using Json = nlohmann::json;

// The default namespace's source prefix: BuildSourceObject's provisional source_ref (a commit
// names the object under its store's namespace).
constexpr std::string_view kSourcePrefix = "mcs/src/";
static_assert(kSourcePrefix.starts_with(kReservedKeyPrefix));


/// Appends the decimal digits of `v` (std::to_string's) without a temporary string.
template <typename Int>
void AppendDecimal(std::string& s, Int v) {
    char buf[24];
    const auto end = std::to_chars(buf, buf + sizeof(buf), v).ptr;
    s.append(buf, static_cast<std::size_t>(end - buf));
}

/// Appends `<tensor_id>/g<base>-<delta>/<policy>[/<axis>=<value>]` (a source's logical key),
/// built in place: it is built for every committed object.
void AppendLogicalKey(std::string& key, std::string_view tensor_id, Generation generation,
                      const PlacementPolicy& policy, const NamedAxes& placement) {
    const std::string policy_text = policy.ToString();
    key.reserve(key.size() + tensor_id.size() + policy_text.size() + 64);
    key.append(tensor_id).append("/g");
    AppendDecimal(key, generation.base);
    key.push_back('-');
    AppendDecimal(key, generation.delta);
    key.push_back('/');
    key.append(policy_text);
    if (policy.kind() == PlacementPolicy::Kind::kOwner) {
        key.push_back('/');
        key.append(policy.axis()).push_back('=');
        AppendDecimal(key, *placement.Get(policy.axis()));
    }
}

std::string LogicalKeyOf(std::string_view tensor_id, Generation generation,
                         const PlacementPolicy& policy, const NamedAxes& placement) {
    std::string key;
    AppendLogicalKey(key, tensor_id, generation, policy, placement);
    return key;
}

/// Whether the object stored under a source key (`existing`) holds the payload of `object`:
/// what makes a second commit of the same logical key an idempotent retry, not a conflict.
bool IsSameCommit(const ObjectInfo& existing, const SparseObject& object) {
    const SourceDescriptor& d = object.desc;
    auto prev = DecodeObjectMetadata(d.source_ref, existing.metadata);
    const MemberInfo* idx = existing.FindMember("indices");
    const MemberInfo* val = existing.FindMember("values");
    return prev.ok() && idx && val && prev->nnz == d.nnz && prev->apply == d.apply &&
           prev->value_dtype == d.value_dtype && prev->box == d.box &&
           prev->global_shape == d.global_shape && idx->checksum == object.checksum_indices &&
           val->checksum == object.checksum_values;
}

/// The bytes of a source object's members, in the order of SpecsInto (views of `object`).
/// `indices` / `values` empty: the object's own.
SourceMemberBytes BytesOf(const SparseObject& object, std::span<const std::byte> indices = {},
                          std::span<const std::byte> values = {}) {
    const auto bytes = [](const auto& v) {
        return std::span<const std::byte>(reinterpret_cast<const std::byte*>(v.data()),
                                          v.size() * sizeof(v[0]));
    };
    const bool external = !indices.empty() || !values.empty();
    return {external ? indices : bytes(object.indices), external ? values : bytes(object.values),
            bytes(object.tile_coords), bytes(object.tile_ptr)};
}

/// Calls `f(name, dtype, shape, checksum)` for each of a source object's four members, as the
/// store keeps them, in BytesOf's order.
template <typename F>
void ForEachMember(const SparseObject& object, F&& f) {
    const SourceDescriptor& d = object.desc;
    f("indices", d.index_dtype, {Index(d.nnz), Index(d.rank())}, object.checksum_indices);
    f("values", d.value_dtype, {Index(d.nnz)}, object.checksum_values);
    f("tile_coords", DType::kUInt32, {Index(d.num_tiles), Index(d.rank())},
      object.checksum_tile_coords);
    f("tile_ptr", DType::kUInt64, {Index(d.num_tiles + 1)}, object.checksum_tile_ptr);
}

/// Appends the object's members to `out`, built in place: a commit is a few dozen allocations
/// per object, and each one counts at 10^5 objects.
void SpecsInto(const SparseObject& object, std::vector<MemberSpec>& out) {
    ForEachMember(object, [&](const char* name, DType dtype, std::initializer_list<Index> shape,
                              std::uint64_t checksum) {
        MemberSpec& m = out.emplace_back();
        m.name = name;
        m.dtype = dtype;
        m.shape.assign(shape);
        m.checksum = checksum;
    });
}

/// The members of a source object with their bytes (BytesOf's views), for ObjectStore::Put.
std::vector<MemberData> MembersOf(const SparseObject& object, std::span<const std::byte> indices = {},
                                  std::span<const std::byte> values = {}) {
    const SourceMemberBytes bytes = BytesOf(object, indices, values);
    std::vector<MemberData> out;
    out.reserve(bytes.size());
    ForEachMember(object, [&](const char* name, DType dtype, std::initializer_list<Index> shape,
                              std::uint64_t checksum) {
        MemberData& m = out.emplace_back();
        m.name = name;
        m.dtype = dtype;
        m.shape.assign(shape);
        m.bytes = bytes[out.size() - 1];
        m.checksum = checksum;
    });
    return out;
}

}  // namespace

/// Source objects smaller than this are not placed in the pinned pool: a pinned block is at
/// least 2 MiB, and a device read gathers a small object's few bytes through staging as fast.
constexpr std::uint64_t kMinPinnedObjectBytes = std::uint64_t{256} << 10;
/// A batch of at least this many objects that is not filled in place commits through
/// CommitEachLocked (its store puts built side by side), a smaller one object by object.
constexpr std::size_t kEachCommitObjects = 64;

namespace {

/// The bytes of an object's entries: nnz * rank * index size + nnz * value size (false on
/// overflow).
bool EntryBytes(const SourceDescriptor& d, std::uint64_t& index_bytes,
                std::uint64_t& value_bytes) {
    return !__builtin_mul_overflow(d.nnz, d.rank() * DTypeSize(d.index_dtype), &index_bytes) &&
           !__builtin_mul_overflow(d.nnz, DTypeSize(d.value_dtype), &value_bytes);
}

}  // namespace

/// The bytes a source object holds in the store (entries and tile index).
std::uint64_t StoredBytes(const SparseObject& o) {
    return o.desc.nnz * o.desc.EntryBytes() + o.tile_coords.size() * sizeof(TileCoord) +
           o.tile_ptr.size() * sizeof(std::uint64_t);
}

std::string SourceObjectKey(std::string_view tensor_id, Generation generation,
                            const PlacementPolicy& policy, const NamedAxes& placement,
                            const Box& box) {
    std::string key(kSourcePrefix);
    AppendLogicalKey(key, tensor_id, generation, policy, placement);
    key.append("/at");
    const std::span<const Index> origin = box.origin();
    for (std::size_t i = 0; i < origin.size(); ++i) {
        if (i) key.push_back('_');
        AppendDecimal(key, origin[i]);
    }
    return key;
}

namespace {

/// The descriptor of a put_sparse_object call's source (validated), before its entries.
Result<SourceDescriptor> SourceDescOf(const PutSparseRequest& req) {
    MCS_RETURN_IF_ERROR(internal::ValidateId("tensor_id", req.tensor_id));
    MCS_RETURN_IF_ERROR(ValidateShape(req.global_shape));
    MCS_ASSIGN_OR_RETURN(Generation generation,
                         Generation::Make(req.generation.base, req.generation.delta));
    // The box from views of the request's shapes: no temporary shape vectors (the rank is at
    // most kMaxRank, checked above).
    const std::size_t rank = req.global_shape.size();
    std::array<Index, kMaxRank> zeros{};
    const std::span<const Index> offset =
        req.global_offset ? std::span<const Index>(*req.global_offset)
                          : std::span<const Index>(zeros.data(), std::min(rank, zeros.size()));
    const std::span<const Index> local =
        req.local_shape ? std::span<const Index>(*req.local_shape) : std::span<const Index>(req.global_shape);
    auto box = Box::Make(offset, local);
    if (!box.ok()) return box.status().WithContext("source box of " + req.tensor_id);
    SourceDescriptor desc;
    desc.tensor_id = req.tensor_id;
    desc.global_shape = req.global_shape;
    desc.box = std::move(box).value();
    desc.generation = generation;
    desc.placement = req.source_placement;
    desc.policy = req.placement_policy;
    desc.apply = req.apply;
    MCS_RETURN_IF_ERROR(desc.policy.ValidateSource(desc.placement));
    desc.source_ref =
        SourceObjectKey(desc.tensor_id, generation, desc.policy, desc.placement, desc.box);
    return desc;
}

}  // namespace

Result<SparseObject> BuildSourceObject(const PutSparseRequest& req) {
    MCS_ASSIGN_OR_RETURN(SourceDescriptor desc, SourceDescOf(req));
    // Updates from encode_update(s) are sorted already: they skip the sort.
    return BuildSparseObjectSortedFirst(std::move(desc), req.indices, req.values, req.encode);
}

std::optional<SparseObject> IndexSourceObject(const PutSparseRequest& req) {
    Result<SourceDescriptor> desc = SourceDescOf(req);
    if (!desc.ok()) return std::nullopt;
    return IndexCanonicalEntries(std::move(desc).value(), req.indices, req.values, req.encode);
}

std::optional<SourceDescriptor> PlanIndexedSource(const PutSparseRequest& req,
                                                  const CooLayout& entries) {
    Result<SourceDescriptor> desc = SourceDescOf(req);
    if (!desc.ok()) return std::nullopt;
    return PlanCanonicalEntries(std::move(desc).value(), entries, req.encode);
}

Result<CommitResult> SparseStore::PutSparseObject(const PutSparseRequest& req) {
    MCS_ASSIGN_OR_RETURN(SparseObject object, BuildSourceObject(req));
    return CommitSparseObject(std::move(object), req.hard_pin);
}

namespace {

std::string HeadMetadata(Generation g) {
    // What nlohmann::json {{"base", b}, {"delta", d}}.dump() writes (keys sorted, no spaces),
    // written directly: every commit that moves a head writes one.
    std::string out;
    out.reserve(64);
    char digits[24];
    out += "{\"base\":";
    out.append(digits, std::to_chars(digits, digits + sizeof(digits), g.base).ptr);
    out += ",\"delta\":";
    out.append(digits, std::to_chars(digits, digits + sizeof(digits), g.delta).ptr);
    out += '}';
    return out;
}

std::optional<Generation> ParseHeadMetadata(std::string_view text) {
    // The form HeadMetadata writes, parsed directly; anything else through the JSON parser.
    const auto number = [&](std::string_view prefix, char end) -> std::optional<std::uint64_t> {
        if (!text.starts_with(prefix)) return std::nullopt;
        text.remove_prefix(prefix.size());
        std::uint64_t v = 0;
        const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec != std::errc() || p == text.data() || p == text.data() + text.size() || *p != end) {
            return std::nullopt;
        }
        text.remove_prefix(static_cast<std::size_t>(p - text.data()) + 1);
        return v;
    };
    const std::string_view all = text;
    const std::optional<std::uint64_t> base = number("{\"base\":", ',');
    const std::optional<std::uint64_t> delta = base ? number("\"delta\":", '}') : std::nullopt;
    if (base && delta && text.empty()) return Generation{*base, *delta};
    Json j = Json::parse(all, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("base") || !j.contains("delta") ||
        !j["base"].is_number_unsigned() || !j["delta"].is_number_unsigned()) {
        return std::nullopt;
    }
    return Generation{j["base"].get<std::uint64_t>(), j["delta"].get<std::uint64_t>()};
}

}  // namespace

Result<std::optional<Generation>> SparseStore::CurrentGeneration(std::string_view tensor_id) {
    auto info = store_->Find(HeadKeyOf(tensor_id));
    if (!info.ok()) return info.status();
    if (*info == nullptr) return std::optional<Generation>();
    std::optional<Generation> head = ParseHeadMetadata((*info)->metadata);
    if (!head) return DataLoss("generation head of " + std::string(tensor_id) + " is corrupt");
    return std::optional<Generation>(*head);
}

Status SparseStore::PrepareCommit(SparseObject& object, std::string& metadata) {
    SourceDescriptor& d = object.desc;
    if (object.coordinate_space != "global") {
        return InvalidArgument("only global-coordinate objects are committed as sources");
    }
    const std::string key =
        SourceObjectKey(d.tensor_id, d.generation, d.policy, d.placement, d.box);
    d.source_ref.clear();
    d.source_ref.reserve(source_prefix_.size() + key.size() - kSourcePrefix.size());
    d.source_ref.append(source_prefix_).append(std::string_view(key).substr(kSourcePrefix.size()));
    MCS_RETURN_IF_ERROR(SourceDescriptor::Validate(d));
    metadata = EncodeObjectMetadata(object);
    return Status::Ok();
}

std::optional<Result<CommitResult>> SparseStore::CheckCommitLocked(
    const SparseObject& object, CommitBatch& batch, std::optional<Generation>& head) {
    const SourceDescriptor& d = object.desc;
    // Idempotence first: a retry of a committed step must succeed even after the tensor moved on.
    // (A first commit misses here: Find, not Stat, which would build a NotFound for it.)
    auto existing = store_->Find(d.source_ref);
    if (!existing.ok()) return Result<CommitResult>(existing.status());
    if (*existing != nullptr) {
        if (!IsSameCommit(**existing, object)) {
            return Result<CommitResult>(
                Conflict("a different payload is already committed for " + d.source_ref));
        }
        ++batch.idempotent;
        return Result<CommitResult>(CommitResult{d.source_ref, false, d.nnz, 0});
    }

    // Whether the step takes commits: checked once per step of a batch.
    auto [step, fresh] = batch.steps.try_emplace(d.generation);
    if (fresh) {
        step->second = [&]() -> Status {
            MCS_ASSIGN_OR_RETURN(const bool sealed, IsSealed(d.generation));
            if (sealed) return Conflict("step " + d.generation.ToString() + " is sealed");
            MCS_ASSIGN_OR_RETURN(const bool freed, PastRetention(d.generation));
            if (freed) {
                return Conflict("step " + d.generation.ToString() + " is past retention (freed)");
            }
            return Status::Ok();
        }();
    }
    if (!step->second.ok()) {
        return Result<CommitResult>(Status(step->second.code(), step->second.message() + ": " +
                                                                    d.source_ref +
                                                                    " cannot join it"));
    }
    auto [head_it, unread] = batch.heads.try_emplace(d.tensor_id);
    if (unread) {
        auto current = CurrentGeneration(d.tensor_id);
        if (!current.ok()) return Result<CommitResult>(current.status());
        head_it->second = *current;
    }
    head = head_it->second;
    // Fencing: the first writer of a step moves the head to (base, delta); the other writers
    // of the same step (other experts, other boxes) find it at exactly (base, delta). A tensor
    // left unchanged for steps commits a later step directly (base past its head); a base
    // older than the head's delta is stale.
    if (head && *head != d.generation && d.generation.base < head->delta) {
        return Result<CommitResult>(StaleGeneration(
            "tensor '" + d.tensor_id + "' is at generation " + head->ToString() + "; commit " +
            d.generation.ToString() + " does not extend it"));
    }
    return std::nullopt;
}

Result<CommitResult> SparseStore::PublishCommitLocked(const SparseObject& object,
                                                      const std::string& metadata,
                                                      std::optional<Generation> head,
                                                      CommitBatch& batch, std::uint64_t bytes) {
    const SourceDescriptor& d = object.desc;
    const std::string manifest_key = ManifestKeyOf(d);
    Status s = store_->Put(manifest_key, metadata, {}, {PutMode::kUpsert, true});
    if (s.ok() && (!head || *head != d.generation)) {
        s = store_->Put(HeadKeyOf(d.tensor_id), HeadMetadata(d.generation), {},
                        {PutMode::kUpsert, true});
        if (s.ok()) batch.heads[d.tensor_id] = d.generation;
    }
    if (!s.ok()) {
        // Leave the store as it was: nothing of a failed commit stays visible.
        (void)store_->Remove(manifest_key);
        (void)store_->Remove(d.source_ref);
        return s;
    }
    ++batch.created;
    batch.created_bytes += bytes;
    return CommitResult{d.source_ref, true, d.nnz, bytes};
}

Result<CommitResult> SparseStore::CommitLocked(const SparseObject& object,
                                               const std::string& metadata, bool hard_pin,
                                               CommitBatch& batch, const EntryViews& entries) {
    const SourceDescriptor& d = object.desc;
    const std::uint64_t bytes =
        object.PayloadBytes() + entries.indices.size() + entries.values.size();
    std::optional<Generation> head;
    if (std::optional<Result<CommitResult>> done = CheckCommitLocked(object, batch, head)) {
        if (done->ok()) (*done)->bytes = bytes;
        return std::move(*done);
    }
    const std::vector<MemberData> members = MembersOf(object, entries.indices, entries.values);
    // Sources are found through manifests, never listed.
    MCS_RETURN_IF_ERROR(
        store_->Put(d.source_ref, metadata, members, {PutMode::kCreate, hard_pin, false}));
    return PublishCommitLocked(object, metadata, head, batch, bytes);
}

Status SparseStore::PutFilledByClass(
    const std::vector<std::optional<SparseObject>>& objects,
    const std::vector<std::string>& metadata, std::span<const std::size_t> write,
    const std::vector<bool>& hard_pin,
    const std::function<SourceMemberBytes(std::size_t)>& members_of,
    const std::vector<bool>& external, const EntryFill& fill, int num_threads,
    const std::function<Status(std::span<const std::size_t>, const Status&, const Status&)>&
        on_class) {
    const auto is_external = [&](std::size_t i) { return !external.empty() && external[i]; };
    // Per pin class and, with a pinned pool, per size class (only large objects go into it).
    for (int cls = 0; cls < 4; ++cls) {
        const bool pin = cls < 2;
        const bool large = cls % 2 == 0;
        std::vector<std::size_t> items;
        for (std::size_t i : write) {
            const bool big =
                host_pool_ == nullptr || StoredBytes(*objects[i]) >= kMinPinnedObjectBytes;
            if (hard_pin[i] == pin && big == large) items.push_back(i);
        }
        if (items.empty()) continue;
        // Every item's four members in one array: no per-object vectors but the shapes.
        std::vector<SourceMemberBytes> members(items.size());
        constexpr std::size_t kMembers = std::tuple_size_v<SourceMemberBytes>;
        std::vector<MemberSpec> specs;
        specs.reserve(members.size() * kMembers);
        for (std::size_t k = 0; k < items.size(); ++k) {
            members[k] = members_of(items[k]);
            SpecsInto(*objects[items[k]], specs);
        }
        std::vector<FilledPut> puts(items.size());
        for (std::size_t k = 0; k < items.size(); ++k) {
            const std::size_t i = items[k];
            puts[k] = {objects[i]->desc.source_ref, metadata[i],
                       std::span<const MemberSpec>(specs).subspan(k * kMembers, kMembers)};
        }
        Status fill_status = Status::Ok();
        const auto fill_members = [&](std::span<const FillTarget> targets) -> Status {
            std::vector<HostCopy> copies;
            std::vector<EntryTarget> entries;
            copies.reserve(targets.size() * 2);
            entries.reserve(targets.size());
            for (const FillTarget& t : targets) {
                const std::size_t i = items[t.index];
                const SourceMemberBytes& from = members[t.index];
                if (t.members.size() != from.size()) return Internal("filled member count");
                for (std::size_t m = 0; m < from.size(); ++m) {
                    // Members 0 and 1 (indices, values) of an external object are the fill's.
                    if (is_external(i) && m < 2) continue;
                    if (t.members[m].size() != from[m].size()) {
                        return Internal("filled member size");
                    }
                    if (!from[m].empty()) {
                        copies.push_back({t.members[m].data(), from[m].data(), from[m].size()});
                    }
                }
                if (is_external(i)) {
                    std::uint64_t index_bytes = 0, value_bytes = 0;
                    EntryBytes(objects[i]->desc, index_bytes, value_bytes);
                    if (t.members[0].size() != index_bytes || t.members[1].size() != value_bytes) {
                        return Internal("filled entry size");
                    }
                    entries.push_back({i, t.members[0], t.members[1], t.pinned});
                }
            }
            ParallelCopies(copies, num_threads == 0 ? DefaultCopyThreads()
                                                    : static_cast<unsigned>(num_threads));
            if (!entries.empty()) {
                fill_status = fill ? fill(entries)
                                   : InvalidArgument("objects without their entries and no fill");
            }
            return fill_status;
        };
        // Sources are found through manifests, never listed.
        const Status put = store_->PutFilled(puts, {PutMode::kCreate, pin, false}, fill_members,
                                             large ? host_pool_.get() : nullptr);
        MCS_RETURN_IF_ERROR(on_class(items, put, fill_status));
    }
    return Status::Ok();
}

void SparseStore::CommitFilledLocked(std::vector<std::optional<SparseObject>>& objects,
                                     const std::vector<std::string>& metadata,
                                     const std::vector<bool>& hard_pin,
                                     std::span<const EntryViews> entries,
                                     std::vector<Result<CommitResult>>& results,
                                     std::vector<const SparseObject*>& committed,
                                     CommitBatch& batch, int num_threads) {
    const auto entries_of = [&](std::size_t i) {
        return entries.empty() ? EntryViews{} : entries[i];
    };
    const auto bytes_of = [&](std::size_t i) {
        const EntryViews e = entries_of(i);
        return objects[i]->PayloadBytes() + e.indices.size() + e.values.size();
    };
    // 1. Every object's checks.
    const BatchChecks checks = CheckBatchLocked(objects, bytes_of, results, committed, batch);
    const std::vector<std::size_t>& write = checks.write;
    // 2. The source objects, in one PutFilled per class, their bytes copied in parallel; the
    //    objects of a class whose PutFilled fails are committed alone below.
    std::vector<bool> written(objects.size(), false);
    (void)PutFilledByClass(
        objects, metadata, write, hard_pin,
        [&](std::size_t i) {
            const EntryViews e = entries_of(i);
            return BytesOf(*objects[i], e.indices, e.values);
        },
        {}, nullptr, num_threads,
        [&](std::span<const std::size_t> items, const Status& put, const Status&) {
            if (put.ok()) {
                for (std::size_t i : items) written[i] = true;
            }
            return Status::Ok();
        });
    // 3. Manifest entries and heads; an object whose batch write failed is committed alone.
    std::vector<std::size_t> published;
    for (std::size_t i : write) {
        if (written[i]) published.push_back(i);
    }
    PublishEachLocked(objects, metadata, published, checks.heads, bytes_of, results, batch,
                      num_threads);
    for (std::size_t i : write) {
        if (!written[i]) {
            results[i] = CommitLocked(*objects[i], metadata[i], hard_pin[i], batch, entries_of(i));
        }
    }
    for (std::size_t i : checks.later) {
        results[i] = CommitLocked(*objects[i], metadata[i], hard_pin[i], batch, entries_of(i));
    }
}

SparseStore::BatchChecks SparseStore::CheckBatchLocked(
    const std::vector<std::optional<SparseObject>>& objects,
    const std::function<std::uint64_t(std::size_t)>& bytes_of,
    std::vector<Result<CommitResult>>& results, std::vector<const SparseObject*>& committed,
    CommitBatch& batch) {
    BatchChecks out;
    out.heads.resize(objects.size());
    // An object whose tensor already has another generation in this batch is checked against the
    // head the first one moves, so it is committed after them.
    std::map<std::string_view, Generation, std::less<>> generation_of;
    for (std::size_t i = 0; i < objects.size(); ++i) {
        if (!objects[i]) continue;
        const SourceDescriptor& d = objects[i]->desc;
        committed[i] = &*objects[i];
        auto [it, fresh] = generation_of.try_emplace(d.tensor_id, d.generation);
        if (!fresh && it->second != d.generation) {
            out.later.push_back(i);
            continue;
        }
        if (std::optional<Result<CommitResult>> done =
                CheckCommitLocked(*objects[i], batch, out.heads[i])) {
            if (done->ok()) (*done)->bytes = bytes_of(i);
            results[i] = std::move(*done);
            continue;
        }
        out.write.push_back(i);
    }
    return out;
}

void SparseStore::CommitEachLocked(std::vector<std::optional<SparseObject>>& objects,
                                   const std::vector<std::string>& metadata,
                                   const std::vector<bool>& hard_pin,
                                   std::span<const EntryViews> entries,
                                   std::vector<Result<CommitResult>>& results,
                                   std::vector<const SparseObject*>& committed,
                                   CommitBatch& batch, int num_threads) {
    const auto entries_of = [&](std::size_t i) {
        return entries.empty() ? EntryViews{} : entries[i];
    };
    const auto bytes_of = [&](std::size_t i) {
        const EntryViews e = entries_of(i);
        return objects[i]->PayloadBytes() + e.indices.size() + e.values.size();
    };
    // 1. Every object's checks.
    const BatchChecks checks = CheckBatchLocked(objects, bytes_of, results, committed, batch);
    const std::vector<std::size_t>& write = checks.write;
    // 2. The source objects, each alone, built side by side by the store.
    const auto put_start = std::chrono::steady_clock::now();
    std::vector<std::vector<MemberData>> members(write.size());
    std::vector<EachPut> sources(write.size());
    for (std::size_t k = 0; k < write.size(); ++k) {
        const std::size_t i = write[k];
        const EntryViews e = entries_of(i);
        members[k] = MembersOf(*objects[i], e.indices, e.values);
        // Sources are found through manifests, never listed.
        sources[k] = {objects[i]->desc.source_ref, metadata[i], members[k],
                      {PutMode::kCreate, hard_pin[i], false}};
    }
    const std::vector<Status> put = store_->PutEach(sources, num_threads);
    std::vector<std::size_t> written;
    written.reserve(write.size());
    for (std::size_t k = 0; k < write.size(); ++k) {
        if (put[k].ok()) {
            written.push_back(write[k]);
        } else {
            results[write[k]] = put[k];
        }
    }
    // 3. Manifest entries and heads.
    const auto publish_start = std::chrono::steady_clock::now();
    PublishEachLocked(objects, metadata, written, checks.heads, bytes_of, results, batch, num_threads);
    {
        const auto end = std::chrono::steady_clock::now();
        std::lock_guard lock(metrics_mu_);
        metrics_.commit_put_seconds +=
            std::chrono::duration<double>(publish_start - put_start).count();
        metrics_.commit_publish_seconds += std::chrono::duration<double>(end - publish_start).count();
    }
    for (std::size_t i : checks.later) {
        results[i] = CommitLocked(*objects[i], metadata[i], hard_pin[i], batch, entries_of(i));
    }
}

void SparseStore::PublishEachLocked(const std::vector<std::optional<SparseObject>>& objects,
                                    const std::vector<std::string>& metadata,
                                    std::span<const std::size_t> write,
                                    const std::vector<std::optional<Generation>>& heads,
                                    const std::function<std::uint64_t(std::size_t)>& bytes_of,
                                    std::vector<Result<CommitResult>>& results,
                                    CommitBatch& batch, int num_threads) {
    const std::size_t m = write.size();
    if (m == 0) return;
    // 1. The manifest entries.
    std::vector<std::string> entry_keys(m);
    std::vector<EachPut> entries(m);
    for (std::size_t k = 0; k < m; ++k) {
        const std::size_t i = write[k];
        entry_keys[k] = ManifestKeyOf(objects[i]->desc);
        entries[k] = {entry_keys[k], metadata[i], {}, {PutMode::kUpsert, true}};
    }
    const std::vector<Status> entered = store_->PutEach(entries, num_threads);
    // 2. The heads that move: one per tensor (every object of a tensor here is of one step,
    //    and the checks found one head for all of them).
    std::vector<std::string> head_keys, head_metadata;
    head_keys.reserve(m);  // no reallocation: the items view them
    head_metadata.reserve(m);
    std::vector<EachPut> moves;
    std::vector<std::ptrdiff_t> move_of(m, -1);
    std::map<std::string_view, std::size_t, std::less<>> move_of_tensor;
    for (std::size_t k = 0; k < m; ++k) {
        const SourceDescriptor& d = objects[write[k]]->desc;
        const std::optional<Generation>& head = heads[write[k]];
        if (!entered[k].ok() || (head && *head == d.generation)) continue;
        auto [it, fresh] = move_of_tensor.try_emplace(d.tensor_id, moves.size());
        if (fresh) {
            head_keys.push_back(HeadKeyOf(d.tensor_id));
            head_metadata.push_back(HeadMetadata(d.generation));
            moves.push_back({head_keys.back(), head_metadata.back(), {}, {PutMode::kUpsert, true}});
        }
        move_of[k] = static_cast<std::ptrdiff_t>(it->second);
    }
    const std::vector<Status> moved = store_->PutEach(moves, num_threads);
    // 3. The outcomes: a failed object leaves nothing of itself visible.
    for (std::size_t k = 0; k < m; ++k) {
        const std::size_t i = write[k];
        const SourceDescriptor& d = objects[i]->desc;
        Status s = entered[k];
        if (s.ok() && move_of[k] >= 0) s = moved[static_cast<std::size_t>(move_of[k])];
        if (!s.ok()) {
            (void)store_->Remove(entry_keys[k]);
            (void)store_->Remove(d.source_ref);
            results[i] = std::move(s);
            continue;
        }
        if (move_of[k] >= 0) batch.heads[d.tensor_id] = d.generation;
        const std::uint64_t bytes = bytes_of(i);
        ++batch.created;
        batch.created_bytes += bytes;
        results[i] = CommitResult{d.source_ref, true, d.nnz, bytes};
    }
}

std::string SparseStore::ManifestKeyOf(const SourceDescriptor& d) const {
    const std::string tag = GenerationTag(d.generation);
    const std::string_view logical = std::string_view(d.source_ref).substr(source_prefix_.size());
    std::string key;
    key.reserve(manifest_prefix_.size() + tag.size() + 1 + logical.size());
    key.append(manifest_prefix_).append(tag).append(1, '/').append(logical);
    return key;
}

void SparseStore::UndoMissedCommits(std::span<const SparseObject* const> objects,
                                    std::span<Result<CommitResult>> results, CommitBatch& batch) {
    // Per step, the commits of the batch that created objects: a seal by another process
    // that missed them undoes them (docs/design.md §9 "As built").
    std::map<Generation, std::vector<std::size_t>> created;
    for (std::size_t i = 0; i < objects.size(); ++i) {
        if (objects[i] != nullptr && results[i].ok() && results[i]->created) {
            created[objects[i]->desc.generation].push_back(i);
        }
    }
    for (const auto& [step, items] : created) {
        std::vector<std::string_view> refs;
        refs.reserve(items.size());
        for (std::size_t i : items) refs.push_back(objects[i]->desc.source_ref);
        std::vector<bool> missed;
        Status s = CheckCommitsNotMissed(step, refs, missed);
        for (std::size_t k = 0; k < items.size(); ++k) {
            if (s.ok() && !missed[k]) continue;
            const SourceDescriptor& d = objects[items[k]]->desc;
            (void)store_->Remove(ManifestKeyOf(d));
            (void)store_->Remove(d.source_ref);
            --batch.created;
            batch.created_bytes -= results[items[k]]->bytes;
            results[items[k]] = s.ok() ? Status(Conflict("step " + step.ToString() +
                                                         " was sealed by another process before " +
                                                         d.source_ref + " joined it"))
                                       : s;
        }
    }
}

void SparseStore::CacheCommittedIndexes(std::span<SparseObject* const> objects,
                                        std::span<const Result<CommitResult>> results,
                                        int num_threads) {
    if (!options_.cache_committed_indexes) return;
    // Each object's index is checked and built on its own (in parallel: a step commits tens of
    // thousands of objects), then the cache takes them all under its lock once.
    std::vector<std::shared_ptr<const SourceIndex>> built(objects.size());
    internal::ParallelFor(
        num_threads, objects.size(),
        [&](std::size_t i) {
            SparseObject* o = objects[i];
            if (o == nullptr || !results[i].ok() || !results[i]->created) return;
            auto source = std::make_shared<const SourceDescriptor>(std::move(o->desc));
            Result<TileIndex> index =
                TileIndex::Make(*source, std::move(o->tile_coords), std::move(o->tile_ptr));
            if (!index.ok()) return;  // not possible for a committed object; a read builds it
            built[i] = std::make_shared<const SourceIndex>(
                SourceIndex{std::move(source), std::move(index).value()});
        },
        /*chunk=*/0);
    std::vector<std::shared_ptr<const SourceIndex>> indexes;
    indexes.reserve(built.size());
    for (std::shared_ptr<const SourceIndex>& b : built) {
        if (b) indexes.push_back(std::move(b));
    }
    if (!indexes.empty()) cache_->AddIndexes(indexes);
}

void SparseStore::CacheCommittedIndexes(std::vector<std::optional<SparseObject>>& owned,
                                        std::span<const SparseObject* const> committed,
                                        std::span<const Result<CommitResult>> results,
                                        int num_threads) {
    std::vector<SparseObject*> objects(owned.size(), nullptr);
    for (std::size_t i = 0; i < owned.size(); ++i) {
        if (committed[i] != nullptr && owned[i]) objects[i] = &*owned[i];
    }
    CacheCommittedIndexes(objects, results, num_threads);
}

void SparseStore::CountCommits(const CommitBatch& batch) {
    std::lock_guard mlock(metrics_mu_);
    metrics_.idempotent_commits += batch.idempotent;
    metrics_.source_objects_put += batch.created;
    metrics_.source_bytes_put += batch.created_bytes;
}

Result<CommitResult> SparseStore::CommitSparseObject(SparseObject object, bool hard_pin) {
    if (host_pool_ != nullptr && StoredBytes(object) >= kMinPinnedObjectBytes) {
        // Through PutFilled, like a batch, so that the object lands in the pinned pool.
        std::vector<SparseObject> one;
        one.push_back(std::move(object));
        return std::move(CommitSparseObjects(std::move(one), {hard_pin}, 1).front());
    }
    std::string metadata;
    MCS_RETURN_IF_ERROR(PrepareCommit(object, metadata));
    CommitBatch batch;
    Result<CommitResult> result = Internal("unset");
    {
        std::lock_guard lock(commit_mu_);
        result = CommitLocked(object, metadata, hard_pin, batch);
        const SparseObject* one = &object;
        UndoMissedCommits({&one, 1}, {&result, 1}, batch);
    }
    SparseObject* committed = &object;
    CacheCommittedIndexes({&committed, 1}, {&result, 1}, 1);
    CountCommits(batch);
    return result;
}

std::vector<Result<CommitResult>> SparseStore::PutSparseObjects(
    std::span<const PutSparseRequest> requests, int num_threads) {
    std::vector<Result<CommitResult>> results(requests.size(), Internal("unset"));
    std::vector<std::optional<SparseObject>> objects(requests.size());
    // Validation and encoding, in parallel: a bad request fails alone, before any write.
    // Entries already in canonical order are only indexed: the store copies them once, from the
    // caller's arrays.
    std::vector<EntryViews> entries(requests.size());
    const auto start = std::chrono::steady_clock::now();
    internal::ParallelFor(num_threads, requests.size(), [&](std::size_t i) {
        if (std::optional<SparseObject> indexed = IndexSourceObject(requests[i])) {
            objects[i] = std::move(indexed);
            entries[i] = {requests[i].indices.data, requests[i].values.data};
            return;
        }
        Result<SparseObject> built = BuildSourceObject(requests[i]);
        if (!built.ok()) {
            results[i] = built.status();
            return;
        }
        objects[i] = std::move(built).value();
    });
    std::vector<bool> hard_pin(requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i) hard_pin[i] = requests[i].hard_pin;
    const auto indexed = std::chrono::steady_clock::now();
    CommitBuilt(objects, hard_pin, results, num_threads, entries);
    {
        const auto written = std::chrono::steady_clock::now();
        std::lock_guard lock(metrics_mu_);
        metrics_.commit_index_seconds += std::chrono::duration<double>(indexed - start).count();
        metrics_.commit_write_seconds += std::chrono::duration<double>(written - indexed).count();
    }
    for (std::size_t i = 0; i < requests.size(); ++i) {
        if (!results[i].ok()) {
            results[i] = results[i].status().WithContext("update " + std::to_string(i) + " ('" +
                                                         requests[i].tensor_id + "')");
        }
    }
    return results;
}

std::vector<Result<CommitResult>> SparseStore::CommitSparseObjects(
    std::vector<SparseObject> objects, const std::vector<bool>& hard_pin, int num_threads) {
    std::vector<Result<CommitResult>> results(objects.size(), Internal("unset"));
    std::vector<std::optional<SparseObject>> held(objects.size());
    for (std::size_t i = 0; i < objects.size(); ++i) held[i] = std::move(objects[i]);
    std::vector<bool> pins = hard_pin;
    pins.resize(held.size(), true);
    CommitBuilt(held, pins, results, num_threads);
    return results;
}

void SparseStore::PrepareCommits(std::vector<std::optional<SparseObject>>& objects,
                                 std::vector<std::string>& metadata,
                                 std::vector<Result<CommitResult>>& results, int num_threads) {
    metadata.assign(objects.size(), std::string());
    internal::ParallelFor(num_threads, objects.size(), [&](std::size_t i) {
        if (!objects[i]) return;
        if (Status s = PrepareCommit(*objects[i], metadata[i]); !s.ok()) {
            results[i] = s;
            objects[i].reset();
        }
    });
}

void SparseStore::CommitBuilt(std::vector<std::optional<SparseObject>>& objects,
                              const std::vector<bool>& hard_pin,
                              std::vector<Result<CommitResult>>& results, int num_threads,
                              std::span<const EntryViews> entries) {
    std::vector<std::string> metadata;
    PrepareCommits(objects, metadata, results, num_threads);
    std::vector<const SparseObject*> committed(objects.size(), nullptr);
    CommitBatch batch;
    {
        std::lock_guard lock(commit_mu_);
        // One PutFilled pays off when its copies can run on several threads; on one thread the
        // object-by-object Put does the same work. With a pinned pool a batch that holds an
        // object large enough for it goes through PutFilled, which places the object there.
        std::uint64_t bytes = 0;
        bool pool_sized = false;
        for (std::size_t i = 0; i < objects.size(); ++i) {
            if (!objects[i]) continue;
            const std::uint64_t b =
                objects[i]->PayloadBytes() +
                (entries.empty() ? 0 : entries[i].indices.size() + entries[i].values.size());
            bytes += b;
            pool_sized = pool_sized || b >= kMinPinnedObjectBytes;
        }
        constexpr std::uint64_t kBatchFillBytes = std::uint64_t{8} << 20;
        if (store_->FillsInPlace() &&
            ((host_pool_ != nullptr && pool_sized) ||
             (objects.size() > 1 && bytes >= kBatchFillBytes &&
              internal::ResolveThreads(num_threads) > 1))) {
            CommitFilledLocked(objects, metadata, hard_pin, entries, results, committed, batch,
                               num_threads);
        } else if (objects.size() >= kEachCommitObjects) {
            CommitEachLocked(objects, metadata, hard_pin, entries, results, committed, batch,
                             num_threads);
        } else {
            for (std::size_t i = 0; i < objects.size(); ++i) {
                if (!objects[i]) continue;
                results[i] = CommitLocked(*objects[i], metadata[i], hard_pin[i], batch,
                                          entries.empty() ? EntryViews{} : entries[i]);
                committed[i] = &*objects[i];
            }
        }
        UndoMissedCommits(committed, results, batch);
    }
    CacheCommittedIndexes(objects, committed, results, num_threads);
    CountCommits(batch);
}

namespace {

/// Whether the members of an object of PutIndexedObjects fit its descriptor; `external`: its
/// entries are the fill's (indexed without them).
Status CheckIndexedMembers(const SparseObject& object, bool& external) {
    const SourceDescriptor& d = object.desc;
    const std::uint64_t rank = d.rank();
    external = d.nnz > 0 && object.indices.empty() && object.values.empty();
    std::uint64_t index_bytes = 0, value_bytes = 0, coords = 0;
    bool fits = rank >= 1 && EntryBytes(d, index_bytes, value_bytes) &&
                !__builtin_mul_overflow(d.num_tiles, rank, &coords) &&
                object.tile_coords.size() == coords && !object.tile_ptr.empty() &&
                object.tile_ptr.size() - 1 == d.num_tiles;
    if (!external) {
        fits = fits && object.indices.size() == index_bytes && object.values.size() == value_bytes;
    }
    if (!fits) {
        return InvalidArgument("the members of the object of '" + d.tensor_id +
                               "' do not match its descriptor (nnz " + std::to_string(d.nnz) +
                               ", " + std::to_string(d.num_tiles) + " tiles)");
    }
    return Status::Ok();
}

}  // namespace

Result<std::vector<Result<CommitResult>>> SparseStore::PutIndexedObjects(
    std::vector<SparseObject> objects, const std::vector<bool>& hard_pin, const EntryFill& fill,
    int num_threads) {
    if (!store_->FillsInPlace()) {
        return FailedPrecondition(
            "this store does not fill objects in place: commit the entries from host memory");
    }
    {
        // A second generation of a tensor is checked against the head the first one moves, so
        // it commits after the first is published: not in the same PutFilled.
        std::map<std::string_view, Generation, std::less<>> generation_of;
        for (const SparseObject& o : objects) {
            auto [it, fresh] = generation_of.try_emplace(o.desc.tensor_id, o.desc.generation);
            if (!fresh && it->second != o.desc.generation) {
                return FailedPrecondition("the batch holds two generations of tensor '" +
                                          o.desc.tensor_id + "': commit it object by object");
            }
        }
    }
    const std::size_t n = objects.size();
    std::vector<Result<CommitResult>> results(n, Internal("unset"));
    std::vector<std::optional<SparseObject>> held(n);
    std::vector<bool> external(n, false);
    for (std::size_t i = 0; i < n; ++i) {
        bool ext = false;
        if (Status s = CheckIndexedMembers(objects[i], ext); !s.ok()) {
            results[i] = s;
            continue;
        }
        external[i] = ext;
        held[i] = std::move(objects[i]);
    }
    std::vector<bool> pins = hard_pin;
    pins.resize(n, true);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::string> metadata;
    PrepareCommits(held, metadata, results, num_threads);
    std::vector<const SparseObject*> committed(n, nullptr);
    CommitBatch batch;
    {
        std::lock_guard lock(commit_mu_);
        MCS_RETURN_IF_ERROR(CommitIndexedLocked(held, metadata, pins, external, fill, results,
                                                committed, batch, num_threads));
        UndoMissedCommits(committed, results, batch);
    }
    CacheCommittedIndexes(held, committed, results, num_threads);
    CountCommits(batch);
    {
        std::lock_guard lock(metrics_mu_);
        metrics_.commit_write_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    return results;
}

Status SparseStore::CommitIndexedLocked(std::vector<std::optional<SparseObject>>& objects,
                                        const std::vector<std::string>& metadata,
                                        const std::vector<bool>& hard_pin,
                                        const std::vector<bool>& external, const EntryFill& fill,
                                        std::vector<Result<CommitResult>>& results,
                                        std::vector<const SparseObject*>& committed,
                                        CommitBatch& batch, int num_threads) {
    const auto bytes_of = [&](std::size_t i) {
        std::uint64_t index_bytes = 0, value_bytes = 0;
        if (external[i]) EntryBytes(objects[i]->desc, index_bytes, value_bytes);
        return objects[i]->PayloadBytes() + index_bytes + value_bytes;
    };
    // 1. Every object's checks (PutIndexedObjects took no second generation of a tensor: none
    //    is left for later).
    const BatchChecks checks = CheckBatchLocked(objects, bytes_of, results, committed, batch);
    const std::vector<std::size_t>& write = checks.write;
    // 2. The source objects, in one PutFilled per class: the objects' own members copied in
    //    parallel, the external entries written by `fill`. A failure removes what the other
    //    classes wrote, so that nothing of the call stays.
    const auto put_start = std::chrono::steady_clock::now();
    std::vector<std::string_view> written;
    MCS_RETURN_IF_ERROR(PutFilledByClass(
        objects, metadata, write, hard_pin, [&](std::size_t i) { return BytesOf(*objects[i]); },
        external, fill, num_threads,
        [&](std::span<const std::size_t> items, const Status& put,
            const Status& fill_status) -> Status {
            if (!put.ok()) {
                for (std::string_view key : written) (void)store_->Remove(key);
                if (!fill_status.ok()) return fill_status;
                return FailedPrecondition("the batch's objects cannot be written together (" +
                                          put.message() + "): commit them object by object");
            }
            for (std::size_t i : items) written.push_back(objects[i]->desc.source_ref);
            return Status::Ok();
        }));
    // 3. Manifest entries and heads.
    const auto publish_start = std::chrono::steady_clock::now();
    PublishEachLocked(objects, metadata, write, checks.heads, bytes_of, results, batch,
                      num_threads);
    const auto end = std::chrono::steady_clock::now();
    std::lock_guard lock(metrics_mu_);
    metrics_.commit_put_seconds += std::chrono::duration<double>(publish_start - put_start).count();
    metrics_.commit_publish_seconds += std::chrono::duration<double>(end - publish_start).count();
    return Status::Ok();
}

Result<bool> SparseStore::Admit(std::string_view tensor_id, Generation generation,
                                const PlacementPolicy& policy, const NamedAxes& source_placement,
                                std::string_view writer_id) {
    MCS_RETURN_IF_ERROR(internal::ValidateId("tensor_id", tensor_id));
    MCS_RETURN_IF_ERROR(internal::ValidateId("writer_id", writer_id));
    MCS_RETURN_IF_ERROR(Generation::Make(generation.base, generation.delta));
    MCS_RETURN_IF_ERROR(policy.ValidateSource(source_placement));
    const std::string key = keys_.Admit() + GenerationTag(generation) + "/" +
                            LogicalKeyOf(tensor_id, generation, policy, source_placement);
    Status s = store_->Put(key, writer_id, {}, {PutMode::kCreate, false});
    if (s.ok()) return true;
    if (s.code() != StatusCode::kConflict) return s;
    // The key exists: ours when an earlier try of this writer created it (an idempotent retry).
    auto info = store_->Stat(key);
    if (!info.ok()) {
        // Taken but not yet visible: another writer's create is still in flight (a store whose
        // objects appear when their put ends, as upstream Mooncake's do). Not ours.
        if (info.status().code() == StatusCode::kNotFound) return false;
        return info.status();
    }
    return info->metadata == writer_id;
}

Result<std::vector<SourceDescriptor>> SparseStore::Manifest(Generation generation) {
    return ManifestWithEntries(generation, nullptr);
}

Result<std::vector<SourceDescriptor>> SparseStore::ManifestWithEntries(
    Generation generation, std::vector<std::shared_ptr<const ObjectInfo>>* kept_entries) {
    MCS_RETURN_IF_ERROR(Generation::Make(generation.base, generation.delta));
    const std::string prefix = keys_.Manifest() + GenerationTag(generation) + "/";
    // Every entry of the step with its metadata, in one pass of the store where it can.
    MCS_ASSIGN_OR_RETURN(auto entries, store_->ListInfos(prefix));
    std::vector<SourceDescriptor> out;
    out.reserve(entries.size());
    std::string ref = keys_.Source();
    const std::size_t base = ref.size();
    for (const auto& [key, info] : entries) {
        ref.resize(base);
        ref.append(key, prefix.size());
        MCS_ASSIGN_OR_RETURN(SourceDescriptor d, DecodeObjectMetadata(ref, info->metadata));
        out.push_back(std::move(d));
    }
    if (kept_entries != nullptr) {
        kept_entries->clear();
        kept_entries->reserve(entries.size());
        for (auto& entry : entries) kept_entries->push_back(std::move(entry.second));
    }
    return out;
}

std::vector<std::size_t> DeviceCommitGroups(std::span<const std::uint64_t> bytes,
                                            std::uint64_t first_bytes) {
    std::vector<std::size_t> bounds{0};
    if (first_bytes > 0) {
        std::uint64_t rest = 0;
        for (std::uint64_t b : bytes) rest += b;
        std::uint64_t target = first_bytes, held = 0;
        for (std::size_t i = 0; i + 1 < bytes.size(); ++i) {
            held += bytes[i];
            rest -= bytes[i];
            if (held < target || rest < target) continue;
            bounds.push_back(i + 1);
            held = 0;
            target = target > std::numeric_limits<std::uint64_t>::max() / 3
                         ? std::numeric_limits<std::uint64_t>::max()
                         : 3 * target;
        }
    }
    bounds.push_back(bytes.size());
    return bounds;
}

}  // namespace mooncake::sparse
