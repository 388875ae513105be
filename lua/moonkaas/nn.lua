--[[
moonkaas.nn: a small functional layer set over named weights, no framework.

    local nn = require "moonkaas.nn"
    local y = nn.linear(x, w, b)        -- w [out, in] as PyTorch's, b [out] or nil

Each function takes nodes and returns nodes built from the op table's rows
(x:matmul, x:conv2d, x:batch_norm, ...): there are no modules, no parameter
registry and no state. Weights are nodes (mk.constant, mk.input) or tensors
(made constants here). Layouts and gate orders are PyTorch's, so a
state_dict saved as safetensors plugs in by name. doc/nn.md has each one.
]]

local mk = require "moonkaas"
local isinteger = require("moonkaas.compat").isinteger -- the module runs on Lua 5.1 too

local nn = {}

-- raised at the user's line: depth 0 when called from nn.<fn> itself, 1
-- from a helper of it
local function fail_at(depth, fn, fmt, ...)
    error(string.format("argument error: nn.%s: " .. fmt, fn, ...), 3 + depth)
end
local function fail(fn, fmt, ...) fail_at(1, fn, fmt, ...) end

-- a weight given as a tensor becomes a constant; nil stays nil
local function node(v)
    if v ~= nil and mk.is_tensor(v) then return mk.constant(v) end
    return v
end

local function need(fn, what, v)
    if not mk.is_node(v) then fail_at(1, fn, "%s must be a node or tensor, got %s", what, type(v)) end
    return v
end

-- x [..., in] @ w^T + b, w [out, in] (torch.nn.functional.linear)
function nn.linear(x, w, b)
    w, b = need("linear", "w", node(w)), node(b)
    if w.rank ~= 2 then fail("linear", "w must be [out, in], got rank %d", w.rank) end
    local y = x:matmul(w:T())
    if b ~= nil then y = y + b end
    return y
end

local function conv_opts(fn, opts, b, allowed)
    local o = { bias = b }
    for k, v in pairs(opts or {}) do
        if not allowed[k] then fail_at(1, fn, "unknown option %s", tostring(k)) end
        o[k] = v
    end
    return o
end

local CONV = { stride = true, padding = true, dilation = true, groups = true }
local CONV_T = { stride = true, padding = true, dilation = true, groups = true, output_padding = true }

-- x [N, C, H, W], w [O, C/groups, kH, kW], b [O] or nil;
-- opts {stride =, padding =, dilation =, groups =} (integers or {h, w})
function nn.conv2d(x, w, b, opts)
    return x:conv2d(need("conv2d", "w", node(w)), conv_opts("conv2d", opts, node(b), CONV))
end

-- x [N, C, H, W], w [C, O/groups, kH, kW], b [O] or nil; opts as conv2d's
-- and output_padding
function nn.conv_transpose2d(x, w, b, opts)
    return x:conv_transpose2d(need("conv_transpose2d", "w", node(w)),
        conv_opts("conv_transpose2d", opts, node(b), CONV_T))
end

-- inference batch norm over channel axis 1 with running mean and var [C]
function nn.batch_norm(x, mean, var, w, b, eps)
    return x:batch_norm(need("batch_norm", "mean", node(mean)), need("batch_norm", "var", node(var)),
        { weight = node(w), bias = node(b), eps = eps or 1e-5 })
end

-- layer norm over x's last axes, as many as w has (one without w)
function nn.layer_norm(x, w, b, eps)
    w = node(w)
    local k = w and w.rank or 1
    return x:layer_norm(k, { weight = w, bias = node(b), eps = eps or 1e-5 })
end

-- group norm of x [N, C, ...] in `groups` groups, w and b [C]
function nn.group_norm(x, groups, w, b, eps)
    return x:group_norm(groups, { weight = node(w), bias = node(b), eps = eps or 1e-5 })
end

-- opts {stride = kernel, padding = 0, dilation = 1}
function nn.max_pool2d(x, kernel, opts)
    return x:max_pool2d(kernel, opts or {})
end

-- padding counted (count_include_pad); opts {stride = kernel, padding = 0}
function nn.avg_pool2d(x, kernel, opts)
    return x:avg_pool2d(kernel, opts or {})
end

function nn.adaptive_avg_pool2d(x, size)
    return x:adaptive_avg_pool2d(size)
end

-- rows of w [V, D] picked by int64 ids of any shape: ids' shape + [D]
-- (torch.nn.functional.embedding's argument order)
function nn.embedding(ids, w)
    w = need("embedding", "w", node(w))
    if ids.rank == 1 then return mk.embedding(w, ids) end
    local shape = {}
    local n = 1
    for i = 1, ids.rank do
        shape[i] = ids.shape[i]
        n = n * ids.shape[i]
    end
    shape[#shape + 1] = w.shape[2]
    return mk.embedding(w, ids:reshape { n }):reshape(shape)
end

-- GELU, the erf form by default (PyTorch's); approximate = "tanh" the other
function nn.gelu(x, approximate)
    return x:gelu { approximate = approximate or "none" }
end

-- x [T, D] or [B, T, D]; p {wq, bq, wk, bk, wv, bv, wo, bo}, each w [D, D]
-- (PyTorch layout), b [D] or nil; heads divides D; opts {causal = false}.
-- softmax(q k^T / sqrt(D / heads)) v per head, then the output projection.
function nn.multi_head_attention(x, p, heads, opts)
    opts = opts or {}
    for k in pairs(opts) do
        if k ~= "causal" then fail("multi_head_attention", "unknown option %s", tostring(k)) end
    end
    local batched = x.rank == 3
    if not batched and x.rank ~= 2 then
        fail("multi_head_attention", "x must be [T, D] or [B, T, D], got rank %d", x.rank)
    end
    local B = batched and x.shape[1] or 1
    local T, D = x.shape[x.rank - 1], x.shape[x.rank]
    if not isinteger(heads) or heads < 1 or D % heads ~= 0 then
        fail("multi_head_attention", "heads (%s) must divide the width %d", tostring(heads), D)
    end
    local hd = math.floor(D / heads)
    local function split(t) -- [.., T, D] -> [B, H, T, hd]
        return t:reshape { B, T, heads, hd }:permute { 0, 2, 1, 3 }
    end
    local q = split(nn.linear(x, p.wq, p.bq))
    local k = split(nn.linear(x, p.wk, p.bk))
    local v = split(nn.linear(x, p.wv, p.bv))
    local scores = q:matmul(k:transpose(2, 3)) * (1 / math.sqrt(hd)) -- [B, H, T, T]
    local att = opts.causal and scores:causal_softmax(T) or scores:softmax(3)
    local o = att:matmul(v):permute { 0, 2, 1, 3 }:reshape(batched and { B, T, D } or { T, D })
    return nn.linear(o, p.wo, p.bo)
end

-- columns [i*n, (i+1)*n) of the last axis
local function chunk(t, i, n)
    return t:slice_axis(t.rank - 1, i * n, (i + 1) * n)
end

-- one LSTM step, PyTorch's gate order (input, forget, cell, output):
-- x [B, I], h and c [B, H], w_ih [4H, I], w_hh [4H, H], biases [4H] or nil.
-- Returns h', c'.
function nn.lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh)
    local g = nn.linear(x, w_ih, b_ih) + nn.linear(h, w_hh, b_hh)
    local n = math.floor(g.shape[g.rank] / 4)
    local i, f = chunk(g, 0, n):sigmoid(), chunk(g, 1, n):sigmoid()
    local gg, o = chunk(g, 2, n):tanh(), chunk(g, 3, n):sigmoid()
    local c2 = f * c + i * gg
    return o * c2:tanh(), c2
end

-- one GRU step, PyTorch's gate order (reset, update, new):
-- x [B, I], h [B, H], w_ih [3H, I], w_hh [3H, H], biases [3H] or nil.
-- r = s(xr + hr), z = s(xz + hz), n = tanh(xn + r hn), h' = (1 - z) n + z h
function nn.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)
    local gi, gh = nn.linear(x, w_ih, b_ih), nn.linear(h, w_hh, b_hh)
    local n = math.floor(gi.shape[gi.rank] / 3)
    local r = (chunk(gi, 0, n) + chunk(gh, 0, n)):sigmoid()
    local z = (chunk(gi, 1, n) + chunk(gh, 1, n)):sigmoid()
    local cand = (chunk(gi, 2, n) + r * chunk(gh, 2, n)):tanh()
    return cand + z * (h - cand)
end

return nn
