-- llama2.lua — run a llama2.c checkpoint through moonkaas, like llama2.c's run.c.
--
--   lua scripts/llama2.lua <checkpoint> [-t temp] [-p topp] [-s seed] [-n steps]
--       [-i prompt] [-z tokenizer] [-m generate|chat] [-y system] [-d cpu|cuda]
--       [-q fp32|bf16|fp16|q8|q8a8] [--cudnn] [--per-token]   (`-h` says what each does)
--
-- Example: lua scripts/llama2.lua ../shared/models/stories260K.bin \
--              -z ../shared/models/tok512.bin -t 0 -n 200
--
-- The checkout's lua/ and build/ come first on the module paths, so the
-- script runs from a fresh build without LUA_PATH/LUA_CPATH (MK_BUILD=dir
-- picks another build folder, e.g. build-asan, as the specs do).

local here = (arg and arg[0] or ""):match("^(.*)[/\\]") or "."
local root = here .. "/.."
local build = os.getenv("MK_BUILD") or (root .. "/build")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local llama2 = require("moonkaas.llama2")
os.exit(llama2.main({ ... }), true) -- closing the state frees the models (MK_CUDA_TIMELINE writes then)
