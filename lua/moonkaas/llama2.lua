-- moonkaas.llama2 — llama2.c checkpoints run through moonkaas.
--
-- What llama2.c's run.c does, with the network defined in Lua and compiled
-- by moonkaas (one graph per step, see llama2/model.lua):
--
--   local llama2 = require "moonkaas.llama2"
--   local mk = require "moonkaas"
--   local c = assert(llama2.read_config("stories260K.bin"))      -- header, checked
--   local tok = assert(llama2.load_tokenizer("tok512.bin", c.vocab_size))
--   local net = llama2.build(mk, c, {device = "cpu", greedy = true})
--   local sampler = llama2.sampler(c.vocab_size, 0.0, 0.9, 42)
--   llama2.generate(net, tok, sampler, "Once upon a time", 256)
--   net:reset()                         -- before the next generation
--
-- Parts: checkpoint (format, header checks, mmap'd weights), tokenizer
-- (encode/decode as run.c), sampler (run.c's, in float32 Lua; a model built
-- with output = "sample" runs the same as a node), float32 (the
-- emulation), model (the graph). This file adds run.c's generate and chat
-- loops and its command line; scripts/llama2.lua is the thin CLI over main().

local C = require("moonkaas.compat")
local checkpoint = require("moonkaas.llama2.checkpoint")
local tokenizer = require("moonkaas.llama2.tokenizer")
local sampler = require("moonkaas.llama2.sampler")
local model = require("moonkaas.llama2.model")
local float32 = require("moonkaas.llama2.float32")

local M = {
    checkpoint = checkpoint,
    tokenizer = tokenizer,
    sampler_module = sampler,
    model = model,
    float32 = float32,
    read_config = checkpoint.read_config,
    clock = function() return model.clock() end,
}

-- Tokenizer for a model's vocabulary: (path, vocab_size) → tokenizer | nil, err.
M.load_tokenizer = tokenizer.load

-- run.c's sampler: (vocab_size, temperature, topp, seed) → sampler.
M.sampler = sampler.new

-- Maps the weights of a checked config and compiles the model.
--   opts: device ("cpu" | "cuda"), cudnn, output ("argmax": temperature 0;
--         "sample": run.c's sampler inside the model; "logits", the default;
--         greedy = true stands for "argmax"),
--         steps (positions to hold, default seq_len), precision (fp32 | bf16 |
--         fp16 | q8 | q8a8, default the file's), log (function(msg), progress),
--         copy (read the weights into memory whatever the file's size:
--         checkpoint.map)
function M.build(mk, c, opts)
    opts = opts or {}
    local log = opts.log or function() end
    local t0 = model.clock()
    -- int8 weights are read from the file straight into their groups
    local q8 = opts.precision and model.PRECISIONS[opts.precision] == "q8"
    local group = q8 and (c.version == 2 and c.group_size or model.group_size(c)) or nil
    local w = checkpoint.map(mk, c, { copy = opts.copy, quantize = group })
    log(string.format("mapped %s (%.1f MB) in %.0f ms", c.path, c.file_bytes / 1e6, (model.clock() - t0) * 1000))
    return model.build(mk, c, w, opts)
end

-- ---------------------------------------------------------------------------
-- generation loops (run.c's generate and chat)

local function default_write(s)
    io.stdout:write(s)
    io.stdout:flush()
end

-- generate's chunk follows the model's speed: about CHUNK_SECONDS of steps a
-- call (see generate).
M.CHUNK_SECONDS = 0.02

-- The chunk after a call that made n tokens in `seconds`: the power of two in
-- [4, 64] nearest below CHUNK_SECONDS of steps at that rate.
local function next_chunk(n, seconds)
    local want, chunk = n * M.CHUNK_SECONDS / math.max(seconds, 1e-9), 4
    while chunk < 64 and chunk * 2 <= want do chunk = chunk * 2 end
    return chunk
end

-- Generates up to `steps` positions from `prompt`, printing pieces through
-- opts.write (stdout by default) and "achieved tok/s" through opts.report
-- (stderr by default). Returns the generated ids (prompt included, 0-based
-- token ids) and the tok/s figure (nil when no step ran after the first).
-- The transformer must be fresh or reset. The prompt runs in one evaluation
-- (net:prefill) where it fits in `steps`; past it, a greedy or sampling model
-- generates opts.chunk tokens a call inside the model (net:steps), printing
-- each chunk as it returns; without opts.chunk, 16 at first, then as many
-- as take about CHUNK_SECONDS at the rate the last call ran (4 to 64), so
-- that a fast model returns to the host rarely (its per-call cost spread over
-- many tokens) while text still appears every few milliseconds.
-- opts.per_token runs one evaluation a token throughout instead (the same
-- text).
function M.generate(net, tok, smp, prompt, steps, opts)
    opts = opts or {}
    local write = opts.write or default_write
    local report = opts.report or function(s) io.stderr:write(s) end
    local stop_on_bos = opts.stop_on_bos ~= false
    local chunk = net.output_kind ~= "logits" and not opts.per_token and (opts.chunk or 16) or nil
    local prompt_tokens = tok:encode(prompt or "", true, false)
    local ids = { prompt_tokens[1] }
    local start, timed = nil, 0 -- the timer starts after the first call (warm-up)
    local token, pos = prompt_tokens[1], 0
    local function emit(nxt) -- false at BOS (1), which delimits sequences
        pos = pos + 1
        if nxt == tokenizer.BOS and stop_on_bos then return false end
        write(tokenizer.printable(tok:decode(token, nxt)))
        ids[#ids + 1] = nxt
        token = nxt
        return true
    end
    local going = true
    if not opts.per_token and #prompt_tokens > 1 and #prompt_tokens <= steps then
        -- the prompt in one evaluation (prefill): its tokens, then the one after
        local made = { C.unpack(prompt_tokens, 2) }
        made[#made + 1] = net:prefill(prompt_tokens, 0, smp)
        for _, nxt in ipairs(made) do
            going = emit(nxt)
            if not going then break end
        end
        start = model.clock()
    end
    while going and pos < steps do
        local made
        if chunk and pos >= #prompt_tokens - 1 then
            local t0 = model.clock()
            made = net:steps(token, pos, math.min(chunk, steps - pos), stop_on_bos and tokenizer.BOS or nil, smp)
            if not opts.chunk and #made > 0 then chunk = next_chunk(#made, model.clock() - t0) end
        elseif pos < #prompt_tokens - 1 then
            net:forward(token, pos, smp)          -- run.c does not sample here: smp stays
            made = { prompt_tokens[pos + 2] }     -- still inside the prompt: force it
        else
            made = { net:next_token(token, pos, smp) }
        end
        if start then timed = timed + #made end
        for _, nxt in ipairs(made) do
            going = emit(nxt)
            if not going then break end
        end
        if not start then start = model.clock() end
    end
    write("\n")
    local rate
    if timed > 0 then
        rate = timed / math.max(model.clock() - start, 1e-9)
        report(string.format("achieved tok/s: %f\n", rate))
    end
    return ids, rate
end

-- generate for o.batch stories at once (net:batch): seeds o.seed, o.seed +
-- 1, ... (wrapped as run.c's unsigned long long of an int), each from
-- o.prompt, up to o.steps positions, ending at BOS as generate does. Each
-- story is written whole through opts.write as generate writes it, in seed
-- order, once all are told; a line per story and the aggregate tok/s go to
-- opts.report. Returns the stories' ids (prompt included), in seed order.
function M.generate_batch(net, tok, o, opts)
    opts = opts or {}
    local write = opts.write or default_write
    local report = opts.report or function(s) io.stderr:write(s) end
    local b = net:batch({ slots = o.batch, tokenizer = tok })
    local prompt = tok:encode(o.prompt or "", true, false)
    local story, ids = {}, {}
    for i = 1, o.batch do
        local seed = (o.seed + i - 1) % 0x100000000
        local id = b:add(prompt, sampler.new(net.config.vocab_size, o.temperature, o.topp, seed))
        story[id] = { i = i, seed = seed, text = {}, ids = { prompt[1] }, last = prompt[1] }
    end
    local t0, made = model.clock(), 0
    while b:count() > 0 do
        for _, r in ipairs(b:step()) do
            local s = story[r.id]
            made = made + 1
            if r.token == tokenizer.BOS then
                if not r.done then b:remove(r.id) end
            else
                s.text[#s.text + 1] = tokenizer.printable(tok:decode(s.last, r.token))
                s.ids[#s.ids + 1], s.last = r.token, r.token
            end
        end
    end
    local seconds = model.clock() - t0
    for _, s in pairs(story) do ids[s.i] = s end
    for i, s in ipairs(ids) do
        write(table.concat(s.text) .. "\n")
        report(string.format("story %d: seed %d, %d tokens\n", i, s.seed, #s.ids))
        ids[i] = s.ids
    end
    report(string.format("%d stories, achieved tok/s: %f (all together)\n", o.batch, made / math.max(seconds, 1e-9)))
    return ids
end

-- run.c reads lines into 512-byte buffers with fgets.
local function default_read_line(guide)
    io.stdout:write(guide)
    io.stdout:flush()
    return io.stdin:read("*l")
end

-- run.c's chat loop: Llama 2 chat template, the assistant's turn ends on EOS
-- (2), user (and, at the start, system) prompts from opts.read_line(guide)
-- unless given. Writes through opts.write. Ends after `steps` positions.
-- Each turn's prompt runs in one evaluation (net:prefill) where it fits in
-- `steps`: run.c samples at every prompt position and keeps only the last
-- draw, so the generator steps once for each of the others first, and the
-- text is run.c's. opts.per_token feeds prompts a token at a time instead.
function M.chat(net, tok, smp, user_prompt, system_prompt, steps, opts)
    opts = opts or {}
    local write = opts.write or default_write
    local read_line = opts.read_line or default_read_line
    local function read(guide, previous)
        local line = read_line(guide)
        if line == nil then return previous or "" end   -- fgets at EOF keeps the buffer
        return line:sub(1, 511)
    end
    local system, user = "", ""
    local prompt_tokens, user_idx = {}, 1
    local user_turn = true
    local nxt, token
    local pos = 0
    while pos < steps do
        local prefilled = false -- the whole prompt ran in one evaluation
        if user_turn then
            if pos == 0 then
                if system_prompt == nil then
                    system = read("Enter system prompt (optional): ", system)
                else
                    system = system_prompt
                end
            end
            if pos == 0 and user_prompt ~= nil then
                user = user_prompt
            else
                user = read("User: ", user)
            end
            local rendered
            if pos == 0 and system ~= "" then
                rendered = string.format("[INST] <<SYS>>\n%s\n<</SYS>>\n\n%s [/INST]", system, user)
            else
                rendered = string.format("[INST] %s [/INST]", user)
            end
            prompt_tokens = tok:encode(rendered, true, false)
            user_idx = 1
            user_turn = false
            write("Assistant: ")
            if not opts.per_token and #prompt_tokens > 1 and pos + #prompt_tokens <= steps then
                if not smp:greedy() then
                    for _ = 1, #prompt_tokens - 1 do smp:coin() end
                end
                token = prompt_tokens[#prompt_tokens]
                nxt = net:prefill(prompt_tokens, pos, smp)
                pos = pos + #prompt_tokens
                user_idx = #prompt_tokens + 1
                if nxt == tokenizer.EOS then
                    write("\n")
                else
                    write(tokenizer.printable(tok:decode(token, nxt)))
                end
                prefilled = true
            end
        end
        if not prefilled then
            if user_idx <= #prompt_tokens then
                token = prompt_tokens[user_idx]
                user_idx = user_idx + 1
            else
                token = nxt
            end
            -- EOS (2) ends the assistant's turn.
            if token == tokenizer.EOS then user_turn = true end
            nxt = net:next_token(token, pos, smp)
            pos = pos + 1
            if user_idx > #prompt_tokens and nxt ~= tokenizer.EOS then
                write(tokenizer.printable(tok:decode(token, nxt)))
            end
            if nxt == tokenizer.EOS then write("\n") end
        end
    end
    write("\n")
end

-- ---------------------------------------------------------------------------
-- command line (run.c's, plus -d and --cudnn)

M.USAGE = [[
Usage:   lua scripts/llama2.lua <checkpoint> [options]
Example: lua scripts/llama2.lua model.bin -n 256 -i "Once upon a time"
Options:
  -t <float>  temperature in [0,inf], default 1.0
  -p <float>  p value in top-p (nucleus) sampling in [0,1] default 0.9
  -s <int>    random seed, default time(NULL)
  -n <int>    number of steps to run for, default 256. 0 = max_seq_len
  -i <string> input prompt
  -z <string> optional path to custom tokenizer
  -m <string> mode: generate|chat, default: generate
  -y <string> (optional) system prompt in chat mode
  -d <string> device: cpu|cuda, default: cuda when available
  -q <string> weights: fp32|bf16|fp16|q8 (int8 groups), converted at load,
              or q8a8 (q8, and each product's input in int8 groups: runq.c);
              default: the checkpoint's own precision
  --cudnn     fuse with cuDNN (CUDA only)
  --batch <int> tell that many stories at once (seeds s, s+1, ...), one
              evaluation a step for all of them; each story is the one
              this seed tells alone (generate mode)
  --per-token one evaluation a token (otherwise each prompt in one
              evaluation, chat's turns included, and generate's tokens 4 to
              64 a call run inside the model, sampler included; the text is
              the same)
  -h          print this help
]]

-- C's atoi on a 32-bit int: the leading integer, wrapped to int32.
local function parse_int(s)
    local v = C.tointeger(tonumber(s))
    if not v then return nil end
    return (v + 0x80000000) % 0x100000000 - 0x80000000
end

-- Parses argv (a 1-based array, argv[1] the checkpoint). Returns an options
-- table, or nil, a message ("" for -h) and the exit code.
function M.parse_args(argv)
    local o = {
        tokenizer = "tokenizer.bin", temperature = 1.0, topp = 0.9, steps = 256,
        prompt = nil, seed = 0, mode = "generate", system_prompt = nil,
        device = nil, cudnn = false,
    }
    for _, a in ipairs(argv) do
        if a == "-h" or a == "--help" then return nil, "", 0 end
    end
    if #argv < 1 then return nil, "missing <checkpoint>", 1 end
    o.checkpoint = argv[1]
    if o.checkpoint:sub(1, 1) == "-" then
        return nil, "the first argument must be the checkpoint, not " .. o.checkpoint, 1
    end
    local i = 2
    while i <= #argv do
        local flag = argv[i]
        if flag == "--cudnn" then
            o.cudnn = true
            i = i + 1
        elseif flag == "--per-token" then
            o.per_token = true
            i = i + 1
        elseif flag == "--batch" then
            local n = C.tointeger(tonumber(argv[i + 1] or ""))
            if not n or n < 1 then
                return nil, string.format("--batch needs a number of stories >= 1 (got %s)", tostring(argv[i + 1])), 1
            end
            o.batch = n
            i = i + 2
        else
            -- the letters that take a value: anything else is unknown before its value is asked for
            if flag:sub(1, 1) ~= "-" or #flag ~= 2 or not ("tpsnizmyqd"):find(flag:sub(2, 2), 1, true) then
                return nil, "unknown option: " .. flag, 1
            end
            local value = argv[i + 1]
            if value == nil then return nil, "option " .. flag .. " needs a value", 1 end
            local letter = flag:sub(2, 2)
            local function number(v)
                local n = tonumber(v)
                if not n or n ~= n then return nil end
                return n
            end
            if letter == "t" then
                o.temperature = number(value)
            elseif letter == "p" then
                o.topp = number(value)
            elseif letter == "s" then
                o.seed = parse_int(value)
            elseif letter == "n" then
                o.steps = parse_int(value)
            elseif letter == "i" then
                o.prompt = value
            elseif letter == "z" then
                o.tokenizer = value
            elseif letter == "m" then
                if value ~= "generate" and value ~= "chat" then
                    return nil, "unknown mode: " .. value, 1
                end
                o.mode = value
            elseif letter == "y" then
                o.system_prompt = value
            elseif letter == "q" then
                if not model.PRECISIONS[value] then
                    return nil, "unknown precision: " .. value .. " (fp32|bf16|fp16|q8|q8a8)", 1
                end
                o.precision = value
            elseif letter == "d" then
                if value ~= "cpu" and value ~= "cuda" then
                    return nil, "unknown device: " .. value .. " (cpu|cuda)", 1
                end
                o.device = value
            else
                return nil, "unknown option: " .. flag, 1
            end
            for _, k in ipairs({ "temperature", "topp", "seed", "steps" }) do
                if o[k] == nil then
                    return nil, string.format("bad value for %s: %q", flag, value), 1
                end
            end
            i = i + 2
        end
    end
    -- run.c's overrides.
    if o.temperature < 0 then o.temperature = 0.0 end
    if o.topp < 0 or o.topp > 1 then o.topp = 0.9 end
    if o.steps < 0 then o.steps = 0 end
    if o.seed == 0 then o.seed = os.time() % 0x100000000 end
    if o.batch and o.mode ~= "generate" then return nil, "--batch works in generate mode", 1 end
    return o
end

-- The CLI: returns the process exit code. env (optional, for tests):
-- mk (the moonkaas module), stdout/stderr writers, read_line.
-- The compile's progress (mk.on_progress) on stderr: a bar redrawn in place
-- on a terminal, else one line as each phase completes.
function M.progress_display(write, terminal)
    local function what(phase, done, total)
        if phase == "upload" then
            return string.format("uploading weights %.1f / %.1f MB", done / 1e6, total / 1e6)
        elseif phase == "kernels" then
            return string.format("generating kernels %d / %d", done, total)
        end
        return string.format("compiling, stage %d / %d", done, total)
    end
    local drawn = false
    return function(phase, done, total)
        if phase == "run" then return end
        if not terminal then
            if done == total and total > 0 and phase ~= "compile" then
                write(what(phase, done, total) .. "\n")
            end
            return
        end
        local width = 24
        local filled = total > 0 and math.floor(width * done / total) or width
        write(string.format("\r[%s%s] %-40s", string.rep("#", filled), string.rep(".", width - filled),
                            what(phase, done, total)))
        drawn = true
        if phase == "compile" and done == total and drawn then
            write("\r" .. string.rep(" ", width + 43) .. "\r") -- done: the bar goes
            drawn = false
        end
    end
end

function M.main(argv, env)
    env = env or {}
    local err_write = env.stderr or function(s) io.stderr:write(s) end
    local o, msg, code = M.parse_args(argv)
    if not o then
        if msg ~= "" then err_write("error: " .. msg .. "\n") end
        if code == 0 then
            (env.stdout or function(s) io.stdout:write(s) end)(M.USAGE)
        else
            err_write(M.USAGE)
        end
        return code
    end
    local function fail(m)
        err_write(m .. "\n")
        return 1
    end
    local c, cerr = checkpoint.read_config(o.checkpoint)
    if not c then return fail(cerr) end
    if o.steps == 0 or o.steps > c.seq_len then o.steps = c.seq_len end
    local tok, terr = tokenizer.load(o.tokenizer, c.vocab_size)
    if not tok then return fail(terr) end

    local mk = env.mk
    if not mk then
        local ok, m = pcall(require, "moonkaas")
        if not ok then return fail("cannot load the moonkaas module: " .. tostring(m)) end
        mk = m
    end
    local has_cuda, no_cuda_why = false, "this moonkaas has no cuda_available()"
    -- asked only when CUDA may run: the question loads the CUDA plugin (and its libraries)
    if mk.cuda_available and o.device ~= "cpu" then has_cuda, no_cuda_why = mk.cuda_available() end
    local device = o.device or (has_cuda and "cuda" or "cpu")
    if o.cudnn and device ~= "cuda" then
        if o.device == "cpu" then return fail("--cudnn needs -d cuda") end
        return fail("--cudnn: no CUDA device: " .. tostring(no_cuda_why))
    end
    if device == "cuda" and not has_cuda then
        return fail("-d cuda: no CUDA device: " .. tostring(no_cuda_why))
    end
    local smp = sampler.new(c.vocab_size, o.temperature, o.topp, o.seed)
    local log = function(m) err_write(m .. "\n") end
    log(string.format("%s: %s", c.path, checkpoint.describe(c)))
    local terminal = env.terminal
    if terminal == nil then terminal = mk.is_terminal ~= nil and mk.is_terminal(io.stderr) end
    if mk.on_progress then mk.on_progress(M.progress_display(err_write, terminal)) end
    if mk.on_log then -- the core's warnings; its info repeats what is printed below
        mk.on_log(function(level, m) if level == "warning" then log("warning: " .. m) end end)
    end
    -- The sampler node's state is a 64-bit integer, which a Lua 5.1 number
    -- cannot carry between runs: there the model gives the logits and the Lua
    -- sampler (the same draws) picks the token.
    local sampled = C.lua51 and "logits" or "sample"
    local ok, net = pcall(M.build, mk, c, {
        device = device, cudnn = o.cudnn, output = smp:greedy() and "argmax" or sampled,
        steps = o.steps, log = log,
        precision = o.precision })
    if mk.on_progress then mk.on_progress(nil) end -- runs report nothing
    if not ok then return fail(tostring(net)) end
    collectgarbage() -- the build's garbage freed now, its memory serves the run: lower peak RSS
    local run_ok, rerr = pcall(function()
        if o.batch then
            M.generate_batch(net, tok, o, { write = env.stdout, report = err_write })
        elseif o.mode == "generate" then
            M.generate(net, tok, smp, o.prompt, o.steps,
                       { write = env.stdout, report = err_write, per_token = o.per_token })
        else
            M.chat(net, tok, smp, o.prompt, o.system_prompt, o.steps,
                   { write = env.stdout, read_line = env.read_line, per_token = o.per_token })
        end
    end)
    if not run_ok then return fail(tostring(rerr)) end
    return 0
end

return M
