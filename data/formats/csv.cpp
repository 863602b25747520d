// csv: a table per split, features in columns and the label in one column (class indexes) or in
// several (float targets, when the loss reads targets), with or without a header row.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include "data/datasets.h"
#include "data/formats/reading.h"

namespace mirrored {

namespace {

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
}

// A field as spreadsheets quote it ("label", "0.5") without its quotes.
std::string_view unquote(std::string_view f) {
    return f.size() >= 2 && f.front() == '"' && f.back() == '"' ? f.substr(1, f.size() - 2) : f;
}

// The fields of a line into `out` (reused from line to line: no allocation per row).
void split(std::string_view line, char delim, std::vector<std::string_view>& out) {
    out.clear();
    size_t start = 0;
    for (;;) {
        const size_t pos = line.find(delim, start);
        out.push_back(
            unquote(trim(line.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start))));
        if (pos == std::string_view::npos) break;
        start = pos + 1;
    }
}

// A number in float range; one too small for a float (1e-50) is 0, as a float cannot say better.
enum class Parsed { ok, not_a_number, too_large };
Parsed parse_number(std::string_view s, float& v) {
    if (s.empty()) return Parsed::not_a_number;
    if (s.front() == '+') s.remove_prefix(1);
    double d = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), d);
    if (r.ptr != s.data() + s.size() || (r.ec != std::errc() && r.ec != std::errc::result_out_of_range))
        return Parsed::not_a_number;
    if (r.ec == std::errc::result_out_of_range) {  // beyond a double: tiny (to 0) or huge, by its exponent
        const size_t e = s.find_first_of("eE");
        if (e != std::string_view::npos && e + 1 < s.size() && s[e + 1] == '-') {
            v = 0.0f;
            return Parsed::ok;
        }
        return Parsed::too_large;
    }
    if (!std::isfinite(d)) return Parsed::not_a_number;  // "nan", "inf"
    if (std::fabs(d) > double(std::numeric_limits<float>::max())) return Parsed::too_large;
    v = float(d);
    return Parsed::ok;
}
bool parse_float(std::string_view s, float& v) { return parse_number(s, v) == Parsed::ok; }

// Printable form of a field for an error message: control bytes escaped, long fields cut.
std::string shown(std::string_view f) { return shown_text(f, 40); }

bool all_numbers(const std::vector<std::string_view>& fields) {
    float v;
    return std::all_of(fields.begin(), fields.end(), [&](std::string_view f) { return parse_float(f, v); });
}

// One label column by index or header name.
size_t find_column(const std::string& want, const std::vector<std::string>& header, size_t columns,
                   const std::string& path) {
    if (want.empty()) throw DataError(path + ": a label column's name is empty");
    if (std::all_of(want.begin(), want.end(), ::isdigit)) {
        const size_t col = want.size() > 9 ? columns : std::stoul(want);
        if (col >= columns)
            throw DataError(path + ": label column index " + want + " is out of range (" + std::to_string(columns) +
                            " columns)");
        return col;
    }
    auto it = std::find(header.begin(), header.end(), want);
    if (it == header.end())
        throw DataError(path + ": no column named '" + want + "' in the header" +
                        (header.empty() ? " (the file has no header row)" : ""));
    return size_t(it - header.begin());
}

// The label columns: label_columns by index or header name; unset, the header's "label", else the
// last. Each once, and at least one column left for the features.
std::vector<size_t> find_label_columns(const std::vector<std::string>& header, size_t columns, const CsvOptions& opt,
                                       const std::string& path) {
    if (opt.label_columns.empty()) {
        auto it = std::find(header.begin(), header.end(), "label");
        return {it != header.end() ? size_t(it - header.begin()) : columns - 1};
    }
    std::vector<size_t> cols;
    for (const std::string& want : opt.label_columns) {
        const size_t c = find_column(want, header, columns, path);
        if (std::find(cols.begin(), cols.end(), c) != cols.end())
            throw DataError(path + ": label column '" + want + "' is named twice");
        cols.push_back(c);
    }
    if (cols.size() >= columns)
        throw DataError(path + ": every one of the " + std::to_string(columns) +
                        " columns is a label column: no features left");
    return cols;
}

// One data row's features and label (class index, or targets in label_cols' order) onto the
// dataset (line `line_no` of `path`, for errors).
void append_row(const std::vector<std::string_view>& fields, const std::vector<size_t>& label_cols, bool targets,
                const std::vector<std::string>& header, const std::string& path, size_t line_no, Dataset& ds) {
    const auto where = [&] { return path + ":" + std::to_string(line_no) + ": "; };
    const size_t first_target = ds.targets.size();
    if (targets) ds.targets.resize(first_target + label_cols.size());
    for (size_t c = 0; c < fields.size(); ++c) {
        float v;
        if (const Parsed p = parse_number(fields[c], v); p != Parsed::ok)
            throw DataError(
                where() + "column " + std::to_string(c + 1) + (header.empty() ? "" : " (" + shown(header[c]) + ")") +
                ": '" + shown(fields[c]) +
                (p == Parsed::too_large ? "' is beyond a 32-bit float's range (3.4e38)" : "' is not a finite number"));
        const auto label = std::find(label_cols.begin(), label_cols.end(), c);
        if (label == label_cols.end()) {
            ds.features.push_back(v);
        } else if (targets) {
            ds.targets[first_target + size_t(label - label_cols.begin())] = v;
        } else {
            if (v < 0 || v != std::floor(v))
                throw DataError(where() + "label '" + shown(fields[c]) + "' is not a non-negative integer");
            if (v >= float(1 << 20))  // check_labels' bound on classes
                throw DataError(where() + "label '" + shown(fields[c]) +
                                "' is out of range: class indexes go from 0 "
                                "to at most 1048575");
            ds.labels.push_back(int32_t(v));
        }
    }
}

}  // namespace

Dataset read_csv(InputFile& in, const CsvOptions& opt) {
    const std::string& path = in.path();
    std::vector<unsigned char> bytes;
    as_data_error(
        [&] { in.read_rest(bytes, size_t(std::min<uint64_t>(memory_bound() / 2, SIZE_MAX)), "the CSV file"); });
    std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // a UTF-8 byte-order mark (Excel writes one)
    Dataset ds;
    ds.name = path;
    ds.labels_source = path;
    std::vector<std::string> header;
    std::vector<size_t> label_cols;
    size_t columns = 0, line_no = 0, pos = 0;
    bool first = true, sized = false;
    std::vector<std::string_view> fields;
    auto where = [&](size_t line) { return path + ":" + std::to_string(line) + ": "; };
    // Lines end in \n or \r\n; files from old Mac programs end them in \r alone
    const char eol =
        text.find('\n') == std::string_view::npos && text.find('\r') != std::string_view::npos ? '\r' : '\n';
    while (pos < text.size()) {
        size_t end = text.find(eol, pos);
        if (end == std::string_view::npos) end = text.size();
        const size_t line_start = pos;
        const std::string_view line = trim(text.substr(pos, end - pos));
        pos = end + 1;
        ++line_no;
        if (line.empty()) continue;
        if (line.find('\0') != std::string_view::npos)
            throw DataError(where(line_no) + "a NUL byte: this is not a text CSV file");
        split(line, opt.delimiter, fields);
        if (first) {  // the first line fixes the columns, and may be a header
            first = false;
            columns = fields.size();
            if (columns < 2)
                throw DataError(where(line_no) + "expected at least 2 columns (features and a label), found " +
                                std::to_string(columns));
            if (columns - 1 > kMaxFeatures)
                throw DataError(where(line_no) + std::to_string(columns) + " columns is implausibly many");
            // at most one row per line from this one on
            const std::string_view rest = text.substr(line_start);
            sized = reserve_samples(ds, uint64_t(std::count(rest.begin(), rest.end(), eol)) + 1, columns - 1);
            const bool is_header = opt.header == CsvOptions::Header::yes ||
                                   (opt.header == CsvOptions::Header::auto_detect && !all_numbers(fields));
            if (is_header)
                for (auto f : fields) header.emplace_back(f);
            label_cols = find_label_columns(header, columns, opt, path);
            if (label_cols.size() > 1 && !opt.targets)
                throw DataError(path +
                                ": several label columns are float targets, but the loss takes one class index "
                                "per sample (model.loss: mse or binary_cross_entropy reads targets)");
            if (is_header) continue;
        }
        if (fields.size() != columns)
            throw DataError(where(line_no) + "expected " + std::to_string(columns) + " columns, found " +
                            std::to_string(fields.size()));
        if (ds.features.size() / (columns - label_cols.size()) >= kMaxSamples)
            throw DataError(where(line_no) + "more than 2^31 - 1 rows");
        append_row(fields, label_cols, opt.targets, header, path, line_no, ds);
    }
    if (ds.features.empty()) throw DataError(path + ": no data rows");
    if (!sized) prefer_huge_pages(ds.features);  // grown row by row in small pages
    ds.shape = {int(columns - label_cols.size())};
    if (opt.targets) ds.target_size = int(label_cols.size());
    else ds.classes = check_labels(ds.labels, 1 << 20, path);
    return ds;
}

Dataset read_csv(const std::string& path, const CsvOptions& options) {
    return as_data_error([&] {
        InputFile in(path);
        return read_csv(in, options);
    });
}

namespace {

struct CsvFormatOptions final : OptionsOf<CsvFormatOptions> {
    std::string train, test;
    CsvOptions csv;
    Fields fields() const override {
        const char* header = csv.header == CsvOptions::Header::auto_detect ? "auto"
                             : csv.header == CsvOptions::Header::yes       ? "true"
                                                                           : "false";
        return {{"train.file", train},
                {"test.file", test},
                {"csv.label_column", csv.label_columns.size() > 1 ? yaml_list(csv.label_columns)
                                     : csv.label_columns.empty()  ? std::string()
                                                                  : csv.label_columns[0]},
                {"csv.header", header},
                {"csv.delimiter", std::string(1, csv.delimiter)}};
    }
    bool operator==(const CsvFormatOptions&) const = default;
};

OptionsPtr read(SpecReader& r, const std::string& p, bool targets) {
    auto o = std::make_shared<CsvFormatOptions>();
    for (auto [split, file] : {std::pair{".train", &o->train}, std::pair{".test", &o->test}}) {
        r.expect_map(p + split);
        *file = r.text(p + split + ".file", "");
        if (file->empty()) r.fail(p + split + ".file", "required for dataset csv: the CSV file's path");
    }
    CsvOptions& c = o->csv;
    r.expect_map(p + ".csv");
    c.label_columns = r.text_list(p + ".csv.label_column");  // "" (as --print-config writes the default): unset
    if (c.label_columns.size() == 1 && c.label_columns[0].empty()) c.label_columns.clear();
    if (c.label_columns.size() > 1 && !targets)
        r.fail(p + ".csv.label_column",
               "several label columns are float targets, but the loss takes one class index "
               "per sample (model.loss: mse and binary_cross_entropy read targets)");
    const std::string h = r.choice(p + ".csv.header", "auto", {"auto", "true", "false"});
    c.header = h == "auto"   ? CsvOptions::Header::auto_detect
               : h == "true" ? CsvOptions::Header::yes
                             : CsvOptions::Header::no;
    const std::string delim = r.text(p + ".csv.delimiter", ",");
    if (delim.size() != 1) r.fail(p + ".csv.delimiter", "expected one character");
    c.delimiter = delim[0];
    return o;
}

Datasets load(const Options& options, const DataSource& src) {
    const auto& o = options_as<CsvFormatOptions>(options);
    CsvOptions csv = o.csv;
    csv.targets = src.config.targets;
    Datasets out;
    out.train = read_csv(src.path(o.train), csv);
    out.test = read_csv(src.path(o.test), csv);
    if (out.test.shape != out.train.shape)
        throw DataError(src.path(o.test) + ": " + std::to_string(out.test.shape[0]) +
                        " feature columns, the training file has " + std::to_string(out.train.shape[0]));
    return out;
}

std::vector<std::string> inputs(const Options& opts) {
    const auto& o = options_as<CsvFormatOptions>(opts);
    return {o.train, o.test};
}

}  // namespace

extern const DataFormat kCsvFormat{"csv", ".", "", read, load, inputs};

}  // namespace mirrored
