-- dev/gpu/conv_cases.lua: the convolution and pooling cases of the op-case
-- table drawn from seed SEED, on the CPU, each against its reference; only
-- the CASE-th where CASE is set (its name printed first, so a crash names it).
--   MK_BUILD=build lua5.4 -e 'SEED=1 CASE=3' dev/gpu/conv_cases.lua
package.path = "./?.lua;./lua/?.lua;./lua/?/init.lua;" .. package.path
local H = require "spec.helpers"
math.randomseed(SEED)
local list = {}
for _, case in ipairs(H.family_cases()) do
    if case.name:find("^Conv") or case.name:find("Pool") then list[#list + 1] = case end
end
for i, case in ipairs(list) do
    if not CASE or i == CASE then
        io.write(case.name, " | out ", table.concat(case.output.shape, "x"), "\n")
        io.flush()
        local out = H.mk().compile(case.output):run(case.feeds)
        H.assert_close(out, case.want, case.atol, case.rtol)
    end
end
print("ok")
