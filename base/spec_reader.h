// How a registry entry reads its configuration keys, and holds them.
//
// SpecReader reads keys by full path ("model.layers.3.units"); the config reader implements it
// over the YAML file (knowing where each key came from for its messages), FieldsReader over
// (key, value text) pairs, so that code and tests can build an entry's keys through the same
// reader the config uses. Options is the interface every entry's own keys struct implements:
// the holder (a layer spec, the optimizer's or the loss's config, the data config) keeps a
// pointer to it, never a union of every entry's keys.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "base/error.h"

namespace mirrored {

class SpecReader {
public:
    virtual ~SpecReader() = default;
    virtual int64_t integer(const std::string& path, int64_t def, int64_t lo, int64_t hi) = 0;
    virtual double number(const std::string& path, double def, double lo, double hi) = 0;
    virtual double number_above(const std::string& path, double def, double lo, double hi) = 0;  // (lo, hi]
    virtual bool boolean(const std::string& path, bool def) = 0;
    virtual std::string choice(const std::string& path, const std::string& def,
                               const std::vector<std::string>& allowed) = 0;
    virtual std::string text(const std::string& path, const std::string& def) = 0;  // any scalar
    virtual std::string nonempty_text(const std::string& path, const std::string& def) = 0;
    // A scalar or a list of non-empty strings; {} when absent.
    virtual std::vector<std::string> text_list(const std::string& path) = 0;
    // A non-empty list of integers in [lo, hi]; def when absent.
    virtual std::vector<int> integer_list(const std::string& path, const std::vector<int>& def, int lo, int hi) = 0;
    // A non-empty list of numbers; {} when absent.
    virtual std::vector<double> number_list(const std::string& path) = 0;
    virtual size_t list_size(const std::string& path) = 0;
    virtual void expect_map(const std::string& path) = 0;
    virtual bool has(const std::string& path) = 0;  // present with a value
    [[noreturn]] virtual void fail(const std::string& path, const std::string& what) = 0;
};

// (key, value) pairs in the order a config lists them: a scalar's text; a list in YAML's flow form
// (yaml_list); a key of a nested mapping dotted ("train.file" for train: {file: ...}).
using Fields = std::vector<std::pair<std::string, std::string>>;
// ["a", "b"] as a Fields value: items plain where YAML reads them back as written, else quoted.
std::string yaml_list(const std::vector<std::string>& items);

// One entry's keys. fields() writes them back (--print-config, summaries, checkpoints' model
// description); equals() compares two configurations.
class Options {
public:
    virtual ~Options() = default;
    virtual Fields fields() const = 0;
    virtual bool equals(const Options& other) const = 0;
};
using OptionsPtr = std::shared_ptr<const Options>;

// The usual implementation: a struct of plain values with a defaulted operator==.
template <typename Self>
class OptionsOf : public Options {
public:
    bool equals(const Options& other) const override {
        const auto* o = dynamic_cast<const Self*>(&other);
        return o && *o == static_cast<const Self&>(*this);
    }
    bool operator==(const OptionsOf&) const { return true; }  // so that Self's == may be defaulted
};

// The options of an entry that has no keys of its own.
struct NoOptions final : OptionsOf<NoOptions> {
    Fields fields() const override { return {}; }
    bool operator==(const NoOptions&) const = default;
};
inline OptionsPtr read_no_options(SpecReader&, const std::string&) { return std::make_shared<NoOptions>(); }

inline bool same_options(const OptionsPtr& a, const OptionsPtr& b) {
    if (!a || !b) return !a && !b;
    return a->equals(*b);
}

// The options an entry read, as its own type (a programming error, not a user's, if it is not).
template <typename T>
const T& options_as(const Options* p) {
    const auto* t = dynamic_cast<const T*>(p);
    if (!t) throw Error(kExitFailure, std::string("options of the wrong kind: expected ") + typeid(T).name());
    return *t;
}
template <typename T>
const T& options_as(const OptionsPtr& p) {
    return options_as<T>(p.get());
}
template <typename T>
const T& options_as(const Options& o) {
    return options_as<T>(&o);
}

// A SpecReader over (key, value text) pairs under `prefix` ("prefix.key"): scalars as YAML writes
// them, lists in flow form ("[1, 2]"). Every pair must be read: finish() throws for one that was not.
class FieldsReader final : public SpecReader {
public:
    FieldsReader(std::string prefix, Fields fields) : prefix_(std::move(prefix)), fields_(std::move(fields)) {}

    int64_t integer(const std::string& path, int64_t def, int64_t lo, int64_t hi) override;
    double number(const std::string& path, double def, double lo, double hi) override;
    double number_above(const std::string& path, double def, double lo, double hi) override;
    bool boolean(const std::string& path, bool def) override;
    std::string choice(const std::string& path, const std::string& def,
                       const std::vector<std::string>& allowed) override;
    std::string text(const std::string& path, const std::string& def) override;
    std::string nonempty_text(const std::string& path, const std::string& def) override;
    std::vector<std::string> text_list(const std::string& path) override;
    std::vector<int> integer_list(const std::string& path, const std::vector<int>& def, int lo, int hi) override;
    std::vector<double> number_list(const std::string& path) override;
    size_t list_size(const std::string& path) override;
    void expect_map(const std::string&) override {}
    bool has(const std::string& path) override { return value(path) != nullptr; }
    [[noreturn]] void fail(const std::string& path, const std::string& what) override { throw ConfigError(path, what); }
    // Every pair was read (ConfigError naming the first that was not).
    void finish() const;

private:
    const std::string* value(const std::string& path);
    std::vector<std::string> items(const std::string& path);
    std::string prefix_;
    Fields fields_;
    std::set<std::string> read_;
};

}  // namespace mirrored
