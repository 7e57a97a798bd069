// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Every read of a source decodes this metadata (a manifest entry, then the stored object it
// names), and every commit encodes it: at 70,000 sources per step it is on the per-object fixed
// cost of both paths, so it is written and parsed with RapidJSON (in place, no DOM of maps).
// Keys are written in sorted order, as earlier versions of this file wrote them.

// GCC 12 reports a false -Wrestrict inside std::string operator+ inlined from contracts.h
// (Generation::ToString, via SourceDescriptor::Make); GCC bug 105329. The
// diagnostic is located in <string>, so this must come before any include.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include "codec/object_metadata.h"

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace mooncake::sparse {
namespace {

template <typename Writer>
void Key(Writer& w, std::string_view k) { w.Key(k.data(), static_cast<rapidjson::SizeType>(k.size())); }
template <typename Writer>
void String(Writer& w, std::string_view s) {
    w.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
}

template <typename Writer>
void IntArray(Writer& w, std::span<const Index> v) {
    w.StartArray();
    for (Index e : v) w.Int64(e);
    w.EndArray();
}

template <typename Writer>
void Member(Writer& w, std::string_view name, DType dtype, std::initializer_list<std::uint64_t> shape,
            std::uint64_t checksum) {
    Key(w, name);
    w.StartObject();
    Key(w, "checksum");
    w.Uint64(checksum);
    Key(w, "dtype");
    String(w, DTypeName(dtype));
    Key(w, "shape");
    w.StartArray();
    for (std::uint64_t e : shape) w.Uint64(e);
    w.EndArray();
    w.EndObject();
}

// The parse of one metadata text: a document whose allocators start in buffers of its own, so
// that a typical object's metadata parses without a heap allocation. It parses a NUL-terminated
// copy of the text in place (RapidJSON's in-situ mode: strings are not copied out, and the
// input is read through a plain pointer, not a bounds-checked stream), about twice as fast.
// Anything but white space after the document is an error, and so is a NUL anywhere in the
// text (which would end an in-situ parse early; JSON has no place for one).
class Parsed {
public:
    explicit Parsed(std::string_view text)
        : values_(value_buffer_.data(), value_buffer_.size()),
          stack_(stack_buffer_.data(), stack_buffer_.size()),
          doc_(&values_, 1024, &stack_) {
        if (std::memchr(text.data(), '\0', text.size()) != nullptr) return;
        char* copy = text_buffer_.data();
        if (text.size() >= text_buffer_.size()) {
            large_text_.assign(text.size() + 1, '\0');
            copy = large_text_.data();
        }
        std::memcpy(copy, text.data(), text.size());
        copy[text.size()] = '\0';
        doc_.ParseInsitu(copy);
        ok_ = !doc_.HasParseError() && doc_.IsObject();
    }
    Parsed(const Parsed&) = delete;
    Parsed& operator=(const Parsed&) = delete;
    bool ok() const { return ok_; }
    const rapidjson::Value& root() const { return doc_; }

private:
    using Allocator = rapidjson::MemoryPoolAllocator<>;
    std::array<char, 2048> text_buffer_;  ///< The text, parsed in place (strings point into it).
    std::string large_text_;              ///< Where a longer text is parsed.
    std::array<char, 8192> value_buffer_;
    std::array<char, 2048> stack_buffer_;
    Allocator values_;
    Allocator stack_;
    rapidjson::GenericDocument<rapidjson::UTF8<>, Allocator, Allocator> doc_;
    bool ok_ = false;
};

const rapidjson::Value* Field(const rapidjson::Value& obj, std::string_view name) {
    auto it = obj.FindMember(
        rapidjson::Value(rapidjson::StringRef(name.data(), static_cast<rapidjson::SizeType>(name.size()))));
    return it == obj.MemberEnd() ? nullptr : &it->value;
}

Result<Shape> ShapeFromJson(const rapidjson::Value& j, std::string_view what) {
    if (!j.IsArray()) return InvalidArgument(std::string(what) + " is not an array");
    Shape s;
    s.reserve(j.Size());
    for (const auto& e : j.GetArray()) {
        if (!e.IsInt64()) return InvalidArgument(std::string(what) + " has a non-integer");
        s.push_back(e.GetInt64());
    }
    return s;
}

/// The metadata of an object: the one writer of both EncodeObjectMetadata and
/// IsMetadataOf, so that what one writes the other compares.
template <typename Writer>
void WriteMetadata(Writer& w, const SourceDescriptor& d, std::string_view coordinate_space,
                   const MemberChecksums& c) {
    w.StartObject();
    Key(w, "apply");
    String(w, ApplyModeName(d.apply));
    Key(w, "base_generation");
    w.Uint64(d.generation.base);
    Key(w, "coordinate_space");
    String(w, coordinate_space);
    Key(w, "delta_generation");
    w.Uint64(d.generation.delta);
    Key(w, "global_offset");
    IntArray(w, d.box.origin());
    Key(w, "global_shape");
    IntArray(w, d.global_shape);
    Key(w, "index_dtype");
    String(w, DTypeName(d.index_dtype));
    Key(w, "local_shape");
    IntArray(w, d.box.shape());
    Key(w, "members");
    w.StartObject();
    Member(w, "indices", d.index_dtype, {d.nnz, d.rank()}, c.indices);
    Member(w, "tile_coords", DType::kUInt32, {d.num_tiles, d.rank()}, c.tile_coords);
    Member(w, "tile_ptr", DType::kUInt64, {d.num_tiles + 1}, c.tile_ptr);
    Member(w, "values", d.value_dtype, {d.nnz}, c.values);
    w.EndObject();
    Key(w, "nnz");
    w.Uint64(d.nnz);
    Key(w, "num_tiles");
    w.Uint64(d.num_tiles);
    Key(w, "placement_policy");
    String(w, d.policy.ToString());
    Key(w, "schema");
    String(w, kSparseObjectSchema);
    Key(w, "source_placement");
    w.StartObject();
    for (const auto& [axis, ordinal] : d.placement.entries()) {
        Key(w, axis);
        w.Int64(ordinal);
    }
    w.EndObject();
    Key(w, "tensor_id");
    String(w, d.tensor_id);
    Key(w, "tile_shape");
    IntArray(w, d.tile_shape);
    Key(w, "value_dtype");
    String(w, DTypeName(d.value_dtype));
    Key(w, "version");
    w.Int(kSparseObjectVersion);
    w.EndObject();
}

/// A RapidJSON output stream that compares what is written with an expected text.
class CompareStream {
public:
    using Ch = char;
    explicit CompareStream(std::string_view expected) : p_(expected.data()), end_(p_ + expected.size()) {}
    void Put(char c) {
        if (p_ == end_ || *p_ != c) {
            same_ = false;
            p_ = end_;
            return;
        }
        ++p_;
    }
    void Flush() {}
    bool Same() const { return same_ && p_ == end_; }

private:
    const char* p_;
    const char* end_;
    bool same_ = true;
};

/// Writes what RapidJSON's Writer writes for the calls WriteMetadata makes (no white space,
/// integers in decimal, strings in quotes), with plain copies into a buffer: several times
/// faster, and the metadata of every object of a step is written (commit) or compared (read).
/// A string that Writer would escape (a quote, a backslash, a control character) is not
/// written: then `escaped()` is set and the caller uses Writer instead.
class PlainWriter {
public:
    explicit PlainWriter(std::string& out) : out_(out) {}

    bool StartObject() { return Open('{'); }
    bool EndObject(rapidjson::SizeType = 0) { return Close('}'); }
    bool StartArray() { return Open('['); }
    bool EndArray(rapidjson::SizeType = 0) { return Close(']'); }
    bool Key(const char* s, rapidjson::SizeType n) {
        Separate();
        Quoted(s, n);
        out_ += ':';
        key_ = true;
        return true;
    }
    bool String(const char* s, rapidjson::SizeType n) {
        Prefix();
        Quoted(s, n);
        return true;
    }
    bool Uint64(std::uint64_t v) { return Number(v); }
    bool Int64(std::int64_t v) { return Number(v); }
    bool Int(int v) { return Number(v); }

    bool escaped() const { return escaped_; }

private:
    bool Open(char c) {
        Prefix();
        out_ += c;
        first_[++depth_] = true;  // WriteMetadata nests four deep
        return true;
    }
    bool Close(char c) {
        out_ += c;
        --depth_;
        return true;
    }
    /// Before a key: a comma unless it is its object's first.
    void Separate() {
        if (depth_ == 0) return;
        if (!first_[depth_]) out_ += ',';
        first_[depth_] = false;
    }
    /// Before a value: nothing after a key; a comma between array elements.
    void Prefix() {
        if (key_) {
            key_ = false;
            return;
        }
        Separate();
    }
    void Quoted(const char* s, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) {
            const auto c = static_cast<unsigned char>(s[i]);
            if (c < 0x20 || c == '"' || c == '\\') escaped_ = true;
        }
        out_ += '"';
        out_.append(s, n);
        out_ += '"';
    }
    template <typename T>
    bool Number(T v) {
        Prefix();
        char buf[24];
        const auto r = std::to_chars(buf, buf + sizeof(buf), v);
        out_.append(buf, r.ptr);
        return true;
    }

    std::string& out_;
    /// Per open object or array (from 1): nothing written in it yet.
    std::array<bool, 8> first_{};
    std::size_t depth_ = 0;
    bool key_ = false;         ///< A key was written: its value comes next.
    bool escaped_ = false;
};

/// The metadata text by PlainWriter into `out`; false when a string needs escaping.
bool WritePlain(std::string& out, const SourceDescriptor& d, std::string_view coordinate_space,
                const MemberChecksums& c) {
    out.clear();
    PlainWriter w(out);
    WriteMetadata(w, d, coordinate_space, c);
    return !w.escaped();
}

}  // namespace

std::string EncodeObjectMetadata(const SparseObject& o) {
    const MemberChecksums c{o.checksum_indices, o.checksum_values, o.checksum_tile_coords,
                            o.checksum_tile_ptr};
    std::string out;
    out.reserve(768);
    if (WritePlain(out, o.desc, o.coordinate_space, c)) return out;
    rapidjson::StringBuffer buffer(nullptr, 1024);
    rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
    WriteMetadata(w, o.desc, o.coordinate_space,
                  {o.checksum_indices, o.checksum_values, o.checksum_tile_coords,
                   o.checksum_tile_ptr});
    return std::string(buffer.GetString(), buffer.GetSize());
}

bool IsMetadataOf(std::string_view text, const SourceDescriptor& d,
                  std::string_view coordinate_space, const MemberChecksums& checksums) {
    // Written into a buffer of this thread's (no allocation once it has grown) and compared.
    thread_local std::string plain;
    if (WritePlain(plain, d, coordinate_space, checksums)) return plain == text;
    CompareStream out(text);
    // The writer's level stack lives in a buffer of its own: no heap allocation per check.
    alignas(std::max_align_t) std::array<char, 1024> stack_buffer;
    rapidjson::MemoryPoolAllocator<> stack(stack_buffer.data(), stack_buffer.size());
    rapidjson::Writer<CompareStream, rapidjson::UTF8<>, rapidjson::UTF8<>,
                      rapidjson::MemoryPoolAllocator<>>
        w(out, &stack);
    WriteMetadata(w, d, coordinate_space, checksums);
    return out.Same();
}

Result<SourceDescriptor> DecodeObjectMetadata(std::string_view source_ref, std::string_view text) {
    const Parsed parsed(text);
    if (!parsed.ok()) {
        return InvalidArgument("metadata of " + std::string(source_ref) + " is not a JSON object");
    }
    const rapidjson::Value& j = parsed.root();
    const auto bad = [&](std::string_view why) {
        return InvalidArgument("metadata of " + std::string(source_ref) + ": " + std::string(why));
    };
    constexpr std::array<std::string_view, 16> kRequired = {
        "schema", "version", "tensor_id", "global_shape", "global_offset", "local_shape",
        "base_generation", "delta_generation", "source_placement", "placement_policy",
        "tile_shape", "nnz", "num_tiles", "apply", "index_dtype", "value_dtype"};
    std::array<const rapidjson::Value*, kRequired.size()> f{};
    for (std::size_t i = 0; i < kRequired.size(); ++i) {
        f[i] = Field(j, kRequired[i]);
        if (f[i] == nullptr) {
            return InvalidArgument("metadata of " + std::string(source_ref) + " lacks '" +
                                   std::string(kRequired[i]) + "'");
        }
    }
    const auto& [schema, version, tensor_id, global_shape, global_offset, local_shape, base, delta,
                 placement, policy, tile_shape, nnz, num_tiles, apply, index_dtype, value_dtype] = f;
    const auto str = [](const rapidjson::Value* v) {
        return std::string_view(v->GetString(), v->GetStringLength());
    };
    if (!schema->IsString() || str(schema) != kSparseObjectSchema || !version->IsInt() ||
        version->GetInt() != kSparseObjectVersion) {
        return InvalidArgument(std::string(source_ref) + " is not a mooncake.sparse_object v1");
    }
    for (const rapidjson::Value* v : {tensor_id, policy, apply, index_dtype, value_dtype}) {
        if (!v->IsString()) return bad("a string field is not a string");
    }
    for (const rapidjson::Value* v : {base, delta, nnz, num_tiles}) {
        if (!v->IsUint64()) return bad("a count or generation is not an unsigned integer");
    }
    if (!placement->IsObject()) return bad("source_placement is not an object");
    SourceDescriptor d;
    d.source_ref = std::string(source_ref);
    d.tensor_id = std::string(str(tensor_id));
    MCS_ASSIGN_OR_RETURN(d.global_shape, ShapeFromJson(*global_shape, "global_shape"));
    MCS_ASSIGN_OR_RETURN(Shape offset, ShapeFromJson(*global_offset, "global_offset"));
    MCS_ASSIGN_OR_RETURN(Shape local, ShapeFromJson(*local_shape, "local_shape"));
    MCS_ASSIGN_OR_RETURN(d.box, Box::Make(offset, local));
    d.generation = {base->GetUint64(), delta->GetUint64()};
    std::vector<NamedAxes::Entry> axes;
    for (const auto& m : placement->GetObject()) {
        if (!m.value.IsInt64()) return bad("a source_placement ordinal is not an integer");
        axes.emplace_back(std::string(m.name.GetString(), m.name.GetStringLength()),
                          m.value.GetInt64());
    }
    MCS_ASSIGN_OR_RETURN(d.placement, NamedAxes::Make(std::move(axes)));
    MCS_ASSIGN_OR_RETURN(d.policy, PlacementPolicy::Parse(std::string(str(policy))));
    MCS_ASSIGN_OR_RETURN(d.tile_shape, ShapeFromJson(*tile_shape, "tile_shape"));
    d.nnz = nnz->GetUint64();
    d.num_tiles = num_tiles->GetUint64();
    MCS_ASSIGN_OR_RETURN(d.apply, ParseApplyMode(std::string(str(apply))));
    MCS_ASSIGN_OR_RETURN(d.index_dtype, ParseDType(std::string(str(index_dtype))));
    MCS_ASSIGN_OR_RETURN(d.value_dtype, ParseDType(std::string(str(value_dtype))));
    return SourceDescriptor::Make(std::move(d));
}

}  // namespace mooncake::sparse
