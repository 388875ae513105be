// ort_run.js — runs an ONNX file with ONNX Runtime's CPU provider (npm's
// onnxruntime-node, installed outside the checkout; NODE_PATH names it), for
// spec/onnx_ort_spec.lua:
//
//     NODE_PATH=/opt/ortnode/node_modules node spec/onnx/ort_run.js model.onnx inputs.json
//
// inputs.json: {"name": {"type": "float32" | "int64", "dims": [...], "data": [...]}};
// prints {"name": {"dims": [...], "data": [...]}} for every output.
const fs = require('fs');
const ort = require('onnxruntime-node');

(async () => {
    const [model, inputs] = process.argv.slice(2);
    const session = await ort.InferenceSession.create(model, { executionProviders: ['cpu'] });
    const feeds = {};
    for (const [name, t] of Object.entries(JSON.parse(fs.readFileSync(inputs, 'utf8')))) {
        const data = t.type === 'int64' ? BigInt64Array.from(t.data.map(BigInt))
                                        : Float32Array.from(t.data);
        feeds[name] = new ort.Tensor(t.type, data, t.dims);
    }
    const out = await session.run(feeds);
    const result = {};
    for (const [name, t] of Object.entries(out))
        result[name] = { dims: t.dims, data: Array.from(t.data, Number) };
    process.stdout.write(JSON.stringify(result));
})().catch((e) => {
    process.stderr.write('ort_run: ' + e.message + '\n');
    process.exit(1);
});
