// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// SparseStore: the sparse object layer over any ObjectStore (docs/design.md §2-4). The commit side
// (validation, encoding, generation fencing, idempotent commit by logical key, single-owner
// admission, manifest entries) and the read side (read_sparse_objects: batch plan -> index-only
// GETs cached per node -> dedup -> range reads, each unique range once per node -> boundary
// filter + rebase -> target-local objects), with the §4 metrics. It is the in-process
// SparseService (sparse_service.h, which defines the requests, results, read options and step
// manifests of its operations); the node daemon runs one for its clients.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "codec/codec.h"
#include "codec/object_metadata.h"  // EncodeObjectMetadata / DecodeObjectMetadata
#include "executor/sparse_service.h"
#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/placement.h"
#include "mooncake/sparse/planner.h"
#include "mooncake/sparse/status.h"
#include "store/object_store.h"
#include "transport/pinned_pool.h"

namespace mooncake::sparse {

class NodeCache;
struct SourceIndex;

/// The §4 counters (names fixed by docs/design.md), plus planning detail.
struct SparseMetrics {
    std::uint64_t source_objects_put = 0;
    std::uint64_t source_bytes_put = 0;
    std::uint64_t index_gets = 0;
    std::uint64_t range_gets = 0;
    std::uint64_t range_bytes_read = 0;
    std::uint64_t full_gets = 0;
    std::uint64_t dense_fallbacks = 0;
    std::uint64_t nd_fallbacks = 0;
    std::uint64_t cache_hits = 0;
    std::uint64_t fanout_bytes = 0;
    std::uint64_t target_objects_published = 0;
    std::uint64_t target_bytes = 0;
    // Beyond the contract: useful to explain a run.
    std::uint64_t idempotent_commits = 0;
    std::uint64_t index_cache_hits = 0;
    std::uint64_t range_cache_hits = 0;
    /// Unique range reads that waited for the same range already being read by a concurrent
    /// request instead of reading it again (single flight, across the processes of a node when
    /// the node daemon runs this SparseStore). Per call, range_gets + range_cache_hits +
    /// single_flight_waits == unique_ranges.
    std::uint64_t single_flight_waits = 0;
    /// Index-only GETs that waited for a concurrent request's GET of the same index.
    std::uint64_t index_single_flight_waits = 0;
    std::uint64_t planned_ranges = 0;   ///< Regions planned (before dedup).
    std::uint64_t unique_ranges = 0;    ///< Physical reads after dedup (incl. cache hits).
    std::uint64_t full_bytes_read = 0;
    double plan_seconds = 0;
    double read_seconds = 0;
    double materialize_seconds = 0;
    /// A batch commit of updates (PutSparseObjects): validating and indexing (or encoding) the
    /// entries, then preparing and placing the objects in the store.
    double commit_index_seconds = 0;
    double commit_write_seconds = 0;
    /// ... of which writing the objects (allocation and their bytes), and publishing them
    /// (manifest entries, generation heads); PutIndexedObjects only.
    double commit_put_seconds = 0;
    double commit_publish_seconds = 0;

    /// (name, value) pairs in a stable order, for printing and for Python's metrics() dict.
    std::vector<std::pair<std::string, double>> Items() const;
};

struct SparseStoreOptions {
    std::string node_id = "node0";
    /// Keeps the tensor ids, steps, seals and retention of runs that share one store apart
    /// (docs/design.md §9). "" is the default namespace; others must pass ValidateNamespace.
    std::string name_space;
    /// How long a reader's lease on a step lasts when the reader does not end it (a crashed
    /// reader): retention frees a leased step only after its lease expired.
    double lease_seconds = 60;
    /// Wait for a seal made by another process (not through this store): the store is checked
    /// at this interval at most, starting at 1 ms.
    double wait_poll_max_seconds = 0.05;
    /// A seal in progress that has not ended after this long is a crashed sealer's: a commit
    /// stops waiting for it and another seal may take its place.
    double seal_seconds = 30;
    std::uint64_t index_cache_capacity_bytes = std::uint64_t{1} << 30;
    /// A commit puts the tile index of each object it creates into the index cache, so that the
    /// step's reads through this store load none (about 1.5 us per object at the commit). Off
    /// for a store whose readers are other processes with stores of their own (an object store
    /// shared across nodes): their caches cannot see it.
    bool cache_committed_indexes = true;
    std::uint64_t range_cache_capacity_bytes = std::uint64_t{1} << 30;
    /// Host bytes of source objects that may be page-locked (PinnedHostPool: pinned once,
    /// reused, pageable beyond the quota or without CUDA), for a store that fills its objects
    /// in place (the embedded store): a device read then gathers their ranges straight from
    /// host memory, and a commit from the GPU lands at the copy engine's full speed. 0: none.
    std::uint64_t pinned_quota_bytes = 0;
};

/// The bytes of a source object's four members (indices, values, tile_coords, tile_ptr).
using SourceMemberBytes = std::array<std::span<const std::byte>, 4>;

class SparseStore final : public SparseService {
public:
    SparseStore(std::shared_ptr<ObjectStore> store, SparseStoreOptions options = {});
    ~SparseStore() override;
    SparseStore(const SparseStore&) = delete;
    SparseStore& operator=(const SparseStore&) = delete;

    /// Validates, encodes and commits one source object. Idempotent by logical key
    /// (tensor_id, generation, policy, owner ordinal, box origin): a retry with the same payload
    /// returns the same source_ref with created = false.
    /// Errors: InvalidArgument (any bad input); StaleGeneration (base is not the tensor's current
    /// generation); Conflict (a different payload under the same logical key);
    /// ResourceExhausted. On error the store is unchanged.
    Result<CommitResult> PutSparseObject(const PutSparseRequest& request) override;

    /// Commits an object built by BuildSparseObject (same semantics as PutSparseObject).
    Result<CommitResult> CommitSparseObject(SparseObject object, bool hard_pin = true);

    /// Validates, encodes and commits a batch of source objects (a step's updates): one result
    /// per request, in order, each as PutSparseObject would return it. A bad request fails
    /// alone and leaves nothing of itself behind; the others commit. Requests are validated and
    /// encoded on up to `num_threads` threads (0: the hardware's), then committed under one
    /// lock, with the step checks made once per step of the batch.
    std::vector<Result<CommitResult>> PutSparseObjects(std::span<const PutSparseRequest> requests,
                                                       int num_threads = 0) override;

    /// Commits a batch of objects built by BuildSparseObject (PutSparseObjects after the
    /// encode): one result per object, in order; `hard_pin[i]` for object i (default true).
    std::vector<Result<CommitResult>> CommitSparseObjects(std::vector<SparseObject> objects,
                                                          const std::vector<bool>& hard_pin,
                                                          int num_threads = 0);

    /// Commits a batch of built objects, as CommitSparseObjects does (one result per object, in
    /// order; fencing, idempotence, conflicts, step seals, manifest entries and metrics alike),
    /// where an object may be indexed without its entries: desc.nnz > 0 with `indices` and
    /// `values` empty, its descriptor, tile index and checksums set (IndexSourceObject's, or
    /// FinishCanonicalEntries'). `fill` writes those objects' entries straight into the store's
    /// memory of the objects (EntryTarget), with every object of a pin class in one PutFilled:
    /// it is called once or twice (hard-pinned objects, then the others), never for objects that
    /// fail their checks or are idempotent retries. The other objects' members are copied from
    /// the objects. An object that fails (malformed members, bad descriptor, Conflict,
    /// StaleGeneration, a sealed step) fails alone and leaves nothing of itself behind.
    /// Errors, of the whole call, which then has committed nothing and left nothing behind:
    /// FailedPrecondition (the store does not fill objects in place, the batch holds two
    /// generations of one tensor, or its objects cannot be written by one PutFilled per pin
    /// class, e.g. a store too full for all of them: PutSparseObjects commits such a batch
    /// object by object); whatever `fill` returns.
    Result<std::vector<Result<CommitResult>>> PutIndexedObjects(
        std::vector<SparseObject> objects, const std::vector<bool>& hard_pin,
        const EntryFill& fill, int num_threads = 0) override;

    /// Store-side single-owner admission: among writers racing for one logical key, exactly one
    /// gets true (a retry by the winner gets true again).
    /// Errors: InvalidArgument.
    Result<bool> Admit(std::string_view tensor_id, Generation generation,
                       const PlacementPolicy& policy, const NamedAxes& source_placement,
                       std::string_view writer_id) override;

    /// Every source object committed for `generation`, in a stable order.
    /// Errors: InvalidArgument (corrupt manifest entry).
    Result<std::vector<SourceDescriptor>> Manifest(Generation generation) override;

    /// The manifest of a step (sealed or not; an unsealed one lists what is committed so far),
    /// or the fold of the sealed steps j+1..k for (j, k) with k > j + 1.
    /// Errors: InvalidArgument; NotFound (a step of a fold is not sealed, or past retention).
    Result<StepManifest> GetManifest(Generation generation) override;

    /// GetManifest's answer with its arrays shared, not copied: a sealed step's are the ones
    /// this store keeps (the last few sealed steps'), so that a reader of the step (a node
    /// daemon's read by step, a rank's manifest) costs no copy of its tens of thousands of
    /// entries. Errors: as GetManifest.
    struct SharedStepManifest {
        Generation generation;
        std::shared_ptr<const std::vector<SourceDescriptor>> sources;  ///< Never null.
        std::shared_ptr<const std::vector<std::string>> unchanged;     ///< Never null; sorted.
        bool sealed = false;
        StepManifestView view() const { return {generation, *sources, *unchanged}; }
    };
    Result<SharedStepManifest> GetManifestShared(Generation generation);
    /// WaitGeneration's answer with its arrays shared, as GetManifestShared's.
    Result<SharedStepManifest> WaitGenerationShared(Generation generation, double timeout_seconds);

    /// Seals a step: `tensor_ids` is the model's complete list of tensors at that step; those
    /// without a source in the step are unchanged. Then frees what retention no longer keeps.
    /// Errors: InvalidArgument (bad id, a committed tensor missing from the list);
    /// FailedPrecondition (sealed already, or an admitted writer of the step has not
    /// committed).
    Status SealGeneration(Generation generation, std::span<const std::string> tensor_ids) override;

    /// Blocks until `generation` (a step, or a fold whose last step is) is sealed, then returns
    /// its manifest. A negative timeout waits for ever.
    /// Errors: DeadlineExceeded; as GetManifest.
    Result<StepManifest> WaitGeneration(Generation generation, double timeout_seconds) override;

    /// The newest sealed step, if any.
    Result<std::optional<Generation>> LatestGeneration() override;

    /// Keeps the last `keep_last` sealed steps (0: keep every step) and frees the older ones:
    /// their source objects, manifest entries, admissions, seals and cached ranges. A step a
    /// reader holds a lease on is never freed.
    /// Errors: InvalidArgument; FailedPrecondition (it would free a leased step: nothing is
    /// changed).
    Status SetRetention(std::uint64_t keep_last) override;

    /// The retention in force (0: keep every step).
    Result<std::uint64_t> Retention() override;

    /// Records an anchor: the full weights of sealed step `step` stored as tensor objects under
    /// AnchorTensorKey(namespace, step, id) for every id in `tensor_ids` (written by the caller
    /// through the tensor API first). Retention keeps the newest `keep_anchors` anchors (1 by
    /// default) and frees older ones with their tensor objects.
    /// Errors: InvalidArgument; NotFound (the step is not sealed, or a tensor object is
    /// missing); FailedPrecondition (an anchor of that step exists).
    Status RecordAnchor(Generation step, std::span<const std::string> tensor_ids) override;
    /// The newest anchored step, if any.
    Result<std::optional<Generation>> LatestAnchor() override;
    /// How many anchors retention keeps (>= 1).
    Status SetKeepAnchors(std::uint64_t keep_anchors) override;

    /// ReadSparseObjects on a step manifest: targets of unchanged tensors get empty objects,
    /// and a fold's steps are merged per target. Holds a lease on the steps while it reads.
    Result<std::vector<TargetObject>> ReadSparseObjects(const StepManifestView& manifest,
                                                        std::span<const TargetDescriptor> targets,
                                                        const ReadOptions& options = {});

    /// The tensor's current generation (the last committed delta), if any.
    Result<std::optional<Generation>> CurrentGeneration(std::string_view tensor_id) override;

    /// docs/design.md §4 steps 1-8: one target-local object per target, same order.
    /// Errors: as SelectSources/PlanBatch; NotFound (a source vanished); DataLoss (checksum).
    Result<std::vector<TargetObject>> ReadSparseObjects(std::span<const SourceDescriptor> manifest,
                                                        std::span<const TargetDescriptor> targets,
                                                        const ReadOptions& options = {});

    /// ReadSparseObjects, each result a view that owns its object (SparseService).
    Result<std::vector<TargetObjectView>> ReadViews(std::span<const SourceDescriptor> manifest,
                                                    std::span<const TargetDescriptor> targets,
                                                    const ReadOptions& options) override;
    Result<std::vector<TargetObjectView>> ReadViews(const StepManifestView& manifest,
                                                    std::span<const TargetDescriptor> targets,
                                                    const ReadOptions& options) override;
    /// The planned read of a step (one step, or a plain manifest of one generation), its
    /// ranges viewed in place under one snapshot of the store (SparseService::ReadPlanned).
    /// Counts range_gets, range_bytes_read, fanout_bytes and the published targets as an
    /// in-place read does, once `build` succeeded.
    Result<std::vector<TargetObjectView>> ReadPlanned(const StepManifestView& manifest,
                                                      std::span<const TargetDescriptor> targets,
                                                      const ReadOptions& options,
                                                      const PlannedReadFn& build) override;

    SparseMetrics Metrics() const;
    void ResetMetrics();
    /// Metrics().Items(), then ResetMetrics() when `reset`, in one step (SparseService).
    Result<MetricItems> Metrics(bool reset) override;
    /// Drops the node-local index and range caches and the cached manifests of sealed steps.
    /// Never fails.
    Status ClearCaches() override;
    Result<StoreCounters> ObjectCounters() override;
    Result<std::vector<std::string>> ListKeys(std::string_view prefix) override;
    /// A LocalTensorStore over this store's ObjectStore.
    std::unique_ptr<TensorStore> MakeTensorStore(const LocalTensorStoreOptions& options) override;

    ObjectStore& object_store() override { return *store_; }
    const SparseStoreOptions& options() const { return options_; }

private:
    /// One ReadSparseObjects call's state, from step to step (sparse_read.cc).
    struct ReadCall;

    /// The keys of this layer's objects. A namespace tags the second component of every key
    /// ("mcs/src@run1/..."), which no tensor id can reach: the key spaces of two namespaces are
    /// disjoint, and each of their directories lists on its own.
    struct Keys {
        std::string tag;  ///< "" or "@<namespace>"
        std::string Source() const { return "mcs/src" + tag + "/"; }
        std::string Manifest() const { return "mcs/manifest" + tag + "/"; }
        std::string Head() const { return "mcs/head" + tag + "/"; }
        std::string Admit() const { return "mcs/admit" + tag + "/"; }
        std::string Seal() const { return "mcs/seal" + tag + "/steps/"; }
        /// A seal in progress (created before it reads the manifest, removed once it is done).
        std::string Sealing() const { return "mcs/seal" + tag + "/pending/"; }
        std::string Lease() const { return "mcs/lease" + tag + "/"; }
        std::string Latest() const { return "mcs/step" + tag + "/latest"; }
        std::string Floor() const { return "mcs/step" + tag + "/floor"; }
        std::string RetentionKey() const { return "mcs/step" + tag + "/retention"; }
        std::string Anchor() const { return "mcs/anchor" + tag + "/steps/"; }
        std::string LatestAnchorKey() const { return "mcs/step" + tag + "/anchor"; }
        std::string KeepAnchorsKey() const { return "mcs/step" + tag + "/keep_anchors"; }
    };

    // Steps (sparse_steps.cc).
    Result<bool> IsSealed(Generation step);
    /// What a seal holds: the model's tensor ids and the source objects it sealed (keys below
    /// the source prefix), both sorted.
    struct SealRecord {
        std::vector<std::string> tensor_ids;
        std::vector<std::string> sources;
    };
    /// The record of a sealed step (cached: a seal never changes). Errors: NotFound.
    Result<std::shared_ptr<const SealRecord>> ReadSeal(Generation step);
    /// A sealed step's manifest as this store keeps it: the entries its seal holds (a commit
    /// that listed itself after the seal read the manifest, another process's on a shared
    /// store, is not one) and the tensor ids the seal lists that have none (sorted).
    struct SealedStepManifest {
        std::vector<SourceDescriptor> sources;
        std::vector<std::string> unchanged;
        /// The manifest entries the sources were decoded from, in the same order (their texts
        /// are what EntryTexts compares a source object's metadata with).
        std::vector<std::shared_ptr<const ObjectInfo>> entries;
    };
    /// The entry texts of the kept sealed manifest a read's entries belong to (as
    /// ReadOptions::manifest_owner, whose array they are): a source object whose metadata is
    /// exactly its entry's text is the object the entry was decoded from, with no need to write
    /// the claimed descriptor out again to compare (IsMetadataOf).
    struct EntryTexts {
        std::shared_ptr<const SealedStepManifest> kept;  ///< Null: none known.
        /// The text `claimed` was decoded from, or null.
        const std::string* Of(const SourceDescriptor& claimed) const;
    };
    /// The kept sealed manifest `owner` shares, if any.
    EntryTexts EntryTextsOf(const std::shared_ptr<const void>& owner);
    /// Manifest, and (when `entries` is given) the manifest entries it decoded, in its order.
    Result<std::vector<SourceDescriptor>> ManifestWithEntries(
        Generation generation, std::vector<std::shared_ptr<const ObjectInfo>>* entries);
    /// The kept one, or read and kept. Errors: as Manifest and ReadSeal; DataLoss.
    Result<std::shared_ptr<const SealedStepManifest>> SealedManifest(Generation step);
    /// Keeps `manifest` as sealed step `step`'s (the last kCachedManifests). Needs
    /// seal_cache_mu_.
    void KeepSealedManifestLocked(Generation step, std::shared_ptr<const SealedStepManifest> m);
    /// After commits of `step` (their source refs) listed themselves in its manifest: which of
    /// them a seal of the step by another process missed (`missed`; those are undone:
    /// Conflict). Waits while a seal of the step is in progress.
    Status CheckCommitsNotMissed(Generation step, std::span<const std::string_view> refs,
                                 std::vector<bool>& missed);

    // Commits (sparse_commit.cc).
    /// What one commit call (one object or a batch) learns and counts under commit_mu_.
    struct CommitBatch {
        std::map<Generation, Status> steps;  ///< Whether each step takes commits.
        std::map<std::string, std::optional<Generation>, std::less<>> heads;  ///< As moved.
        std::uint64_t created = 0, created_bytes = 0, idempotent = 0;
    };
    /// Names the object under this store's namespace, checks its descriptor, and encodes its
    /// metadata.
    Status PrepareCommit(SparseObject& object, std::string& metadata);
    /// The entries of an indexed object (IndexSourceObject): the caller's arrays, written to the
    /// store as they are. Both empty: the object's own members.
    struct EntryViews {
        std::span<const std::byte> indices;
        std::span<const std::byte> values;
    };
    /// One commit with commit_mu_ held: idempotence, step and fencing checks, then the writes.
    Result<CommitResult> CommitLocked(const SparseObject& object, const std::string& metadata,
                                      bool hard_pin, CommitBatch& batch,
                                      const EntryViews& entries = {});
    /// CommitLocked's checks: nullopt when the object is to be written (`head` is then its
    /// tensor's head as this batch has it), else its result (an idempotent retry, or the error).
    std::optional<Result<CommitResult>> CheckCommitLocked(const SparseObject& object,
                                                          CommitBatch& batch,
                                                          std::optional<Generation>& head);
    /// The checks of a batch's objects with commit_mu_ held (CheckCommitLocked for each, in
    /// order; `committed[i]` set for every object tried).
    struct BatchChecks {
        std::vector<std::size_t> write;  ///< To be written, checked against `heads`.
        /// Whose tensor has another generation earlier in the batch: committed object by object
        /// after the first one moved the head.
        std::vector<std::size_t> later;
        std::vector<std::optional<Generation>> heads;  ///< Per object: its tensor's head.
    };
    /// An idempotent retry's or a refused object's result is set, a retry's with `bytes_of(i)`.
    BatchChecks CheckBatchLocked(const std::vector<std::optional<SparseObject>>& objects,
                                 const std::function<std::uint64_t(std::size_t)>& bytes_of,
                                 std::vector<Result<CommitResult>>& results,
                                 std::vector<const SparseObject*>& committed, CommitBatch& batch);
    /// CommitLocked's writes after the source object: its manifest entry and its tensor's head
    /// (the source object is removed again when they fail).
    Result<CommitResult> PublishCommitLocked(const SparseObject& object,
                                             const std::string& metadata,
                                             std::optional<Generation> head, CommitBatch& batch,
                                             std::uint64_t bytes);
    /// The commits of a batch with commit_mu_ held, on a store that fills objects in place: the
    /// checks of every object, then every source object written by one PutFilled whose copies
    /// run on `num_threads` threads, then the manifest entries and heads. When the PutFilled
    /// fails as a whole (the store full) the objects are committed one by one, so that each
    /// fails or succeeds alone. `committed[i]` is set for every object that was tried.
    void CommitFilledLocked(std::vector<std::optional<SparseObject>>& objects,
                            const std::vector<std::string>& metadata,
                            const std::vector<bool>& hard_pin,
                            std::span<const EntryViews> entries,
                            std::vector<Result<CommitResult>>& results,
                            std::vector<const SparseObject*>& committed, CommitBatch& batch,
                            int num_threads);
    /// The commits of a batch of many small objects with commit_mu_ held, on any store:
    /// CommitFilledLocked's checks, then every source object in one PutEach (the store builds
    /// them on `num_threads` threads and makes them visible under one lock), then
    /// PublishEachLocked. Each object succeeds or fails alone, as by CommitLocked.
    /// `committed[i]` is set for every object that was tried.
    void CommitEachLocked(std::vector<std::optional<SparseObject>>& objects,
                          const std::vector<std::string>& metadata,
                          const std::vector<bool>& hard_pin, std::span<const EntryViews> entries,
                          std::vector<Result<CommitResult>>& results,
                          std::vector<const SparseObject*>& committed, CommitBatch& batch,
                          int num_threads);
    /// PublishCommitLocked of the objects `write` (indices into `objects`, their source objects
    /// written; `heads[i]`: object i's tensor's head as the batch's checks found it) in two
    /// PutEach: every manifest entry, then every head that moves (one per tensor). An object
    /// whose entry or head fails is removed again (entry and source object) and fails with
    /// that error; `bytes_of(i)`: object i's stored bytes.
    void PublishEachLocked(const std::vector<std::optional<SparseObject>>& objects,
                           const std::vector<std::string>& metadata,
                           std::span<const std::size_t> write,
                           const std::vector<std::optional<Generation>>& heads,
                           const std::function<std::uint64_t(std::size_t)>& bytes_of,
                           std::vector<Result<CommitResult>>& results, CommitBatch& batch,
                           int num_threads);
    /// The source objects `write` (indices into `objects`), in one PutFilled per pin class and,
    /// with a pinned pool, per size class (only large objects go into it): each object's
    /// members (`members_of`) copied into the store on `num_threads` threads, but for the
    /// entries (members 0 and 1) of the objects `external` marks (empty: none), whose targets
    /// go to `fill` in the same PutFilled. `on_class` is told each class's objects, the
    /// PutFilled's status and the fill's; an error it returns stops the writes and is returned.
    Status PutFilledByClass(
        const std::vector<std::optional<SparseObject>>& objects,
        const std::vector<std::string>& metadata, std::span<const std::size_t> write,
        const std::vector<bool>& hard_pin,
        const std::function<SourceMemberBytes(std::size_t)>& members_of,
        const std::vector<bool>& external, const EntryFill& fill, int num_threads,
        const std::function<Status(std::span<const std::size_t>, const Status&, const Status&)>&
            on_class);
    /// Undoes the created commits of `objects` (null: not committed) that a seal by another
    /// process missed, setting their results to Conflict.
    void UndoMissedCommits(std::span<const SparseObject* const> objects,
                           std::span<Result<CommitResult>> results, CommitBatch& batch);
    void CountCommits(const CommitBatch& batch);
    /// Caches the tile index of each object of `objects` (null: not committed) whose commit
    /// created it, moved out of the object (which the commit is done with): the node's reads of
    /// the step then find them (NodeCache::AddIndexes). Unless
    /// SparseStoreOptions::cache_committed_indexes is off. The indexes are built on up to
    /// `num_threads` threads (0: all).
    void CacheCommittedIndexes(std::span<SparseObject* const> objects,
                               std::span<const Result<CommitResult>> results, int num_threads);
    /// CacheCommittedIndexes of the objects of `owned` that `committed` names.
    void CacheCommittedIndexes(std::vector<std::optional<SparseObject>>& owned,
                               std::span<const SparseObject* const> committed,
                               std::span<const Result<CommitResult>> results, int num_threads);
    /// Names, checks and encodes the metadata of `objects` (null: failed already; `results`
    /// holds why) in parallel, then commits them under one lock, with the step checks once per
    /// step, and undoes what a seal by another process missed.
    /// `entries` (empty, or one per object) gives indexed objects' entries.
    void CommitBuilt(std::vector<std::optional<SparseObject>>& objects,
                     const std::vector<bool>& hard_pin, std::vector<Result<CommitResult>>& results,
                     int num_threads, std::span<const EntryViews> entries = {});
    /// PrepareCommit of every object (null: failed already), in parallel: one that fails is
    /// reset and its result set.
    void PrepareCommits(std::vector<std::optional<SparseObject>>& objects,
                        std::vector<std::string>& metadata,
                        std::vector<Result<CommitResult>>& results, int num_threads);
    /// PutIndexedObjects' commits with commit_mu_ held: CommitFilledLocked's checks, then one
    /// PutFilled per pin class in which `fill` writes the entries of the objects that
    /// `external` marks, then the manifest entries and heads. On error nothing it wrote stays.
    Status CommitIndexedLocked(std::vector<std::optional<SparseObject>>& objects,
                               const std::vector<std::string>& metadata,
                               const std::vector<bool>& hard_pin,
                               const std::vector<bool>& external, const EntryFill& fill,
                               std::vector<Result<CommitResult>>& results,
                               std::vector<const SparseObject*>& committed, CommitBatch& batch,
                               int num_threads);
    std::string ManifestKeyOf(const SourceDescriptor& d) const;
    /// Creates the pending record of a seal of `step` (taking over a crashed sealer's) and
    /// returns its expiry. Errors: FailedPrecondition (another seal is in progress).
    Result<std::int64_t> BeginSeal(Generation step);
    /// Whether retention freed `step` (or would free it as soon as it were sealed): older than
    /// the oldest step kept and than the last keep_last sealed steps.
    Result<bool> PastRetention(Generation step);
    Result<std::optional<std::uint64_t>> ReadStepRecord(const std::string& key);
    Status WriteStepRecord(const std::string& key, std::uint64_t value);
    /// Frees what the retention in force no longer keeps. `strict`: fail (changing nothing)
    /// when a leased step would go, instead of keeping it for a later pass.
    Status CollectSteps(std::uint64_t keep_last, bool strict);
    /// Steps k in [first, last] that left any record (seal, seal in progress, manifest entry,
    /// admission, lease), ascending: what a retention pass over a long span of step numbers
    /// has to free, found by listing instead of by trying every number.
    Result<std::vector<std::uint64_t>> StepsWithRecords(std::uint64_t first, std::uint64_t last);
    Status FreeStep(Generation step);
    /// Frees anchors older than the newest keep_anchors ones.
    Status CollectAnchors();
    /// A lease on steps for the life of the returned token (store objects that expire).
    class StepLease;
    Result<std::unique_ptr<StepLease>> LeaseSteps(std::span<const Generation> steps);
    Result<bool> IsLeased(Generation step);

    // The steps of ReadSparseObjects, in the order it takes them (docs/design.md §4).
    /// Steps 1-2: which sources each target reads, from the manifest alone.
    Status SelectTargetSources(ReadCall& call);
    /// Step 3: the tile index of every needed source, each checked against the stored object.
    Status LoadIndexes(ReadCall& call);
    /// Steps 4-5: plan and dedup. False when over the planning budget: the caller then reads
    /// the needed sources in full (ReadFullSources), an explicit, counted fallback.
    Result<bool> PlanReads(ReadCall& call);
    /// Step 6: each unique range from the node cache, from a concurrent request's read of it
    /// (single flight), or read by this call.
    Status ReadUniqueRanges(ReadCall& call);
    /// Each target's pieces of the planned, read ranges.
    void CollectPlannedPieces(ReadCall& call);
    /// The budget fallback: every needed source read in full once for the node.
    Status ReadFullSources(ReadCall& call);
    /// The kFullSourcePerTarget baseline: each target reads its sources in full, then is
    /// materialized, with no dedup.
    Status ReadAndMaterializePerTarget(ReadCall& call);
    /// Steps 7-8: filter, rebase and build each target's object from its pieces.
    void MaterializeTargets(ReadCall& call);
    /// Steps 6-8 with ReadOptions::view_in_place: each unique range viewed where the store
    /// holds it, then every target built from those views while they last.
    /// Errors: as ViewObjects (NotFound); DataLoss or OutOfRange when a stored object no
    /// longer holds a planned range as its descriptor says.
    Status MaterializeInPlace(ReadCall& call, int threads);
    /// ReadPlanned of one step, its lease held by the caller.
    Result<std::vector<TargetObjectView>> ReadPlannedStep(const StepManifestView& manifest,
                                                          std::span<const TargetDescriptor> targets,
                                                          const ReadOptions& options,
                                                          const PlannedReadFn& build);
    /// Points every unique read of the plan at the stored bytes of `views` (one per source the
    /// plan reads, in `view_of` order), checked against the objects as they are now.
    Status BindInPlaceReads(ReadCall& call, std::span<const ObjectView> views,
                            std::span<const std::uint32_t> view_of);
    /// The targets' objects in target order, or the first target's error.
    Result<std::vector<TargetObject>> PublishTargets(ReadCall& call);
    /// Adds a successful call's metrics to the store's.
    void AddReadMetrics(const SparseMetrics& call_metrics);

    /// The tile index of a source by one index-only GET, built from the stored object's
    /// metadata, which `claimed` (a requester's manifest entry) must match. Errors: NotFound;
    /// InvalidArgument (the entry describes another object); DataLoss. `owner`: as
    /// ReadOptions::manifest_owner, of `claimed`.
    Result<std::shared_ptr<const SourceIndex>> ReadIndex(const SourceDescriptor& claimed,
                                                         const std::shared_ptr<const void>& owner,
                                                         const EntryTexts& texts = {});
    /// ReadIndex of each source into out[i], as one view of the batch where the store views
    /// objects in place.
    void ReadIndexes(std::span<const SourceDescriptor* const> sources,
                     const std::shared_ptr<const void>& owner, const EntryTexts& texts,
                     std::span<Result<std::shared_ptr<const SourceIndex>>> out);
    /// The stored object's descriptor, read with one Stat and checked against `claimed` and
    /// against the sizes of its members. Errors: as ReadIndex.
    Result<SourceDescriptor> StoredDescriptor(const SourceDescriptor& claimed);
    /// StoredDescriptor, answered from the index cache when the source is in it.
    Result<SourceDescriptor> VerifySource(const SourceDescriptor& claimed);

    std::shared_ptr<ObjectStore> store_;
    /// Page-locked memory for source objects (SparseStoreOptions::pinned_quota_bytes), or null.
    std::shared_ptr<PinnedHostPool> host_pool_;
    SparseStoreOptions options_;
    /// The last read's manifest index and plan, whose storage the next read plans into: a
    /// node's plan is tens of MB, and fresh pages cost a fifth of its planning time. One spare
    /// set; a read that finds it taken (a concurrent read) plans into fresh memory.
    struct PlanScratch {
        ManifestIndex index;
        BatchPlan plan;
    };
    std::unique_ptr<PlanScratch> TakeScratch();
    void ReturnScratch(std::unique_ptr<PlanScratch> scratch);

    Keys keys_;
    /// keys_.Source(), Manifest() and Head(), built once: every commit names three keys.
    std::string source_prefix_, manifest_prefix_, head_prefix_;
    /// The key of a tensor's generation head.
    std::string HeadKeyOf(std::string_view tensor_id) const {
        std::string key;
        key.reserve(head_prefix_.size() + tensor_id.size());
        key.append(head_prefix_).append(tensor_id);
        return key;
    }
    std::mutex commit_mu_;
    std::mutex seal_mu_;
    std::condition_variable sealed_cv_;
    std::uint64_t seals_ = 0;  ///< Seals made through this store (wakes its waiters).
    std::atomic<std::uint64_t> lease_ids_{0};
    std::uint64_t lease_holder_ = 0;  ///< Random per store: lease keys of two processes differ.
    std::mutex seal_cache_mu_;
    std::map<std::uint64_t, std::shared_ptr<const SealRecord>> seal_cache_;
    /// The manifests of the last few sealed steps read (by delta; guarded by seal_cache_mu_):
    /// a sealed step's manifest never changes, and every reader of a node (each rank, through
    /// the node daemon) reads the same one. Dropped by ClearCaches and when retention frees
    /// the step.
    std::map<std::uint64_t, std::shared_ptr<const SealedStepManifest>> manifest_cache_;
    static constexpr std::size_t kCachedManifests = 4;
    std::mutex scratch_mu_;
    std::unique_ptr<PlanScratch> scratch_;
    mutable std::mutex metrics_mu_;
    SparseMetrics metrics_;
    std::unique_ptr<NodeCache> cache_;
};

/// Validates and encodes the source object of one put_sparse_object call: exactly what
/// PutSparseObject commits. A trainer talking to the node daemon encodes with it locally and
/// sends the object (the daemon validates it again before committing).
/// Errors: InvalidArgument.
Result<SparseObject> BuildSourceObject(const PutSparseRequest& request);

/// BuildSourceObject without copying the entries, for requests whose entries are already in
/// canonical order (what encode_update returns): the object's descriptor, tile index and
/// checksums, its indices and values left empty (they are exactly request.indices and
/// request.values). nullopt otherwise (BuildSourceObject then encodes, or reports the error).
std::optional<SparseObject> IndexSourceObject(const PutSparseRequest& request);

/// IndexSourceObject's checks that read no entry, for a request whose entries are not in host
/// memory (they lie on a GPU, as `entries` describes them; request.indices and request.values
/// are not used): the descriptor of its object (PlanCanonicalEntries: box, tile shape, dtypes
/// and nnz set), or nullopt where IndexSourceObject would not take the entries as they are,
/// whatever they hold (BuildSourceObject then decides, errors included). Entries that are
/// canonical for the plan make, through FinishCanonicalEntries, the object IndexSourceObject
/// makes.
std::optional<SourceDescriptor> PlanIndexedSource(const PutSparseRequest& request,
                                                  const CooLayout& entries);

/// How a commit checked on the GPU splits its items (entry bytes `bytes`, in order) into groups
/// whose checks overlap the copies of the group before into the store (the node daemon's
/// device commits, the embedded store's commits from CUDA memory): the bounds [0, b1, ..., n]
/// of consecutive groups. A group closes at the first item at which it holds at least its
/// target bytes, when the items after it hold at least as many; targets start at `first_bytes`
/// and grow threefold (the copies over PCIe are several times slower than the check, so each
/// group's check ends before the copies of the one before it). `first_bytes` 0 (or fewer than
/// two items): one group, [0, n].
std::vector<std::size_t> DeviceCommitGroups(std::span<const std::uint64_t> bytes,
                                            std::uint64_t first_bytes);

/// "base-delta": how a generation appears in keys.
std::string GenerationTag(Generation generation);
/// The generation of a GenerationTag, or nullopt for text that is not one.
std::optional<Generation> ParseGenerationTag(std::string_view tag);

/// A namespace name: 1-64 of [A-Za-z0-9_.-] ("" is the default namespace).
/// Errors: InvalidArgument.
Status ValidateNamespace(std::string_view name_space);

/// The tensor key of a tensor's anchor at `step` in namespace `name_space` (tensor objects:
/// "mcs-anchor/<b-d>/<tensor_id>", "mcs-anchor@NAME/..." in a namespace).
std::string AnchorTensorKey(std::string_view name_space, Generation step,
                            std::string_view tensor_id);

/// Key of the structured object for a logical key.
std::string SourceObjectKey(std::string_view tensor_id, Generation generation,
                            const PlacementPolicy& policy, const NamedAxes& placement,
                            const Box& box);

}  // namespace mooncake::sparse
