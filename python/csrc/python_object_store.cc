// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "python_object_store.h"

#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "arrays.h"

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

class PythonObjectStore final : public ObjectStore {
public:
    explicit PythonObjectStore(pyb::object impl) : impl_(std::move(impl)) {}

    ~PythonObjectStore() override {
        if (Py_IsInitialized()) {
            pyb::gil_scoped_acquire gil;
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
        } catch (pyb::error_already_set& e) {
            (void)StatusOf(e, "counters");
        }
        return c;
    }

private:
    pyb::object impl_;
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
