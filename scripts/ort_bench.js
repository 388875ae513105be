// ort_bench.js — ONNX Runtime's CPU provider (npm's onnxruntime-node, outside
// the checkout: NODE_PATH names its node_modules) as scripts/bench_nets.lua's
// peer: runs model.onnx on one float32 input read raw from x.bin, prints
// "p50 MS p99 MS" over RUNS runs after 3 warm-ups, and writes the output's
// float32 values raw to out.bin.
//
//     NODE_PATH=/opt/ortnode/node_modules node scripts/ort_bench.js model.onnx x.bin 1,3,224,224 RUNS THREADS out.bin
const fs = require('fs');
const ort = require('onnxruntime-node');

(async () => {
    const [model, xbin, dims, runs, threads, outbin] = process.argv.slice(2);
    const opts = { executionProviders: ['cpu'] };
    if (Number(threads) > 0) { opts.intraOpNumThreads = Number(threads); opts.interOpNumThreads = 1; }
    const session = await ort.InferenceSession.create(model, opts);
    const buf = fs.readFileSync(xbin);
    const x = new Float32Array(buf.buffer, buf.byteOffset, buf.length / 4);
    const feeds = { [session.inputNames[0]]: new ort.Tensor('float32', x, dims.split(',').map(Number)) };
    let out;
    for (let i = 0; i < 3; i++) out = await session.run(feeds);
    const times = [];
    for (let i = 0; i < Number(runs); i++) {
        const t0 = process.hrtime.bigint();
        out = await session.run(feeds);
        times.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
    times.sort((a, b) => a - b);
    const pick = (p) => times[Math.max(0, Math.min(times.length - 1, Math.ceil(p * times.length) - 1))];
    const y = out[session.outputNames[0]].data;
    fs.writeFileSync(outbin, Buffer.from(y.buffer, y.byteOffset, y.byteLength));
    process.stdout.write(`p50 ${pick(0.5).toFixed(3)} p99 ${pick(0.99).toFixed(3)}\n`);
})().catch((e) => {
    process.stderr.write('ort_bench: ' + e.message + '\n');
    process.exit(1);
});
