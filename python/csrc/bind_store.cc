// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Binding of `_Store` (store.h): `_Store(...)` is an in-process store, `_Store.connect(PATH, ...)`
// a client of the node daemon (the backend of mcs.connect("unix:///PATH")); every method is
// written once against SparseService, with the GIL released while the backend works. The
// daemon's client encodes a put_sparse_object here and the daemon validates it again before
// committing; its read_sparse_objects returns SparseObjects that view the daemon's read-only
// segment memory in place and hold its lease until they are collected, where the in-process
// store's own their bytes. `_NodeStore` is the old name of `_Store.connect`.
#include "store.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <optional>
#include <type_traits>

#include "arrays.h"
#include "bind_common.h"
#include "executor/sparse_store.h"
#include "node/node_client.h"
#include "object_store_handle.h"
#include "python_object_store.h"
#include "sparse_object.h"
#include "torch_arrays.h"

namespace mooncake::sparse::py {

std::unique_ptr<PyStore> PyStore::Embedded(std::string node_id, std::uint64_t capacity_bytes,
                                           const pyb::object& object_store,
                                           const std::string& name_space,
                                           std::uint64_t pinned_quota_bytes) {
    ThrowIfError(ValidateNamespace(name_space));
    SparseStoreOptions options;
    options.node_id = std::move(node_id);
    options.name_space = name_space;
    options.pinned_quota_bytes = pinned_quota_bytes;
    // An object store of the caller's (Mooncake's, across nodes) is read by other processes
    // through stores of their own: a commit's indexes cached here would serve none of them.
    options.cache_committed_indexes = object_store.is_none();
    std::shared_ptr<ObjectStore> objects =
        object_store.is_none() ? std::shared_ptr<ObjectStore>(MakeEmbeddedStore({capacity_bytes}))
                               : MakePythonObjectStore(object_store);
    return std::unique_ptr<PyStore>(
        new PyStore(std::make_shared<SparseStore>(std::move(objects), options), nullptr));
}

namespace {

using GenerationArg = std::pair<std::uint64_t, std::uint64_t>;

Generation GenerationOf(GenerationArg g) { return {g.first, g.second}; }

/// Runs `fn` without the GIL and returns its value or throws its error.
template <typename Fn>
auto NoGil(Fn&& fn) {
    using R = decltype(fn());
    std::optional<R> r;
    {
        pyb::gil_scoped_release nogil;
        r.emplace(fn());
    }
    if constexpr (std::is_same_v<R, Status>) {
        ThrowIfError(*r);
    } else {
        return ValueOrThrow(std::move(*r));
    }
}

/// Longest duration taken (about 31 years): its microseconds still fit int64.
constexpr double kMaxSeconds = 1e9;

void CheckSeconds(double seconds, const char* what, bool allow_zero) {
    const bool ok = std::isfinite(seconds) && (allow_zero ? seconds >= 0 : seconds > 0) &&
                    seconds <= kMaxSeconds;
    if (!ok) {
        throw StatusError(InvalidArgument(std::string(what) +
                                          " must be a finite number of seconds " +
                                          (allow_zero ? ">= 0" : "> 0") + " (at most 1e9), got " +
                                          std::to_string(seconds)));
    }
}

/// The daemon's client of `store`, for what only a connection has.
NodeClient& NodeOf(PyStore& store, const char* what) {
    if (store.node() == nullptr) {
        throw StatusError(FailedPrecondition(std::string(what) +
                                             ": this store is not a client of a node daemon"));
    }
    return *store.node();
}

pyb::dict PutSparseObject(PyStore& s, const std::string& tensor_id,
                          const pyb::object& global_shape, const pyb::object& indices,
                          const pyb::object& values, const pyb::object& source_placement,
                          const std::optional<std::string>& placement_policy,
                          GenerationArg generation, const std::string& apply,
                          const pyb::object& tile_shape, const std::string& duplicates,
                          const pyb::object& global_offset, const pyb::object& local_shape,
                          bool hard_pin, int num_threads) {
    ParsedPut put = ParsePut(tensor_id, global_shape, indices, values, source_placement,
                             placement_policy, generation, apply, tile_shape, duplicates,
                             global_offset, local_shape, hard_pin, num_threads);
    ParsedPut* one = &put;
    std::shared_ptr<void> staged;
    if (put.on_device()) staged = StageDeviceMembers({&one, 1}, 0);
    CommitResult c = NoGil([&] { return s.service().PutSparseObject(put.request); });
    return CommitDict(c.source_ref, c.created, c.nnz, c.bytes);
}

namespace {

/// Where put_sparse_objects spends its time in the binding (ns, summed over calls): the parse of
/// the updates (fields, members: for CUDA members torch's exporter), the backend's commit (the
/// embedded store, or the daemon's client and its request), and the results' Python objects.
/// For benchmarks to split a batch commit's fixed cost per object.
struct CommitCallCounters {
    std::atomic<std::uint64_t> calls{0};
    std::atomic<std::uint64_t> updates{0};
    std::atomic<std::uint64_t> parse_ns{0};
    std::atomic<std::uint64_t> commit_ns{0};
    std::atomic<std::uint64_t> results_ns{0};
};

CommitCallCounters& CallCounters() {
    static CommitCallCounters* c = new CommitCallCounters;  // never destroyed
    return *c;
}

}  // namespace

/// put_sparse_objects: each update a dict of put_sparse_object's keyword arguments. Returns,
/// per update in order, its commit dict or (status code, message) for its error. An update
/// that does not parse fails alone, like one the store rejects.
pyb::list PutSparseObjects(PyStore& s, const pyb::list& updates, int num_threads,
                           std::optional<std::uintptr_t> stream_arg) {
    // The fields of an update, looked up by interned keys (a step parses tens of thousands of
    // updates: no key string is made or converted per update).
    enum Field {
        kTensorId, kGlobalShape, kIndices, kValues, kSourcePlacement, kPlacementPolicy,
        kGeneration, kApply, kTileShape, kDuplicates, kGlobalOffset, kLocalShape, kHardPin,
        kNumThreads, kNumFields
    };
    static constexpr const char* kNames[kNumFields] = {
        "tensor_id", "global_shape", "indices", "values", "source_placement",
        "placement_policy", "generation", "apply", "tile_shape", "duplicates",
        "global_offset", "local_shape", "hard_pin", "num_threads"};
    static PyObject* const* const kKeys = [] {
        static PyObject* keys[kNumFields];
        for (int f = 0; f < kNumFields; ++f) keys[f] = PyUnicode_InternFromString(kNames[f]);
        return keys;  // never released: they live as long as the module
    }();
    const auto t_parse = std::chrono::steady_clock::now();
    const std::size_t n = updates.size();
    std::vector<std::optional<ParsedPut>> parsed(n);
    std::vector<Status> errors(n);
    for (std::size_t i = 0; i < n; ++i) {
        const auto what = [i] { return "update " + std::to_string(i); };
        try {
            PyObject* u = PyList_GET_ITEM(updates.ptr(), static_cast<Py_ssize_t>(i));
            if (!PyDict_Check(u)) {
                throw StatusError(InvalidArgument(what() + " is not a dict of put_sparse_object's "
                                                           "keyword arguments"));
            }
            std::array<pyb::object, kNumFields> field;
            Py_ssize_t present = 0;
            // An update written as a dict display or dict(...) keywords has the interned keys
            // themselves: its few entries are matched by identity in one pass, instead of a
            // lookup per field. Any other key (a copy of a name, an unknown one) takes the
            // lookups below, which then see every field.
            bool matched = false;
            {
                PyObject* key = nullptr;
                PyObject* value = nullptr;
                Py_ssize_t pos = 0;
                while (PyDict_Next(u, &pos, &key, &value)) {
                    int f = 0;
                    while (f < kNumFields && kKeys[f] != key) ++f;
                    if (f == kNumFields) break;
                    field[f] = pyb::reinterpret_borrow<pyb::object>(value);
                    ++present;
                }
                matched = present == PyDict_Size(u);
                if (!matched) {
                    field = {};
                    present = 0;
                } else {
                    for (pyb::object& v : field) {
                        if (!v) v = pyb::none();
                    }
                }
            }
            for (int f = 0; !matched && f < kNumFields; ++f) {
                if (kKeys[f] == nullptr) throw pyb::error_already_set();
                PyObject* v = PyDict_GetItemWithError(u, kKeys[f]);  // borrowed
                if (v == nullptr) {
                    if (PyErr_Occurred() != nullptr) throw pyb::error_already_set();
                    field[f] = pyb::none();
                    continue;
                }
                ++present;
                field[f] = pyb::reinterpret_borrow<pyb::object>(v);
            }
            if (PyDict_Size(u) != present) {
                // A key that is none of the fields: name it.
                for (const auto& [k, v] : pyb::reinterpret_borrow<pyb::dict>(u)) {
                    const std::string key = pyb::str(k);
                    if (std::find(std::begin(kNames), std::end(kNames), key) == std::end(kNames)) {
                        throw StatusError(
                            InvalidArgument(what() + " has an unknown field '" + key + "'"));
                    }
                }
            }
            const auto str = [&](Field f, const char* fallback) {
                const pyb::object& v = field[f];
                if (v.is_none()) {
                    if (fallback != nullptr) return std::string(fallback);
                    throw StatusError(InvalidArgument(what() + " lacks '" + kNames[f] + "'"));
                }
                if (!pyb::isinstance<pyb::str>(v)) {
                    throw StatusError(InvalidArgument(what() + ": " + kNames[f] + " must be a str"));
                }
                return v.cast<std::string>();
            };
            for (Field required : {kGlobalShape, kIndices, kValues}) {
                if (field[required].is_none()) {
                    throw StatusError(InvalidArgument(what() + " lacks '" + kNames[required] + "'"));
                }
            }
            std::optional<std::string> policy;
            if (!field[kPlacementPolicy].is_none()) policy = str(kPlacementPolicy, nullptr);
            const pyb::object& g = field[kGeneration];
            const GenerationArg generation =
                g.is_none() ? GenerationArg{0, 1} : g.cast<GenerationArg>();
            const pyb::object& pin = field[kHardPin];
            const pyb::object& threads = field[kNumThreads];
            parsed[i] = ParsePut(str(kTensorId, nullptr), field[kGlobalShape], field[kIndices],
                                 field[kValues], field[kSourcePlacement], policy, generation,
                                 str(kApply, "overwrite"), field[kTileShape],
                                 str(kDuplicates, "error"), field[kGlobalOffset],
                                 field[kLocalShape], pin.is_none() || pin.cast<bool>(),
                                 threads.is_none() ? 0 : threads.cast<int>());
        } catch (const StatusError& e) {
            errors[i] = e.status.WithContext(what());
        } catch (const pyb::cast_error& e) {
            errors[i] = InvalidArgument(what() + ": a field has the wrong type (" + e.what() + ")");
        } catch (pyb::error_already_set& e) {
            errors[i] = InvalidArgument(what() + ": " + e.what());
        }
    }
    const auto t_commit = std::chrono::steady_clock::now();
    std::vector<ParsedPut*> on_device;
    bool all_on_device = true;
    for (auto& p : parsed) {
        if (p && p->on_device()) on_device.push_back(&*p);
        if (p && !(p->device_indices && p->device_values)) all_on_device = false;
    }
    // The stream the copies from the device are ordered on: the caller's, else torch's current
    // stream of the first CUDA member's device (the stream that produced it).
    std::uintptr_t stream = stream_arg.value_or(0);
    if (!stream_arg && !on_device.empty()) {
        const ParsedPut& first = *on_device.front();
        stream = TorchCurrentStream(first.device_indices ? first.device_indices->device
                                                         : first.device_values->device);
    }
    std::vector<std::size_t> of;  // request -> update
    of.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
        if (parsed[i]) of.push_back(i);
    }
    // The requests, moved out of the parsed updates (which keep their members' memory).
    const auto take_requests = [&] {
        std::vector<PutSparseRequest> requests;
        requests.reserve(of.size());
        for (std::size_t i : of) requests.push_back(std::move(parsed[i]->request));
        return requests;
    };
    std::vector<Result<CommitResult>> results;
    NodeClient* node = s.node();
    bool device_commit = !on_device.empty() && all_on_device && node != nullptr;
    if (device_commit) {
        pyb::gil_scoped_release nogil;
        device_commit = node->CanCommitFromDevice();
    }
    // In this process, a batch that is all on the GPU is checked and indexed there, and its
    // entries land in the store's memory in one copy (bind_gpu_commit.cc); nullopt: staged.
    std::optional<std::vector<Result<CommitResult>>> direct;
    if (!on_device.empty() && all_on_device && node == nullptr) {
        direct = CommitDeviceBatch(s.service(), on_device, num_threads, stream);
    }
    if (device_commit) {
        // Through the daemon, a batch that is all on the GPU stays there: the daemon copies
        // its members by CUDA IPC into its own pinned memory.
        std::vector<NodeClient::DeviceMember> indices, values;
        indices.reserve(of.size());
        values.reserve(of.size());
        const auto member = [](const DeviceMember& m) {
            return NodeClient::DeviceMember{m.dtype, m.shape, {m.address, m.bytes, m.device}};
        };
        for (std::size_t i : of) {
            indices.push_back(member(*parsed[i]->device_indices));
            values.push_back(member(*parsed[i]->device_values));
        }
        std::vector<PutSparseRequest> requests = take_requests();
        pyb::gil_scoped_release nogil;
        results = node->PutSparseObjectsFromDevice(requests, indices, values, stream);
    } else if (direct) {
        results = std::move(*direct);
    } else {
        // CUDA members (a batch encoded on the GPU) reach host memory in a few large copies.
        std::shared_ptr<void> staged;
        if (!on_device.empty()) staged = StageDeviceMembers(on_device, stream);
        const std::vector<PutSparseRequest> requests = take_requests();
        pyb::gil_scoped_release nogil;
        results = s.service().PutSparseObjects(requests, num_threads);
    }
    const auto t_results = std::chrono::steady_clock::now();
    std::vector<std::optional<Result<CommitResult>>> by_update(n);
    for (std::size_t k = 0; k < results.size(); ++k) by_update[of[k]] = std::move(results[k]);
    pyb::list out(n);  // filled in place: no growth of the list per update
    const GcPause no_collection;  // n result dicts
    for (std::size_t i = 0; i < n; ++i) {
        pyb::object item;
        if (!by_update[i]) {
            item = pyb::make_tuple(static_cast<int>(errors[i].code()), errors[i].message());
        } else if (!by_update[i]->ok()) {
            const Status& e = by_update[i]->status();
            item = pyb::make_tuple(static_cast<int>(e.code()), e.message());
        } else {
            const CommitResult& c = **by_update[i];
            item = CommitDict(c.source_ref, c.created, c.nnz, c.bytes);
        }
        PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), item.release().ptr());
    }
    CommitCallCounters& c = CallCounters();
    c.calls.fetch_add(1, std::memory_order_relaxed);
    c.updates.fetch_add(n, std::memory_order_relaxed);
    c.parse_ns.fetch_add(Nanos(t_commit - t_parse), std::memory_order_relaxed);
    c.commit_ns.fetch_add(Nanos(t_results - t_commit), std::memory_order_relaxed);
    c.results_ns.fetch_add(NanosSince(t_results), std::memory_order_relaxed);
    return out;
}

pyb::dict CommitCallCountersDict() {
    const CommitCallCounters& c = CallCounters();
    pyb::dict d;
    d["calls"] = c.calls.load();
    d["updates"] = c.updates.load();
    d["parse_seconds"] = double(c.parse_ns.load()) * 1e-9;
    d["commit_seconds"] = double(c.commit_ns.load()) * 1e-9;
    d["results_seconds"] = double(c.results_ns.load()) * 1e-9;
    return d;
}

std::vector<std::shared_ptr<SparseObjectView>> Read(
    PyStore& s, const pyb::list& manifest_list, const pyb::object& targets,
    const std::string& strategy, std::int64_t read_coalesce_gap, int num_threads,
    const std::optional<GenerationArg>& generation, const std::vector<std::string>& unchanged,
    const std::optional<bool>& view_in_place) {
    const ManifestArg manifest = ManifestFrom(manifest_list);
    const TargetsArg targets_arg = TargetsArgFrom(targets);
    const std::span<const TargetDescriptor> tds = targets_arg.targets;
    ReadOptions options = ParseReadOptions(strategy, read_coalesce_gap, num_threads);
    if (view_in_place) {
        if (s.node() != nullptr) {
            // The daemon's reads are its own to make: its read_in_place setting decides.
            ThrowIfError(InvalidArgument(
                "view_in_place is the node daemon's setting (--read_in_place), not a read's"));
        }
        options.view_in_place = *view_in_place;
    }
    // A viewed array (a manifest as the store returned it) is immutable and shared: the
    // indexes the node cache keeps refer to its entries.
    options.manifest_owner = manifest.owner;
    std::optional<StepManifestView> step;
    std::vector<std::string> unchanged_sorted;
    if (generation) {
        unchanged_sorted = unchanged;
        std::sort(unchanged_sorted.begin(), unchanged_sorted.end());
        step.emplace(ValueOrThrow(Generation::Make(generation->first, generation->second)),
                     manifest.sources, unchanged_sorted);
    }
    // The manifest of a sealed step exactly as the node daemon returned it: the daemon reads it
    // with its own copy of that manifest, and only the step is sent.
    const bool by_step = step && s.IsSealedManifest(step->generation, manifest.sources);
    std::vector<TargetObjectView> views = NoGil([&] {
        if (by_step) return s.node()->ReadSealedStepViews(step->generation, tds, options);
        return step ? s.service().ReadViews(*step, tds, options)
                    : s.service().ReadViews(manifest.sources, tds, options);
    });
    std::vector<std::shared_ptr<SparseObjectView>> out;
    out.reserve(views.size());
    for (TargetObjectView& v : views) {
        out.push_back(std::make_shared<SparseObjectView>(std::move(v)));
    }
    return out;
}

bool Admit(PyStore& s, const std::string& tensor_id, GenerationArg generation,
           const std::optional<std::string>& policy, const pyb::object& placement,
           const std::string& writer_id) {
    auto p = ValueOrThrow(PlacementPolicy::Parse(policy.value_or("")));
    auto axes = AxesFromDict(placement, "source_placement");
    return NoGil([&] {
        return s.service().Admit(tensor_id, GenerationOf(generation), p, axes, writer_id);
    });
}

/// Admit of every item (tuples of admit's arguments), in order: True/False, or the item's
/// error as (code, message).
pyb::list AdmitBatch(PyStore& s, const pyb::list& items) {
    std::vector<AdmitRequest> requests;
    requests.reserve(items.size());
    std::vector<pyb::object> refused(items.size());  // an item's argument error, as admit's
    for (std::size_t i = 0; i < items.size(); ++i) {
        try {
            const auto t = items[i].cast<pyb::tuple>();
            if (t.size() != 5) ThrowIfError(InvalidArgument("an admission is 5 values"));
            auto p = ValueOrThrow(PlacementPolicy::Parse(
                t[2].is_none() ? std::string() : t[2].cast<std::string>()));
            const auto g = t[1].cast<GenerationArg>();
            requests.push_back({t[0].cast<std::string>(), GenerationOf(g), std::move(p),
                                AxesFromDict(pyb::object(t[3]), "source_placement"),
                                t[4].cast<std::string>()});
        } catch (const pyb::cast_error& e) {
            refused[i] = pyb::make_tuple(static_cast<int>(StatusCode::kInvalidArgument),
                                         "admission " + std::to_string(i) + ": " + e.what());
        } catch (const StatusError& e) {
            refused[i] = pyb::make_tuple(static_cast<int>(e.status.code()),
                                         "admission " + std::to_string(i) + ": " +
                                             std::string(e.status.message()));
        }
    }
    std::vector<Result<bool>> got;
    {
        pyb::gil_scoped_release nogil;
        got = s.service().AdmitBatch(requests);
    }
    pyb::list out;
    std::size_t k = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
        if (refused[i]) {
            out.append(refused[i]);
            continue;
        }
        const Result<bool>& r = got[k++];
        if (r.ok()) {
            out.append(pyb::bool_(*r));
        } else {
            out.append(pyb::make_tuple(static_cast<int>(r.status().code()),
                                       "admission " + std::to_string(i) + " ('" +
                                           requests[k - 1].tensor_id + "'): " +
                                           std::string(r.status().message())));
        }
    }
    return out;
}

pyb::dict StoreCountersDict(PyStore& s) {
    const StoreCounters c = NoGil([&] { return s.service().ObjectCounters(); });
    pyb::dict d;
    d["puts"] = c.puts;
    d["bytes_put"] = c.bytes_put;
    d["member_gets"] = c.member_gets;
    d["member_bytes"] = c.member_bytes;
    d["range_reads"] = c.range_reads;
    d["range_bytes"] = c.range_bytes;
    d["removes"] = c.removes;
    return d;
}

pyb::dict Hello(PyStore& s) {
    NodeClient& node = NodeOf(s, "hello");
    wire::HelloReply h = NoGil([&] { return node.Hello(); });
    pyb::dict d;
    d["node_id"] = h.node_id;
    d["daemon_version"] = h.daemon_version;
    d["protocol_version"] = h.protocol_version;
    d["client_buffer_max"] = h.client_buffer_max;
    pyb::list segments;
    for (const auto& seg : h.segments) {
        pyb::dict sd;
        sd["segment_id"] = seg.segment_id;
        sd["size"] = seg.size;
        sd["read_only"] = seg.read_only;
        segments.append(sd);
    }
    d["segments"] = segments;
    return d;
}

pyb::dict ClientStats(PyStore& s) {
    NodeClient& node = NodeOf(s, "client_stats");
    const NodeClientStats st = node.Stats();
    pyb::dict d;
    d["calls"] = st.calls;
    d["connects"] = st.connects;
    d["disconnects"] = st.disconnects;
    d["replies_spun"] = st.replies_spun;
    d["replies_slept"] = st.replies_slept;
    d["leases_released"] = st.leases_released;
    d["buffer_bytes"] = st.buffer_bytes;
    d["call_seconds"] = st.call_seconds;
    d["device_commit_gather_seconds"] = st.device_commit_gather_seconds;
    d["connected"] = node.connected();
    return d;
}

/// Zero-copy views of the members of a leased object (read-only numpy, holding the lease).
pyb::tuple LeaseObject(PyStore& s, const std::string& key) {
    NodeClient& node = NodeOf(s, "lease_object");
    auto holder = std::make_shared<LeasedObject>(NoGil([&] { return node.Lease(key); }));
    pyb::dict members;
    for (std::size_t i = 0; i < holder->members.size(); ++i) {
        const MemberInfo& m = holder->info.members[i];
        members[pyb::str(m.name)] =
            ViewNumpy(holder->members[i], m.dtype, m.shape, std::shared_ptr<const void>(holder));
    }
    return pyb::make_tuple(pyb::bytes(holder->info.metadata), members);
}

}  // namespace

std::unique_ptr<PyStore> PyStore::Connect(const std::string& socket_path,
                                          double connect_timeout_s, double call_timeout_s,
                                          const std::string& client_name,
                                          std::uint64_t initial_buffer_bytes,
                                          std::optional<double> reply_spin_max_s,
                                          std::optional<double> reply_spin_s,
                                          const std::string& name_space,
                                          std::uint64_t planned_read_targets) {
    ThrowIfError(ValidateNamespace(name_space));
    NodeClientOptions options;
    options.socket_path = socket_path;
    options.client_name = client_name;
    options.name_space = name_space;
    // A float -> int cast of inf, NaN or a value past int64 is undefined: check first.
    CheckSeconds(connect_timeout_s, "connect_timeout", /*allow_zero=*/false);
    CheckSeconds(call_timeout_s, "call_timeout", /*allow_zero=*/false);
    options.connect_timeout =
        std::chrono::milliseconds(static_cast<std::int64_t>(connect_timeout_s * 1000));
    options.call_timeout =
        std::chrono::milliseconds(static_cast<std::int64_t>(call_timeout_s * 1000));
    if (initial_buffer_bytes > 0) options.initial_buffer_bytes = initial_buffer_bytes;
    if (planned_read_targets > 0) options.planned_read_targets = planned_read_targets;
    if (reply_spin_max_s) {
        CheckSeconds(*reply_spin_max_s, "reply_spin_max", /*allow_zero=*/true);
        options.reply_spin_max =
            std::chrono::microseconds(static_cast<std::int64_t>(*reply_spin_max_s * 1e6));
    }
    if (reply_spin_s) {
        CheckSeconds(*reply_spin_s, "reply_spin", /*allow_zero=*/true);
        options.reply_spin =
            std::chrono::microseconds(static_cast<std::int64_t>(*reply_spin_s * 1e6));
    }
    std::shared_ptr<NodeClient> client = NoGil([&] { return NodeClient::Connect(options); });
    return std::unique_ptr<PyStore>(new PyStore(client, client));
}

void PyStore::RememberSealedManifest(
    Generation step, const std::shared_ptr<const std::vector<SourceDescriptor>>& array) {
    if (node_ == nullptr || array == nullptr || array->empty()) return;
    std::lock_guard lock(sealed_mu_);
    sealed_.push_back({step, array});
    if (sealed_.size() > kSealedManifests) sealed_.pop_front();
}

bool PyStore::IsSealedManifest(Generation step, std::span<const SourceDescriptor> sources) {
    if (node_ == nullptr || sources.empty()) return false;
    std::lock_guard lock(sealed_mu_);
    for (const SealedManifest& m : sealed_) {
        if (m.step != step) continue;
        // Alive, so its memory is not another's: the same address is the same array.
        const std::shared_ptr<const std::vector<SourceDescriptor>> array = m.array.lock();
        if (array && array->data() == sources.data() && array->size() == sources.size()) {
            return true;
        }
    }
    return false;
}

namespace {

/// A step manifest for Python; a node store notes a sealed step's (its reads name the step).
pyb::tuple StepManifestOf(PyStore& s, StepManifest m) {
    const Generation step = m.generation;
    const bool remember = m.sealed && s.node() != nullptr && step.delta == step.base + 1;
    std::shared_ptr<const std::vector<SourceDescriptor>> array;
    pyb::tuple out = StepManifestTuple(std::move(m), remember ? &array : nullptr);
    if (remember) s.RememberSealedManifest(step, array);
    return out;
}

}  // namespace

void RegisterStore(pyb::module_& m) {
    m.def("_commit_call_counters", &CommitCallCountersDict,
          "Where put_sparse_objects spent its time in this process (monotonic): calls, updates, "
          "and the seconds of its parse of the updates (parse_seconds), of the backend's commit "
          "(commit_seconds: the embedded store, or the daemon's client and its request) and of "
          "the results' Python objects (results_seconds).");
    using Store = PyStore;
    auto cls = pyb::class_<Store>(
        m, "_Store",
        "A store backend: _Store(...) in this process, _Store.connect(PATH, ...) a node daemon.");
    cls.def(pyb::init(&Store::Embedded), pyb::arg("node_id") = "node0",
            pyb::arg("capacity_bytes") = 0, pyb::arg("object_store") = pyb::none(),
            pyb::arg("name_space") = "", pyb::arg("pinned_quota_bytes") = 0)
        .def_static("connect", &Store::Connect, pyb::arg("socket_path"),
                    pyb::arg("connect_timeout") = 5.0, pyb::arg("call_timeout") = 120.0,
                    pyb::arg("client_name") = "", pyb::arg("initial_buffer_bytes") = 0,
                    pyb::arg("reply_spin_max") = pyb::none(), pyb::arg("reply_spin") = pyb::none(),
                    pyb::arg("name_space") = "", pyb::arg("planned_read_targets") = 0)
        .def_property_readonly("remote", [](Store& s) { return s.node() != nullptr; },
                               "Whether the work runs in a node daemon.")
        .def("put_sparse_object", &PutSparseObject, pyb::arg("tensor_id"),
             pyb::arg("global_shape"), pyb::arg("indices"), pyb::arg("values"),
             pyb::arg("source_placement") = pyb::none(), pyb::arg("placement_policy") = pyb::none(),
             pyb::arg("generation"), pyb::arg("apply") = "overwrite",
             pyb::arg("tile_shape") = pyb::none(), pyb::arg("duplicates") = "error",
             pyb::arg("global_offset") = pyb::none(), pyb::arg("local_shape") = pyb::none(),
             pyb::arg("hard_pin") = true, pyb::arg("num_threads") = 0)
        .def("put_sparse_objects", &PutSparseObjects, pyb::arg("updates"),
             pyb::arg("num_threads") = 0, pyb::arg("stream") = pyb::none())
        .def("manifest",
             [](Store& s, GenerationArg g) {
                 return SourcesList(
                     NoGil([&] { return s.service().Manifest(GenerationOf(g)); }));
             },
             pyb::arg("generation"))
        .def("read_sparse_objects", &Read, pyb::arg("manifest"), pyb::arg("targets"),
             pyb::arg("strategy") = "sparse", pyb::arg("read_coalesce_gap") = -1,
             pyb::arg("num_threads") = 0, pyb::arg("generation") = pyb::none(),
             pyb::arg("unchanged") = std::vector<std::string>{},
             pyb::arg("view_in_place") = pyb::none())
        .def("step_manifest",
             [](Store& s, GenerationArg g) -> pyb::tuple {
                 if (auto* local = dynamic_cast<SparseStore*>(&s.service())) {
                     // The store's own arrays of a sealed step, viewed (no copy per call).
                     SparseStore::SharedStepManifest m =
                         NoGil([&] { return local->GetManifestShared(GenerationOf(g)); });
                     return pyb::make_tuple(SourcesList(std::move(m.sources)),
                                            pyb::cast(*m.unchanged), m.sealed);
                 }
                 return StepManifestOf(
                     s, NoGil([&] { return s.service().GetManifest(GenerationOf(g)); }));
             },
             pyb::arg("generation"))
        .def("wait_generation",
             [](Store& s, GenerationArg g, double timeout) -> pyb::tuple {
                 if (auto* local = dynamic_cast<SparseStore*>(&s.service())) {
                     // The store's own arrays of the sealed step, viewed (no copy per call).
                     SparseStore::SharedStepManifest m = NoGil(
                         [&] { return local->WaitGenerationShared(GenerationOf(g), timeout); });
                     return pyb::make_tuple(SourcesList(std::move(m.sources)),
                                            pyb::cast(*m.unchanged), m.sealed);
                 }
                 return StepManifestOf(s, NoGil([&] {
                     return s.service().WaitGeneration(GenerationOf(g), timeout);
                 }));
             },
             pyb::arg("generation"), pyb::arg("timeout"))
        .def("seal_generation",
             [](Store& s, GenerationArg g, const std::vector<std::string>& tensor_ids) {
                 NoGil([&] { return s.service().SealGeneration(GenerationOf(g), tensor_ids); });
             },
             pyb::arg("generation"), pyb::arg("tensor_ids"))
        .def("latest_generation",
             [](Store& s) {
                 return GenerationOrNone(NoGil([&] { return s.service().LatestGeneration(); }));
             })
        .def("set_retention",
             [](Store& s, std::uint64_t keep_last) {
                 NoGil([&] { return s.service().SetRetention(keep_last); });
             },
             pyb::arg("keep_last"))
        .def("retention", [](Store& s) { return NoGil([&] { return s.service().Retention(); }); })
        .def("record_anchor",
             [](Store& s, GenerationArg g, const std::vector<std::string>& tensor_ids) {
                 NoGil([&] { return s.service().RecordAnchor(GenerationOf(g), tensor_ids); });
             },
             pyb::arg("generation"), pyb::arg("tensor_ids"))
        .def("latest_anchor",
             [](Store& s) {
                 return GenerationOrNone(NoGil([&] { return s.service().LatestAnchor(); }));
             })
        .def("set_keep_anchors",
             [](Store& s, std::uint64_t keep) {
                 NoGil([&] { return s.service().SetKeepAnchors(keep); });
             },
             pyb::arg("keep_anchors"))
        .def("admit", &Admit, pyb::arg("tensor_id"), pyb::arg("generation"),
             pyb::arg("placement_policy"), pyb::arg("source_placement"), pyb::arg("writer_id"))
        .def("admit_batch", &AdmitBatch, pyb::arg("items"))
        .def("current_generation",
             [](Store& s, const std::string& tensor_id) {
                 return GenerationOrNone(
                     NoGil([&] { return s.service().CurrentGeneration(tensor_id); }));
             },
             pyb::arg("tensor_id"))
        .def("metrics",
             [](Store& s) {
                 return MetricsDict(NoGil([&] { return s.service().Metrics(/*reset=*/false); }));
             })
        .def("reset_metrics",
             [](Store& s) { NoGil([&] { return s.service().Metrics(/*reset=*/true); }); })
        .def("clear_caches", [](Store& s) { NoGil([&] { return s.service().ClearCaches(); }); })
        .def("store_counters", &StoreCountersDict)
        .def("list_keys",
             [](Store& s, const std::string& prefix) {
                 return NoGil([&] { return s.service().ListKeys(prefix); });
             },
             pyb::arg("prefix") = "")
        .def("_object_store",
             [](Store& s) { return ObjectStoreHandle(s.service().object_store()); },
             pyb::keep_alive<0, 1>())
        // What only a node daemon's client has (FailedPrecondition in this process, but
        // disconnect, which has nothing to drop).
        .def("hello", &Hello)
        .def("client_stats", &ClientStats)
        .def("lease_object", &LeaseObject, pyb::arg("key"))
        .def("flush_releases",
             [](Store& s) {
                 NodeClient& node = NodeOf(s, "flush_releases");
                 NoGil([&] { return node.FlushReleases(); });
             })
        .def("disconnect", [](Store& s) {
            if (s.node() == nullptr) return;
            pyb::gil_scoped_release nogil;
            s.node()->Disconnect();
        });
    m.attr("_NodeStore") = cls.attr("connect");
}

}  // namespace mooncake::sparse::py
