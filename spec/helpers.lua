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
  helpers.family_cases()       fresh random cases {name, output, feeds, want, atol, rtol}
                               from every spec/cases/<family>.lua (one file per
                               family of ops: each returns function(c), c = {mk =, add =,
                               steps =, input =, R = helpers.ref_ops, H = helpers}, and adds
                               its cases; steps(name, output, {{feeds =, want = | error =}, ...})
                               a stateful one: one model run step after step)
  helpers.check_case(model, case[, atol, rtol])   runs a case (each step) on a fresh model
                               and checks it; returns the outputs' references
  helpers.all_cases([opts])    the same: the one cross-device table (ops_spec on the
                               CPU, gpu_spec on CUDA); opts.large (gpu_spec): the
                               families' large shapes too (c.large); MK_CASES=quick
                               (valgrind): a sample of the families' cases (c.quick)
  helpers.away(shape, dtype, lo, hi)   values of magnitude in [lo, hi], never zero
                               (exact in float32), and their reference
  helpers.leaf(name, t, constant, feeds)   t as a constant, or an input fed from feeds
  helpers.f32(x)               x rounded to float32 (string.pack)
  helpers.round_even(x)        x rounded to an integer, ties to even (x a double)
  helpers.requires_cuda()      nil when a CUDA device is usable, else the reason
                               (specs call pending(reason) with it)
  helpers.read_file(path)      a file's bytes, or nil where it cannot be opened
  helpers.tmpfile(bytes)       a fresh temporary file holding bytes; its path
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

-- A tensor of values with magnitudes in [lo, hi] and either sign, never zero
-- (dtype float32 or int64), and its reference. float32 values are drawn on a
-- grid of 2^-24 times the power of two at or above hi: exact in float32, so
-- the reference is the values themselves (no read back).
function helpers.away(shape, dtype, lo, hi)
    local data, step = {}, 1
    if dtype ~= "int64" then step = 2 ^ (math.ceil(math.log(hi) / math.log(2) - 1e-9) - 24) end
    local random, floor = math.random, math.floor
    for i = 1, numel(shape) do
        local v = floor((lo + (hi - lo) * random()) / step) * step
        if v == 0 then v = step end
        data[i] = random() < 0.5 and -v or v
    end
    return helpers.mk().tensor(data, dtype, shape), { shape = copy(shape), data = data, dtype = dtype }
end

-- A leaf for a case: the constant t, or an input fed t from `feeds`.
function helpers.leaf(name, t, constant, feeds)
    if constant then return helpers.mk().constant(t, name) end
    feeds[name] = t
    return helpers.mk().input(name, t.dtype, t.shape)
end

-- A list of cases ({name =, output = node, feeds = {name = tensor}, want =
-- reference, atol =, rtol =}, or steps = {...} in place of feeds and want), its add(name, output, feeds, want[, atol[, rtol]]) with
-- these default tolerances, and input(name, shape, lo, hi) -> node, tensor, ref.
local function case_list(atol, rtol)
    local mk = helpers.mk()
    local cases = {}
    -- tf32: the case's absolute error bound where its products may run in
    -- TF32 (gpu_spec's cudnn = true), where 2e-3 is too tight for long sums
    local function add(name, output, feeds, want, a, r, tf32)
        cases[#cases + 1] = { name = name, output = output, feeds = feeds, want = want,
            atol = a or atol, rtol = r or rtol, tf32 = tf32 }
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

-- c.quick (spec/valgrind.sh: MK_CASES=quick): c.keep() keeps about one case
-- in five of the families' exhaustive loops, and c.sizes leaves out the
-- large shapes; every kernel still runs
function helpers.family_cases(opts)
    local mk, cases, add, input, steps = case_list(1e-5, 1e-5)
    local quick = os.getenv("MK_CASES") == "quick"
    local function keep() return not quick or math.random() < 0.2 end
    for _, path in ipairs(case_files()) do
        local family = assert(loadfile(path))()
        family({ mk = mk, add = add, steps = steps, input = input, R = R, H = helpers,
                 large = opts and opts.large, quick = quick, keep = keep,
                 sizes = quick and { false } or { false, true } })
    end
    return cases
end

helpers.all_cases = helpers.family_cases

return helpers
