-- The CUDA device is a plugin (build/libmoonkaas_cuda.so) that the core opens
-- the first time CUDA is asked for (core/plugin.c). Each case runs in a child
-- lua5.4 process (this one has long since asked for CUDA in other specs) with
-- this spec's package.path and package.cpath, builds a small MLP on the CPU
-- and checks it against a plain-Lua reference in double precision; then:
--   * before anything asks for CUDA, the process maps no CUDA library and not
--     the plugin; asking for CUDA then loads the plugin where the build made one;
--   * with MK_CUDA_PLUGIN naming a missing file, mk.cuda_available() says why,
--     compiling for CUDA fails with "no CUDA device:", and the CPU still works;
--   * OpenBLAS is not mapped while every product runs in a group or has few
--     rows (a short prompt); a product of more rows opens it at its compile,
--     or, with MK_BLAS naming a missing file, fails saying so while the rest
--     still runs; the OpenMP build of OpenBLAS is the one opened where it is
--     installed.
local H = require "spec.helpers"
local mk = H.mk()
local seed = H.seed("plugin_spec")

local LUA = os.getenv("LUA") or "lua5.4"
local CUDA_LIBS = { "libcudart", "libcublas", "libcublasLt", "libcudnn", "libmoonkaas_cuda" }
local with_plugin = mk.build_info:find("cuda plugin", 1, true) ~= nil

-- The child's program: prints "key=value" lines the cases read.
local CHILD = [==[
local mk = require "moonkaas"
math.randomseed(SEED)

local function mapped()
    local maps = assert(io.open("/proc/self/maps")):read("a")
    local found = {}
    for _, lib in ipairs(CUDA_LIBS) do
        if maps:find("/" .. lib, 1, true) then found[#found + 1] = lib end
    end
    return table.concat(found, ",")
end

-- x [4, 8] -> relu(x @ w1 + b1) [4, 16] -> @ w2 [16, 3]; values uniform in ±[0.1, 1)
local function rand(rows, cols)
    local t = {}
    for i = 1, rows do
        t[i] = {}
        for j = 1, cols do
            local v = 0.1 + 0.9 * math.random()
            t[i][j] = math.random(2) == 1 and v or -v
        end
    end
    return t
end
local function mlp_error()
    local X, W1, B1, W2 = rand(4, 8), rand(8, 16), rand(1, 16), rand(16, 3)
    local x = mk.input("x", "float32", { 4, 8 })
    local y = (x:matmul(mk.constant(mk.tensor(W1), "w1")) + mk.constant(mk.tensor(B1), "b1"))
        :relu():matmul(mk.constant(mk.tensor(W2), "w2"))
    local model <close> = mk.compile(y)
    local got = model:run({ x = mk.tensor(X) }):totable()
    -- the reference reads back the float32 values the model was given
    local function f32(t) return mk.tensor(t):totable() end
    X, W1, B1, W2 = f32(X), f32(W1), f32(B1), f32(W2)
    local worst = 0
    for i = 1, 4 do
        local h = {}
        for j = 1, 16 do
            local s = B1[1][j]
            for k = 1, 8 do s = s + X[i][k] * W1[k][j] end
            h[j] = s > 0 and s or 0
        end
        for j = 1, 3 do
            local s = 0
            for k = 1, 16 do s = s + h[k] * W2[k][j] end
            local e = math.abs(got[i][j] - s) / (1e-5 + 1e-5 * math.abs(s))
            if e > worst then worst = e end
        end
    end
    return worst -- <= 1: within atol 1e-5 + rtol 1e-5
end

print("cpu_error=" .. mlp_error())
print("mapped_after_cpu=" .. mapped())
local hwm = assert(io.open("/proc/self/status")):read("a"):match("VmHWM:%s*(%d+)")
print("vmhwm_kb=" .. tostring(hwm))
local ok, reason = mk.cuda_available()
print("cuda_available=" .. tostring(ok))
print("reason=" .. tostring(reason):gsub("\n", " "))
local x = mk.input("x", "float32", { 2 })
local compiled, err = pcall(mk.compile, x * 2, { device = "cuda" })
print("cuda_compile=" .. tostring(compiled))
print("cuda_error=" .. (compiled and "" or tostring(err):gsub("\n", " ")))
print("mapped_after_cuda=" .. mapped())
print("cpu_error_after=" .. mlp_error())
-- OpenBLAS: not mapped while every product runs in a group (the MLP above)
-- or has few rows (up to 64: CPU_FEW_ROWS in core/cpu/matmul.c, as a short
-- prompt's); a product of more rows needs it
local function blas_mapped()
    return assert(io.open("/proc/self/maps")):read("a"):find("libopenblas", 1, true) and "yes" or "no"
end
print("blas_after_groups=" .. blas_mapped())
-- a [rows, 8] @ w [8, 8], over w's first `prefix` rows where given (matmul_prefix)
local function product_error(rows, prefix)
    local A, W = rand(rows, 8), rand(8, 8)
    local a, w = mk.input("a", "float32", { rows, 8 }), mk.constant(mk.tensor(W), "w8")
    local model <close> = mk.compile(prefix and a:matmul_prefix(w, prefix) or a:matmul(w))
    local got = model:run({ a = mk.tensor(A) }):totable()
    local function f32(t) return mk.tensor(t):totable() end
    A, W = f32(A), f32(W)
    local worst = 0
    for i = 1, rows do
        for j = 1, 8 do
            local s = 0
            for k = 1, prefix or 8 do s = s + A[i][k] * W[k][j] end
            local e = math.abs(got[i][j] - s) / (1e-5 + 1e-5 * math.abs(s))
            if e > worst then worst = e end
        end
    end
    return worst
end
print("few_rows_error=" .. product_error(64))
print("blas_after_few_rows=" .. blas_mapped())
local prefix_ok, prefix = pcall(product_error, 80, 5)
print("prefix_compile=" .. tostring(prefix_ok))
print("prefix_error=" .. tostring(prefix):gsub("\n", " "))
print("blas_after_prefix=" .. blas_mapped())
local lone_ok, lone = pcall(product_error, 80)
print("lone_compile=" .. tostring(lone_ok))
print("lone_error=" .. tostring(lone):gsub("\n", " "))
print("blas_after_lone=" .. blas_mapped())
local maps = assert(io.open("/proc/self/maps")):read("a")
print("blas_build=" .. (maps:find("openblas-openmp/", 1, true) and "openmp"
    or maps:find("openblas-pthread/", 1, true) and "pthread" or "other"))
print("cpu_error_last=" .. mlp_error())
print("done=true")
]==]

-- Runs CHILD in a fresh interpreter with `env` ("NAME=value ..." or "") and returns its lines as a table.
local function run_child(env)
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(string.format("package.path = %q\npackage.cpath = %q\nSEED = %d\nCUDA_LIBS = {",
        package.path, package.cpath, seed))
    for _, lib in ipairs(CUDA_LIBS) do f:write(string.format("%q, ", lib)) end
    f:write("}\n", CHILD)
    f:close()
    local p = assert(io.popen(string.format("env -u MK_CUDA_PLUGIN %s %s %s 2>&1", env, LUA, path)))
    local out = p:read("a")
    p:close()
    os.remove(path)
    local r = { output = out }
    for k, v in out:gmatch("([%w_]+)=([^\n]*)") do r[k] = v end
    assert.are.equal("true", r.done, "the child did not finish:\n" .. out)
    return r
end

describe("OpenBLAS", function()
    it("is opened by the first compile with a product of many rows (a prefix's too), not by groups or few rows", function()
        local r = run_child("")
        assert.are.equal("no", r.blas_after_groups, r.output)
        assert.is_true(tonumber(r.few_rows_error) <= 1, r.output)
        assert.are.equal("no", r.blas_after_few_rows, r.output)
        assert.are.equal("true", r.prefix_compile, r.output)
        assert.is_true(tonumber(r.prefix_error) <= 1, r.output)
        assert.are.equal("yes", r.blas_after_prefix, r.output)
        assert.are.equal("true", r.lone_compile, r.output)
        assert.is_true(tonumber(r.lone_error) <= 1, r.output)
        assert.are.equal("yes", r.blas_after_lone, r.output)
    end)

    -- Debian's two builds: the OpenMP one first where it is installed (its
    -- threads are OpenMP's own), else the pthreads one; MK_BLAS picks either
    local multiarch = "/usr/lib/x86_64-linux-gnu/"
    local function installed(build)
        local f = io.open(multiarch .. "openblas-" .. build .. "/libopenblas.so.0")
        if f then f:close() end
        return f ~= nil
    end
    it("is OpenBLAS's OpenMP build where one is installed, else the pthreads build; MK_BLAS names either", function()
        if not (installed("openmp") and installed("pthread")) then
            pending("needs Debian's libopenblas0-openmp and libopenblas0-pthread (x86_64)")
            return
        end
        local r = run_child("")
        assert.are.equal("yes", r.blas_after_lone, r.output)
        assert.are.equal("openmp", r.blas_build, r.output)
        assert.is_true(tonumber(r.lone_error) <= 1, r.output)
        r = run_child("MK_BLAS=" .. multiarch .. "openblas-pthread/libopenblas.so.0")
        assert.are.equal("pthread", r.blas_build, r.output)
        assert.is_true(tonumber(r.lone_error) <= 1, r.output)
    end)

    it("named by MK_BLAS where it cannot be opened fails that compile clearly; the rest runs", function()
        local r = run_child("MK_BLAS=/nonexistent/libopenblas.so.0")
        assert.is_true(tonumber(r.cpu_error) <= 1, r.output)
        assert.is_true(tonumber(r.few_rows_error) <= 1, r.output)
        assert.are.equal("false", r.prefix_compile, r.output)
        assert.truthy(r.prefix_error:find("device error: .*PrefixMatMulNode %$%d+: the CPU's matrix "
            .. "products need OpenBLAS, which cannot be opened"), r.prefix_error)
        assert.are.equal("false", r.lone_compile, r.output)
        assert.truthy(r.lone_error:find("device error: .*MatMulNode %$%d+: the CPU's matrix products "
            .. "need OpenBLAS, which cannot be opened: /nonexistent/libopenblas.so.0"), r.lone_error)
        assert.are.equal("no", r.blas_after_lone, r.output)
        assert.is_true(tonumber(r.cpu_error_last) <= 1, r.output)
    end)
end)

describe("the CUDA plugin", function()
    it("is not mapped by a process that only uses the CPU, and is loaded when CUDA is asked for", function()
        local r = run_child("")
        assert.is_true(tonumber(r.cpu_error) <= 1, "MLP on the CPU: " .. r.cpu_error)
        assert.are.equal("", r.mapped_after_cpu, "mapped by a CPU-only process")
        print("# CPU-only MLP process: peak RSS (VmHWM) " .. r.vmhwm_kb .. " kB")
        if with_plugin then
            -- the build made a plugin: it is found (beside the module) and loads; on a
            -- machine without a GPU only the probe fails
            assert.is_nil(r.reason:find("was not found", 1, true), r.reason)
            assert.is_nil(r.reason:find("is broken", 1, true), r.reason)
            assert.truthy(r.mapped_after_cuda:find("libmoonkaas_cuda", 1, true), r.output)
            assert.truthy(r.mapped_after_cuda:find("libcudart", 1, true), r.output)
        else
            assert.are.equal("false", r.cuda_available)
            assert.are.equal("", r.mapped_after_cuda)
        end
        if r.cuda_available == "false" then
            assert.are.equal("false", r.cuda_compile)
            assert.truthy(r.cuda_error:find("^no CUDA device: "), r.cuda_error)
        end
        assert.is_true(tonumber(r.cpu_error_after) <= 1, "MLP on the CPU after CUDA: " .. r.output)
    end)

    it("missing (MK_CUDA_PLUGIN names no file) is a reason, a clean CUDA error and a working CPU", function()
        local missing = "/nonexistent/moonkaas-" .. seed .. "/libmoonkaas_cuda.so"
        local r = run_child("MK_CUDA_PLUGIN=" .. missing)
        assert.are.equal("false", r.cuda_available)
        if with_plugin then
            assert.truthy(r.reason:find("CUDA plugin", 1, true), r.reason)
            assert.truthy(r.reason:find("not found", 1, true), r.reason)
            assert.truthy(r.reason:find(missing, 1, true), r.reason)
        else
            assert.truthy(r.reason:find("without CUDA", 1, true), r.reason)
        end
        assert.are.equal("false", r.cuda_compile)
        assert.truthy(r.cuda_error:find("^no CUDA device: "), r.cuda_error)
        assert.truthy(r.cuda_error:find(r.reason, 1, true), r.cuda_error)
        assert.are.equal("", r.mapped_after_cpu)
        assert.are.equal("", r.mapped_after_cuda, "a missing plugin mapped CUDA libraries")
        assert.is_true(tonumber(r.cpu_error) <= 1, "MLP on the CPU: " .. r.output)
        assert.is_true(tonumber(r.cpu_error_after) <= 1, "MLP on the CPU after the failure: " .. r.output)
    end)

    it("broken (MK_CUDA_PLUGIN names a file that is no plugin) is a reason naming it, never a crash", function()
        local junk = os.tmpname()
        local f = assert(io.open(junk, "w"))
        f:write("not a shared object\n")
        f:close()
        local r = run_child("MK_CUDA_PLUGIN=" .. junk)
        os.remove(junk)
        assert.are.equal("false", r.cuda_available)
        if with_plugin then
            assert.truthy(r.reason:find("CUDA plugin " .. junk .. " is broken", 1, true), r.reason)
        end
        assert.truthy(r.cuda_error:find("^no CUDA device: "), r.cuda_error)
        assert.is_true(tonumber(r.cpu_error_after) <= 1, "MLP on the CPU after the failure: " .. r.output)
    end)
end)
