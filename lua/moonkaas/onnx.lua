--[==[
moonkaas.onnx — mk.load_onnx(path[, opts]) -> an ONNX model, compiled.

    local m <close> = mk.load_onnx("net.onnx", {shapes = {x = {1, 3, 224, 224}}})
    local outs = m:run({x = image})          -- {[output name] = tensor}

opts: shapes = {input = {dims}} fixes the symbolic dims (dim_param) of those
inputs (a symbolic dim left unfixed is an error naming it); every other
option is mk.compile's (device, cudnn, fuse, passes, max_bytes, threads...).
The file becomes a script and constants (mk.onnx_open(path, shapes) gives
them: import:script(), import:constants(), import:inputs(), import:outputs())
compiled with the same options as any network built in Lua. On the CPU the
model reads the file's initializers in place.

The model: m:run(inputs) takes {[ONNX input name] = tensor} and returns
{[ONNX output name] = tensor}; m:inputs() and m:outputs() list
{name, dtype, shape} under the ONNX names (a scalar is held as [1]);
m:script() (after the passes), m.source (the imported script), m.model (the
moonkaas model: stats, kernel_source, ...), m:close().
]==]
local core = require "moonkaas.core"

local M = {}
local model_mt = {__name = "moonkaas.onnx_model"}
model_mt.__index = model_mt

function M.load(path, opts)
    if opts ~= nil and type(opts) ~= "table" then
        error(string.format("argument error: load_onnx: opts must be a table, got %s",
                            type(opts)), 3)
    end
    local shapes, compile_opts = nil, {}
    for k, v in pairs(opts or {}) do
        if k == "shapes" then shapes = v else compile_opts[k] = v end
    end
    local import = core.onnx_open(path, shapes)
    local script = import:script()
    local model = core.compile_script(script, import:constants(), compile_opts)
    local self = setmetatable({model = model, source = script, opset = import:opset(),
                               path = path}, model_mt)
    self._inputs, self._outputs, self._script_of = import:inputs(), import:outputs(), {}
    for _, input in ipairs(self._inputs) do self._script_of[input.name] = input.script end
    return self
end

local function names(list)
    local t = {}
    for i, x in ipairs(list) do t[i] = type(x) == "table" and x.name or x end
    return table.concat(t, ", ")
end

-- m:run({[ONNX input name] = tensor}) -> {[ONNX output name] = tensor}
function model_mt:run(inputs)
    if type(inputs) ~= "table" then
        error(string.format("argument error: run: inputs must be a table {name = tensor}, "
                            .. "got %s", type(inputs)), 2)
    end
    local named = {}
    for k, v in pairs(inputs) do
        local s = self._script_of[k]
        if not s then
            error(string.format("input error: run: unknown input '%s' (the model takes %s)",
                                tostring(k), names(self._inputs)), 2)
        end
        named[s] = v
    end
    for _, input in ipairs(self._inputs) do
        if inputs[input.name] == nil then
            error(string.format("input error: run: missing input '%s' (%s [%s])", input.name,
                                input.dtype, table.concat(input.shape, ", ")), 2)
        end
    end
    local outs = { self.model:run(named) } -- tensors: never nil
    local result = {}
    for i, name in ipairs(self._outputs) do result[name] = outs[i] end
    return result
end

function model_mt:inputs()
    local t = {}
    for i, x in ipairs(self._inputs) do t[i] = {name = x.name, dtype = x.dtype, shape = x.shape} end
    return t
end

function model_mt:outputs()
    local t = self.model:outputs()
    for i, x in ipairs(t) do x.name = self._outputs[i] end
    return t
end

function model_mt:script() return self.model:script() end
function model_mt:stats() return self.model:stats() end
function model_mt:close() self.model:close() end
model_mt.__close = model_mt.close

function model_mt:__tostring()
    return string.format("onnx model %s (opset %d; inputs %s; outputs %s)", self.path,
                         self.opset, names(self._inputs), names(self._outputs))
end

return M
