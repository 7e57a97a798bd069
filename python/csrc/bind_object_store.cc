// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Binding of the raw ObjectStore (object_store_handle.h) shared by both backends.
#include <pybind11/stl.h>

#include "bind_common.h"
#include "codec/codec.h"
#include "object_store_handle.h"
#include "store/pinned_memory.h"

namespace mooncake::sparse::py {
namespace {

PutMode ParseMode(const std::string& mode) {
    if (mode == "create") return PutMode::kCreate;
    if (mode == "upsert") return PutMode::kUpsert;
    ThrowIfError(InvalidArgument("mode must be 'create' or 'upsert', got '" + mode + "'"));
    return PutMode::kCreate;
}

pyb::dict InfoDict(const ObjectInfo& info) {
    pyb::dict d;
    d["key"] = info.key;
    d["metadata"] = pyb::bytes(info.metadata);
    d["version"] = info.version;
    d["hard_pinned"] = info.hard_pinned;
    pyb::list members;
    for (const MemberInfo& m : info.members) {
        pyb::dict md;
        md["name"] = m.name;
        md["dtype"] = std::string(DTypeName(m.dtype));
        md["shape"] = ShapeTuple(m.shape);
        md["size_bytes"] = m.size_bytes;
        md["checksum"] = m.checksum;
        members.append(md);
    }
    d["members"] = members;
    return d;
}

}  // namespace

void RegisterObjectStore(pyb::module_& m) {
    pyb::class_<ObjectStoreHandle>(m, "_ObjectStore", "The raw structured-object store.")
        .def(
            "put",
            [](ObjectStoreHandle& h, const std::string& key, const pyb::dict& members,
               const pyb::bytes& metadata, const std::string& mode, bool hard_pin,
               bool checksum) {
                std::vector<BorrowedArray> arrays;
                std::vector<MemberData> data;
                for (auto [name, value] : members) {
                    arrays.push_back(Borrow(value, "member"));
                }
                std::size_t i = 0;
                for (auto [name, value] : members) {
                    const BorrowedArray& a = arrays[i++];
                    Shape shape = a.shape.empty() ? Shape{1} : a.shape;
                    data.push_back({name.cast<std::string>(), a.dtype, shape,
                                    {a.data, a.nbytes}, 0});
                }
                const std::string meta = metadata;
                const PutOptions options{ParseMode(mode), hard_pin};
                Status s;
                {
                    pyb::gil_scoped_release nogil;
                    if (checksum) {
                        for (MemberData& d : data) d.checksum = Checksum(d.bytes);
                    }
                    s = h.store->Put(key, meta, data, options);
                }
                ThrowIfError(s);
            },
            pyb::arg("key"), pyb::arg("members"), pyb::arg("metadata") = pyb::bytes(),
            pyb::arg("mode") = "create", pyb::arg("hard_pin") = false,
            pyb::arg("checksum") = false)
        .def(
            "read_into",
            [](ObjectStoreHandle& h, const std::string& key, const std::string& member,
               const pyb::object& out) {
                // Into a caller array (exactly the member's bytes): no allocation per read.
                BorrowedArray dst = BorrowContiguousOut(out, "out");
                Status s;
                {
                    pyb::gil_scoped_release nogil;
                    s = h.store->ReadMember(key, member, {dst.data, dst.nbytes});
                }
                ThrowIfError(s);
            },
            pyb::arg("key"), pyb::arg("member"), pyb::arg("out"))
        .def(
            "get",
            [](ObjectStoreHandle& h, const std::string& key) {
                // Stat then one read per member: a concurrent upsert may change the object in
                // between (the reads then fail cleanly or return the new version's bytes); use
                // the checksums from the returned info to check what was read.
                Result<ObjectInfo> info = Internal("unset");
                std::vector<std::vector<std::byte>> bufs;
                Status s;
                {
                    pyb::gil_scoped_release nogil;
                    info = h.store->Stat(key);
                    if (info.ok()) {
                        for (const MemberInfo& mi : info->members) {
                            bufs.emplace_back(mi.size_bytes);
                            s = h.store->ReadMember(key, mi.name, bufs.back());
                            if (!s.ok()) break;
                        }
                    }
                }
                ObjectInfo i = ValueOrThrow(std::move(info));
                ThrowIfError(s);
                pyb::dict members;
                for (std::size_t k = 0; k < i.members.size(); ++k) {
                    const MemberInfo& mi = i.members[k];
                    members[pyb::str(mi.name)] = ToNumpy(std::move(bufs[k]), mi.dtype, mi.shape);
                }
                return pyb::make_tuple(InfoDict(i), members);
            },
            pyb::arg("key"))
        .def(
            "stat",
            [](ObjectStoreHandle& h, const std::string& key) {
                Result<ObjectInfo> info = Internal("unset");
                {
                    pyb::gil_scoped_release nogil;
                    info = h.store->Stat(key);
                }
                return InfoDict(ValueOrThrow(std::move(info)));
            },
            pyb::arg("key"))
        .def(
            "remove",
            [](ObjectStoreHandle& h, const std::string& key) {
                Status s;
                {
                    pyb::gil_scoped_release nogil;
                    s = h.store->Remove(key);
                }
                ThrowIfError(s);
            },
            pyb::arg("key"))
        .def(
            "list",
            [](ObjectStoreHandle& h, const std::string& prefix) {
                Result<std::vector<std::string>> keys = Internal("unset");
                {
                    pyb::gil_scoped_release nogil;
                    keys = h.store->List(prefix);
                }
                return ValueOrThrow(std::move(keys));
            },
            pyb::arg("prefix") = "")
        .def("checksum", [](ObjectStoreHandle&, const pyb::object& array) {
            BorrowedArray a = Borrow(array, "array");
            return Checksum({a.data, a.nbytes});
        });

    // Host memory this process did not allocate with the pinned pool (an upstream store's
    // segment, mapped by upstream) page-locked for the CUDA copy engine, for as long as the
    // handle is open.
    struct PinnedHostRange {
        PinnedRegion region;
        std::uintptr_t address = 0;
    };
    pyb::class_<PinnedHostRange>(
        m, "_PinnedHostRange",
        "_PinnedHostRange(address, nbytes): cudaHostRegister of host memory mapped in this "
        "process until close(). Raises Unimplemented without CUDA, Unavailable when the driver "
        "refuses.")
        .def(pyb::init([](std::uintptr_t address, std::uint64_t nbytes) {
                 if (address == 0 || nbytes == 0) {
                     ThrowIfError(InvalidArgument("a pinned host range needs an address and bytes"));
                 }
                 Result<PinnedRegion> r = Internal("unset");
                 {
                     pyb::gil_scoped_release nogil;
                     r = PinnedRegion::Register(reinterpret_cast<void*>(address), nbytes);
                 }
                 return PinnedHostRange{ValueOrThrow(std::move(r)), address};
             }),
             pyb::arg("address"), pyb::arg("nbytes"))
        .def_property_readonly("nbytes", [](const PinnedHostRange& p) { return p.region.size(); })
        .def_property_readonly("address", [](const PinnedHostRange& p) { return p.address; })
        .def("close", [](PinnedHostRange& p) {
            pyb::gil_scoped_release nogil;
            p.region = PinnedRegion();
        });
}

}  // namespace mooncake::sparse::py
