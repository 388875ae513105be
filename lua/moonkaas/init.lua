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
           mk.from_file(path, {offset =, dtype =, shape =})  (mmap, read-only)
           t.dtype t.shape t.rank t.numel t.readonly #t tostring(t)
           t:totable() t:bytes() t:get(i...) t:set(i..., v) t:argmax() t:copy()
  nodes    mk.input(name, dtype, shape)  mk.constant(tensor[, name])
           mk.buffer(dtype, shape)  mk.embedding(table, ids)
           a + b  a * b  (numbers become broadcast constants)
           x:matmul(w) x:relu() x:silu() x:slice(b, e) x:reshape{...}
           x:permute{...} x:replace(r, b, e) x:rms_norm(w) x:complex_mul(f)
           x:sliced_softmax(p) x:argmax()    n.shape n.dtype n.op n.name
  models   mk.compile(node[, opts])  mk.compile_script(text[, constants[, opts]])
           m:run(inputs[, out]) m:stats() m:script() m:inputs() m:output()
           m:reset() (buffers back to zero) m:fusion_report() (cuDNN groups)
           m:close() (also <close> and the collector)
  misc     mk.script(node)  mk.lower(node)  mk.format_script(text)
           mk.cuda_available()  mk.best_device()  mk.version  mk.build_info
           mk.clock() (monotonic wall-clock seconds, for timing)

On the CPU a model uses its constants' memory in place (no copy): writing to
a constant's tensor with t:set after compiling changes that model's weights.
Errors are raised with a kind prefix: "shape error: ", "dtype error: ",
"name error: ", "argument error: ", "input error: ", "file error: ",
"evaluation error: ", "no CUDA device: ", "script:L:C: ...".
]==]
local core = require "moonkaas.core"

local mk = {}
for k, v in pairs(core) do mk[k] = v end

local node_info = core.node_info
local concat, format = table.concat, string.format

local is_node = core.is_node

local function list(t)
    return "[" .. concat(t, ", ") .. "]"
end

-- The nodes reachable from `output`, operands before users (iterative
-- depth-first post-order, so deep chains do not hit the C stack).
local function topological(output)
    local order, info, state = {}, {}, {}
    local stack = { output }
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

--[[
Lowers the DAG ending at `output` to script text. Returns the text and the
constants table {name = tensor} that compiling it needs. Input and constant
names are checked for clashes; unnamed constants become constant_<k>.
]]
local function lower(output)
    if not is_node(output) then
        error(format("argument error: script: the output must be a node, got %s", type(output)), 0)
    end
    local order, info = topological(output)

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

    local k, constants, lines, id = 0, {}, {}, {}
    for index, n in ipairs(order) do
        id[n] = index
        local i = info[n]
        local args = {}
        if i.op == "InputTensor" then
            args = { i.name, i.dtype, list(i.shape) }
        elseif i.op == "ConstantTensor" then
            local name = i.name
            if not name then
                repeat
                    k = k + 1
                    name = "constant_" .. k
                until owner[name] == nil
                owner[name] = n
            end
            constants[name] = i.tensor
            args = { name, i.dtype, list(i.shape) }
        elseif i.op == "BufferTensor" then
            args = { i.dtype, list(i.shape) }
        else
            for _, m in ipairs(i.inputs) do args[#args + 1] = "$" .. id[m] end
            if i.op == "SliceNode" then
                args[#args + 1] = i.attrs[1]
                args[#args + 1] = i.attrs[2]
            elseif i.op == "ReshapeNode" or i.op == "PermuteNode" then
                args[#args + 1] = list(i.attrs)
            end
        end
        lines[index] = format("$%d = %s(%s);", index, i.op, concat(args, ", "))
    end
    lines[#lines + 1] = format("result = $%d;", #order)
    return concat(lines, "\n") .. "\n", constants
end

-- mk.script(node) -> the script text of the network ending at node.
function mk.script(output)
    return (lower(output))
end

-- mk.lower(node) -> text, constants: what mk.compile hands to the core.
mk.lower = lower

--[[
mk.compile(node[, opts]) -> model. opts: device = "cpu" | "cuda" (default
"cpu"), cudnn = boolean, passes = boolean (false skips optional passes). The
constants' memory is handed to the core as it is: copied to the device on
CUDA, borrowed in place on the CPU (the model keeps the tensors alive).
]]
function mk.compile(output, opts)
    local text, constants = lower(output)
    return core.compile_script(text, constants, opts)
end

-- mk.compile_script(text[, constants[, opts]]) -> model, for any script.
mk.compile_script = core.compile_script

-- The best device this process can use, and why when it is the CPU.
function mk.best_device()
    local ok, why = core.cuda_available()
    if ok then return "cuda" end
    return "cpu", why
end

return mk
