--[==[
moonkaas — define tensor networks in Lua, compile them with the moonkaas core.

    local mk = require "moonkaas"
    local x = mk.input("x", "float32", {2, 3})
    local w = mk.constant(mk.tensor({{1, 2}, {3, 4}, {5, 6}}), "w")
    local y = x:matmul(w):relu()
    print(mk.script(y))                      -- the IR text the core compiles
    local model <close> = mk.compile(y)      -- {device = "cuda", cudnn = true} on a GPU
    print(model:run({x = mk.tensor({{1, 0, -1}, {2, 2, 2}})}))

Host tensors, nodes and models are userdata of the C binding `moonkaas.core`;
this file adds the lowering: a node DAG printed as a script (`$1 .. $N` in
topological order, `result = $N;`), which then goes through the same
`mk_compile` as any hand-written script. Axis numbers are 0-based and ranges
half-open, as in the IR; element access on host tensors (t:get, t:set,
t:argmax, t:totable) is 1-based, as Lua tables are.

  tensors  mk.tensor(nested[, dtype]) | mk.tensor(flat, dtype, shape)
           mk.zeros(dtype, shape)  mk.from_bytes(s, dtype, shape)
           mk.from_file(path, {offset =, dtype =, shape =, copy =})  (read-only;
           files up to 64 MiB or with copy read, larger ones mapped)
           mk.load_safetensors(path[, {copy =}]) -> {name = tensor} (read-only,
           as from_file)  mk.save_safetensors(path, {name = tensor})
           mk.tensor_from_string(s, dtype, shape) (the same as mk.from_bytes)
           t.dtype t.shape t.rank t.numel t.readonly #t tostring(t)
           t:totable() t:bytes([i[, j]]) t:get(i...) t:set(i..., v) t:argmax()
           t:copy() t:reshape{...} t:to(dtype)  mk.quantize(t, group) -> q, scale
           q:dequantize(scale) (float32 q * scale in blocks)
           mk.quantize_file(path, {offset =, shape =, group =}) -> q, scale
           (mk.quantize of a file's float32 values, read in ~1 MiB pieces)
           dtypes: float32, int64, float16, bfloat16, int8, bool (the core's
           table); elements are Lua numbers in each (float16 and bfloat16 round
           to nearest even on the way in, int8 takes integers in [-128, 127]),
           Lua booleans in bool (mk.tensor({true, false}) is bool)
  files    mk.file_writer(path[, mode]) -> w: w:write(s...) w:commit() w:abort()
           (written whole or not at all, never through a planted link)
  nodes    mk.input(name, dtype, shape) | mk.input(name, shape) (float32)
           mk.constant(tensor[, name])  mk.buffer(dtype, shape)
           a + b  a - b  a * b (elementwise)  a / b; the operands broadcast
           as NumPy's: dims aligned from the last, each pair equal or 1
           ([n] + [m, n], [m, 1] + [1, n] -> [m, n]). A number on either side
           becomes a [1, ..., 1] constant of the other operand's dtype (1 - x,
           2 / x). A host tensor becomes an unnamed constant.
           -x (x:neg())  x ^ e (x:pow(e); e = 2, 1, -1 are x * x, x, 1 / x)
           x % y (x:mod(y), Python's: the divisor's sign)  x // y
           (x:floor_div(y); Lua 5.1 and LuaJIT have the method only); a
           number on either side of each. Comparisons are methods with bool
           results (Lua's < <= must give booleans): x:lt(y) x:le(y) x:gt(y)
           x:ge(y) x:eq(y) x:ne(y)  mk.where(c, a, b) (c bool)
           x:logical_and(y) x:logical_or(y) x:logical_not() (bool)
           x:clamp(lo, hi) (numbers or nodes; either may be nil)
           x:T() (axes reversed)  x:transpose(a, b) (two axes swapped; from
           the end where negative): permutes
           x:add(y) x:sub(y) x:mul(y) x:div(y)  x:relu() x:silu() x:exp()
           x:tanh() x:sigmoid() x:gelu() (tanh form)  x:matmul(w)
           x:abs() x:sqrt() x:rsqrt() x:log() x:exp2() x:sin() x:cos() x:erf()
           x:floor() x:ceil() x:round() (ties to even) x:sign() x:reciprocal()
           x:leaky_relu([alpha = 0.01]) x:elu([alpha = 1]) x:softplus()
           x:gelu_erf() (= x:gelu{approximate = "none"}) x:hardswish() x:mish()
           x:pow(y) x:minimum(y) x:maximum(y) x:mod(y) x:floor_div(y)
           x:slice(b, e) x:reshape{...} (one dim may be -1: what the count
           leaves) x:permute{...} (or the integers as arguments)  x:replace(r, b, e) x:rms_norm(w) x:complex_mul(f)
           x:sliced_softmax(p) x:argmax()  mk.embedding(table, ids)
           x:sample(state, t, p) (run.c's sampler: int64 (token, state))
           x:matmul(w) is numpy.matmul (1-D on either side, batch dims
           broadcast); shapes and data movement (doc/ops/shape.md):
           x:slice_axis(axis, b[, e[, step]]) x:squeeze([axis])
           x:unsqueeze(axis) x:flatten([s[, e]]) x:expand{...} x:flip(axis)
           x:concat(y[, axis]) mk.concat({...}[, axis]) mk.stack({...}[, axis])
           x:split(n | {sizes}[, axis]) x:pad(axis, before, after[, value |
           "reflect" | "edge"]) x:tile{...} x:repeat_interleave(r, axis)
           x:gather(index, axis) x:index_select(index, axis) x:cumsum([axis])
           x:sum([axes][, {keepdims = false}]) (also mean, max, min, prod)
           x:var([axes][, {correction = 0, keepdims = false}])
           x:argmax(axis[, opts]) x:argmin([axis][, opts]) x:softmax([axis])
           x:log_softmax([axis]) x:layer_norm([k][, {weight =, bias =, eps =}])
           x:group_norm(groups[, opts]) x:batch_norm(mean, var[, opts])
           x:rms_norm(w, eps): see moonkaas/reduce.lua
           b, e and p are int64 [1] nodes, or Lua integers (constants whose
           range the core checks when the node is built); sample's t and p
           are float32 [1] nodes
           n.shape n.dtype n.op n.name n.rank n.where  mk.node_info(n)
           All of these but the three leaves come from the core's op table:
           mk.ops() lists its rows {name, alias, signature, role, method,
           infix, expr, summary, broadcast, commutes, ...}, and a row the
           core adds appears here with its shape checks.
  models   mk.compile(node | {nodes}[, opts])
           mk.compile_script(text[, constants[, opts[, sources]]])
           m:run(inputs[, out...]) -> the outputs  m:stats() m:script()
           m:inputs() m:output() m:outputs() m:recurrence()
           m:run_steps(n, inputs[, outs][, {stop = {output =, value =}}])
           -> outs (each output's n steps stacked: [n, ...]), steps run
           (opts.next = {input = output node | integer} in mk.compile)
           m:reset() (buffers back to zero) m:fusion_report() (cuDNN groups)
           m:kernel_source(i) (the CUDA C of launch i, 1-based in evaluation
           order like every Lua index here; C's mk_model_kernel_source counts
           from 0) m:close() (also <close> and the collector)
  onnx     mk.load_onnx(path[, {shapes = {input = {dims}}, compile opts...}]) -> m:
           m:run({[input name] = tensor}) -> {[output name] = tensor}
           (moonkaas/onnx.lua; doc/onnx.md)  mk.onnx_open(path[, shapes])
           -> the script and constants it becomes  mk.onnx_ops() (the table)
  misc     mk.script(output[, next])  mk.format_script(text)
           mk.lower(output[, next]) -> text, constants, sources ({[line] = "file.lua:12"})
           mk.cuda_available()  mk.best_device()  mk.version  mk.build_info
           mk.clock() (monotonic wall-clock seconds, for timing)
           mk.is_terminal(file)
  hosts    mk.on_log(fn(level, message) | nil)  mk.on_progress(fn(phase, done,
           total) | nil)  mk.cancel(): the core prints nothing; it tells these
           functions ("info"/"warning"; phases "compile" (6 stages), "upload"
           (bytes), "kernels", "run" (CPU launches; CUDA: 0 of 1 before its
           graph, 1 of 1 after)). mk.cancel() from one of
           them stops the compile or run in progress with "cancelled: ..."; a
           function that raises stops that call only, with its own error.
           They may run other models; running, resetting or closing the
           model whose call they report on is a "busy: ..." error (doc/guide.md,
           "Threads and callbacks").

On the CPU a model uses its constants' memory in place (no copy): writing to
a constant's tensor with t:set after compiling changes that model's weights.
Errors are raised with a kind prefix: "shape error: ", "dtype error: ",
"name error: ", "argument error: ", "input error: ", "file error: ",
"evaluation error: ", "no CUDA device: ", "cancelled: ", "busy: ",
"script:L:C: ...". An error about a node built in Lua (its shape when built,
a compile error, a run-time fault) names first the Lua line that built it,
then the script line: "policy.lua:12: shape error: MatMulNode: ..." or
"policy.lua:12: evaluation error: ... (script:7:1)"; n.where and mk.lower's
third result hold those lines.
]==]
local core = require "moonkaas.core"
local compat = require("moonkaas.compat")
local isinteger, rawlen = compat.isinteger, compat.rawlen

-- Nodes record the Lua line that built them, skipping this module's own
-- files (this one's folder: init.lua, llama2.lua).
do
    local source = debug.getinfo(1, "S").source
    core.set_module_source(source:match("^(@.*[/\\])init%.lua$") or source)
end

local mk = {}
for k, v in pairs(core) do mk[k] = v end
mk.set_module_source = nil
mk.tensor_from_string = core.from_bytes

local node_info = core.node_info
local concat, format = table.concat, string.format

local is_node = core.is_node

local function list(t)
    return "[" .. concat(t, ", ") .. "]"
end

-- The nodes reachable from `outputs` (a list), operands before users
-- (iterative depth-first post-order, so deep chains do not hit the C stack).
local function topological(outputs)
    local order, info, state = {}, {}, {}
    local stack = {}
    for k = #outputs, 1, -1 do stack[#stack + 1] = outputs[k] end
    while #stack > 0 do
        local n = stack[#stack]
        if state[n] == nil then
            state[n] = "open"
            local i = node_info(n)
            info[n] = i
            for k = #i.inputs, 1, -1 do
                local m = i.inputs[k]
                if state[m] == nil then stack[#stack + 1] = m end
            end
        else
            stack[#stack] = nil
            if state[n] == "open" then
                state[n] = "done"
                order[#order + 1] = n
            end
        end
    end
    return order, info
end

-- `output` as a list of nodes: a node alone, or a list of them, read raw (a
-- __len or __index of the caller's table runs nothing here).
local function output_list(output)
    if is_node(output) then return { output } end
    local n = type(output) == "table" and rawlen(output) or 0
    if n == 0 then
        error(format("argument error: script: the output must be a node or a list of nodes, got %s",
            type(output)), 0)
    end
    local list = {}
    for k = 1, n do
        local node = rawget(output, k)
        if not is_node(node) then
            error(format("argument error: script: output %d must be a node, got %s", k, type(node)), 0)
        end
        list[k] = node
    end
    return list
end

--[[
Lowers the DAG ending at `output` (a node, or a list of nodes: the model's
outputs, in order) to script text. Returns the text, the constants table
{name = tensor} that compiling it needs, and the sources {[line] =
"file.lua:12"}: the Lua line that built each statement's node, so errors
about a line of the script name the user's line first. Input and constant names are checked
for clashes; unnamed constants become constant_<k>. Each statement is printed
from its op's signature (core.node_info), so no op is special here.

`next` ({input_name = node | integer}) makes the model a recurrence
(m:run_steps): at the next step, input_name holds that node's value (one of
the outputs), or its own value plus the integer (an int64 counter). The lines
are written in name order, and the core checks them.
]]
local function lower(output, next)
    local outputs = output_list(output)
    local order, info = topological(outputs)

    local owner = {} -- name -> node that carries it
    for _, n in ipairs(order) do
        local i = info[n]
        if i.name then
            local other = owner[i.name]
            if other and other ~= n then
                error(format("name error: script: two different nodes are named '%s' (%s and %s)",
                    i.name, tostring(other), tostring(n)), 0)
            end
            owner[i.name] = n
        end
    end

    local k, constants, lines, id, sources = 0, {}, {}, {}, {}
    for index, n in ipairs(order) do
        id[n] = index
        local i = info[n]
        sources[index] = i.where
        local name = i.name
        if i.leaf == "constant" then
            if not name then
                repeat
                    k = k + 1
                    name = "constant_" .. k
                until owner[name] == nil
                owner[name] = n
            end
            constants[name] = i.tensor
        end
        -- one argument per signature letter: n/r an operand, s the name (o an
        -- optional one), d the
        -- dtype, i the next integer, l the integers that the i's after it leave
        local args, input, attr = {}, 0, 0
        local sig = i.signature
        local ints_left = select(2, sig:gsub("i", ""))
        for c in sig:gmatch(".") do
            if c == "n" or c == "r" then
                input = input + 1
                args[#args + 1] = "$" .. id[i.inputs[input]]
            elseif c == "s" then
                args[#args + 1] = name
            elseif c == "o" then
                args[#args + 1] = i.name -- nil (left out) without one
            elseif c == "d" then
                args[#args + 1] = i.dtype
            elseif c == "i" then
                attr = attr + 1
                args[#args + 1] = i.attrs[attr]
                ints_left = ints_left - 1
            elseif c == "l" then
                local items = {}
                for j = attr + 1, #i.attrs - ints_left do items[#items + 1] = i.attrs[j] end
                attr = attr + #items
                args[#args + 1] = list(items)
            else
                error(format("internal error: script: %s has an unknown signature letter '%s'",
                    i.op, c), 0)
            end
        end
        lines[index] = format("$%d = %s(%s);", index, i.op, concat(args, ", "))
    end
    local results = {}
    for k, n in ipairs(outputs) do results[k] = "$" .. id[n] end
    lines[#lines + 1] = format("result = %s;", concat(results, ", "))
    if next ~= nil then
        if type(next) ~= "table" then
            error(format("argument error: script: next must be a table {input = node | integer}, got %s",
                type(next)), 0)
        end
        local names = {}
        for name in pairs(next) do
            if type(name) ~= "string" then
                error(format("argument error: script: next's keys are input names, got %s", type(name)), 0)
            end
            names[#names + 1] = name
        end
        table.sort(names)
        for _, name in ipairs(names) do
            local v = next[name]
            if isinteger(v) then
                lines[#lines + 1] = format("next %s = %s + %d;", name, name, v)
            elseif is_node(v) and id[v] then
                lines[#lines + 1] = format("next %s = $%d;", name, id[v])
            else
                error(format("argument error: script: next.%s must be an output node or an integer, got %s",
                    name, is_node(v) and "a node that is not an output" or type(v)), 0)
            end
        end
    end
    return concat(lines, "\n") .. "\n", constants, sources
end

-- mk.script(output[, next]) -> the script text of the network ending at
-- output (a node or a list of nodes), with next lines for a recurrence.
function mk.script(output, next)
    return (lower(output, next))
end

-- mk.lower(output[, next]) -> text, constants, sources: what mk.compile hands
-- to the core.
mk.lower = lower

--[[
mk.compile(output[, opts]) -> model, output a node or a list of nodes (the
model's outputs, in order). opts: device = "cpu" | "cuda" (default "cpu"),
cudnn = boolean, fuse = boolean (false: one launch per node, no pointwise
groups), passes = boolean (false skips optional passes), max_bytes = integer
(the most device memory the model may take; more is an "out of memory: ..."
error before anything is allocated), next = {input = node | integer} (a
recurrence for m:run_steps; see mk.lower), share = model (use that model's
memory for each named buffer it also has, one KV cache for two models, and
each constant of the same name and tensor; see "sharing" in moonkaas.h: the
two must not run at the same time), threads = integer (CPU: 0, the default,
lets the cost rule choose per launch, which keeps a small model such as a
policy MLP on the calling thread; n caps every launch at n threads; 1 opens
no OpenMP region at all, the same results bit for bit; see "threads" in
moonkaas.h). The constants' memory is handed to
the core as it is: copied to the device on CUDA, borrowed in place on the CPU
(the model keeps the tensors alive).
]]
function mk.compile(output, opts)
    local next
    if type(opts) == "table" and opts.next ~= nil then
        local rest = {}
        for k, v in pairs(opts) do rest[k] = v end
        next, rest.next = opts.next, nil
        opts = rest
    end
    local text, constants, sources = lower(output, next)
    return core.compile_script(text, constants, opts, sources)
end

-- mk.compile_script(text[, constants[, opts[, sources]]]) -> model, for any
-- script; sources (mk.lower's) put Lua lines in front of its errors.
mk.compile_script = core.compile_script

-- mk.load_onnx(path[, opts]) -> an ONNX file as a model (lua/moonkaas/onnx.lua)
function mk.load_onnx(path, opts)
    return require("moonkaas.onnx").load(path, opts)
end

-- ---- operators and methods made of rows the core has ---------------------
-- Each is set only where the core's table gave none, so a row that arrives
-- with its own operator (a pow op's "^") takes its place.

local node_mt = getmetatable(core.input("x", { 1 }))
local methods = core.node_methods

-- Raises "kind: fn: message" at the line that used the operator or method
-- (level 3: the caller of the function that calls this).
local function raise(kind, fn, message, ...)
    error(format("%s: %s: " .. message, kind, fn, ...), 3)
end

local function describe(v)
    return is_node(v) and tostring(v) or type(v) == "number" and tostring(v) or type(v)
end

-- x ^ e: PowNode (the core's __pow), but for the exponents whose result an
-- exact pow (rounded once) gives with cheaper rows: x * x and 1 / x round
-- once, as a correctly rounded pow would, and C's powf may not.
local core_pow = node_mt.__pow
node_mt.__pow = function(x, e)
    if is_node(x) and type(e) == "number" then
        if e == 1 then return x end
        if e == 2 then return x * x end
        if e == -1 then return 1 / x end
    end
    return core_pow(x, e)
end

-- Lua's < and <= must return a boolean, not a node: comparisons are the
-- methods x:lt(y) x:le(y) x:gt(y) x:ge(y) x:eq(y) x:ne(y) (bool results).
local function comparison(op, event, method)
    return function(x, y)
        raise("argument error", format("%s (%s)", op, event),
            "%s %s %s cannot be a node (Lua makes it a boolean): write x:%s(y), a bool node",
            describe(x), op, describe(y), method)
    end
end
node_mt.__lt = node_mt.__lt or comparison("<", "__lt", "lt")
node_mt.__le = node_mt.__le or comparison("<=", "__le", "le")

-- Scalar parameters with their defaults; a number becomes a float32 [1]
-- constant (a node broadcasts as any operand).
local leaky_relu, elu, gelu, gelu_erf = methods.leaky_relu, methods.elu, methods.gelu, methods.gelu_erf
function methods.leaky_relu(x, alpha)
    if alpha == nil then alpha = 0.01 end
    return leaky_relu(x, alpha)
end
function methods.elu(x, alpha)
    if alpha == nil then alpha = 1 end
    return elu(x, alpha)
end

-- x:gelu() is the tanh form (GELUNode, as HamKaas has it); x:gelu{approximate
-- = "none"} the erf form (x:gelu_erf()), {approximate = "tanh"} the tanh form.
function methods.gelu(x, opts)
    if opts == nil then return gelu(x) end
    local form = type(opts) == "table" and opts.approximate or nil
    if form == "none" then return gelu_erf(x) end
    if form == "tanh" then return gelu(x) end
    raise("argument error", "gelu", "opts must be {approximate = \"none\" | \"tanh\"}, got %s",
        type(opts) == "table" and tostring(form) or type(opts))
end

-- x:clamp(lo, hi): either bound may be nil (then x:maximum(lo) or x:minimum(hi)).
local clamp = methods.clamp
function methods.clamp(x, lo, hi)
    if lo == nil and hi == nil then
        raise("argument error", "clamp", "needs lo, hi or both, got neither")
    end
    if lo == nil then return x:minimum(hi) end
    if hi == nil then return x:maximum(lo) end
    return clamp(x, lo, hi)
end

-- x:T(): the axes reversed (NumPy's .T); a vector as it is.
methods.T = methods.T or function(x)
    if not is_node(x) then
        raise("argument error", "T", "argument #1 must be a node, got %s", type(x))
    end
    if x.rank == 1 then return x end
    local perm = {}
    for i = 1, x.rank do perm[i] = x.rank - i end
    return x:permute(perm)
end

-- x:transpose(a, b): axes a and b (0-based; negative from the end) swapped.
methods.transpose = methods.transpose or function(x, a, b)
    if not is_node(x) then
        raise("argument error", "transpose", "argument #1 must be a node, got %s", type(x))
    end
    local rank, axes = x.rank, { a, b }
    for k = 1, 2 do
        local v = axes[k]
        if not isinteger(v) then
            raise("argument error", "transpose", "argument #%d must be an integer axis, got %s",
                k + 1, describe(v))
        end
        if v < -rank or v >= rank then
            raise("shape error", "transpose", "axis %d is outside [%d, %d) for %s", v, -rank, rank,
                list(x.shape))
        end
        axes[k] = v % rank
    end
    local perm = {}
    for i = 1, rank do perm[i] = i - 1 end
    perm[axes[1] + 1], perm[axes[2] + 1] = axes[2], axes[1]
    return x:permute(perm)
end

-- ---- shape and data movement: the rows' methods with defaults, and lists ----

local function check_node_arg(fn, x)
    if not is_node(x) then
        raise("argument error", fn, "argument #1 must be a node, got %s", type(x))
    end
end

-- x:slice_axis(axis, begin[, end[, step]]): Python's x[begin:end:step] along
-- axis (end: the axis' length; step: 1).
local slice_axis = methods.slice_axis
methods.slice_axis = function(x, axis, b, e, step)
    check_node_arg("slice_axis", x)
    if e == nil and isinteger(axis) and axis >= -x.rank and axis < x.rank then
        e = x.shape[axis % x.rank + 1]
    end
    return slice_axis(x, axis, b, e, step or 1)
end

-- x:squeeze([axis]): without an axis, every axis of 1 (a [1, 1] keeps one).
local squeeze = methods.squeeze
methods.squeeze = function(x, axis)
    check_node_arg("squeeze", x)
    if axis ~= nil then return squeeze(x, axis) end
    for d = x.rank, 1, -1 do
        if x.rank > 1 and x.shape[d] == 1 then x = squeeze(x, d - 1) end
    end
    return x
end

-- x:flatten([start[, end]]): axes start to end (both included; 0 and -1).
local flatten = methods.flatten
methods.flatten = function(x, s, e)
    return flatten(x, s or 0, e or -1)
end

-- x:cumsum([axis]) (axis: the last)
local cumsum = methods.cumsum
methods.cumsum = function(x, axis)
    return cumsum(x, axis or -1)
end

-- x:concat(y[, axis]) (axis 0)
local concat_row = methods.concat
methods.concat = function(x, y, axis)
    return concat_row(x, y, axis or 0)
end

-- x:pad(axis, before, after[, value | "reflect" | "edge"]): value (default 0)
-- fills the new elements; "reflect" mirrors x without repeating its edge,
-- "edge" repeats it (numpy.pad's modes). One axis a call: chain them.
local pad_modes = { reflect = 1, edge = 2 }
methods.pad = function(x, axis, before, after, how)
    check_node_arg("pad", x)
    local mode, value = 0, 0
    if type(how) == "string" then
        mode = pad_modes[how]
        if not mode then
            raise("argument error", "pad", "mode must be a number, \"reflect\" or \"edge\", got %q", how)
        end
    elseif how ~= nil then
        if type(how) ~= "number" then
            raise("argument error", "pad", "argument #5 must be a number or a mode, got %s", type(how))
        end
        value = how
    end
    return x:pad_axis(mk.tensor({ value }, "float32", { 1 }), axis, before, after, mode)
end

-- A list of nodes (argument #1 of mk.concat, mk.stack).
local function node_list(fn, xs)
    if type(xs) ~= "table" or rawlen(xs) == 0 then
        raise("argument error", fn, "argument #1 must be a non-empty list of nodes, got %s", type(xs))
    end
    for k = 1, rawlen(xs) do
        if not is_node(rawget(xs, k)) then
            raise("argument error", fn, "item %d of argument #1 must be a node, got %s", k,
                type(rawget(xs, k)))
        end
    end
    return xs
end

-- mk.concat({x1, x2, ...}[, axis]): the nodes joined along axis (0), as
-- ConcatNodes in a chain.
function mk.concat(xs, axis)
    xs = node_list("concat", xs)
    local y = xs[1]
    for k = 2, #xs do y = y:concat(xs[k], axis or 0) end
    return y
end

-- mk.stack({x1, x2, ...}[, axis]): the nodes (of one shape) along a new axis (0).
function mk.stack(xs, axis)
    xs = node_list("stack", xs)
    local parts = {}
    for k = 1, #xs do parts[k] = xs[k]:unsqueeze(axis or 0) end
    return mk.concat(parts, axis or 0)
end

-- x:split(sizes | n[, axis]) -> a list of slices along axis (0): n equal parts,
-- or parts of the sizes given, which must add up to the axis.
methods.split = methods.split or function(x, sizes, axis)
    check_node_arg("split", x)
    axis = axis or 0
    if not isinteger(axis) or axis < -x.rank or axis >= x.rank then
        raise("shape error", "split", "axis %s is out of range for %s", describe(axis), list(x.shape))
    end
    local dim = x.shape[axis % x.rank + 1]
    if isinteger(sizes) then
        if sizes < 1 or dim % sizes ~= 0 then
            raise("shape error", "split", "%d parts do not divide axis %d's %d of %s", sizes, axis,
                dim, list(x.shape))
        end
        local n = sizes
        sizes = {}
        for k = 1, n do sizes[k] = compat.idiv(dim, n) end
    end
    if type(sizes) ~= "table" then
        raise("argument error", "split", "argument #2 must be an integer or a list of sizes, got %s",
            type(sizes))
    end
    local parts, at = {}, 0
    for k = 1, rawlen(sizes) do
        parts[k] = x:slice_axis(axis, at, at + sizes[k])
        at = at + sizes[k]
    end
    if at ~= dim then
        raise("shape error", "split", "sizes add up to %d, not axis %d's %d of %s", at, axis, dim,
            list(x.shape))
    end
    return parts
end
-- x:sum(...), x:softmax(...), x:layer_norm(...) and the other reductions and
-- norms: their axes, options and numbers (moonkaas/reduce.lua).
require("moonkaas.reduce")(mk, methods)
-- ---- convolution and pooling: PyTorch's argument forms -------------------
-- x:conv2d(w[, {stride =, padding =, dilation =, groups =, bias =}]) and the
-- rest: stride, padding, dilation (and output_padding, kernel sizes) an
-- integer or {h, w}; bias a node or tensor [O], added to the result. The
-- rows' own positional form (x:conv2d(w, sh, sw, ph, pw, dh, dw, groups))
-- still works: a number where the options go passes the call through.

-- The integers of option `key` (n of them: an integer repeats); errors name
-- the user's line (level 3: the caller of the method calling this).
local function option_ints(fn, opts, key, n, default)
    local v = opts[key]
    if v == nil then v = default end
    local out, ok = {}, isinteger(v)
    if ok then
        for i = 1, n do out[i] = v end
    elseif type(v) == "table" and rawlen(v) == n then
        ok = true
        for i = 1, n do
            ok = ok and isinteger(v[i])
            out[i] = v[i]
        end
    end
    if not ok then
        error(format("argument error: %s: %s must be an integer%s, got %s", fn, key,
            n > 1 and format(" or a list of %d integers", n) or "", describe(v)), 3)
    end
    return out
end

local function option_table(fn, opts, allowed)
    if opts == nil then return {} end
    if type(opts) ~= "table" then
        error(format("argument error: %s: the options must be a table, got %s", fn,
            describe(opts)), 3)
    end
    for key in pairs(opts) do
        if not allowed[key] then
            local names = {}
            for name in pairs(allowed) do names[#names + 1] = name end
            table.sort(names)
            error(format("argument error: %s: unknown option '%s' (takes %s)", fn, tostring(key),
                concat(names, ", ")), 3)
        end
    end
    return opts
end

-- y plus bias [O] along y's axis 1 (a [O, 1(, 1)] view broadcast).
local function add_bias(y, bias)
    if bias == nil then return y end
    if not is_node(bias) then bias = mk.constant(bias) end
    local shape = { bias.shape[1] }
    for i = 3, y.rank do shape[i - 1] = 1 end
    return y + bias:reshape(shape)
end

local unpack = table.unpack or unpack
local conv_keys = { stride = true, padding = true, dilation = true, groups = true, bias = true }

local function conv_method(fn, raw, dims, keys)
    return function(x, w, opts, ...)
        if type(opts) == "number" then return raw(x, w, opts, ...) end
        opts = option_table(fn, opts, keys)
        local args = {}
        for _, key in ipairs({ "stride", "padding", "output_padding", "dilation" }) do
            if keys[key] then
                local v = option_ints(fn, opts, key, dims,
                    (key == "padding" or key == "output_padding") and 0 or 1)
                for i = 1, dims do args[#args + 1] = v[i] end
            end
        end
        args[#args + 1] = option_ints(fn, opts, "groups", 1, 1)[1]
        return add_bias(raw(x, w, unpack(args)), opts.bias)
    end
end

if methods.conv2d then
    local t_keys = { output_padding = true }
    for k in pairs(conv_keys) do t_keys[k] = true end
    methods.conv1d = conv_method("conv1d", methods.conv1d, 1, conv_keys)
    methods.conv2d = conv_method("conv2d", methods.conv2d, 2, conv_keys)
    methods.conv_transpose2d = conv_method("conv_transpose2d", methods.conv_transpose2d, 2,
        t_keys)

    -- x:max_pool2d(kernel[, {stride = kernel, padding = 0, dilation = 1}])
    local raw_max = methods.max_pool2d
    methods.max_pool2d = function(x, kernel, opts, ...)
        if type(opts) == "number" then return raw_max(x, kernel, opts, ...) end
        opts = option_table("max_pool2d", opts, { stride = true, padding = true, dilation = true })
        local k = option_ints("max_pool2d", { kernel = kernel }, "kernel", 2)
        local s = option_ints("max_pool2d", opts, "stride", 2, k)
        local p = option_ints("max_pool2d", opts, "padding", 2, 0)
        local d = option_ints("max_pool2d", opts, "dilation", 2, 1)
        return raw_max(x, k[1], k[2], s[1], s[2], p[1], p[2], d[1], d[2])
    end

    -- x:avg_pool2d(kernel[, {stride = kernel, padding = 0}]): padding counted
    -- (PyTorch's count_include_pad), floor rule
    local raw_avg = methods.avg_pool2d
    methods.avg_pool2d = function(x, kernel, opts, ...)
        if type(opts) == "number" then return raw_avg(x, kernel, opts, ...) end
        opts = option_table("avg_pool2d", opts, { stride = true, padding = true })
        local k = option_ints("avg_pool2d", { kernel = kernel }, "kernel", 2)
        local s = option_ints("avg_pool2d", opts, "stride", 2, k)
        local p = option_ints("avg_pool2d", opts, "padding", 2, 0)
        return raw_avg(x, k[1], k[2], s[1], s[2], p[1], p[2])
    end

    -- x:adaptive_avg_pool2d(size): size an integer or {oh, ow}
    local raw_adaptive = methods.adaptive_avg_pool2d
    methods.adaptive_avg_pool2d = function(x, size, ...)
        if select("#", ...) > 0 then return raw_adaptive(x, size, ...) end
        local s = option_ints("adaptive_avg_pool2d", { size = size }, "size", 2)
        return raw_adaptive(x, s[1], s[2])
    end

    -- x:upsample_nearest2d({size = n | {oh, ow}} or {scale_factor = n | {sh, sw}}):
    -- integer scale factors
    local raw_up = methods.upsample_nearest2d
    methods.upsample_nearest2d = function(x, opts, ...)
        if type(opts) == "number" then return raw_up(x, opts, ...) end
        local fn = "upsample_nearest2d"
        opts = option_table(fn, opts, { size = true, scale_factor = true })
        if (opts.size == nil) == (opts.scale_factor == nil) then
            error(format("argument error: %s: give one of size and scale_factor", fn), 2)
        end
        if opts.size ~= nil then
            local s = option_ints(fn, opts, "size", 2)
            return raw_up(x, s[1], s[2])
        end
        local f = option_ints(fn, opts, "scale_factor", 2)
        if not is_node(x) or x.rank ~= 4 then return raw_up(x, f[1], f[2]) end -- its error
        return raw_up(x, x.shape[3] * f[1], x.shape[4] * f[2])
    end
end

-- The best device this process can use, and why when it is the CPU.
function mk.best_device()
    local ok, why = core.cuda_available()
    if ok then return "cuda" end
    return "cpu", why
end

return mk
