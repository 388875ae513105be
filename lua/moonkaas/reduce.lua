--[[
moonkaas.reduce — the Lua forms of the reductions, softmaxes and norms (the
core's "reductions and norms" rows): axes as Lua integers or lists, keepdims,
and numbers for eps and var's correction (float32 [1] constants).

  x:sum([axes][, {keepdims = false}])   also mean, max, min, prod; axes: an
        integer or a list (0-based, negative from the end), all when left out;
        without keepdims the reduced axes are dropped ([1] when none is left)
  x:var([axes][, {correction = 0, keepdims = false}])   0: NumPy's, 1: torch's
  x:argmax(axis[, {keepdims = false}])  x:argmin([axis][, {keepdims = false}])
        int64, the first on ties; x:argmax() and x:argmin(): the last axis, kept
        (ArgMaxNode's form)
  x:softmax([axis])  x:log_softmax([axis])   the last axis when left out
  x:layer_norm([k][, {weight =, bias =, eps = 1e-5}])   the last k axes (1)
  x:group_norm(groups[, {weight =, bias =, eps = 1e-5}])   x [N, C, ...]
  x:batch_norm(mean, var[, {weight =, bias =, eps = 1e-5}])   x [N, C, ...]
  x:rms_norm(w[, eps])   without eps RmsNormNode (eps 1e-5), with it RmsNormEpsNode

Weights and biases are nodes or tensors (float32) of the normalized shape; left
out, a [1] constant of 1 or 0. Each method's errors name the caller's line.
]]
local compat = require("moonkaas.compat")
local isinteger = compat.isinteger

return function(mk, methods)
    local is_node, is_tensor, format = mk.is_node, mk.is_tensor, string.format

    -- An argument error of a method here: raised as a table, which `method`
    -- turns into "file.lua:12: kind: fn: message" at the method's caller.
    local function fail(kind, fn, message, ...)
        error({ format("%s: %s: " .. message, kind, fn, ...) })
    end

    -- "file.lua:12: ": the innermost Lua line outside this module's folder,
    -- as the core finds a node's line (lua/node.c's caller_where).
    local folder = debug.getinfo(1, "S").source:match("^(@.*[/\\])[^/\\]*$")
    local function where()
        for level = 2, 200 do
            local info = debug.getinfo(level, "Sl")
            if not info then break end
            if info.currentline > 0 and not (folder and info.source:sub(1, #folder) == folder) then
                return info.short_src .. ":" .. info.currentline .. ": "
            end
        end
        return ""
    end

    -- methods[name] = f, run protected: the core's errors pass as they are
    -- (they name the user's line already), ours get that line too.
    local function method(name, f)
        methods[name] = function(...)
            local ok, r = pcall(f, ...)
            if ok then return r end
            if type(r) == "table" then error(where() .. r[1], 0) end
            error(r, 0)
        end
    end

    local function check_self(fn, x)
        if not is_node(x) then fail("argument error", fn, "argument #1 must be a node, got %s", type(x)) end
    end

    -- opts: nil or a table whose keys are among `known`.
    local function options(fn, opts, known)
        if opts == nil then return {} end
        if type(opts) ~= "table" then
            fail("argument error", fn, "the options must be a table, got %s", type(opts))
        end
        for k in pairs(opts) do
            if not known[k] then fail("argument error", fn, "unknown option '%s'", tostring(k)) end
        end
        return opts
    end

    local function keepdims_of(fn, opts)
        local k = opts.keepdims
        if k ~= nil and type(k) ~= "boolean" then
            fail("argument error", fn, "keepdims must be a boolean, got %s", type(k))
        end
        return k == true
    end

    -- A float32 [1] constant for a number, a node as it is.
    local function scalar(fn, what, v)
        if is_node(v) then return v end
        if type(v) ~= "number" then
            fail("argument error", fn, "%s must be a number or a float32 [1] node, got %s", what, type(v))
        end
        return mk.constant(mk.tensor({ v }, "float32"))
    end

    -- A weight or bias: a node or tensor, or (nil) a [1] constant of `default`.
    local function param(fn, what, v, default)
        if v == nil then return mk.constant(mk.tensor({ default }, "float32")) end
        if is_node(v) then return v end
        if is_tensor(v) then return mk.constant(v) end
        fail("argument error", fn, "%s must be a node or a tensor, got %s", what, type(v))
    end

    local function check_axis(fn, axis)
        if not isinteger(axis) then
            fail("argument error", fn, "the axis must be an integer, got %s", tostring(axis))
        end
    end

    -- The axis list of a reduction of x: all, one integer, or a list.
    local function axes_of(fn, x, axes)
        local list = {}
        if axes == nil then
            for i = 1, x.rank do list[i] = i - 1 end
        elseif isinteger(axes) then
            list[1] = axes
        elseif type(axes) == "table" then
            for i, a in ipairs(axes) do
                if not isinteger(a) then
                    fail("argument error", fn, "axis %d must be an integer, got %s", i, tostring(a))
                end
                list[i] = a
            end
        else
            fail("argument error", fn, "axes must be an integer or a list of integers, got %s", type(axes))
        end
        return list
    end

    -- y (x reduced over `list`, those axes kept as 1) with those axes
    -- dropped: [1] when none is left. The core has checked the axes.
    local function drop(x, y, list)
        local gone, shape = {}, {}
        for _, a in ipairs(list) do gone[a % x.rank] = true end
        for d = 0, x.rank - 1 do
            if not gone[d] then shape[#shape + 1] = x.shape[d + 1] end
        end
        if #shape == 0 then shape[1] = 1 end
        if #shape == y.rank then return y end
        return y:reshape(shape)
    end

    local reduce_opts = { keepdims = true }
    for _, name in ipairs({ "sum", "mean", "max", "min", "prod" }) do
        local raw = methods[name]
        method(name, function(x, axes, opts)
            check_self(name, x)
            opts = options(name, opts, reduce_opts)
            local list = axes_of(name, x, axes)
            local y = raw(x, list)
            return keepdims_of(name, opts) and y or drop(x, y, list)
        end)
    end

    local raw_var = methods.var
    local var_opts = { keepdims = true, correction = true }
    method("var", function(x, axes, opts)
        check_self("var", x)
        opts = options("var", opts, var_opts)
        local list = axes_of("var", x, axes)
        local c = opts.correction == nil and 0 or opts.correction
        local y = raw_var(x, scalar("var", "correction", c), list)
        return keepdims_of("var", opts) and y or drop(x, y, list)
    end)

    -- argmax and argmin along one axis; with neither axis nor options the
    -- last axis, kept (ArgMaxNode's form, which x:argmax() stays).
    local raw_argmax, raw_argmax_axis, raw_argmin = methods.argmax, methods.argmax_axis, methods.argmin
    for name, raw in pairs({ argmax = raw_argmax_axis, argmin = raw_argmin }) do
        method(name, function(x, axis, opts)
            check_self(name, x)
            if axis == nil and opts == nil then
                if name == "argmax" then return raw_argmax(x) end
                return raw(x, -1)
            end
            opts = options(name, opts, reduce_opts)
            if axis == nil then axis = -1 end
            check_axis(name, axis)
            local y = raw(x, axis)
            return keepdims_of(name, opts) and y or drop(x, y, { axis })
        end)
    end

    for _, name in ipairs({ "softmax", "log_softmax" }) do
        local raw = methods[name]
        method(name, function(x, axis)
            check_self(name, x)
            if axis == nil then axis = -1 end
            check_axis(name, axis)
            return raw(x, axis)
        end)
    end

    local norm_opts = { weight = true, bias = true, eps = true }
    local function norm_params(fn, opts)
        return param(fn, "weight", opts.weight, 1), param(fn, "bias", opts.bias, 0),
            scalar(fn, "eps", opts.eps == nil and 1e-5 or opts.eps)
    end

    local raw_layer = methods.layer_norm
    method("layer_norm", function(x, k, opts)
        check_self("layer_norm", x)
        if type(k) == "table" and opts == nil then k, opts = nil, k end
        opts = options("layer_norm", opts, norm_opts)
        if k == nil then k = 1 end
        if not isinteger(k) then
            fail("argument error", "layer_norm", "k (the normalized axes) must be an integer, got %s", tostring(k))
        end
        local w, b, eps = norm_params("layer_norm", opts)
        return raw_layer(x, w, b, eps, k)
    end)

    local raw_group = methods.group_norm
    method("group_norm", function(x, groups, opts)
        check_self("group_norm", x)
        opts = options("group_norm", opts, norm_opts)
        if not isinteger(groups) then
            fail("argument error", "group_norm", "groups must be an integer, got %s", tostring(groups))
        end
        local w, b, eps = norm_params("group_norm", opts)
        return raw_group(x, w, b, eps, groups)
    end)

    local raw_batch = methods.batch_norm
    method("batch_norm", function(x, mean, var, opts)
        check_self("batch_norm", x)
        opts = options("batch_norm", opts, norm_opts)
        local w, b, eps = norm_params("batch_norm", opts)
        return raw_batch(x, mean, var, w, b, eps)
    end)

    local raw_rms, raw_rms_eps = methods.rms_norm, methods.rms_norm_eps
    method("rms_norm", function(x, w, eps)
        if eps == nil then return raw_rms(x, w) end
        return raw_rms_eps(x, w, scalar("rms_norm", "eps", eps))
    end)
end
