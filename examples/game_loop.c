/*
 * game_loop.c — a game host embedding Lua and moonkaas: a policy network,
 * defined in Lua, picks an action every simulated frame.
 *
 * What a host does, in order:
 *   - its own lua_State, moonkaas's binding linked in and registered with
 *     luaL_requiref (no shared module searched for), the Lua layer found
 *     through package.path;
 *   - a Lua chunk (POLICY below) builds the policy, an MLP 64 -> 256 -> 256
 *     -> 8 with biases and ReLUs, compiles it for a device and returns a
 *     function that runs one frame into preallocated tensors;
 *   - every frame the host writes the observation, calls that function with
 *     lua_pcall (errors come back as values: nothing is printed on stderr,
 *     nothing aborts) and reads the action;
 *   - one frame is cancelled on purpose, as a host whose frame budget ran out
 *     would (mk.cancel from the progress function): that frame reports
 *     "cancelled" and the next ones run.
 *
 * It prints the per-frame latency (p50, p99, p99.9, max) of the whole call, on the
 * CPU and, where there is a GPU, on CUDA (else the reason), and exits
 * non-zero if any frame failed but the cancelled one or an action was wrong.
 *
 *     make examples && build/examples/game_loop [--frames N]
 * Run from the repository root (MK_ROOT=dir to run elsewhere).
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int luaopen_moonkaas_core(lua_State *L);

/* The policy: returns (frame, reference) for a device, or nil and why. */
static const char *POLICY =
    "local mk = require 'moonkaas'\n"
    "local device = ...\n"
    "if device == 'cuda' then\n"
    "    local ok, why = mk.cuda_available()\n"
    "    if not ok then return nil, why end\n"
    "end\n"
    "math.randomseed(7)\n"
    "local function weights(rows, cols)\n"
    "    local t = {}\n"
    "    for i = 1, rows do\n"
    "        t[i] = {}\n"
    "        for j = 1, cols do t[i][j] = (math.random() - 0.5) / math.sqrt(rows) end\n"
    "    end\n"
    "    return t\n"
    "end\n"
    "local function bias(n) local t = {} for i = 1, n do t[i] = 0.01 * i end return t end\n"
    "local W1, W2, W3 = weights(64, 256), weights(256, 256), weights(256, 8)\n"
    "local B1, B2, B3 = bias(256), bias(256), bias(8)\n"
    "local obs = mk.input('obs', 'float32', {1, 64})\n"
    "local function layer(x, w, b) return x:matmul(mk.constant(mk.tensor(w))) + mk.constant(mk.tensor({b})) end\n"
    "local h = layer(obs, W1, B1):relu()\n"
    "h = layer(h, W2, B2):relu()\n"
    "local model = mk.compile(layer(h, W3, B3):argmax(), {device = device})\n"
    "local obs_t, action = mk.zeros('float32', {1, 64}), mk.zeros('int64', {1, 1})\n"
    "local inputs = {obs = obs_t}\n"
    /* one frame: the host's observation in, the action out (errors: false, message) */
    "local function frame(o)\n"
    "    for j = 1, 64 do obs_t:set(1, j, o[j]) end\n"
    "    local ok, err = pcall(model.run, model, inputs, action)\n"
    "    if not ok then return false, err end\n"
    "    return true, action:get(1, 1)\n"
    "end\n"
    /* the same policy in plain Lua, to check the actions */
    "local function reference(o)\n"
    "    local function lin(x, w, b)\n"
    "        local y = {}\n"
    "        for j = 1, #b do\n"
    "            local s = b[j]\n"
    "            for i = 1, #x do s = s + x[i] * w[i][j] end\n"
    "            y[j] = s\n"
    "        end\n"
    "        return y\n"
    "    end\n"
    "    local function relu(x) for i = 1, #x do x[i] = math.max(x[i], 0) end return x end\n"
    "    local y = lin(relu(lin(relu(lin(o, W1, B1)), W2, B2)), W3, B3)\n"
    "    local best, margin = 1, math.huge\n"
    "    for j = 2, #y do if y[j] > y[best] then best = j end end\n"
    "    for j = 1, #y do if j ~= best then margin = math.min(margin, y[best] - y[j]) end end\n"
    "    return best - 1, margin\n"
    "end\n"
    /* a frame whose budget runs out: cancelled from the progress function */
    "local function overrun(o)\n"
    "    mk.on_progress(function(phase) if phase == 'run' then mk.cancel() end end)\n"
    "    local ok, err = frame(o)\n"
    "    mk.on_progress(nil)\n"
    "    return ok, err\n"
    "end\n"
    "return frame, reference, overrun\n";

static const char *root(void) {
    const char *r = getenv("MK_ROOT");
    return r && *r ? r : ".";
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The index of quantile q among n sorted values: the smallest value with at
 * least q * n values at or below it. */
static int quantile(int n, double q) {
    int i = (int)ceil(q * n) - 1;
    return i < 0 ? 0 : i >= n ? n - 1 : i;
}

/* Pushes an observation table for frame f (a smooth, changing signal). */
static void push_observation(lua_State *L, int f) {
    lua_createtable(L, 64, 0);
    for (int j = 0; j < 64; j++) {
        lua_pushnumber(L, sin(0.05 * f + 0.3 * j) + 0.1 * cos(0.7 * j * f));
        lua_rawseti(L, -2, j + 1);
    }
}

/* Runs the frames on one device; returns 0, 1 on a failure, 2 if the device is absent. */
static int play(const char *device, int frames) {
    lua_State *L = luaL_newstate();
    if (!L) {
        printf("%-5s cannot create a Lua state\n", device);
        return 1;
    }
    luaL_openlibs(L);
    luaL_requiref(L, "moonkaas.core", luaopen_moonkaas_core, 0);
    lua_pop(L, 1);
    lua_getglobal(L, "package");
    lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua", root(), root());
    lua_setfield(L, -2, "path");
    lua_pushstring(L, "");
    lua_setfield(L, -2, "cpath");
    lua_pop(L, 1);

    int rc = 0;
    double t0 = now_us();
    if (luaL_loadstring(L, POLICY) != LUA_OK || (lua_pushstring(L, device),
                                                 lua_pcall(L, 1, 3, 0)) != LUA_OK) {
        printf("%-5s the policy failed to build: %s\n", device, lua_tostring(L, -1));
        lua_close(L);
        return 1;
    }
    if (lua_isnil(L, -3)) {
        printf("%-5s skipped: %s\n", device, lua_tostring(L, -2));
        lua_close(L);
        return 2;
    }
    double build_ms = (now_us() - t0) / 1000.0;
    int frame = lua_absindex(L, -3), reference = lua_absindex(L, -2), overrun = lua_absindex(L, -1);
    double *lat = malloc(sizeof *lat * (size_t)frames);
    int wrong = 0, failed = 0, cancelled = 0, checked = 0, warm = 50;
    for (int f = -warm; f < frames && lat; f++) {
        bool budget_out = f == frames / 2; /* one frame's budget runs out */
        lua_pushvalue(L, budget_out ? overrun : frame);
        push_observation(L, f);
        double t = now_us();
        int status = lua_pcall(L, 1, 2, 0);
        double us = now_us() - t;
        if (f >= 0) lat[f] = us;
        if (status != LUA_OK || !lua_toboolean(L, -2)) {
            const char *why = lua_tostring(L, -1);
            if (budget_out && why && strstr(why, "cancelled")) {
                cancelled++;
            } else if (failed++ < 3) { /* the first few say why */
                printf("%-5s frame %d failed: %s\n", device, f, why ? why : "?");
            }
            lua_pop(L, status == LUA_OK ? 2 : 1);
            continue;
        }
        if (budget_out) { /* the cancel did not land: that is a failure too */
            failed++;
            printf("%-5s frame %d ran although it was cancelled\n", device, f);
        }
        lua_Integer action = lua_tointeger(L, -1);
        lua_pop(L, 2);
        if (f % 97 == 0) { /* check some actions against the plain-Lua policy */
            lua_pushvalue(L, reference);
            push_observation(L, f);
            if (lua_pcall(L, 1, 2, 0) != LUA_OK) {
                printf("%-5s the reference failed: %s\n", device, lua_tostring(L, -1));
                failed++;
                lua_pop(L, 1);
                continue;
            }
            lua_Integer want = lua_tointeger(L, -2);
            double margin = lua_tonumber(L, -1);
            lua_pop(L, 2);
            checked++;
            if (action != want && margin > 1e-4) { /* near-ties may round either way */
                wrong++;
                printf("%-5s frame %d: action %lld, the reference says %lld\n", device, f,
                       (long long)action, (long long)want);
            }
        }
    }
    if (lat) {
        qsort(lat, (size_t)frames, sizeof *lat, by_value);
        printf("%-5s %6d frames  p50 %7.1f us  p99 %7.1f us  p99.9 %8.1f us  max %8.1f us  "
               "(built and compiled in %.0f ms; %d actions checked, %d wrong; %d frame "
               "cancelled on purpose)\n",
               device, frames, lat[quantile(frames, 0.5)], lat[quantile(frames, 0.99)],
               lat[quantile(frames, 0.999)], lat[frames - 1], build_ms, checked, wrong,
               cancelled);
    }
    if (!lat || wrong || failed || cancelled != 1) rc = 1;
    free(lat);
    lua_close(L);
    return rc;
}

int main(int argc, char **argv) {
    int frames = 3000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--frames") && i + 1 < argc) frames = atoi(argv[++i]);
        else {
            printf("usage: %s [--frames N]\n", argv[0]);
            return 2;
        }
    }
    if (frames < 10) frames = 10;
    printf("game_loop: policy MLP 64 -> 256 -> 256 -> 8, batch 1, one evaluation a frame "
           "(the whole Lua call)\n");
    int cpu = play("cpu", frames), cuda = play("cuda", frames);
    return cpu == 1 || cuda == 1 ? 1 : 0;
}
