--[[
spec/helpers.lua — what the busted specs share:

  helpers.mk()                 the moonkaas module (MK_BUILD=dir picks another build)
  helpers.seed(label)          seeds math.random from MK_SEED or the clock and prints
                               "# <label> seed N (replay with MK_SEED=N)"
  helpers.rand(shape[, lo, hi])     float32 tensor of uniform values, and its reference
  helpers.randint(shape, lo, hi)    int64 tensor, and its reference
  helpers.ref(tensor)          reference value {shape =, data = flat row-major, 1-based}
  helpers.assert_close(got, want[, atol, rtol])   |got - want| <= atol + rtol |want|
  helpers.ref_ops.*            the nodes' semantics as plain Lua loops in double
                               precision, written from the ops' definitions, not from the core
  helpers.op_cases()           fresh random {name, output, feeds, want, atol, rtol}
                               cases, one or more per node kind
  helpers.pointwise_cases()    the same for SubNode, DivNode, ExpNode, TanhNode,
                               SigmoidNode, GELUNode (broadcasting, numbers on
                               either side, int64 wrap-around, a fused tree)
  helpers.family_cases()       the same from every spec/cases/<family>.lua (one file per
                               family of ops: each returns function(c), c = {mk =, add =,
                               steps =, input =, R = helpers.ref_ops, H = helpers}, and adds
                               its cases; steps(name, output, {{feeds =, want = | error =}, ...})
                               a stateful one: one model run step after step)
  helpers.check_case(model, case[, atol, rtol])   runs a case (each step) on a fresh model
                               and checks it; returns the outputs' references
  helpers.all_cases([opts])    op_cases, pointwise_cases and family_cases together: the
                               one cross-device table (ops_spec on the CPU, gpu_spec on CUDA);
                               opts.large (gpu_spec): the families' large shapes too (c.large);
                               MK_CASES=quick (valgrind): a sample of the families' cases (c.quick)
  helpers.f32(x)               x rounded to float32 (string.pack)
  helpers.round_even(x)        x rounded to an integer, ties to even (x a double)
  helpers.requires_cuda()      nil when a CUDA device is usable, else the reason
                               (specs call pending(reason) with it)
  helpers.read_file(path)      a file's bytes, or nil where it cannot be opened
  helpers.run_lua(cmd, prelude, body)   runs prelude .. body in a fresh interpreter
                               (cmd: "env ... lua5.4"), with this process's package paths;
                               its "key=value" lines as a table, .output and .status
  helpers.gpu(it, skip)        a gpu_it(name, body): it(name .. " #gpu", body),
                               skip(reason) where no CUDA device is usable; pass
                               function(why) pending(why) end (busted binds the
                               test-level pending only while a test runs)
]]
local helpers = {}

-- Lua 5.1 and LuaJIT run these specs too (make test-lua51, test-luajit).
local compat = require("moonkaas.compat")
local idiv = compat.idiv

local build = os.getenv("MK_BUILD")
if build and build ~= "" and not package.cpath:find(build, 1, true) then
    package.cpath = build .. "/?.so;" .. package.cpath
end

function helpers.mk()
    return require "moonkaas"
end

function helpers.f32(x)
    return compat.f32(x)
end

function helpers.round_even(x)
    local fl = math.floor(x)
    local d = x - fl
    if d > 0.5 or (d == 0.5 and fl % 2 == 1) then return fl + 1 end
    return fl
end

function helpers.seed(label)
    local seed = tonumber(os.getenv("MK_SEED"))
    if not seed then
        seed = (os.time() * 7919 + math.floor(os.clock() * 1e6) + math.random(1, 1048576)) % 2147483647
    end
    math.randomseed(seed)
    print(string.format("# %s seed %d (replay with MK_SEED=%d)", label or "spec", seed, seed))
    return seed
end

-- ---- reference values -------------------------------------------------------

local function numel(shape)
    local n = 1
    for _, d in ipairs(shape) do n = n * d end
    return n
end
helpers.numel = numel

local function copy(t)
    local c = {}
    for i, v in ipairs(t) do c[i] = v end
    return c
end
helpers.copy = copy

-- Row-major strides of a shape (in elements).
local function strides(shape)
    local s, acc = {}, 1
    for i = #shape, 1, -1 do
        s[i] = acc
        acc = acc * shape[i]
    end
    return s
end

-- The 0-based multi-index of flat 0-based position p.
local function unflatten(p, shape)
    local idx = {}
    for i = #shape, 1, -1 do
        idx[i] = p % shape[i]
        p = idiv(p, shape[i])
    end
    return idx
end

local function flatten(idx, shape)
    local p = 0
    for i = 1, #shape do p = p * shape[i] + idx[i] end
    return p
end

function helpers.ref(t)
    local data = {}
    for i = 1, t.numel do data[i] = t:get(i) end
    return { shape = t.shape, data = data, dtype = t.dtype }
end

function helpers.tensor(ref, dtype)
    return helpers.mk().tensor(ref.data, dtype or ref.dtype or "float32", ref.shape)
end

-- Uniform in [lo, hi) (default [-1, 1)), stored as float32; the reference holds
-- the float32-rounded values.
function helpers.rand(shape, lo, hi)
    lo, hi = lo or -1, hi or 1
    local data = {}
    for i = 1, numel(shape) do data[i] = lo + (hi - lo) * math.random() end
    local t = helpers.mk().tensor(data, "float32", shape)
    return t, helpers.ref(t)
end

function helpers.randint(shape, lo, hi)
    local data = {}
    for i = 1, numel(shape) do data[i] = math.random(lo, hi) end
    local t = helpers.mk().tensor(data, "int64", shape)
    return t, helpers.ref(t)
end

-- Nested tables of a reference (for mk.tensor's nested form).
function helpers.nested(ref)
    local function build(depth, offset)
        local out, inner = {}, 1
        for i = depth + 1, #ref.shape do inner = inner * ref.shape[i] end
        for i = 1, ref.shape[depth] do
            if depth == #ref.shape then out[i] = ref.data[offset + i]
            else out[i] = build(depth + 1, offset + (i - 1) * inner) end
        end
        return out
    end
    return build(1, 0)
end

local function shape_str(s)
    return "[" .. table.concat(s, ", ") .. "]"
end
helpers.shape_str = shape_str

function helpers.assert_close(got, want, atol, rtol)
    atol, rtol = atol or 1e-5, rtol or 1e-5
    if type(got) == "userdata" then got = helpers.ref(got) end
    if shape_str(got.shape) ~= shape_str(want.shape) then
        error(string.format("shape %s, expected %s", shape_str(got.shape), shape_str(want.shape)), 2)
    end
    for i = 1, #want.data do
        local g, w = got.data[i], want.data[i]
        local ok
        if type(w) == "boolean" or type(g) == "boolean" then -- bool: equal, whatever the tolerance
            if g ~= w then
                error(string.format("element %s (flat %d): got %s, expected %s",
                    shape_str(unflatten(i - 1, want.shape)), i, tostring(g), tostring(w)), 2)
            end
            ok = true
        elseif w ~= w then ok = g ~= g -- NaN where the reference is NaN
        elseif w == math.huge or w == -math.huge or (atol == 0 and rtol == 0) then ok = g == w
        else ok = math.abs(g - w) <= atol + rtol * math.abs(w) end
        if not ok then
            local idx = unflatten(i - 1, want.shape)
            error(string.format("element %s (flat %d): got %.9g, expected %.9g (atol %g, rtol %g)",
                shape_str(idx), i, g, w, atol, rtol), 2)
        end
    end
    return true
end

function helpers.assert_equal_ref(got, want)
    return helpers.assert_close(got, want, 0, 0)
end

-- ---- reference semantics (each op's definition), double precision -----------

local R = {}
helpers.ref_ops = R

local function new(shape, dtype)
    return { shape = copy(shape), data = {}, dtype = dtype or "float32" }
end

-- NumPy's broadcast of a and b: dims aligned from the last, each pair equal
-- or 1 (a missing leading dim is 1); element p of the result reads each
-- operand at its index with the broadcast dims at 0.
local function broadcast(a, b, f)
    local rank = math.max(#a.shape, #b.shape)
    local shape = {}
    for i = 1, rank do
        local da = a.shape[i - (rank - #a.shape)] or 1
        local db = b.shape[i - (rank - #b.shape)] or 1
        assert(da == db or da == 1 or db == 1, "reference: shapes do not broadcast")
        shape[i] = da == 1 and db or da
    end
    local function at(x, idx)
        local lead, xi = rank - #x.shape, {}
        for i = 1, #x.shape do xi[i] = x.shape[i] == 1 and 0 or idx[i + lead] end
        return x.data[flatten(xi, x.shape) + 1]
    end
    local out = new(shape, a.dtype)
    for p = 0, numel(shape) - 1 do
        local idx = unflatten(p, shape)
        out.data[p + 1] = f(at(a, idx), at(b, idx))
    end
    return out
end

function R.add(a, b) return broadcast(a, b, function(x, y) return x + y end) end
function R.mul(a, b) return broadcast(a, b, function(x, y) return x * y end) end
-- int64 operands are Lua integers: their differences wrap around as int64 does
function R.sub(a, b) return broadcast(a, b, function(x, y) return x - y end) end
function R.div(a, b) return broadcast(a, b, function(x, y) return x / y end) end

local function map(x, f)
    local out = new(x.shape, x.dtype)
    for i, v in ipairs(x.data) do out.data[i] = f(v) end
    return out
end
function R.relu(x) return map(x, function(v) return v > 0 and v or 0 end) end
function R.silu(x) return map(x, function(v) return v / (1 + math.exp(-v)) end) end
function R.exp(x) return map(x, math.exp) end

-- Lua 5.4 has no math.tanh: (1 - e^-2|v|) / (1 + e^-2|v|) with v's sign
local function tanh(v)
    local t = math.exp(-2 * math.abs(v))
    local r = (1 - t) / (1 + t)
    return v < 0 and -r or r
end
function R.tanh(x) return map(x, tanh) end
function R.sigmoid(x) return map(x, function(v) return 1 / (1 + math.exp(-v)) end) end
-- GELU in its tanh form: v/2 (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
function R.gelu(x)
    local c = math.sqrt(2 / math.pi)
    return map(x, function(v) return 0.5 * v * (1 + tanh(c * (v + 0.044715 * v ^ 3))) end)
end

-- A reference of `shape` holding v everywhere (a number turned into a constant).
function R.fill(shape, v, dtype)
    local out = new(shape, dtype)
    for i = 1, numel(shape) do out.data[i] = v end
    return out
end

-- a @ b over the first p elements of the shared axis: the products narrowed
function R.matmul_prefix(a, b, p)
    local r = #a.shape
    local k, n = a.shape[r], b.shape[#b.shape]
    local rows = idiv(numel(a.shape), k)
    local an = { shape = {}, data = {} }
    for d = 1, r do an.shape[d] = a.shape[d] end
    an.shape[r] = p
    for row = 0, rows - 1 do
        for l = 0, p - 1 do an.data[#an.data + 1] = a.data[row * k + l + 1] end
    end
    local bn = { shape = {}, data = {} }
    for d = 1, #b.shape do bn.shape[d] = b.shape[d] end
    bn.shape[#b.shape - 1] = p
    for z = 0, idiv(numel(b.shape), (k * n)) - 1 do
        for l = 0, p - 1 do
            for j = 0, n - 1 do bn.data[#bn.data + 1] = b.data[z * k * n + l * n + j + 1] end
        end
    end
    if p == 0 then -- no terms: zeros of the product's shape
        local shape = r == 1 and { n } or r == 2 and { a.shape[1], n } or { a.shape[1], a.shape[2], n }
        return R.fill(shape, 0.0)
    end
    return R.matmul(an, bn)
end

-- [k]@[k,n], [m,k]@[k,n], [B,m,k]@[B,k,n]
function R.matmul(a, b)
    local batch, m, k, n
    if #a.shape == 1 then batch, m, k, n = 1, 1, a.shape[1], b.shape[2]
    elseif #a.shape == 2 then batch, m, k, n = 1, a.shape[1], a.shape[2], b.shape[2]
    else batch, m, k, n = a.shape[1], a.shape[2], a.shape[3], b.shape[3] end
    local shape = #a.shape == 1 and { n } or #a.shape == 2 and { m, n } or { batch, m, n }
    local out = new(shape)
    local ad, bd, od = a.data, b.data, out.data
    for z = 0, batch - 1 do
        for i = 0, m - 1 do
            local arow = z * m * k + i * k + 1 -- a[z, i, 0]
            for j = 0, n - 1 do
                local s, q = 0.0, z * k * n + j + 1 -- b[z, 0, j]
                for l = arow, arow + k - 1 do
                    s = s + ad[l] * bd[q]
                    q = q + n
                end
                od[z * m * n + i * n + j + 1] = s
            end
        end
    end
    return out
end

-- rows [b, e) of the first axis (0-based, half-open)
function R.slice(x, b, e)
    local shape = copy(x.shape)
    shape[1] = e - b
    local inner = idiv(numel(x.shape), x.shape[1])
    local out = new(shape, x.dtype)
    for i = 1, (e - b) * inner do out.data[i] = x.data[b * inner + i] end
    return out
end

function R.reshape(x, shape)
    local out = new(shape, x.dtype)
    out.data = copy(x.data)
    return out
end

-- out axis i is x axis perm[i] (0-based axis numbers)
function R.permute(x, perm)
    local shape = {}
    for i, p in ipairs(perm) do shape[i] = x.shape[p + 1] end
    local out = new(shape, x.dtype)
    for q = 0, numel(shape) - 1 do
        local oidx = unflatten(q, shape)
        local xidx = {}
        for i, p in ipairs(perm) do xidx[p + 1] = oidx[i] end
        out.data[q + 1] = x.data[flatten(xidx, x.shape) + 1]
    end
    return out
end

function R.replace(x, r, b, e)
    local out = new(x.shape, x.dtype)
    out.data = copy(x.data)
    local inner = idiv(numel(x.shape), x.shape[1])
    assert(#r.data == (e - b) * inner)
    for i = 1, #r.data do out.data[b * inner + i] = r.data[i] end
    return out
end

-- w * x / sqrt(mean(x^2) + 1e-5) over the last axis
function R.rms_norm(x, w)
    local n = x.shape[#x.shape]
    local out = new(x.shape)
    for row = 0, idiv(numel(x.shape), n) - 1 do
        local ss = 0.0
        for j = 1, n do ss = ss + x.data[row * n + j] ^ 2 end
        local scale = 1 / math.sqrt(ss / n + 1e-5)
        for j = 1, n do out.data[row * n + j] = w.data[j] * x.data[row * n + j] * scale end
    end
    return out
end

-- last axis of size 2 is (re, im); b broadcasts on the other axes
function R.complex_mul(a, b)
    local out = new(a.shape)
    for p = 0, numel(a.shape) - 1, 2 do
        local idx = unflatten(p, a.shape)
        for i = 1, #idx - 1 do if b.shape[i] == 1 then idx[i] = 0 end end
        local q = flatten(idx, b.shape)
        local ar, ai = a.data[p + 1], a.data[p + 2]
        local br, bi = b.data[q + 1], b.data[q + 2]
        out.data[p + 1] = ar * br - ai * bi
        out.data[p + 2] = ar * bi + ai * br
    end
    return out
end

-- softmax of the first p entries of each row (last axis), the rest unchanged
function R.sliced_softmax(x, p)
    local n = x.shape[#x.shape]
    local out = new(x.shape)
    out.data = copy(x.data)
    for row = 0, idiv(numel(x.shape), n) - 1 do
        if p > 0 then
            local max = -math.huge
            for j = 1, p do max = math.max(max, x.data[row * n + j]) end
            local sum = 0.0
            for j = 1, p do sum = sum + math.exp(x.data[row * n + j] - max) end
            for j = 1, p do out.data[row * n + j] = math.exp(x.data[row * n + j] - max) / sum end
        end
    end
    return out
end

-- causal attention's softmax of x [..., T, S]: row t of each T over its first
-- e - T + 1 + t entries, the rest zero
function R.causal_softmax(x, e)
    local n, t = x.shape[#x.shape], x.shape[#x.shape - 1]
    local out = new(x.shape)
    for row = 0, idiv(numel(x.shape), n) - 1 do
        local p = e - t + 1 + row % t
        local max = -math.huge
        for j = 1, p do max = math.max(max, x.data[row * n + j]) end
        local sum = 0.0
        for j = 1, p do sum = sum + math.exp(x.data[row * n + j] - max) end
        for j = 1, n do out.data[row * n + j] = j <= p and math.exp(x.data[row * n + j] - max) / sum or 0.0 end
    end
    return out
end

-- rows of table [V, D] picked by ids [n] -> [n, D]
function R.embedding(tbl, ids)
    local d = tbl.shape[2]
    local out = new({ #ids.data, d }, tbl.dtype)
    for i, id in ipairs(ids.data) do
        for j = 1, d do out.data[(i - 1) * d + j] = tbl.data[id * d + j] end
    end
    return out
end

-- 0-based index of the largest entry of each row (the first on ties); last axis 1
function R.argmax(x)
    local n = x.shape[#x.shape]
    local shape = copy(x.shape)
    shape[#shape] = 1
    local out = new(shape, "int64")
    for row = 0, idiv(numel(x.shape), n) - 1 do
        local best = 1
        for j = 2, n do
            if x.data[row * n + j] > x.data[row * n + best] then best = j end
        end
        out.data[row + 1] = best - 1
    end
    return out
end

-- ---- op cases shared by ops_spec (CPU) and gpu_spec (CUDA against CPU) -------

local function rand_shape(rank, lo, hi)
    local s = {}
    for i = 1, rank do s[i] = math.random(lo or 1, hi or 5) end
    return s
end
helpers.rand_shape = rand_shape

-- A random permutation of 0 .. n-1.
local function rand_perm(n)
    local p = {}
    for i = 1, n do p[i] = i - 1 end
    for i = n, 2, -1 do
        local j = math.random(1, i)
        p[i], p[j] = p[j], p[i]
    end
    return p
end
helpers.rand_perm = rand_perm

--[[
Fresh random cases, one or more per node kind. Each is {name =, output = node,
feeds = {name = tensor}, want = reference, atol =, rtol =}.
]]
-- A list of cases, its add(name, output, feeds, want[, atol[, rtol]]) with
-- these default tolerances, and input(name, shape, lo, hi) -> node, tensor, ref.
local function case_list(atol, rtol)
    local mk = helpers.mk()
    local cases = {}
    local function add(name, output, feeds, want, a, r)
        cases[#cases + 1] = { name = name, output = output, feeds = feeds, want = want,
            atol = a or atol, rtol = r or rtol }
    end
    local function input(name, shape, lo, hi)
        local t, r = helpers.rand(shape, lo, hi)
        return mk.input(name, "float32", shape), t, r
    end
    -- a stateful case: one model run with each step's feeds in turn, each
    -- giving its want or failing with an error that starts with its `error`
    local function steps(name, output, list, a, r)
        cases[#cases + 1] = { name = name, output = output, steps = list, atol = a or atol, rtol = r or rtol }
    end
    return mk, cases, add, input, steps
end

-- Runs case on model (a fresh one: its buffers zero) and checks every value
-- against the case's references with atol, rtol; returns the outputs' references.
function helpers.check_case(model, case, atol, rtol)
    local got = {}
    for i, step in ipairs(case.steps or { { feeds = case.feeds, want = case.want } }) do
        if step.error then
            helpers.assert_error(function() model:run(step.feeds) end, step.error)
        else
            local out = model:run(step.feeds)
            assert(case.output.dtype == out.dtype, "dtype " .. out.dtype .. ", expected " .. case.output.dtype)
            got[i] = helpers.ref(out)
            helpers.assert_close(got[i], step.want, atol or case.atol, rtol or case.rtol)
        end
    end
    return got
end

function helpers.op_cases()
    local mk, cases, add, input = case_list(1e-5, 1e-5)

    for rank = 1, 4 do
        local shape = rand_shape(rank, 1, 6)
        local a, at, ar = input("a", shape)
        local b, bt, br = input("b", shape)
        add("SumNode rank " .. rank, a + b, { a = at, b = bt }, R.add(ar, br))
        add("HadamardProductNode rank " .. rank, a * b, { a = at, b = bt }, R.mul(ar, br))
        -- b broadcasts where its dim is 1
        local bshape = copy(shape)
        for i = 1, rank do if math.random() < 0.5 then bshape[i] = 1 end end
        local c, ct, cr = input("c", bshape)
        add("SumNode broadcast " .. helpers.shape_str(bshape) .. " onto " .. helpers.shape_str(shape),
            a + c, { a = at, c = ct }, R.add(ar, cr))
        add("HadamardProductNode broadcast " .. helpers.shape_str(bshape), c * a, { a = at, c = ct },
            R.mul(ar, cr))
        add("ReLUNode rank " .. rank, a:relu(), { a = at }, R.relu(ar))
        add("SiLUNode rank " .. rank, a:silu(), { a = at }, R.silu(ar))
    end

    for _, op in ipairs({ "add", "sub", "mul", "div" }) do -- NumPy's broadcasting, both sides
        local rank = math.random(1, 4)
        local shape = rand_shape(rank, 2, 5)
        -- each operand: the last few of shape's dims, some of them 1
        local function part()
            local r, s = math.random(1, rank), {}
            for i = 1, r do
                s[i] = math.random() < 0.4 and 1 or shape[rank - r + i]
            end
            return s
        end
        local sa, sb = part(), part()
        local a, at, ar = input("a", sa)
        local b, bt, br = input("b", sb)
        if op == "div" then bt, br = helpers.rand_away(sb, 0.5, 2) end -- no zeros to divide by
        local out = ({ add = a + b, sub = a - b, mul = a * b, div = a / b })[op]
        add(string.format("%s broadcast %s with %s", op, helpers.shape_str(sa), helpers.shape_str(sb)),
            out, { a = at, b = bt }, R[op](ar, br))
        -- a chain whose operands broadcast differently (one pointwise group)
        local c, ct, cr = input("c", part())
        add(string.format("(a - c) * b + a with a %s, b %s, c %s", helpers.shape_str(sa),
                helpers.shape_str(sb), helpers.shape_str(c.shape)),
            (a - c) * b + a, { a = at, b = bt, c = ct }, R.add(R.mul(R.sub(ar, cr), br), ar))
    end

    do -- [2, 1] + [1, 3], and a bias [n] on either side of a matrix-vector product
        local m, n, k = math.random(2, 6), math.random(2, 6), math.random(2, 30)
        local col, colt, colr = input("col", { m, 1 })
        local row, rowt, rowr = input("row", { 1, n })
        add("[m, 1] + [1, n]", col + row, { col = colt, row = rowt }, R.add(colr, rowr))
        add("[1, n] - [m, 1]", row - col, { col = colt, row = rowt }, R.sub(rowr, colr))
        local x, xt, xr = input("x", { 1, k })
        local w, wt, wr = input("w", { k, n })
        local bias, biast, biasr = input("bias", { n })
        local xw = R.matmul(xr, wr)
        add("x @ w + bias [n]", x:matmul(w) + bias, { x = xt, w = wt, bias = biast },
            R.add(xw, biasr), 1e-5 * k, 1e-4)
        add("bias [n] - x @ w, then * bias", (bias - x:matmul(w)) * bias,
            { x = xt, w = wt, bias = biast }, R.mul(R.sub(biasr, xw), biasr), 1e-5 * k, 1e-4)
        -- constant weights: matrix-vector groups, reading the biases broadcast
        local wct, wcr = helpers.rand({ k, n })
        add("bias [n] - x @ constant, then * bias (a matrix-vector group)",
            (bias - x:matmul(mk.constant(wct, "wc"))) * bias, { x = xt, bias = biast },
            R.mul(R.sub(biasr, R.matmul(xr, wcr)), biasr), 1e-5 * k, 1e-4)
        add("x @ constant + bias [1, n] + bias [n] (a matrix-vector group)",
            (x:matmul(mk.constant(wct, "wc")) + row) + bias, { x = xt, row = rowt, bias = biast },
            R.add(R.add(R.matmul(xr, wcr), rowr), biasr), 1e-5 * k, 1e-4)
    end

    for rank = 1, 4 do -- reshape with one -1
        local shape = rand_shape(rank, 1, 5)
        local x, xt, xr = input("x", shape)
        local n = numel(shape)
        local d = ({ 1, 2, 3, 4, 6 })[math.random(1, 5)]
        while n % d ~= 0 do d = d - 1 end
        local to = math.random() < 0.5 and { -1, d } or { d, -1 }
        local want = to[1] == -1 and { idiv(n, d), d } or { d, idiv(n, d) }
        add(string.format("ReshapeNode %s to %s", helpers.shape_str(shape), helpers.shape_str(to)),
            x:reshape(to) * 2, { x = xt }, R.mul(R.reshape(xr, want), { shape = { 1 }, data = { 2 } }))
    end

    do -- numbers become constants
        local shape = rand_shape(2, 2, 5)
        local x, xt, xr = input("x", shape)
        local k = math.random() + 0.5
        local ones = {}
        for i = 1, 2 do ones[i] = 1 end
        add("numbers as constants", (x * k + 2) * x, { x = xt },
            R.mul(R.add(R.mul(xr, { shape = ones, data = { k } }), { shape = ones, data = { 2 } }), xr),
            1e-5, 1e-5)
    end

    do -- int64 elementwise
        local shape = rand_shape(2, 2, 5)
        local it, ir = helpers.randint(shape, -1000, 1000)
        local jt, jr = helpers.randint({ shape[1], 1 }, -1000, 1000)
        local i, j = mk.input("i", "int64", shape), mk.input("j", "int64", { shape[1], 1 })
        add("int64 sum, product and relu", ((i + j) * i):relu() + 3, { i = it, j = jt },
            R.add(R.relu(R.mul(R.add(ir, jr), ir)), { shape = { 1, 1 }, data = { 3 } }), 0, 0)
    end

    do -- matmul in its three forms, and with permuted (transposed) operands
        local m, k, n, B = math.random(1, 9), math.random(1, 40), math.random(1, 9), math.random(2, 4)
        local tol = 1e-5 * k
        local v, vt, vr = input("v", { k })
        local a, at, ar = input("a", { m, k })
        local b, bt, br = input("b", { k, n })
        add("MatMulNode [k]@[k,n]", v:matmul(b), { v = vt, b = bt }, R.matmul(vr, br), tol, 1e-4)
        add("MatMulNode [m,k]@[k,n]", a:matmul(b), { a = at, b = bt }, R.matmul(ar, br), tol, 1e-4)
        local x, xt, xr = input("x", { B, m, k })
        local y, yt, yr = input("y", { B, k, n })
        add("MatMulNode [B,m,k]@[B,k,n]", x:matmul(y), { x = xt, y = yt }, R.matmul(xr, yr), tol, 1e-4)
        -- W [n, k] used as W^T: a view where the device takes a transpose flag
        local w, wt, wr = input("w", { n, k })
        add("MatMulNode with a permuted weight", a:matmul(w:permute({ 1, 0 })), { a = at, w = wt },
            R.matmul(ar, R.permute(wr, { 1, 0 })), tol, 1e-4)
        add("MatMulNode [k]@[n,k]^T", v:matmul(w:permute({ 1, 0 })), { v = vt, w = wt },
            R.matmul(vr, R.permute(wr, { 1, 0 })), tol, 1e-4)
        -- a batch of transposed matrices, as attention over a KV cache
        local kv, kvt, kvr = input("kv", { n, B, k }) -- [seq, heads, head] viewed as [heads, head, seq]
        local q, qt, qr = input("q", { B, m, k })
        add("MatMulNode batched with a permuted operand", q:matmul(kv:permute({ 1, 2, 0 })),
            { q = qt, kv = kvt }, R.matmul(qr, R.permute(kvr, { 1, 2, 0 })), tol, 1e-4)
        local c, ct, cr = input("c", { k, n })
        add("MatMulNode of a constant", a:matmul(mk.constant(ct)), { a = at },
            R.matmul(ar, cr), tol, 1e-4)
        -- over a prefix read at run time: all of it, part, none; V as a permuted cache
        local pn = mk.input("p", "int64", { 1 })
        for _, p in ipairs({ k, math.random(1, k), 0 }) do
            local feeds = { x = xt, y = yt, p = mk.tensor({ p }, "int64") }
            add(string.format("PrefixMatMulNode [B,m,k]@[B,k,n] over %d of %d", p, k),
                x:matmul_prefix(y, pn), feeds, R.matmul_prefix(xr, yr, p), tol, 1e-4)
        end
        local vc, vct, vcr = input("vc", { k, B, n }) -- [seq, heads, head] viewed as [heads, seq, head]
        local p = math.random(0, k)
        add(string.format("PrefixMatMulNode with a permuted cache over %d of %d", p, k),
            x:matmul_prefix(vc:permute({ 1, 0, 2 }), pn),
            { x = xt, vc = vct, p = mk.tensor({ p }, "int64") },
            R.matmul_prefix(xr, R.permute(vcr, { 1, 0, 2 }), p), tol, 1e-4)
        add("PrefixMatMulNode [m,k]@[k,n]", a:matmul_prefix(b, pn),
            { a = at, b = bt, p = mk.tensor({ p }, "int64") }, R.matmul_prefix(ar, br, p), tol, 1e-4)
    end

    for rank = 1, 4 do -- slice, reshape, permute
        local shape = rand_shape(rank, 2, 5)
        shape[1] = math.random(2, 8)
        local x, xt, xr = input("x", shape)
        local b = math.random(0, shape[1] - 1)
        local e = math.random(b + 1, shape[1])
        add(string.format("SliceNode [%d, %d) of %s", b, e, helpers.shape_str(shape)),
            x:slice(b, e) * 1, { x = xt }, R.slice(xr, b, e))
        local n = numel(shape)
        local flat = { n }
        add("ReshapeNode " .. helpers.shape_str(shape) .. " to [n]", x:reshape(flat):relu(), { x = xt },
            R.relu(R.reshape(xr, flat)))
        local perm = rand_perm(rank)
        add("PermuteNode " .. helpers.shape_str(perm) .. " of " .. helpers.shape_str(shape),
            x:permute(perm), { x = xt }, R.permute(xr, perm))
        add("PermuteNode then SumNode", x:permute(perm) + x:permute(perm), { x = xt },
            R.add(R.permute(xr, perm), R.permute(xr, perm)))
        add("SliceNode then PermuteNode", x:slice(b, e):permute(perm), { x = xt },
            R.permute(R.slice(xr, b, e), perm))
    end

    for rank = 1, 3 do -- replace with integer and node bounds
        local shape = rand_shape(rank, 2, 5)
        shape[1] = math.random(3, 9)
        local x, xt, xr = input("x", shape)
        local b = math.random(0, shape[1] - 1)
        local e = math.random(b + 1, shape[1])
        local rshape = copy(shape)
        rshape[1] = e - b
        local r, rt, rr = input("r", rshape)
        add(string.format("ReplaceSliceNode rows [%d, %d) of %s", b, e, helpers.shape_str(shape)),
            (x * 1):replace(r, b, e), { x = xt, r = rt }, R.replace(xr, rr, b, e))
        local bn, en = mk.input("b", "int64", { 1 }), mk.input("e", "int64", { 1 })
        add("ReplaceSliceNode with run-time bounds", (x + 0):replace(r, bn, en) * 2,
            { x = xt, r = rt, b = mk.tensor({ b }, "int64"), e = mk.tensor({ e }, "int64") },
            R.mul(R.replace(xr, rr, b, e), { shape = helpers.rand_shape(rank, 1, 1), data = { 2 } }))
    end

    for rank = 1, 3 do -- rms_norm, sliced_softmax, argmax
        local shape = rand_shape(rank, 2, 7)
        local n = shape[rank]
        local x, xt, xr = input("x", shape, -3, 3)
        local w, wt, wr = input("w", { n })
        add("RmsNormNode rank " .. rank, x:rms_norm(w), { x = xt, w = wt }, R.rms_norm(xr, wr), 1e-5, 1e-4)
        local p = math.random(1, n)
        add(string.format("SlicedSoftmaxNode prefix %d of %d", p, n), x:sliced_softmax(p), { x = xt },
            R.sliced_softmax(xr, p), 1e-6, 1e-4)
        local pn = mk.input("p", "int64", { 1 })
        add("SlicedSoftmaxNode run-time prefix", (x * 1):sliced_softmax(pn),
            { x = xt, p = mk.tensor({ p }, "int64") }, R.sliced_softmax(xr, p), 1e-6, 1e-4)
        add("SlicedSoftmaxNode prefix 0", x:sliced_softmax(0), { x = xt }, R.sliced_softmax(xr, 0))
        add("ArgMaxNode rank " .. rank, x:argmax(), { x = xt }, R.argmax(xr), 0, 0)
    end

    for rank = 2, 4 do -- causal_softmax: T query rows after e - T cached keys
        local shape = rand_shape(rank, 2, 6)
        shape[rank] = math.random(shape[rank - 1], 9) -- S >= T
        local x, xt, xr = input("x", shape, -3, 3)
        local e = math.random(shape[rank - 1], shape[rank])
        add(string.format("CausalSoftmaxNode end %d of %s", e, helpers.shape_str(shape)),
            x:causal_softmax(mk.input("e", "int64", { 1 })), { x = xt, e = mk.tensor({ e }, "int64") },
            R.causal_softmax(xr, e), 1e-6, 1e-4)
    end
    do -- one row, no cache: a plain softmax; as many rows as columns: the lower triangle
        local x, xt, xr = input("x", { 3, 3 }, -3, 3)
        add("CausalSoftmaxNode T = S", x:causal_softmax(3), { x = xt }, R.causal_softmax(xr, 3), 1e-6, 1e-4)
        local y, yt, yr = input("y", { 1, 7 }, -3, 3)
        add("CausalSoftmaxNode T = 1", (y * 1):causal_softmax(5), { y = yt }, R.causal_softmax(yr, 5), 1e-6, 1e-4)
        local z, zt, zr = input("z", { 2, 9000 }, -3, 3) -- past the kernels that hold a row in registers
        add("CausalSoftmaxNode long rows", z:causal_softmax(8500), { z = zt }, R.causal_softmax(zr, 8500), 1e-7, 1e-4)
    end

    do -- complex_mul with broadcasting, as rotary embeddings
        local heads, pairs_ = math.random(1, 4), math.random(1, 6)
        local q, qt, qr = input("q", { heads, pairs_, 2 })
        local f, ft, fr = input("f", { 1, pairs_, 2 })
        add("ComplexHadamardProductNode broadcast", q:complex_mul(f), { q = qt, f = ft },
            R.complex_mul(qr, fr))
        local g, gt, gr = input("g", { heads, pairs_, 2 })
        add("ComplexHadamardProductNode same shape", q:complex_mul(g), { q = qt, g = gt },
            R.complex_mul(qr, gr))
    end

    do -- embedding of float and int64 tables
        local V, D, n = math.random(2, 20), math.random(1, 8), math.random(1, 6)
        local tbl, tt, tr = input("t", { V, D })
        local it, ir = helpers.randint({ n }, 0, V - 1)
        local ids = mk.input("ids", "int64", { n })
        add("EmbeddingNode float32", mk.embedding(tbl, ids), { t = tt, ids = it }, R.embedding(tr, ir))
        local ct, cr = helpers.randint({ V, D }, -50, 50)
        add("EmbeddingNode of an int64 constant", mk.embedding(mk.constant(ct), ids), { ids = it },
            R.embedding(cr, ir), 0, 0)
    end

    return cases
end

-- v rounded to float32, as a number becomes when it is made a float32 constant.
function helpers.f32(v)
    return compat.f32(v)
end

-- A float32 tensor whose values have magnitudes in [lo, hi] and either sign
-- (denominators, never near zero), and its reference.
function helpers.rand_away(shape, lo, hi)
    local data = {}
    for i = 1, numel(shape) do
        local v = lo + (hi - lo) * math.random()
        data[i] = math.random() < 0.5 and -v or v
    end
    local t = helpers.mk().tensor(data, "float32", shape)
    return t, helpers.ref(t)
end

--[[
Fresh random cases for the pointwise ops the core's table brought without any
binding code (SubNode, DivNode, ExpNode, TanhNode, SigmoidNode, GELUNode), in
op_cases' form: checked on the CPU with every other op in ops_spec, CUDA
against the CPU in gpu_spec.
]]
function helpers.pointwise_cases()
    local mk, cases, add, input = case_list(1e-6, 1e-5)
    local function input_away(name, shape, lo, hi)
        local t, r = helpers.rand_away(shape, lo, hi)
        return mk.input(name, "float32", shape), t, r
    end
    local S = helpers.shape_str

    for rank = 1, 4 do
        local shape = rand_shape(rank, 1, 6)
        local a, at, ar = input("a", shape)
        local b, bt, br = input("b", shape)
        local d, dt, dr = input_away("d", shape, 0.5, 2)
        add("SubNode rank " .. rank, a - b, { a = at, b = bt }, R.sub(ar, br))
        add("SubNode as a:sub(b) rank " .. rank, a:sub(b), { a = at, b = bt }, R.sub(ar, br))
        add("DivNode rank " .. rank, a / d, { a = at, d = dt }, R.div(ar, dr))
        add("DivNode as a:div(d) rank " .. rank, a:div(d), { a = at, d = dt }, R.div(ar, dr))
        -- the second operand broadcasts where its dim is 1
        local cshape = copy(shape)
        for i = 1, rank do if math.random() < 0.5 then cshape[i] = 1 end end
        local c, ct, cr = input_away("c", cshape, 0.5, 2)
        add("SubNode broadcast " .. S(cshape) .. " onto " .. S(shape), a - c, { a = at, c = ct },
            R.sub(ar, cr))
        add("DivNode broadcast " .. S(cshape) .. " onto " .. S(shape), a / c, { a = at, c = ct },
            R.div(ar, cr))
        local x, xt, xr = input("x", shape, -3, 3)
        add("ExpNode rank " .. rank, x:exp(), { x = xt }, R.exp(xr))
        add("TanhNode rank " .. rank, x:tanh(), { x = xt }, R.tanh(xr))
        local g, gt, gr = input("g", shape, -5, 5)
        add("SigmoidNode rank " .. rank, g:sigmoid(), { g = gt }, R.sigmoid(gr))
        add("GELUNode rank " .. rank, g:gelu(), { g = gt }, R.gelu(gr))
    end

    do -- the issue's shapes: [2, 3] - [1, 3] and [2, 3] / [2, 1]
        local a, at, ar = input("a", { 2, 3 })
        local r, rt, rr = input("r", { 1, 3 })
        local c, ct, cr = input_away("c", { 2, 1 }, 0.5, 2)
        add("SubNode [2, 3] - [1, 3]", a - r, { a = at, r = rt }, R.sub(ar, rr))
        add("DivNode [2, 3] / [2, 1]", a / c, { a = at, c = ct }, R.div(ar, cr))
    end

    do -- numbers on either side: x - k, k - x, x / k, k / x
        local shape = rand_shape(math.random(1, 4), 1, 5)
        local x, xt, xr = input_away("x", shape, 0.25, 2)
        local k = helpers.f32(0.5 + 2.5 * math.random())
        local ones = {}
        for i = 1, #shape do ones[i] = 1 end
        local kb, kf = R.fill(ones, k), R.fill(shape, k)
        add("x - k", x - k, { x = xt }, R.sub(xr, kb))
        add("k - x", k - x, { x = xt }, R.sub(kf, xr))
        add("x / k", x / k, { x = xt }, R.div(xr, kb))
        add("k / x", k / x, { x = xt }, R.div(kf, xr))
    end

    do -- int64 SubNode: exact, wrapping around at the ends of the range as SumNode
        local rows, cols = math.random(2, 5), math.random(2, 5)
        local lo, hi = {}, {}
        for i = 1, rows * cols do
            if math.random() < 0.5 then
                -- minus a positive: wraps (5.1 hosts: numbers stop at 2^53, no wrap)
                lo[i] = (math.mininteger or -2 ^ 52) + math.random(0, 1000)
                hi[i] = 1001 + math.floor(math.random() * 2 ^ 40) -- 5.1: random takes ints
            else
                lo[i] = math.random(-1000000, 1000000)
                hi[i] = math.random(-1000000, 1000000)
            end
        end
        local it, jt = mk.tensor(lo, "int64", { rows, cols }), mk.tensor(hi, "int64", { rows, cols })
        local ir, jr = helpers.ref(it), helpers.ref(jt)
        local i, j = mk.input("i", "int64", { rows, cols }), mk.input("j", "int64", { rows, cols })
        add("int64 SubNode wraps around", i - j, { i = it, j = jt }, R.sub(ir, jr), 0, 0)
        local ct, cr = helpers.randint({ rows, 1 }, -1000, 1000)
        local c = mk.input("c", "int64", { rows, 1 })
        add("int64 SubNode broadcast and numbers", (7 - i) - c - 3, { i = it, c = ct },
            R.sub(R.sub(R.sub(R.fill({ rows, cols }, 7, "int64"), ir), cr), R.fill({ 1, 1 }, 3, "int64")),
            0, 0)
    end

    do -- a tree of the new ops: one fused group where the device fuses
        local shape = rand_shape(2, 2, 6)
        local a, at, ar = input("a", shape, -2, 2)
        local b, bt, br = input("b", shape, -2, 2)
        local d, dt, dr = input_away("d", shape, 0.5, 2)
        local y = ((a - b) / d):tanh() * a:sigmoid() + (b - 1):exp():gelu() / 2
        local ones = { 1, 1 }
        local want = R.add(R.mul(R.tanh(R.div(R.sub(ar, br), dr)), R.sigmoid(ar)),
            R.div(R.gelu(R.exp(R.sub(br, R.fill(ones, 1)))), R.fill(ones, 2)))
        add("a tree of SubNode, DivNode, TanhNode, SigmoidNode, ExpNode, GELUNode", y,
            { a = at, b = bt, d = dt }, want, 1e-5, 1e-4)
    end

    return cases
end

-- ---- devices ------------------------------------------------------------------

-- nil when CUDA is usable; otherwise the reason, for pending().
function helpers.requires_cuda()
    local ok, why = helpers.mk().cuda_available()
    if ok then return nil end
    return "no CUDA device: " .. tostring(why)
end

-- gpu_it(name, body) for a spec file: runs body where CUDA is usable, else
-- reports the spec skipped with the reason.
function helpers.read_file(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local s = f:read("a")
    f:close()
    return s
end

-- A fresh temporary file holding bytes; its path.
function helpers.tmpfile(bytes)
    local path = os.tmpname()
    local f = assert(io.open(path, "wb"))
    f:write(bytes)
    f:close()
    return path
end

function helpers.run_lua(cmd, prelude, body)
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(string.format("package.path = %q\npackage.cpath = %q\n", package.path, package.cpath),
            prelude, body)
    f:close()
    local p = assert(io.popen(string.format("%s %s 2>&1", cmd, path)))
    local out = p:read("a")
    local _, _, status = p:close()
    os.remove(path)
    local r = { output = out, status = status }
    for k, v in out:gmatch("([%w_]+)=([^\n]*)") do r[k] = v end
    return r
end

function helpers.gpu(it, skip)
    local no_cuda = helpers.requires_cuda()
    return function(name, body)
        it(name .. " #gpu", function()
            if no_cuda then
                skip(name .. ": " .. no_cuda)
                return
            end
            body()
        end)
    end
end

-- Asserts that f() raises an error whose message starts with `prefix` (after
-- the Lua position a node's error starts with, unless prefix has one) and
-- contains each of the other strings (plain text, not patterns).
function helpers.assert_error(f, prefix, ...)
    local ok, err = pcall(f)
    if ok then error("expected an error starting with '" .. prefix .. "', got none", 2) end
    err = tostring(err)
    -- a node's error names the Lua line that built it first: "x_spec.lua:12: "
    if not prefix:find("^.-%.lua:%d+: ") then err = err:gsub("^.-%.lua:%d+: ", "", 1) end
    if err:sub(1, #prefix) ~= prefix then
        error(string.format("error %q does not start with %q", err, prefix), 2)
    end
    for _, s in ipairs({ ... }) do
        if not err:find(s, 1, true) then
            error(string.format("error %q does not mention %q", err, s), 2)
        end
    end
    return err
end

-- The files of spec/cases/, sorted: one per family of ops.
local function case_files()
    local dir = (debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "spec") .. "/cases"
    local files, ls = {}, io.popen('ls "' .. dir .. '" 2>/dev/null')
    for name in ls:lines() do
        if name:match("^[%w_]+%.lua$") then files[#files + 1] = dir .. "/" .. name end
    end
    ls:close()
    -- never an empty table by accident (a failed listing): core.lua is always there
    assert(#files > 0, "no case files found in " .. dir)
    table.sort(files)
    return files
end

function helpers.family_cases(opts)
    local mk, cases, add, input, steps = case_list(1e-5, 1e-5)
    for _, path in ipairs(case_files()) do
        local family = assert(loadfile(path))()
        family({ mk = mk, add = add, steps = steps, input = input, R = R, H = helpers,
                 large = opts and opts.large, quick = os.getenv("MK_CASES") == "quick" })
    end
    return cases
end

function helpers.all_cases(opts)
    local cases = helpers.op_cases()
    for _, more in ipairs({ helpers.pointwise_cases(), helpers.family_cases(opts) }) do
        for _, case in ipairs(more) do cases[#cases + 1] = case end
    end
    return cases
end

return helpers
