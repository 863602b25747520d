// An independent reference for mirrored's tiktoken reader (data/tokenizer.h): js-tiktoken, the
// JavaScript port of OpenAI's tiktoken, with the ranks it ships (gpt2, cl100k_base, o200k_base, ...).
// MODULES is the node_modules folder that holds js-tiktoken (`npm install --prefix DIR js-tiktoken`).
//
//   node scripts/tiktoken_reference.js MODULES ranks NAME OUT        NAME's ranks as a tiktoken rank file
//   node scripts/tiktoken_reference.js MODULES encode NAME TEXT OUT  TEXT's ids, one a line (special tokens allowed)
//   node scripts/tiktoken_reference.js MODULES bench NAME TEXT [N]   encode TEXT N times (default 5): median
//                                                                    seconds and MB/s, as JSON
"use strict";
const fs = require("fs");
const path = require("path");

const [modules, verb, name, ...rest] = process.argv.slice(2);
if (!modules || !["ranks", "encode", "bench"].includes(verb) || !name) {
    console.error("usage: tiktoken_reference.js MODULES ranks|encode|bench NAME ...");
    process.exit(2);
}
module.paths.unshift(path.resolve(modules));
const { Tiktoken } = require("js-tiktoken/lite");
const ranks = require("js-tiktoken/ranks/" + name);

if (verb === "ranks") {
    // js-tiktoken's compressed form: lines of "! FIRST_RANK TOKEN TOKEN ...", consecutive ranks
    const out = [];
    for (const line of ranks.bpe_ranks.split("\n")) {
        if (!line) continue;
        const [, first, ...tokens] = line.split(" ");
        tokens.forEach((t, i) => out.push(`${t} ${Number.parseInt(first, 10) + i}\n`));
    }
    fs.writeFileSync(rest[0], out.join(""));
} else {
    const text = fs.readFileSync(rest[0], "utf8");
    const enc = new Tiktoken(ranks);
    if (verb === "encode") {
        fs.writeFileSync(rest[1], enc.encode(text, "all").join("\n") + "\n");
    } else {
        const n = Number.parseInt(rest[1] || "5", 10);
        const times = [];
        let ids = 0;
        for (let i = 0; i < n; ++i) {
            const t0 = process.hrtime.bigint();
            ids = enc.encode(text, "all").length;
            times.push(Number(process.hrtime.bigint() - t0) / 1e9);
        }
        times.sort((a, b) => a - b);
        const median = times[Math.floor(n / 2)], bytes = Buffer.byteLength(text, "utf8");
        console.log(JSON.stringify({ encoder: "js-tiktoken", name, bytes, ids, median_s: median, mb_per_s: bytes / 1e6 / median }));
    }
}
