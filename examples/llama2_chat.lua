--[[
llama2_chat.lua — the llama2 module used from a host program, not from its
command line: load a llama2.c checkpoint and tokenizer, compile the model
once, then hold a conversation whose user lines come from the host (here a
list; a game would pass what the player typed) and whose replies come back
through a callback instead of stdout.

    lua5.4 examples/llama2_chat.lua [checkpoint tokenizer]
        (default ../shared/models/stories260K.bin and tok512.bin, or $MK_MODELS/)

stories260K is a story model, not a chat model: its replies are stories.
The first generation is checked against llama2.c's text for `-t 0 -n 200`
where the models folder has it (stories260K_t0_n200.expected.txt).
]]

do
    local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
    local build = os.getenv("MK_BUILD")
    if not build or build == "" then build = root .. "/build" end
    package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
    package.cpath = build .. "/?.so;" .. package.cpath
end
local mk = require "moonkaas"
local llama2 = require "moonkaas.llama2"

local models = os.getenv("MK_MODELS") or "../shared/models"
local checkpoint = arg[1] or (models .. "/stories260K.bin")
local tokenizer = arg[2] or (models .. "/tok512.bin")

-- 1. The header and the tokenizer, checked (nil and a message on a bad file).
local c, why = llama2.read_config(checkpoint)
if not c then
    print("llama2_chat.lua: " .. why)
    os.exit(1)
end
local tok = assert(llama2.load_tokenizer(tokenizer, c.vocab_size))

-- 2. One model, compiled once: greedy (argmax inside the model) on the CPU.
local net = llama2.build(mk, c, { device = "cpu", output = "argmax", steps = 200 })
local greedy = llama2.sampler(c.vocab_size, 0.0, 0.9, 42)

-- 3. A story from nothing, its text collected by the host.
local pieces = {}
llama2.generate(net, tok, greedy, "", 200, {
    write = function(s) pieces[#pieces + 1] = s end,
    report = function() end, -- the tok/s line
})
local story = table.concat(pieces)
print("story: " .. story)
local f = io.open(models .. "/stories260K_t0_n200.expected.txt", "rb")
if f and arg[1] == nil then
    local expected = f:read("a")
    f:close()
    if story ~= expected .. "\n" then
        print("llama2_chat.lua: FAILED: the text differs from llama2.c's run.c")
        os.exit(1)
    end
    print("(the same text as llama2.c's run.c)")
end

-- 4. Prompts from the host, each a new sequence on the same compiled model.
for _, prompt in ipairs({ "Once upon a time there was a cat", "The dog was happy" }) do
    net:reset() -- the KV caches back to zero before a new sequence
    local out = {}
    llama2.generate(net, tok, greedy, prompt, 60, {
        write = function(s) out[#out + 1] = s end, report = function() end })
    print("prompt: " .. prompt .. "\n  -> " .. table.concat(out):gsub("\n", " "))
end

-- 5. A chat turn (Llama 2's [INST] template): the host hands the user's line
-- through read_line and gets the reply through write. A chat model ends its
-- turn with EOS and asks read_line for the next line; this story model rarely does.
net:reset()
local reply, turns = {}, 0
llama2.chat(net, tok, greedy, "Tell me about a cat.", "", 120, {
    read_line = function() turns = turns + 1 return "And then?" end,
    write = function(s) reply[#reply + 1] = s end,
})
print("user: Tell me about a cat.\n" .. table.concat(reply):gsub("\n+$", ""))
print("llama2_chat.lua: done (" .. turns .. " more user lines asked)")
