-- charge (the model's slot): add to tenants' virtual finish times in their bands what
-- finished requests used beyond the estimate enqueue charged (shared/fairness.py), so
-- a tenant's later work waits for the service it took.
-- KEYS[1] fair clock   KEYS[2] fair tags
-- ARGV triples: priority, fair member '<priority>:<tenant>', units
-- Returns the number of charges applied.
local n = 0
for a = 1, #ARGV, 3 do
  fair_charge(KEYS[1], KEYS[2], ARGV[a], ARGV[a + 1], ARGV[a + 2])
  n = n + 1
end
return n
