-- The policy tests/run.sh gives every test file (SBX_POLICY): backend =
-- "auto" keeps to Docker wherever a daemon answers, as the files that mean
-- Docker and leave the backend to auto were written before auto preferred
-- the local backend. backend_auto_test.lua sets policy.local.auto itself.
return { ["local"] = { auto = false } }
