// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "python_object_store.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "arrays.h"
#include "store/tensor_object.h"
#include "transport/pinned_pool.h"

namespace mooncake::sparse::py {
namespace {

/// The Status of the Python exception being handled: its class's StatusCode (as
/// mooncake.sparse._errors.code_of tells it) and its message.
Status StatusOf(pyb::error_already_set& e, std::string_view what) {
    int code = static_cast<int>(StatusCode::kInternal);
    std::string message;
    try {
        pyb::module_ errors = pyb::module_::import("mooncake.sparse._errors");
        code = errors.attr("code_of")(e.value()).cast<int>();
        message = pyb::str(e.value()).cast<std::string>();
    } catch (const pyb::error_already_set& inner) {
        message = std::string(e.what()) + " (while classifying it: " + inner.what() + ")";
    }
    if (code <= 0 || code > static_cast<int>(kLastStatusCode)) code = static_cast<int>(StatusCode::kInternal);
    return Status(static_cast<StatusCode>(code), std::string(what) + ": " + message);
}

pyb::tuple ShapeOf(const Shape& s) {
    pyb::tuple t(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) t[i] = s[i];
    return t;
}

/// Host memory registered with the Python store's transfer engine (register_region), reused
/// by every batch and grown on demand: a batch's bytes move between it and the network
/// directly, with no copy through memory the engine does not know.
class RegisteredRegion {
public:
    /// At least `bytes` of it, registered. Needs the GIL (it calls the implementation).
    Status Reserve(pyb::object& impl, std::uint64_t bytes, PinnedHostPool* pool) {
        if (buffer_.size() >= bytes && buffer_.size() > 0) return Status::Ok();
        const std::uint64_t size = std::max<std::uint64_t>(
            {bytes, 2 * buffer_.size(), std::uint64_t{1} << 20});
        MCS_RETURN_IF_ERROR(Release(impl));
        auto buffer = pool ? pool->Allocate(size) : HostBuffer::Pageable(size);
        if (!buffer.ok()) return buffer.status();
        try {
            impl.attr("register_region")(reinterpret_cast<std::uintptr_t>(buffer->data()),
                                         buffer->size());
        } catch (pyb::error_already_set& e) {
            return StatusOf(e, "registering " + std::to_string(size) + " bytes of host memory");
        }
        buffer_ = std::move(buffer).value();
        return Status::Ok();
    }

    /// Unregisters and frees it. Needs the GIL.
    Status Release(pyb::object& impl) {
        if (buffer_.size() == 0) return Status::Ok();
        HostBuffer old = std::move(buffer_);
        buffer_ = HostBuffer();
        try {
            impl.attr("unregister_region")(reinterpret_cast<std::uintptr_t>(old.data()));
        } catch (pyb::error_already_set& e) {
            return StatusOf(e, "unregistering host memory");
        }
        return Status::Ok();
    }

    std::byte* data() const { return buffer_.data(); }
    bool pinned() const { return buffer_.pinned(); }

    std::mutex mu;  ///< One batch at a time uses it.

private:
    HostBuffer buffer_;
};

constexpr std::uint64_t kRegionAlign = 64;

std::uint64_t AlignUp(std::uint64_t n) { return (n + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }

bool IsTensorValue(const std::byte* data, std::uint64_t size) {
    std::uint32_t magic = 0;
    if (size < kTensorHeaderBytes) return false;
    std::memcpy(&magic, data, sizeof(magic));
    return magic == kTensorObjectMagic;
}

class PythonObjectStore final : public ObjectStore {
public:
    explicit PythonObjectStore(pyb::object impl) : impl_(std::move(impl)) {}

    ~PythonObjectStore() override {
        if (Py_IsInitialized()) {
            pyb::gil_scoped_acquire gil;
            (void)landing_.Release(impl_);
            (void)sending_.Release(impl_);
            impl_ = pyb::object();
        } else {
            impl_.release();  // The interpreter is gone: nothing left to decrement.
        }
    }

    Status Put(std::string_view key, std::string_view metadata,
               std::span<const MemberData> members, const PutOptions& options) override {
        MCS_RETURN_IF_ERROR(internal::ValidateObjectKey(key));
        for (std::size_t i = 0; i < members.size(); ++i) {
            MCS_RETURN_IF_ERROR(internal::ValidateMemberData(members[i]));
            for (std::size_t j = 0; j < i; ++j) {
                if (members[j].name == members[i].name) {
                    return InvalidArgument("duplicate member name '" + members[i].name + "'");
                }
            }
        }
        pyb::gil_scoped_acquire gil;
        try {
            pyb::list list;
            for (const MemberData& m : members) {
                list.append(pyb::make_tuple(m.name, std::string(DTypeName(m.dtype)),
                                            ShapeOf(m.shape),
                                            reinterpret_cast<std::uintptr_t>(m.bytes.data()),
                                            m.bytes.size(), m.checksum));
            }
            const char* mode = options.mode == PutMode::kCreate ? "create" : "upsert";
            pyb::bytes meta(metadata.data(), metadata.size());
            if (!options.listed && unlisted_puts_) {
                impl_.attr("put")(std::string(key), meta, list, mode, options.hard_pin,
                                  pyb::arg("listed") = false);
            } else {
                impl_.attr("put")(std::string(key), meta, list, mode, options.hard_pin);
            }
        } catch (pyb::error_already_set& e) {
            return StatusOf(e, "put '" + std::string(key) + "'");
        }
        return Status::Ok();
    }

    Result<ObjectInfo> Stat(std::string_view key) override {
        pyb::gil_scoped_acquire gil;
        try {
            pyb::tuple t = impl_.attr("stat")(std::string(key));
            ObjectInfo info;
            info.key = std::string(key);
            info.metadata = t[0].cast<std::string>();
            for (auto m : t[1].cast<pyb::list>()) {
                auto f = m.cast<pyb::tuple>();
                MemberInfo mi;
                mi.name = f[0].cast<std::string>();
                MCS_ASSIGN_OR_RETURN(mi.dtype, ParseDType(f[1].cast<std::string>()));
                for (auto e : f[2]) mi.shape.push_back(e.cast<Index>());
                mi.size_bytes = f[3].cast<std::uint64_t>();
                mi.checksum = f[4].cast<std::uint64_t>();
                info.members.push_back(std::move(mi));
            }
            info.version = t[2].cast<std::uint64_t>();
            info.hard_pinned = t[3].cast<bool>();
            return info;
        } catch (pyb::error_already_set& e) {
            return StatusOf(e, "stat '" + std::string(key) + "'");
        } catch (const pyb::cast_error& e) {
            return Internal("stat '" + std::string(key) + "': malformed answer: " + e.what());
        }
    }

    Status ReadMember(std::string_view key, std::string_view member,
                      std::span<std::byte> dst) override {
        pyb::gil_scoped_acquire gil;
        try {
            impl_.attr("read_member")(std::string(key), std::string(member),
                                      reinterpret_cast<std::uintptr_t>(dst.data()), dst.size());
        } catch (pyb::error_already_set& e) {
            return StatusOf(e, "read of member '" + std::string(member) + "' of '" +
                                   std::string(key) + "'");
        }
        return Status::Ok();
    }

    Status ReadRanges(std::span<const RangeRead> reads) override {
        if (reads.empty()) return Status::Ok();
        pyb::gil_scoped_acquire gil;
        try {
            pyb::list list;
            for (const RangeRead& r : reads) {
                list.append(pyb::make_tuple(std::string(r.key), std::string(r.member), r.row_start,
                                            r.row_end,
                                            reinterpret_cast<std::uintptr_t>(r.dst.data()),
                                            r.dst.size()));
            }
            impl_.attr("read_ranges")(list);
        } catch (pyb::error_already_set& e) {
            return StatusOf(e, "range reads");
        }
        return Status::Ok();
    }

    Status Remove(std::string_view key) override {
        pyb::gil_scoped_acquire gil;
        try {
            impl_.attr("remove")(std::string(key));
        } catch (pyb::error_already_set& e) {
            return StatusOf(e, "remove '" + std::string(key) + "'");
        }
        return Status::Ok();
    }

    Result<std::vector<std::string>> List(std::string_view prefix) override {
        pyb::gil_scoped_acquire gil;
        try {
            return impl_.attr("list")(std::string(prefix)).cast<std::vector<std::string>>();
        } catch (pyb::error_already_set& e) {
            return StatusOf(e, "list '" + std::string(prefix) + "'");
        }
    }

    Status ForgetDirectory(std::string_view prefix) override {
        pyb::gil_scoped_acquire gil;
        if (!pyb::hasattr(impl_, "forget_directory")) return Status::Ok();
        try {
            impl_.attr("forget_directory")(std::string(prefix));
        } catch (pyb::error_already_set& e) {
            return StatusOf(e, "forget_directory '" + std::string(prefix) + "'");
        }
        return Status::Ok();
    }

    StoreCounters Counters() const override {
        StoreCounters c;
        pyb::gil_scoped_acquire gil;
        try {
            pyb::dict d = impl_.attr("counters")();
            auto get = [&](const char* name) {
                return d.contains(name) ? d[name].cast<std::uint64_t>() : std::uint64_t{0};
            };
            c.puts = get("puts");
            c.bytes_put = get("bytes_put");
            c.member_gets = get("member_gets");
            c.member_bytes = get("member_bytes");
            c.range_reads = get("range_reads");
            c.range_bytes = get("range_bytes");
            c.removes = get("removes");
            c.local_views = get("local_views");
            c.remote_views = get("remote_views");
            c.remote_view_bytes = get("remote_view_bytes");
            c.batch_transfers = get("batch_transfers");
        } catch (pyb::error_already_set& e) {
            (void)StatusOf(e, "counters");
        }
        return c;
    }

    /// A batch of tensor objects (one `tensor` member, no metadata: upstream's own tensor value)
    /// is filled in registered memory and written with ONE put_tensors call (one network batch);
    /// anything else takes the staged path of the base class.
    Status PutFilled(std::span<const FilledPut> puts, const PutOptions& options,
                     const FillFn& fill, PinnedHostPool* host_pool) override {
        bool tensors = tensor_batches_ && !puts.empty();
        for (const FilledPut& p : puts) {
            tensors &= p.metadata.empty() && p.members.size() == 1 &&
                       p.members[0].name == kTensorMemberName;
        }
        if (!tensors) return ObjectStore::PutFilled(puts, options, fill, host_pool);
        std::vector<std::uint64_t> sizes(puts.size()), offsets(puts.size());
        std::uint64_t total = 0;
        for (std::size_t i = 0; i < puts.size(); ++i) {
            MCS_RETURN_IF_ERROR(internal::ValidateObjectKey(puts[i].key));
            for (std::size_t j = 0; j < i; ++j) {
                if (puts[j].key == puts[i].key) {
                    return InvalidArgument("key '" + std::string(puts[i].key.substr(0, 200)) +
                                           "' appears more than once in one batch");
                }
            }
            MCS_ASSIGN_OR_RETURN(sizes[i], internal::ValidateMemberSpec(puts[i].members[0]));
            offsets[i] = total;
            total += AlignUp(sizes[i]);
        }
        std::lock_guard lock(sending_.mu);
        {
            pyb::gil_scoped_acquire gil;
            MCS_RETURN_IF_ERROR(sending_.Reserve(impl_, total, host_pool));
            if (options.mode == PutMode::kCreate) {
                // Conflicts are found before any byte moves (one existence query per batch).
                std::vector<std::string> names;
                for (const FilledPut& p : puts) names.emplace_back(p.key);
                try {
                    impl_.attr("check_absent")(names);
                } catch (pyb::error_already_set& e) {
                    return StatusOf(e, "put of " + std::to_string(puts.size()) + " tensors");
                }
            }
        }
        std::vector<std::span<std::byte>> spans(puts.size());
        std::vector<FillTarget> targets(puts.size());
        for (std::size_t i = 0; i < puts.size(); ++i) {
            spans[i] = {sending_.data() + offsets[i], sizes[i]};
            targets[i] = {i, std::span<const std::span<std::byte>>(&spans[i], 1),
                          sending_.pinned()};
        }
        MCS_RETURN_IF_ERROR(fill(targets));
        pyb::gil_scoped_acquire gil;
        try {
            pyb::list keys, addresses, lengths;
            for (std::size_t i = 0; i < puts.size(); ++i) {
                keys.append(std::string(puts[i].key));
                addresses.append(reinterpret_cast<std::uintptr_t>(spans[i].data()));
                lengths.append(sizes[i]);
            }
            impl_.attr("put_tensors")(keys, addresses, lengths,
                                      options.mode == PutMode::kCreate ? "create" : "upsert",
                                      options.hard_pin);
        } catch (pyb::error_already_set& e) {
            return StatusOf(e, "put of " + std::to_string(puts.size()) + " tensors");
        }
        return Status::Ok();
    }

    /// Tensor values viewed from their chosen replica: in place when it is in this process's
    /// own segment, else read by ONE read_tensors call (one network batch) into registered
    /// memory. A key that holds anything but a tensor value takes the base class's path.
    Status ViewObjects(std::span<const std::string_view> keys, const ViewFn& fn,
                       PinnedHostPool* host_pool) override {
        if (!tensor_batches_ || keys.empty()) {
            return ObjectStore::ViewObjects(keys, fn, host_pool);
        }
        std::vector<std::string> unique;
        std::vector<std::size_t> slot(keys.size());
        for (std::size_t i = 0; i < keys.size(); ++i) {
            std::size_t k = 0;
            while (k < unique.size() && unique[k] != keys[i]) ++k;
            if (k == unique.size()) unique.emplace_back(keys[i]);
            slot[i] = k;
        }
        std::unique_lock lock(landing_.mu);
        std::vector<std::uint64_t> sizes(unique.size()), local(unique.size());
        std::vector<const std::byte*> data(unique.size());
        std::pair<std::uintptr_t, std::uintptr_t> segment{0, 0};  // pinned [begin, end)
        bool all_tensors = true;
        constexpr int kAttempts = 2;  // a value replaced between the lookup and the read: again
        for (int attempt = 0;; ++attempt) {
            pyb::gil_scoped_acquire gil;
            Status st = Locate(unique, sizes, local);
            std::uint64_t total = 0;
            pyb::list remote_keys, addresses, lengths;
            std::vector<std::uint64_t> offsets(unique.size(), 0);
            if (st.ok()) {
                for (std::size_t k = 0; k < unique.size(); ++k) {
                    if (local[k] != 0) continue;
                    offsets[k] = total;
                    total += AlignUp(sizes[k]);
                }
                if (total > 0) st = landing_.Reserve(impl_, total, host_pool);
            }
            if (st.ok() && total > 0) {
                try {
                    for (std::size_t k = 0; k < unique.size(); ++k) {
                        if (local[k] != 0) continue;
                        remote_keys.append(unique[k]);
                        addresses.append(
                            reinterpret_cast<std::uintptr_t>(landing_.data() + offsets[k]));
                        lengths.append(sizes[k]);
                    }
                    impl_.attr("read_tensors")(remote_keys, addresses, lengths);
                } catch (pyb::error_already_set& e) {
                    st = StatusOf(e, "read of " + std::to_string(pyb::len(remote_keys)) +
                                         " tensors");
                }
            }
            if (!st.ok()) {
                const bool raced = st.code() == StatusCode::kNotFound ||
                                   st.code() == StatusCode::kFailedPrecondition;
                if (raced && attempt + 1 < kAttempts) continue;
                if (st.code() == StatusCode::kFailedPrecondition) {
                    return Unavailable(st.message());
                }
                return st;
            }
            for (std::size_t k = 0; k < unique.size(); ++k) {
                data[k] = local[k] != 0 ? reinterpret_cast<const std::byte*>(local[k])
                                        : landing_.data() + offsets[k];
                all_tensors &= IsTensorValue(data[k], sizes[k]);
            }
            if (std::any_of(local.begin(), local.end(), [](std::uint64_t a) { return a != 0; })) {
                st = PinnedSegment(segment);
                if (!st.ok()) return st;
            }
            break;
        }
        if (!all_tensors) {
            lock.unlock();
            return ObjectStore::ViewObjects(keys, fn, host_pool);
        }
        std::vector<ObjectInfo> infos(unique.size());
        std::vector<std::span<const std::byte>> spans(unique.size());
        for (std::size_t k = 0; k < unique.size(); ++k) {
            infos[k].key = unique[k];
            infos[k].members.push_back({std::string(kTensorMemberName), DType::kUInt8,
                                        {static_cast<Index>(sizes[k])}, sizes[k], 0});
            infos[k].hard_pinned = true;
            spans[k] = {data[k], sizes[k]};
        }
        std::vector<ObjectView> views(keys.size());
        for (std::size_t i = 0; i < keys.size(); ++i) {
            const std::size_t k = slot[i];
            // A local replica is in this client's segment (pinned when the adapter mounted and
            // page-locked it); a remote one landed in the registered region (pinned when the
            // pool had room).
            const bool pinned = local[k] != 0
                                    ? local[k] >= segment.first && local[k] + sizes[k] <= segment.second
                                    : landing_.pinned();
            views[i] = {&infos[k], std::span<const std::span<const std::byte>>(&spans[k], 1),
                        pinned};
        }
        return fn(views);
    }

private:
    /// The address range of this client's segment when it is page-locked ({0, 0} when not, or
    /// when upstream allocated it). Needs the GIL.
    Status PinnedSegment(std::pair<std::uintptr_t, std::uintptr_t>& out) {
        out = {0, 0};
        if (!pyb::hasattr(impl_, "segment_region")) return Status::Ok();
        try {
            pyb::object r = impl_.attr("segment_region")();
            if (r.is_none()) return Status::Ok();
            auto [address, bytes, pinned] = r.cast<std::tuple<std::uintptr_t, std::uint64_t, bool>>();
            if (pinned) out = {address, address + bytes};
        } catch (pyb::error_already_set& e) {
            return StatusOf(e, "segment_region");
        } catch (const pyb::cast_error& e) {
            return Internal(std::string("segment_region must return (address, bytes, pinned): ") +
                            e.what());
        }
        return Status::Ok();
    }

    /// sizes[k] and, for a replica in this process, its address (local[k]; 0: another node's).
    /// Needs the GIL.
    Status Locate(const std::vector<std::string>& keys, std::vector<std::uint64_t>& sizes,
                  std::vector<std::uint64_t>& local) {
        try {
            pyb::list found = impl_.attr("locate_tensors")(keys);
            if (pyb::len(found) != keys.size()) {
                return Internal("locate_tensors answered " + std::to_string(pyb::len(found)) +
                                " items for " + std::to_string(keys.size()) + " keys");
            }
            for (std::size_t k = 0; k < keys.size(); ++k) {
                auto t = found[k].cast<pyb::tuple>();
                sizes[k] = t[0].cast<std::uint64_t>();
                local[k] = t[1].cast<std::uint64_t>();
            }
        } catch (pyb::error_already_set& e) {
            return StatusOf(e, "lookup of " + std::to_string(keys.size()) + " tensors");
        } catch (const pyb::cast_error& e) {
            return Internal(std::string("locate_tensors: malformed answer: ") + e.what());
        }
        return Status::Ok();
    }

    pyb::object impl_;
    /// The implementation takes batches of tensor values (put_tensors, locate_tensors,
    /// read_tensors, check_absent, register_region, unregister_region).
    const bool tensor_batches_ = pyb::hasattr(impl_, "tensor_batches");
    RegisteredRegion landing_;  ///< Remote replicas land here.
    RegisteredRegion sending_;  ///< Tensor batches are filled here and sent from here.
    /// The implementation takes put(..., listed=False) (it says so with supports_unlisted).
    const bool unlisted_puts_ = pyb::hasattr(impl_, "supports_unlisted");
};

}  // namespace

std::shared_ptr<ObjectStore> MakePythonObjectStore(pyb::object impl) {
    for (const char* name : {"put", "stat", "read_member", "read_ranges", "remove", "list", "counters"}) {
        if (!pyb::hasattr(impl, name)) {
            ThrowIfError(InvalidArgument(std::string("object store implementation lacks '") +
                                         name + "'"));
        }
    }
    return std::make_shared<PythonObjectStore>(std::move(impl));
}

}  // namespace mooncake::sparse::py
