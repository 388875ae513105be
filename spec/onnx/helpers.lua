--[[
spec/onnx/helpers.lua — what the ONNX specs share:

  O.python()              nil when Debian's python3-onnx writes files here, else the reason
  O.write(desc[, name])   the ONNX file a description makes (spec/onnx/make_model.py,
                          with onnx.helper): its path, in a fresh folder per spec run
  O.dir                   that folder
  O.json(v)               a Lua value as JSON (tables with [1] or empty ones as arrays)
  O.init(name, ref[, type])   an initializer of a reference tensor {shape, data}
  O.vi(name, shape[, type])   a graph input or output's value info
  O.decode(text)          JSON text as Lua values (objects, arrays, numbers, strings)
  O.ort_missing()         nil when node and onnxruntime-node are installed (MK_ORTNODE
                          names its node_modules, else /opt/ortnode/node_modules), else the reason
  O.ort(path, feeds)      ONNX Runtime's (CPU provider) outputs for feeds {name = tensor}:
                          {name = {shape =, data =}} (spec/onnx/ort_run.js under node)
]]
local O = {}

local PY = os.getenv("MK_PYTHON") or "/usr/bin/python3"

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local checked, reason
function O.python()
    if checked then return reason end
    checked = true
    local ok = os.execute(PY .. " -c 'import onnx, numpy' > /dev/null 2>&1")
    if ok ~= true and ok ~= 0 then reason = PY .. " cannot import onnx (Debian: python3-onnx)" end
    return reason
end

O.dir = assert(io.popen("mktemp -d /tmp/mk-onnx.XXXXXX")):read("l")

local function encode(v, out)
    local t = type(v)
    if t == "table" then
        if v[1] ~= nil or next(v) == nil then
            out[#out + 1] = "["
            for i, x in ipairs(v) do
                if i > 1 then out[#out + 1] = "," end
                encode(x, out)
            end
            out[#out + 1] = "]"
        else
            out[#out + 1] = "{"
            local keys = {}
            for k in pairs(v) do keys[#keys + 1] = k end
            table.sort(keys)
            for i, k in ipairs(keys) do
                if i > 1 then out[#out + 1] = "," end
                encode(tostring(k), out)
                out[#out + 1] = ":"
                encode(v[k], out)
            end
            out[#out + 1] = "}"
        end
    elseif t == "string" then
        out[#out + 1] = '"' .. v:gsub('[%c"\\]', function(c)
            return string.format("\\u%04x", c:byte())
        end) .. '"'
    elseif t == "number" then
        if math.type and math.type(v) == "integer" then out[#out + 1] = string.format("%d", v)
        elseif v == math.floor(v) and math.abs(v) < 2 ^ 53 then out[#out + 1] = string.format("%d", v)
        else out[#out + 1] = string.format("%.17g", v) end
    elseif t == "boolean" then
        out[#out + 1] = tostring(v)
    elseif v == nil then
        out[#out + 1] = "null"
    else
        error("json: cannot encode " .. t)
    end
end

function O.json(v)
    local out = {}
    encode(v, out)
    return table.concat(out)
end

local count = 0
function O.write(desc, name)
    count = count + 1
    name = name or string.format("m%d", count)
    local json, path = O.dir .. "/" .. name .. ".json", O.dir .. "/" .. name .. ".onnx"
    local f = assert(io.open(json, "w"))
    f:write(O.json(desc))
    f:close()
    local cmd = string.format("%s spec/onnx/make_model.py %s %s 2>&1", PY, q(json), q(path))
    local p = assert(io.popen(cmd))
    local text = p:read("a")
    local ok = p:close()
    if not ok then error("make_model.py failed for " .. json .. ":\n" .. text, 2) end
    return path
end

function O.init(name, ref, type_)
    return { name = name, type = type_ or "FLOAT", shape = ref.shape, values = ref.data }
end

function O.vi(name, shape, type_)
    return { name = name, type = type_ or "FLOAT", shape = shape }
end

function O.decode(text)
    local at = 1
    local function space() at = text:find("[^ \t\r\n]", at) or #text + 1 end
    local value
    local function str()
        local e = text:find('"', at + 1, true)
        local s = text:sub(at + 1, e - 1)
        at = e + 1
        return s
    end
    function value()
        space()
        local c = text:sub(at, at)
        if c == "{" or c == "[" then
            local obj, close, n = {}, c == "{" and "}" or "]", 0
            at = at + 1
            space()
            if text:sub(at, at) == close then at = at + 1; return obj end
            while true do
                space()
                if close == "}" then
                    local k = str()
                    space()
                    at = at + 1 -- ':'
                    obj[k] = value()
                else
                    n = n + 1
                    obj[n] = value()
                end
                space()
                local d = text:sub(at, at)
                at = at + 1
                if d == close then return obj end
            end
        elseif c == '"' then
            return str()
        else
            local s, e = text:find("^[-+0-9.eE]+", at)
            if not s then
                for word, v in pairs({ ["true"] = true, ["false"] = false, null = 0 / 0 }) do
                    if text:sub(at, at + #word - 1) == word then at = at + #word; return v end
                end
                error("json: unexpected " .. text:sub(at, at + 10))
            end
            at = e + 1
            return tonumber(text:sub(s, e))
        end
    end
    return value()
end

local function ort_path()
    for _, p in ipairs({ os.getenv("MK_ORTNODE") or "", "/opt/ortnode/node_modules",
                         "/work/ortnode/node_modules" }) do
        local f = p ~= "" and io.open(p .. "/onnxruntime-node/package.json")
        if f then
            f:close()
            return p
        end
    end
end

function O.ort_missing()
    local ok = os.execute("node --version > /dev/null 2>&1")
    if ok ~= true and ok ~= 0 then return "node is not installed" end
    if not ort_path() then
        return "onnxruntime-node is not installed (MK_ORTNODE, or /opt/ortnode: scripts/setup.sh)"
    end
end

function O.ort(path, feeds)
    local inputs = {}
    for name, t in pairs(feeds) do
        local data = {}
        for i = 1, t.numel do data[i] = t:get(i) end
        inputs[name] = { type = t.dtype, dims = t.shape, data = data }
    end
    local json = path .. ".inputs.json"
    local f = assert(io.open(json, "w"))
    f:write(O.json(inputs))
    f:close()
    local p = assert(io.popen(string.format("NODE_PATH=%s node spec/onnx/ort_run.js %s %s 2>&1",
                                            q(ort_path()), q(path), q(json))))
    local text = p:read("a")
    assert(p:close(), "ort_run.js failed: " .. text)
    local out = {}
    for name, t in pairs(O.decode(text)) do
        out[name] = { shape = t.dims, data = t.data }
    end
    return out
end

return O
