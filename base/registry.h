// One pattern for every pluggable kind (layer types, losses, optimizers, cross-device ops, data
// formats, device backends): an entry is a struct whose first member is its `name`, plus what
// the kind needs (read its keys, create the thing); a registry lists every entry of one kind in
// one place, so a name lives in exactly one spot, and an unknown name is a ConfigError that
// lists the known ones. The lists are explicit rather than filled by static constructors: a
// static library drops object files nothing refers to, entries and all.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace mirrored {

template <typename Entry>
class Registry {
public:
    // what: the kind, for messages ("layer type", "loss").
    Registry(const char* what, std::initializer_list<const Entry*> entries) : what_(what), entries_(entries) {}

    const std::vector<const Entry*>& entries() const { return entries_; }
    const Entry* find(std::string_view name) const {
        for (const Entry* e : entries_)
            if (name == e->name) return e;
        return nullptr;
    }
    // The entry, or a ConfigError at `key` (empty: no key) naming the known ones.
    const Entry& get(const std::string& name, const std::string& key = "") const {
        if (const Entry* e = find(name)) return *e;
        const std::string what = "unknown " + std::string(what_) + " '" + name + "' (known: " + names_text() + ")";
        if (key.empty()) throw ConfigError(what);
        throw ConfigError(key, what);
    }
    std::vector<std::string> names() const {
        std::vector<std::string> v;
        for (const Entry* e : entries_) v.emplace_back(e->name);
        return v;
    }
    std::string names_text(const char* separator = ", ") const {
        std::string s;
        for (const Entry* e : entries_) s += (s.empty() ? "" : separator) + std::string(e->name);
        return s;
    }

private:
    const char* what_;
    std::vector<const Entry*> entries_;
};

}  // namespace mirrored
