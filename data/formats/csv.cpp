// csv: a table per split, features in columns and the label in one column (class indexes) or in
// several (float targets, when the loss reads targets), with or without a header row.
#include "data/datasets.h"

namespace mirrored {

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
